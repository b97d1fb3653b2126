/* A tiny test harness for the libcolo C tests: checks that exit on failure, a watchdog, and
 * helpers shared by the tests (an in-process echo server thread, pattern checks). */
#ifndef COLO_T_H
#define COLO_T_H

#include <colo.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int t_checks __attribute__((unused));

#define CHECK(cond)                                                                          \
    do {                                                                                     \
        t_checks++;                                                                          \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);        \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

#define CHECK_EQ(a, b)                                                                       \
    do {                                                                                     \
        long long t_a = (long long)(a), t_b = (long long)(b);                                \
        t_checks++;                                                                          \
        if (t_a != t_b) {                                                                    \
            fprintf(stderr, "%s:%d: %s is %lld (%s), expected %s = %lld\n", __FILE__,       \
                    __LINE__, #a, t_a, t_a < 0 ? colo_strerror((int)t_a) : "", #b, t_b);    \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

#define RUN(fn)                                                                              \
    do {                                                                                     \
        fprintf(stderr, "  %s\n", #fn);                                                      \
        fn();                                                                                \
    } while (0)

static inline void t_on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "watchdog: test took too long\n";
    ssize_t r = write(2, msg, sizeof msg - 1);
    (void)r;
    _exit(3);
}

/* Every test program starts with this: no test may hang. */
static inline void watchdog(unsigned seconds) {
    signal(SIGALRM, t_on_alarm);
    signal(SIGPIPE, SIG_IGN);
    alarm(seconds);
}

static inline void t_done(const char *name) {
    printf("ok %s: %d checks\n", name, t_checks);
}

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static inline uint8_t pattern(uint64_t i) { return (uint8_t)(i % 251); }

/* Listens on 127.0.0.1:0 with `opts`; returns the listener and its address text in `addr`. */
static inline colo_listener *t_listen(const colo_options *opts, char *addr) {
    colo_listener *l = NULL;
    CHECK_EQ(colo_listen("127.0.0.1:0", opts, &l), 0);
    CHECK(l != NULL);
    CHECK(colo_listener_addr(l, addr, COLO_ADDRSTRLEN) > 0);
    return l;
}

/* Reads exactly `len` bytes (or fails the test). */
static inline void t_read_exact(colo_conn *c, void *buf, size_t len) {
    size_t got = 0;
    while (got < len) {
        ssize_t n = colo_read(c, (char *)buf + got, len - got);
        if (n <= 0) {
            fprintf(stderr, "read_exact: %zd (%s) after %zu of %zu\n", n, colo_strerror((int)n), got, len);
            exit(1);
        }
        got += (size_t)n;
    }
}

/* An echo server on its own thread: accepts one connection, echoes bytes until EOF, then shuts
 * down writing and closes. */
struct t_echo {
    colo_listener *l;
    pthread_t th;
    int accept_flags;
    long long echoed;
};

static inline void *t_echo_main(void *arg) {
    struct t_echo *e = arg;
    colo_conn *c = NULL;
    if (colo_accept(e->l, 0, &c, NULL, 0) != 0) return NULL;
    char buf[65536];
    for (;;) {
        ssize_t n = colo_read(c, buf, sizeof buf);
        if (n <= 0) break;
        if (colo_write_all(c, buf, (size_t)n) != 0) break;
        e->echoed += n;
    }
    colo_shutdown(c, COLO_SHUT_WR);
    colo_close(c);
    return NULL;
}

static inline void t_echo_start(struct t_echo *e, colo_listener *l) {
    memset(e, 0, sizeof *e);
    e->l = l;
    CHECK_EQ(pthread_create(&e->th, NULL, t_echo_main, e), 0);
}

static inline void t_echo_join(struct t_echo *e) { pthread_join(e->th, NULL); }


/* A connected pair (client `c`, server `s`) through listener `l` at `addr`: accepts on a thread,
 * since a shared-memory handshake needs the server side to answer while the client waits. */
struct t_acc {
    colo_listener *l;
    colo_conn *s;
    int rc;
};
static inline void *t_acc_main(void *arg) {
    struct t_acc *a = arg;
    a->rc = colo_accept(a->l, 0, &a->s, NULL, 0);
    return NULL;
}
static inline void t_pair(colo_listener *l, const char *addr, const colo_options *opts, colo_conn **c, colo_conn **s) {
    struct t_acc a = {l, NULL, -1};
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, t_acc_main, &a), 0);
    CHECK_EQ(colo_connect(addr, opts, c), 0);
    pthread_join(th, NULL);
    CHECK_EQ(a.rc, 0);
    *s = a.s;
}
#endif
