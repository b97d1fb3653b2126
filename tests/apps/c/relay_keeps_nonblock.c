/* A non-blocking server hands an accepted connection on and keeps its own descriptor: to an
 * exec'd program as its standard input (round 0), or over a Unix socket (SCM_RIGHTS, rounds 1
 * and 2, where a fork child holds it too);
 * under the shim each is relayed, a relay process holding the connection. Over TCP the open
 * socket's O_NONBLOCK is the server's to set: its recv with nothing queued fails EAGAIN,
 * whatever the other holder does. Under colo the relay of a passed connection turned the shared
 * flag off for every holder: the fork child's recv blocked (here: EINTR at the alarm).
 * alarm() is the watchdog. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "scenario.h"

static void on_alarm(int sig) { (void)sig; }

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {0};
    sa.sa_handler = on_alarm; /* no SA_RESTART: a recv that waits ends EINTR at the alarm */
    sigaction(SIGALRM, &sa, NULL);
    for (int round = 0; round < 3; round++) {
        int k, s;
        connected_pair(&k, &s, 0);
        char q;
        CHECK(write(k, "q", 1) == 1 && read(s, &q, 1) == 1, "the first byte");
        CHECK(fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK) == 0, "O_NONBLOCK set");
        /* Round 2: a fork child holds the connection too, and looks after the hand-on. */
        int go[2] = {-1, -1};
        pid_t holder = -1;
        if (round == 2) {
            if (pipe(go) < 0) die("pipe");
            holder = fork();
            if (holder < 0) die("fork");
            if (holder == 0) {
                char g, b[4];
                close(go[1]);
                if (read(go[0], &g, 1) != 1) _exit(3);
                alarm(5);
                ssize_t n = recv(s, b, sizeof b, 0);
                int e = errno;
                if (!(n < 0 && e == EAGAIN)) fprintf(stderr, "the fork child's recv = %zd (%s)\n", n, strerror(e));
                _exit(n < 0 && e == EAGAIN ? 0 : 1);
            }
            close(go[0]);
        }
        pid_t child = -1;
        int u[2] = {-1, -1}, passed = -1;
        if (round == 0) {
            child = fork();
            if (child < 0) die("fork");
            if (child == 0) {
                close(k);
                dup2(s, 0);
                close(s);
                execl("/bin/sleep", "sleep", "30", (char *)NULL);
                _exit(127);
            }
        } else {
            if (socketpair(AF_UNIX, SOCK_STREAM, 0, u) < 0) die("socketpair");
            char one = 1, ctl[CMSG_SPACE(sizeof(int))] = {0};
            struct iovec v = {&one, 1};
            struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
            struct cmsghdr *c = CMSG_FIRSTHDR(&m);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(c), &s, sizeof(int));
            CHECK(sendmsg(u[0], &m, 0) == 1, "the connection passed over a Unix socket");
            struct msghdr r = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
            CHECK(recvmsg(u[1], &r, 0) == 1 && CMSG_FIRSTHDR(&r), "... and received");
            if (CMSG_FIRSTHDR(&r)) memcpy(&passed, CMSG_DATA(CMSG_FIRSTHDR(&r)), sizeof(int));
        }
        usleep(300 * 1000); /* the hand-on (and under the shim its relay) has happened */
        if (holder > 0) {
            int st;
            CHECK(write(go[1], "g", 1) == 1, "the fork child told to look");
            waitpid(holder, &st, 0);
            close(go[1]);
            CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "a fork child's recv with nothing queued: EAGAIN, after the hand-on");
        }
        alarm(5);
        char b[4];
        ssize_t n = recv(s, b, sizeof b, 0);
        int e = errno;
        alarm(0);
        if (!(n < 0 && e == EAGAIN)) fprintf(stderr, "round %d: recv = %zd (%s)\n", round, n, strerror(e));
        CHECK(n < 0 && e == EAGAIN, "the server's recv with nothing queued: EAGAIN");
        CHECK(fcntl(s, F_GETFL) & O_NONBLOCK, "... and its O_NONBLOCK still set");
        /* The connection still carries bytes to the server. */
        CHECK(write(k, "xy", 2) == 2, "the client writes");
        int got = 0;
        for (int i = 0; i < 200 && got < 2; i++) {
            ssize_t r = recv(s, b + got, 2 - got, 0);
            if (r > 0) got += r;
            else usleep(10 * 1000);
        }
        CHECK(got == 2 && memcmp(b, "xy", 2) == 0, "... and the server reads them");
        if (child > 0) {
            kill(child, SIGKILL);
            waitpid(child, NULL, 0);
        }
        if (passed >= 0) close(passed);
        if (u[0] >= 0) close(u[0]), close(u[1]);
        close(s);
        close(k);
    }
    if (failures == 0) printf("ok: a relayed copy left the server's O_NONBLOCK as it set it%s\n", shimmed() ? " (accelerated)" : "");
    return failures != 0;
}
