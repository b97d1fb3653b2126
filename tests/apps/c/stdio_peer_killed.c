/* A relayed program that writes without end (`yes`, its standard output the connection, as
 * tcpserver or inetd start it) whose peer is killed with SIGKILL: over TCP its next writes fail
 * (the peer's kernel answers with RST) and it dies of SIGPIPE within moments. Under colo the relay
 * must pass that on instead of leaving the program blocked on a full loopback connection nobody
 * reads. Standard output only, and standard input and output; a client that sent nothing, and
 * one that sent a request and ended its stream first. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <signal.h>
#include <sys/wait.h>

#include "scenario.h"

/* Waits up to `ms` for `p` to end; its status, or -1 if it still runs. */
static int wait_for(pid_t p, int ms) {
    int st;
    for (int i = 0; i < ms / 10; i++) {
        if (waitpid(p, &st, WNOHANG) == p) return st;
        usleep(10000);
    }
    return -1;
}

int main(void) {
    alarm(60);
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    for (int round = 0; round < 4; round++) {
        pid_t cl = fork();
        if (cl < 0) die("fork");
        if (cl == 0) {
            /* The client: reads a little, then waits to be killed. */
            int k = socket(AF_INET, SOCK_STREAM, 0);
            if (k < 0 || connect(k, (struct sockaddr *)&a, sizeof a) < 0) _exit(1);
            /* Half its rounds it first sends a line and ends its stream, as a client of a
             * request and response does. */
            if (round >= 2) {
                write_all(k, "request\n", 8);
                shutdown(k, SHUT_WR);
            }
            char b[1000];
            if (read_full(k, b, sizeof b) < 0) _exit(2);
            pause();
            _exit(0);
        }
        int s = accept(l, NULL, NULL);
        if (s < 0) die("accept");
        pid_t y = fork();
        if (y < 0) die("fork");
        if (y == 0) {
            signal(SIGPIPE, SIG_DFL);
            if (round % 2) dup2(s, 0);
            dup2(s, 1);
            close(s);
            close(l);
            execl("/usr/bin/yes", "yes", "abcdefgh", (char *)NULL);
            _exit(127);
        }
        close(s);
        usleep(300000);
        kill(cl, SIGKILL);
        waitpid(cl, NULL, 0);
        int st = wait_for(y, 10000);
        if (st == -1) {
            fprintf(stderr, "round %d: yes still writes 10 s after its peer was killed\n", round);
            kill(y, SIGKILL);
            waitpid(y, NULL, 0);
        }
        CHECK(st != -1, "the writer learns its peer was killed and ends");
    }
    close(l);
    if (failures) return 1;
    printf("stdio_peer_killed: ok\n");
    return 0;
}
