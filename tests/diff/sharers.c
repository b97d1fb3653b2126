/* What the processes holding one connection share, as the kernel keeps it once for the socket:
 * SO_SNDBUF set by one bounds every holder's non-blocking writes and readiness, and holds up
 * none of their calls. */
#include "diff.h"
#include <pthread.h>

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

/* Sends 64 MiB on the descriptor `arg` points to: blocks, its peer reading nothing. */
static void *send_64m(void *arg) {
    static char big[1 << 20];
    for (int i = 0; i < 64; i++)
        if (send(*(int *)arg, big, sizeof big, 0) < 0) break;
    return NULL;
}

/* Ends the scenario if the read below still waits after 5 s (the kernel's returns at once). */
static void *read_watchdog(void *arg) {
    (void)arg;
    settle(5000);
    say("  reader still waiting after 5 s");
    _exit(0);
}

static void sndbuf_by_a_child_while_a_thread_writes(void) {
    /* One thread blocked writing; a fork child sets SO_SNDBUF; the peer sends a byte: another
     * thread's read returns it while the write still waits. */
    int s, c;
    pthread_t w, dog;
    pair(&s, &c);
    pthread_create(&w, NULL, send_64m, &c);
    settle(300);
    sndbuf_in_a_child(c, 4096);
    if (send(s, "r", 1, 0) != 1) die("send");
    pthread_create(&dog, NULL, read_watchdog, NULL);
    char b[8];
    T("reader got", recv(c, b, sizeof b, 0));
}

int main(void) {
    diff_begin();
    RUN(sndbuf_set_by_a_fork_child);
    RUN(sndbuf_set_by_the_parent);
    RUN(sndbuf_raised_by_a_fork_child);
    RUN(sndbuf_by_a_child_while_a_thread_writes);
    diff_end();
    return 0;
}
