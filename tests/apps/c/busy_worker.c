/* A client with an event loop (wrk, nginx to its upstreams) opens several connections, each
 * registered in epoll as it is made, before it writes a request on any; the server is one
 * synchronous worker (gunicorn's, php-fpm's) that accepts a connection, reads its request,
 * answers and closes, then accepts the next. Over TCP this never waits: the kernel completes
 * each connection in the listener's queue and buffers the request. Under the shim the answer
 * to a connection's offer comes when the worker accepts it, and the worker is waiting for the
 * request on the first connection, which the client sends only after its registrations: the
 * client must not wait on an accept that cannot come (with COLO_CARRIER_TIMEOUT_MS at 60 s, a
 * client that does waits for the listener to drop each offer, 5 s, and the alarm() watchdog
 * ends it). Every request gets its answer; the first
 * connection is accelerated (run with the shim preloaded, as tests/apps/run.sh does; also
 * passes without it). */
#define _GNU_SOURCE
#include "scenario.h"
#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/wait.h>

#define CONNS 6

int main(void) {
    alarm(10);
    signal(SIGPIPE, SIG_IGN);
    setenv("COLO_CARRIER_TIMEOUT_MS", "60000", 1);
    setenv("COLO_SHORT_LIVED", "accelerate", 1);
    struct sockaddr_in a;
    int ready[2];
    if (pipe(ready) < 0) die("pipe");
    /* The port, chosen by a listener the parent closes; the worker listens on it itself. */
    int probe = loopback_listener(&a, 1);
    close(probe);
    pid_t w = fork();
    if (w == 0) {
        int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 16) < 0) die("worker listen");
        write_all(ready[1], "r", 1);
        for (int i = 0; i < CONNS; i++) {
            int s = accept(l, NULL, NULL);
            char b[4];
            if (s < 0 || read_full(s, b, 4) < 0) _exit(2);
            write_all(s, b, 4);
            close(s);
        }
        _exit(0);
    }
    char r;
    if (read(ready[0], &r, 1) != 1) die("worker ready");
    int ep = epoll_create1(0), c[CONNS];
    for (int i = 0; i < CONNS; i++) {
        c[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (connect(c[i], (struct sockaddr *)&a, sizeof a) < 0 && errno != EINPROGRESS) die("connect");
        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.u32 = i};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, c[i], &ev) < 0) die("epoll_ctl");
    }
    int answered = 0, sent[CONNS] = {0};
    while (answered < CONNS) {
        struct epoll_event evs[CONNS];
        int n = epoll_wait(ep, evs, CONNS, 10000);
        if (n <= 0) die("epoll_wait");
        for (int k = 0; k < n; k++) {
            int i = evs[k].data.u32;
            char req[4] = {'r', 'q', '0' + i, '\n'}, b[4];
            if ((evs[k].events & EPOLLOUT) && !sent[i]) {
                CHECK(write(c[i], req, 4) == 4, "the request is written at once");
                sent[i] = 1;
                struct epoll_event ev = {.events = EPOLLIN, .data.u32 = i};
                epoll_ctl(ep, EPOLL_CTL_MOD, c[i], &ev);
            } else if (evs[k].events & EPOLLIN) {
                int flags = fcntl(c[i], F_GETFL);
                fcntl(c[i], F_SETFL, flags & ~O_NONBLOCK);
                CHECK(read_full(c[i], b, 4) == 0 && memcmp(b, req, 4) == 0, "each request gets its own answer");
                epoll_ctl(ep, EPOLL_CTL_DEL, c[i], NULL);
                close(c[i]);
                answered++;
            }
        }
    }
    int st;
    CHECK(waitpid(w, &st, 0) == w && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the worker served every connection");
    return failures != 0;
}
