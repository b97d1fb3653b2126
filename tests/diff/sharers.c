/* What the processes holding one connection share, as the kernel keeps it once for the socket:
 * SO_SNDBUF set by one bounds every holder's non-blocking writes and readiness. */
#include "diff.h"

/* Fills `c` with non-blocking sends; says whether it took less than 64 KiB before EAGAIN, and
 * whether poll reports it writable then. The peer `s` reads it all back. */
static void fill_and_drain(const char *who, int c, int s) {
    static char big[1 << 16];
    long total = 0;
    ssize_t n;
    while ((n = send(c, big, sizeof big, MSG_DONTWAIT)) > 0) total += n;
    say("  %s queued before EAGAIN under 64 KiB: %s (last -1 %s)", who, total < 65536 ? "yes" : "no", ename(errno));
    mask("poll writer full", pmask(c) & POLLOUT);
    long got = 0;
    while (got < total && (n = recv(s, big, sizeof big, 0)) > 0) got += n;
    settle(50);
    mask("poll writer drained", pmask(c) & POLLOUT);
}

/* A fork child sets SO_SNDBUF `size` on `c`, and exits. */
static void sndbuf_in_a_child(int c, int size) {
    pid_t p = fork();
    if (p == 0) {
        setsockopt(c, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
        _exit(0);
    }
    waitpid(p, NULL, 0);
}

static void sndbuf_set_by_a_fork_child(void) {
    int s, c;
    pair(&s, &c);
    sndbuf_in_a_child(c, 4096);
    fill_and_drain("parent, after the child's SO_SNDBUF", c, s);
}

static void sndbuf_set_by_the_parent(void) {
    int s, c, size = 4096, go[2];
    pair(&s, &c);
    if (pipe(go) < 0) die("pipe");
    pid_t p = fork();
    if (p == 0) {
        char x;
        if (read(go[0], &x, 1) != 1) _exit(1);
        fill_and_drain("child, after the parent's SO_SNDBUF", c, s);
        _exit(0);
    }
    /* The child holds its copy already when the parent sets the option. */
    setsockopt(c, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
    if (write(go[1], "g", 1) != 1) die("write");
    waitpid(p, NULL, 0);
}

static void sndbuf_raised_by_a_fork_child(void) {
    /* The parent's small buffer, made large again by a child: the parent queues more. */
    int s, c, small = 4096;
    pair(&s, &c);
    setsockopt(c, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    sndbuf_in_a_child(c, 1 << 20);
    fill_and_drain("parent, after the child's larger SO_SNDBUF", c, s);
}

int main(void) {
    diff_begin();
    RUN(sndbuf_set_by_a_fork_child);
    RUN(sndbuf_set_by_the_parent);
    RUN(sndbuf_raised_by_a_fork_child);
    diff_end();
    return 0;
}
