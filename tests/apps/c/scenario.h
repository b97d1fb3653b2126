/* What every scenario program in tests/apps/c shares: the CHECK macro and its failure count,
 * die(), whether the colo shim is preloaded, and how many colo segments this process holds. */
#ifndef COLO_SCENARIO_H
#define COLO_SCENARIO_H
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <errno.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures __attribute__((unused));
#define CHECK(cond, what)                                                   \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "FAIL %s (line %d)\n", what, __LINE__);         \
            failures++;                                                     \
        }                                                                   \
    } while (0)

static void die(const char *what) {
    perror(what);
    exit(1);
}

/* A TCP listener on an ephemeral loopback port (dies on failure); its address goes to *a. */
static inline int loopback_listener(struct sockaddr_in *a, int backlog) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    socklen_t len = sizeof *a;
    *a = (struct sockaddr_in){.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (l < 0 || bind(l, (struct sockaddr *)a, sizeof *a) < 0 || listen(l, backlog) < 0) die("listen");
    getsockname(l, (struct sockaddr *)a, &len);
    return l;
}

#ifndef _GNU_SOURCE
/* glibc declares it only for _GNU_SOURCE, which not every scenario defines first. */
int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags);
#endif

/* A connected loopback TCP pair: the client's end in *k, the accepted end in *c (accept4 with
 * `flags`); the listener is closed. Dies on failure. */
static inline void connected_pair(int *k, int *c, int flags) {
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    *k = socket(AF_INET, SOCK_STREAM, 0);
    if (*k < 0 || connect(*k, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    *c = accept4(l, NULL, NULL, flags);
    if (*c < 0) die("accept");
    close(l);
}

/* Whether the colo shim is preloaded (the programs also run without it). */
static inline int shimmed(void) {
    const char *p = getenv("LD_PRELOAD");
    return p && strstr(p, "colo");
}

/* How many colo segment mappings this process has (one per end a process holds: a connection
 * with both ends in this process counts twice). Counted in /proc/self/maps, not among the
 * descriptors: the shim closes a close-on-exec connection's memfd once mapped. A mapping split
 * into several areas counts once, by its area at offset 0. */
static inline int segments(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512], path[256];
    unsigned long off;
    int found = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "%*s %*s %lx %*s %*s %255s", &off, path) == 2 && off == 0 && strstr(path, "colo-seg")) found++;
    if (f) fclose(f);
    return found;
}

/* Whether an abstract Unix socket named `name` (a colo rendezvous) is listed in /proc/net/unix. */
static inline int abstract_bound(const char *name) {
    FILE *f = fopen("/proc/net/unix", "r");
    char line[512];
    size_t n = strlen(name);
    int found = 0;
    while (f && fgets(line, sizeof line, f)) {
        char *at = strchr(line, '@');
        if (at && strncmp(at + 1, name, n) == 0 && (at[1 + n] == '\n' || at[1 + n] == 0)) found = 1;
    }
    if (f) fclose(f);
    return found;
}

/* How many descriptors this process holds. */
static inline int descriptors_open(void) {
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    while (d && readdir(d)) n++;
    if (d) closedir(d);
    return n - 3; /* ".", ".." and the directory's own descriptor */
}

/* Waits (up to 3 s) until this process has no segment open, and returns the count then. Those
 * of connections closed just before stay open for a moment (parked for reuse up to a second,
 * then unmapped by a background thread), and a count would include them. */
static inline int segments_settled(void) {
    for (int i = 0; i < 300 && segments() > 0; i++) usleep(10000);
    return segments();
}

/* Echoes what `c` reads back to it until end of stream: 0, or -1 once a write fails (the peer
 * is gone). */
static inline int echo_until_eof(int c) {
    static char b[65536];
    ssize_t n;
    while ((n = read(c, b, sizeof b)) > 0)
        for (ssize_t o = 0; o < n;) {
            ssize_t w = write(c, b + o, n - o);
            if (w <= 0) return -1;
            o += w;
        }
    return 0;
}

/* A child process that accepts on `l`, one connection at a time, and echoes each until its end
 * of stream, until killed; `l` is closed in the caller. Dies on failure. */
static inline __attribute__((unused)) pid_t fork_echo_server(int l) {
    pid_t server = fork();
    if (server < 0) die("fork");
    if (server == 0) {
        for (;;) {
            int c = accept(l, NULL, NULL);
            if (c < 0) _exit(1);
            echo_until_eof(c);
            close(c);
        }
    }
    close(l);
    return server;
}

/* Byte `i` of the test pattern. */
static inline unsigned char pattern(long i) { return (unsigned char)((i * 2654435761u) >> 13); }

/* Monotonic seconds. */
static inline double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* Writes all of `p` (retrying after EINTR); dies on an error. */
static inline void write_all(int fd, const void *p, size_t n) {
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) die("write");
        p = (const char *)p + k;
        n -= k;
    }
}

/* Reads exactly `n` bytes (retrying after EINTR); -1 on an error or end of stream first. */
static inline int read_full(int fd, void *p, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, (char *)p + got, n - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        got += k;
    }
    return 0;
}

/* A worker of a forked server: answers each connection's "ping" with "pong" and the worker's
 * pid, then closes it; never returns. */
static inline __attribute__((unused)) void pong_worker(int l) {
    for (;;) {
        int c = accept(l, NULL, NULL);
        if (c < 0) continue;
        char b[4];
        if (read(c, b, 4) == 4) {
            char out[32];
            int n = snprintf(out, sizeof out, "pong %d", (int)getpid());
            write_all(c, out, n);
        }
        close(c);
    }
}
/* For the epoll scenarios: a connected pair (`connected_pair`, the accepted end *c non-blocking)
 * with "hello" waiting for *c, which is registered for EPOLLIN | `et` (0 or EPOLLET) in a new
 * epoll set; returns the set. Dies on failure. */
static inline __attribute__((unused)) int registered_pair(int *k, int *c, unsigned et) {
    connected_pair(k, c, SOCK_NONBLOCK);
    write_all(*k, "hello", 5);
    usleep(50000);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN | et, .data.fd = *c};
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, *c, &ev) < 0) die("epoll");
    return ep;
}

/* A child that writes "again" on `k` 200 ms from now, while the caller sleeps: its pid. */
static inline __attribute__((unused)) pid_t write_later(int k) {
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        usleep(200000);
        write_all(k, "again", 5);
        _exit(0);
    }
    return pid;
}
#endif
