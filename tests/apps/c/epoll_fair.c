/* Fairness of epoll_wait when accelerated connections are always ready (run with the shim
 * preloaded, as tests/apps/run.sh does, and without it): three connections registered for
 * EPOLLOUT (level-triggered, so ready at every call) and a readable pipe in one set. The kernel
 * rotates its ready list, so every fd is reported within a few calls, whatever `maxevents` is;
 * with the shim, connections found ready in their rings once filled every batch and the pipe
 * was never reported, and with `maxevents` 1 the same connection came first every time. A
 * second set polled in between (with connections of its own) must not upset the rotation.
 * alarm() is the watchdog. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "scenario.h"

#define CONNS 3
#define PIPE_TAG 100

int main(void) {
    alarm(30);
    struct sockaddr_in a;
    int l = loopback_listener(&a, CONNS);
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) { /* the peer: connects CONNS times and holds the connections until told */
        int c[CONNS];
        for (int i = 0; i < CONNS; i++) {
            c[i] = socket(AF_INET, SOCK_STREAM, 0);
            if (connect(c[i], (struct sockaddr *)&a, sizeof a) < 0) die("connect");
        }
        char b;
        if (read(c[0], &b, 1) < 0) die("peer read");
        _exit(0);
    }
    int s[CONNS];
    for (int i = 0; i < CONNS; i++)
        if ((s[i] = accept(l, NULL, NULL)) < 0) die("accept");
    if (shimmed()) CHECK(segments() >= CONNS, "the connections are accelerated");
    int p[2];
    if (pipe(p) < 0 || write(p[1], "x", 1) != 1) die("pipe");
    int ep = epoll_create1(0);
    for (int i = 0; i < CONNS; i++) {
        struct epoll_event e = {.events = EPOLLOUT, .data.u64 = i};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, s[i], &e) < 0) die("epoll_ctl");
    }
    struct epoll_event e = {.events = EPOLLIN, .data.u64 = PIPE_TAG};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, p[0], &e) < 0) die("epoll_ctl pipe");

    /* The second set: one of the connections again, polled between the first set's waits. */
    int ep2 = epoll_create1(0);
    struct epoll_event e2 = {.events = EPOLLOUT, .data.u64 = 0};
    if (epoll_ctl(ep2, EPOLL_CTL_ADD, s[0], &e2) < 0) die("epoll_ctl second set");

    for (int max = 1; max <= CONNS + 1; max++) {
        int seen[CONNS + 1] = {0};
        for (int call = 0; call < 8 * (CONNS + 1); call++) {
            struct epoll_event ev[CONNS + 1];
            if (call % 2) CHECK(epoll_wait(ep2, ev, 1, 0) == 1, "the second set reports its connection");
            int n = epoll_wait(ep, ev, max, 1000);
            CHECK(n >= 1 && n <= max, "epoll_wait reports within maxevents");
            for (int k = 0; k < n; k++) seen[ev[k].data.u64 == PIPE_TAG ? CONNS : (int)ev[k].data.u64]++;
        }
        char what[80];
        for (int i = 0; i < CONNS; i++) {
            snprintf(what, sizeof what, "maxevents %d: connection %d reported", max, i);
            CHECK(seen[i] > 0, what);
        }
        snprintf(what, sizeof what, "maxevents %d: the pipe reported", max);
        CHECK(seen[CONNS] > 0, what);
    }
    if (write(s[0], "q", 1) != 1) die("quit");
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the peer exits cleanly");
    if (failures) return 1;
    puts("epoll_fair: ok");
    return 0;
}
