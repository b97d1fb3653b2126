/* A connection closed while a forked child still holds it, after non-blocking reads that found
 * nothing (run with the shim preloaded, as tests/apps/run.sh does; also passes without it).
 * Under the shim such reads hand the connection to the process's hang-up watcher, and the
 * close releases only this process's copy (the child still uses it): the watcher must let go
 * of it then, or the peer's later close (which makes the child's copy of the control socket
 * readable) has it write to the unmapped segment. The process must survive that close and
 * still serve a fresh connection. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>

#include "scenario.h"

int main(void) {
    alarm(30);
    signal(SIGPIPE, SIG_IGN);
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    int s = accept(l, NULL, NULL);
    if (s < 0) die("accept");
    fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
    char b[16];
    for (int i = 0; i < 3; i++) CHECK(read(s, b, sizeof b) < 0 && errno == EAGAIN, "a read with nothing sent is EAGAIN");
    int pp[2];
    if (pipe(pp) < 0) die("pipe");
    pid_t pid = fork();
    if (pid == 0) {
        /* The child keeps the server's end and lets the client's go (its own watchdog: an
         * alarm is not inherited). */
        alarm(30);
        close(c);
        close(pp[0]);
        if (write(pp[1], "k", 1) != 1) _exit(2);
        pause();
        _exit(0);
    }
    close(pp[1]);
    if (read(pp[0], b, 1) != 1) die("child");
    /* Our copy of the server's end goes; the child's stays. */
    close(s);
    /* The client's end goes for good: the child's copy of the server's end hears the hang-up. */
    close(c);
    struct timespec t = {0, 300 * 1000 * 1000};
    nanosleep(&t, NULL);
    /* Still alive, and serving. */
    int c2 = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c2, (struct sockaddr *)&a, sizeof a) < 0) die("connect again");
    int s2 = accept(l, NULL, NULL);
    if (s2 < 0) die("accept again");
    write_all(c2, "ping", 4);
    CHECK(read_full(s2, b, 4) == 0 && memcmp(b, "ping", 4) == 0, "a fresh connection carries its bytes");
    close(c2);
    close(s2);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    if (failures) return 1;
    printf("ok close_while_forked\n");
    return 0;
}
