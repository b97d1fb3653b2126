/* An epoll set watched through poll or select on the set's own descriptor (EventMachine, so
 * ruby's thin, sleeps so, then takes the events with a zero-timeout epoll_wait): the set reports
 * readable when a connection in it has bytes, as the kernel's does. It never did under the shim
 * (the peer's bytes rang no doorbell, nobody having announced a sleep), and thin answered no
 * request. Four ways: bytes there before the registration, or coming while the program sleeps,
 * each through poll and select; then, once an edge-triggered registration's event is taken, the
 * set is quiet again (a poll waits out its timeout). alarm() is the watchdog. */
#define _GNU_SOURCE
#include <poll.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/wait.h>

#include "scenario.h"

/* Waits up to `ms` for the set `ep` to be readable, through poll or select. */
static int set_readable(int ep, int use_select, int ms) {
    if (use_select) {
        fd_set r;
        FD_ZERO(&r);
        FD_SET(ep, &r);
        struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
        return select(ep + 1, &r, NULL, NULL, &tv) == 1 && FD_ISSET(ep, &r);
    }
    struct pollfd p = {.fd = ep, .events = POLLIN};
    return poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

static void one_way(int use_select, unsigned et) {
    int k, c;
    char what[128], b[16];
    const char *via = use_select ? "select" : "poll";
    int ep = registered_pair(&k, &c, et);
    struct epoll_event out[4];
    snprintf(what, sizeof what, "%s%s: the set is readable for bytes there before the registration", via, et ? " (ET)" : "");
    CHECK(set_readable(ep, use_select, 5000), what);
    snprintf(what, sizeof what, "%s%s: ... and the set reports the connection", via, et ? " (ET)" : "");
    CHECK(epoll_wait(ep, out, 4, 0) == 1 && out[0].data.fd == c, what);
    CHECK(read(c, b, sizeof b) == 5, "the bytes are read");
    if (et) {
        snprintf(what, sizeof what, "%s (ET): the set is quiet once its event was taken", via);
        CHECK(!set_readable(ep, use_select, 200), what);
    }
    pid_t pid = write_later(k);
    snprintf(what, sizeof what, "%s%s: the set is readable for bytes that came during the sleep", via, et ? " (ET)" : "");
    CHECK(set_readable(ep, use_select, 5000), what);
    snprintf(what, sizeof what, "%s%s: ... and the set reports the connection", via, et ? " (ET)" : "");
    CHECK(epoll_wait(ep, out, 4, 0) == 1 && out[0].data.fd == c, what);
    CHECK(read(c, b, sizeof b) == 5, "the bytes are read");
    waitpid(pid, NULL, 0);
    close(ep);
    close(c);
    close(k);
}

int main(void) {
    alarm(30);
    for (int s = 0; s < 2; s++) {
        one_way(s, 0);
        one_way(s, EPOLLET);
    }
    if (failures == 0) printf("epoll_set_polled: ok\n");
    return failures != 0;
}
