/* An epoll set registered in another epoll set (sd-event's and libuv's embedding, an event loop
 * inside another): the outer set reports the inner one readable when a connection in the inner
 * one has bytes, as the kernel's does. It never did under the shim (the peer's bytes rang no
 * doorbell, nobody having announced a sleep on the inner set): a wait on the outer set with no
 * timeout hung. Level-triggered and edge-triggered registrations in the inner set; bytes there
 * before the registrations, or coming while the program sleeps; 2,000 round trips through the
 * two sets against an echoing child that closed its copy of the connection (a lost wake-up
 * waits out its 5 s; the child's close took the parent's registrations out of the shared set
 * before); and the inner set's close while registered. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <sys/epoll.h>
#include <sys/wait.h>

#include "scenario.h"

#define INNER_TAG 77

/* Waits up to `ms` on `outer` for the inner set, then takes the connection's event from it.
 * The outer set may report the inner one once with nothing to take (a doorbell rung for bytes
 * already read): the wait goes on then, as an event loop's does. */
static int nested_ready(int outer, int inner, int c, int ms) {
    struct epoll_event out[4];
    for (int spurious = 0; spurious < 100; spurious++) {
        if (epoll_wait(outer, out, 4, ms) != 1 || out[0].data.u64 != INNER_TAG) return 0;
        int n = epoll_wait(inner, out, 4, 0);
        if (n == 1 && out[0].data.fd == c) return 1;
        if (n != 0) return 0;
    }
    return 0;
}

static void one_way(unsigned et) {
    int k, c;
    char what[128], b[16];
    const char *how = et ? "edge-triggered" : "level-triggered";
    int inner = registered_pair(&k, &c, et), outer = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event nest = {.events = EPOLLIN, .data.u64 = INNER_TAG};
    if (outer < 0 || epoll_ctl(outer, EPOLL_CTL_ADD, inner, &nest) < 0) die("epoll");
    snprintf(what, sizeof what, "%s: the outer set reports the inner one for bytes there before", how);
    CHECK(nested_ready(outer, inner, c, 5000), what);
    CHECK(read(c, b, sizeof b) == 5, "the bytes are read");
    if (et) {
        struct epoll_event out[4];
        CHECK(epoll_wait(outer, out, 4, 200) == 0, "edge-triggered: the outer set is quiet once the event was taken");
    }
    pid_t pid = write_later(k);
    snprintf(what, sizeof what, "%s: the outer set reports the inner one for bytes that came during its sleep", how);
    CHECK(nested_ready(outer, inner, c, 5000), what);
    CHECK(read(c, b, sizeof b) == 5, "the bytes are read");
    waitpid(pid, NULL, 0);

    /* Round trips: the child echoes every byte; the parent waits for each through both sets. */
    pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        close(c);
        char x;
        while (recv(k, &x, 1, 0) == 1) write_all(k, &x, 1);
        _exit(0);
    }
    int trips = 0;
    for (int i = 0; i < 2000; i++) {
        char x = (char)i, y;
        write_all(c, &x, 1);
        if (!nested_ready(outer, inner, c, 5000) || read(c, &y, 1) != 1 || y != x) break;
        trips++;
    }
    snprintf(what, sizeof what, "%s: 2000 round trips through the two sets (%d made)", how, trips);
    CHECK(trips == 2000, what);
    close(c);
    close(k);
    waitpid(pid, NULL, 0);

    /* The inner set closed while registered: the outer one just has nothing to report. */
    close(inner);
    struct epoll_event out[4];
    CHECK(epoll_wait(outer, out, 4, 100) == 0, "the inner set closed: the outer one reports nothing");
    close(outer);
}

int main(void) {
    alarm(60);
    one_way(0);
    one_way(EPOLLET);
    if (failures == 0) printf("epoll_nested: ok\n");
    return failures != 0;
}
