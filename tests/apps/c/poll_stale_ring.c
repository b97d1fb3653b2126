/* A relay's loop (microsocks and other copiers of 1 KiB at a time): poll two connections, read
 * the one that is readable. The quiet one's control socket can hold a ring no poll drained: its
 * peer's request woke the relay's poll, and every poll since returned at once, the other
 * connection readable, so none drained it.
 *  1. the bytes arrive intact and in order, and each poll reports the busy connection only;
 *  2. such a poll costs one system call (the kernel fds' look), not a second one a poll to ask
 *     the quiet connection's control socket whether its peer hung up: `poll_stale_ring count N`
 *     makes N polls, which run.sh counts under strace;
 *  3. the quiet connection's peer killed (no FIN, its process gone) is reported by the next such
 *     poll (POLLRDHUP), as over TCP (the kernel's FIN for the dead process's socket).
 * Runs with and without the shim; alarm() is the watchdog. */
#define _GNU_SOURCE
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>

#include "scenario.h"

#define PIECE 64

int main(int argc, char **argv) {
    alarm(20);
    int polls = argc > 2 && strcmp(argv[1], "count") == 0 ? atoi(argv[2]) : 3000;
    int ka, ca, kb, cb;
    connected_pair(&ka, &ca, 0);
    connected_pair(&kb, &cb, 0);
    pid_t child = fork();
    if (child < 0) die("fork");
    if (child == 0) {
        /* The quiet connection's peer: one request, written while the relay sleeps in poll. */
        close(ca);
        close(kb);
        close(cb);
        usleep(50000);
        if (write(ka, "r", 1) != 1) _exit(1);
        for (;;) pause();
    }
    close(ka);
    struct pollfd p[2] = {{ca, POLLIN | POLLRDHUP, 0}, {cb, POLLIN | POLLRDHUP, 0}};
    CHECK(poll(p, 2, 5000) == 1 && (p[0].revents & POLLIN) && p[1].revents == 0, "the request wakes the poll");
    char r;
    CHECK(read(ca, &r, 1) == 1 && r == 'r', "the request is read");
    /* The busy connection: everything its loop reads is there before it starts (the ring grows,
     * as a TCP socket's buffers take it). One piece more stays for the look after the kill. */
    size_t total = (size_t)(polls + 1) * PIECE;
    unsigned char *all = malloc(total), got[PIECE];
    if (!all) die("malloc");
    for (size_t i = 0; i < total; i++) all[i] = pattern((long)i);
    write_all(kb, all, total);
    int bad = 0;
    for (int n = 0; n < polls; n++) {
        p[0].revents = p[1].revents = 0;
        if (poll(p, 2, 5000) != 1 || p[0].revents != 0 || !(p[1].revents & POLLIN)) bad++;
        if (read_full(cb, got, PIECE) != 0) die("read");
        bad += memcmp(got, all + (size_t)n * PIECE, PIECE) != 0;
    }
    CHECK(bad == 0, "each poll reports the busy connection only, and its bytes come intact and in order");
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    p[0].revents = p[1].revents = 0;
    int k = poll(p, 2, 5000);
    CHECK(k == 2 && (p[0].revents & POLLRDHUP) && (p[1].revents & POLLIN), "the quiet peer's death is seen beside the busy connection");
    free(all);
    return failures != 0;
}
