/* One server program with several listeners (a prefork master's pools: php-fpm pools, uwsgi or
 * gunicorn binds, apache's Listen ports), one of them saturated: its listener L1 never accepts,
 * L2 and L3 accept at once. A client holding an accelerated connection to L2 dials L1 without
 * blocking: the shim finds that program not accepting there and goes on over TCP (the
 * connection completes in the kernel's queue, as over TCP). Its next connection to L2, a pool it
 * dialed before, is still accelerated; one to L3, never dialed, goes plain for the moment, as an
 * FTP session's new passive port does (ftp_passive.c). Bytes arrive intact on each (run with the
 * shim preloaded, as tests/apps/run.sh does; also passes without it). */
#define _GNU_SOURCE
#include "scenario.h"
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>

#define MAXFDS 16

/* Accepts on `l2` and `l3` and echoes every connection until its end; `l1` is never accepted. */
static void serve(int l2, int l3) {
    struct pollfd p[MAXFDS];
    int n = 2;
    p[0] = (struct pollfd){.fd = l2, .events = POLLIN};
    p[1] = (struct pollfd){.fd = l3, .events = POLLIN};
    for (;;) {
        if (poll(p, n, -1) < 0) {
            if (errno == EINTR) continue;
            _exit(2);
        }
        for (int i = 0; i < n; i++) {
            if (!p[i].revents) continue;
            if (i < 2) {
                int s = accept(p[i].fd, NULL, NULL);
                if (s >= 0 && n < MAXFDS) p[n++] = (struct pollfd){.fd = s, .events = POLLIN};
                else if (s >= 0) close(s);
                continue;
            }
            char b[256];
            ssize_t k = read(p[i].fd, b, sizeof b);
            if (k > 0) {
                write_all(p[i].fd, b, k);
                continue;
            }
            close(p[i].fd);
            p[i--] = p[--n];
        }
    }
}

/* A blocking connection to `a` that echoes a ping intact: its descriptor. */
static int pinged(const struct sockaddr_in *a, const char *what) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0 || connect(s, (const struct sockaddr *)a, sizeof *a) < 0) die(what);
    char got[4];
    write_all(s, "ping", 4);
    CHECK(read_full(s, got, 4) == 0 && memcmp(got, "ping", 4) == 0, what);
    return s;
}

int main(void) {
    alarm(20);
    signal(SIGPIPE, SIG_IGN);
    /* Counted below: short-lived connections must not go plain for their own reason. */
    setenv("COLO_SHORT_LIVED", "accelerate", 1);
    struct sockaddr_in a[3];
    int ready[2];
    if (pipe(ready) < 0) die("pipe");
    pid_t srv = fork();
    if (srv < 0) die("fork");
    if (srv == 0) {
        int l1 = loopback_listener(&a[0], 8), l2 = loopback_listener(&a[1], 8), l3 = loopback_listener(&a[2], 8);
        (void)l1;
        write_all(ready[1], a, sizeof a);
        serve(l2, l3);
    }
    if (read_full(ready[0], a, sizeof a) < 0) die("server ready");
    int shim = shimmed();

    int first = pinged(&a[1], "a first connection to L2 echoes");
    if (shim) CHECK(segments() == 1, "the first connection to L2 is accelerated");

    int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (s < 0) die("socket");
    if (connect(s, (struct sockaddr *)&a[0], sizeof a[0]) < 0 && errno != EINPROGRESS) die("connect L1");
    struct pollfd p = {.fd = s, .events = POLLOUT};
    CHECK(poll(&p, 1, 15000) == 1, "the connection to L1, never accepted, completes");
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
    CHECK(err == 0, "the connection to L1 completes without error");
    if (shim) CHECK(segments() == 1, "the connection to L1 goes on over TCP");

    int again = pinged(&a[1], "the next connection to L2 echoes");
    if (shim) CHECK(segments() == 2, "the next connection to L2, a pool dialed before, is still accelerated");
    int other = pinged(&a[2], "a connection to L3 echoes");
    if (shim) CHECK(segments() == 2, "a connection to L3, never dialed, is plain while its program is found busy");

    close(first);
    close(again);
    close(other);
    close(s);
    kill(srv, SIGKILL);
    waitpid(srv, NULL, 0);
    return failures ? 1 : 0;
}
