/* libcolo benchmark: 64 B ping-pong (p50/p99) and 64 KiB streaming throughput, colo against TCP
 * loopback and Unix sockets measured in the same run. Each server is a separate process.
 *
 *   make -C tests/c bench            (or build/c/bench [seconds-per-case [round-trip case]])
 *
 * With a case name ("colo", "colo msg", ...) only that round trip is measured, as `colo bench`
 * measures (three slices, the median one), and its p50 printed alone, in us: tests/c/compare.sh
 * alternates such runs with the same case of `colo bench`.
 */
#include <colo.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum kind { K_TCP, K_UNIX, K_COLO, K_COLO_MSG };
enum op { OP_ECHO, OP_SINK };

static double secs = 0.5;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A ratio column, or "-" where there is nothing to compare with yet. */
static void print_ratio(double r) {
    if (r > 0)
        printf("%7.2fx\n", r);
    else
        printf("%8s\n", "-");
}

static void die(const char *what, long long rc) {
    fprintf(stderr, "bench: %s: %s\n", what, rc < 0 ? colo_strerror((int)rc) : strerror(errno));
    exit(1);
}

/* ---- a tiny common connection interface: a colo handle or a plain fd ---- */
struct conn {
    colo_conn *c;
    int fd;
};

static ssize_t c_read(struct conn *c, void *b, size_t n) {
    if (c->c) return colo_read(c->c, b, n);
    ssize_t r = read(c->fd, b, n);
    return r < 0 ? -errno : r;
}

static void c_write_all(struct conn *c, const void *b, size_t n) {
    if (c->c) {
        int r = colo_write_all(c->c, b, n);
        if (r < 0) die("write", r);
        return;
    }
    while (n) {
        ssize_t r = write(c->fd, b, n);
        if (r < 0) die("write", -errno);
        b = (const char *)b + r;
        n -= (size_t)r;
    }
}

static void c_read_exact(struct conn *c, void *b, size_t n) {
    while (n) {
        ssize_t r = c_read(c, b, n);
        if (r <= 0) die("read", r);
        b = (char *)b + r;
        n -= (size_t)r;
    }
}

static colo_options opts(int64_t spin) {
    colo_options o;
    colo_options_init(&o);
    o.spin_us = spin;
    o.ring_capacity = 1 << 20;
    return o;
}

/* ---- server process ---- */
static void serve(struct conn *c, enum kind k, enum op op) {
    static char buf[1 << 16];
    if (k == K_COLO_MSG) {
        colo_msg *m;
        const void *p;
        size_t n;
        while (colo_recv_message(c->c, &m, &p, &n) == 1) {
            colo_buf *b;
            void *d;
            if (colo_loan(c->c, n, &b, &d) < 0) break;
            memcpy(d, p, n);
            colo_msg_release(m);
            if (colo_send(b, n) < 0) break;
        }
        return;
    }
    for (;;) {
        ssize_t n = c_read(c, buf, sizeof buf);
        if (n <= 0) {
            if (n == 0 && op == OP_SINK) c_write_all(c, "k", 1); /* end of a sink run: answer */
            return;
        }
        if (op == OP_ECHO) c_write_all(c, buf, (size_t)n);
    }
}

/* Starts a server child; returns its pid and fills `addr` (ip:port or a Unix path). */
static pid_t start_server(enum kind k, enum op op, int64_t spin, char *addr) {
    int p[2];
    if (pipe(p) < 0) die("pipe", 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        char a[108] = {0};
        struct conn c = {NULL, -1};
        if (k == K_COLO || k == K_COLO_MSG) {
            colo_options o = opts(spin);
            colo_listener *l;
            int r = colo_listen("127.0.0.1:0", &o, &l);
            if (r < 0) die("listen", r);
            colo_listener_addr(l, a, sizeof a);
            if (write(p[1], a, sizeof a) < 0) _exit(1);
            if ((r = colo_accept(l, 0, &c.c, NULL, 0)) < 0) die("accept", r);
        } else {
            int ls;
            if (k == K_TCP) {
                ls = socket(AF_INET, SOCK_STREAM, 0);
                struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
                socklen_t sl = sizeof sa;
                if (bind(ls, (struct sockaddr *)&sa, sizeof sa) < 0) die("bind", 0);
                getsockname(ls, (struct sockaddr *)&sa, &sl);
                snprintf(a, sizeof a, "127.0.0.1:%d", ntohs(sa.sin_port));
            } else {
                ls = socket(AF_UNIX, SOCK_STREAM, 0);
                struct sockaddr_un su = {.sun_family = AF_UNIX};
                snprintf(su.sun_path, sizeof su.sun_path, "/tmp/colo-bench-%d.sock", getpid());
                unlink(su.sun_path);
                if (bind(ls, (struct sockaddr *)&su, sizeof su) < 0) die("bind", 0);
                snprintf(a, sizeof a, "%s", su.sun_path);
            }
            listen(ls, 4);
            if (write(p[1], a, sizeof a) < 0) _exit(1);
            c.fd = accept(ls, NULL, NULL);
            if (k == K_UNIX) unlink(a);
            int one = 1;
            if (k == K_TCP) setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        }
        serve(&c, k, op);
        _exit(0);
    }
    close(p[1]);
    if (read(p[0], addr, 108) != 108) die("server start", 0);
    close(p[0]);
    return pid;
}

static struct conn dial(enum kind k, int64_t spin, const char *addr) {
    struct conn c = {NULL, -1};
    if (k == K_COLO || k == K_COLO_MSG) {
        colo_options o = opts(spin);
        int r = colo_connect(addr, &o, &c.c);
        if (r < 0) die("connect", r);
        if (colo_transport(c.c) != COLO_TRANSPORT_SHM) die("not over shared memory", -EPROTO);
    } else if (k == K_TCP) {
        c.fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(strchr(addr, ':') + 1)), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        if (connect(c.fd, (struct sockaddr *)&sa, sizeof sa) < 0) die("connect", -errno);
        int one = 1;
        setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    } else {
        c.fd = socket(AF_UNIX, SOCK_STREAM, 0);
        struct sockaddr_un su = {.sun_family = AF_UNIX};
        snprintf(su.sun_path, sizeof su.sun_path, "%s", addr);
        if (connect(c.fd, (struct sockaddr *)&su, sizeof su) < 0) die("connect", -errno);
    }
    return c;
}

static void hang_up(struct conn *c, pid_t pid) {
    if (c->c) colo_close(c->c);
    else close(c->fd);
    int st;
    waitpid(pid, &st, 0);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

struct lat {
    double p50, p99;
};

static struct lat round_trip(enum kind k, int64_t spin) {
    char addr[108];
    pid_t pid = start_server(k, OP_ECHO, spin, addr);
    struct conn c = dial(k, spin, addr);
    char buf[64] = {0};
    size_t cap = 4000000, n = 0;
    double *t = malloc(cap * sizeof *t);
    double end = now() + secs, warm = now() + secs / 5;
    while (n < cap) {
        double t0 = now();
        if (t0 > end) break;
        if (k == K_COLO_MSG) {
            colo_buf *b;
            void *d;
            colo_msg *m;
            int r = colo_loan(c.c, 64, &b, &d);
            if (r < 0) die("loan", r);
            memcpy(d, buf, 64);
            if ((r = colo_send(b, 64)) < 0) die("send", r);
            if ((r = colo_recv_message(c.c, &m, NULL, NULL)) != 1) die("recv_message", r);
            colo_msg_release(m);
        } else {
            c_write_all(&c, buf, 64);
            c_read_exact(&c, buf, 64);
        }
        double t1 = now();
        if (t0 >= warm) t[n++] = t1 - t0;
    }
    hang_up(&c, pid);
    qsort(t, n, sizeof *t, cmp_d);
    struct lat l = {t[n / 2] * 1e6, t[n * 99 / 100] * 1e6};
    free(t);
    return l;
}

/* MB/s of 64 KiB writes into a sink, ended by a 1-byte marker and its answer. */
static double stream(enum kind k, int64_t spin) {
    char addr[108];
    pid_t pid = start_server(k, OP_SINK, spin, addr);
    struct conn c = dial(k, spin, addr);
    static char buf[1 << 16];
    memset(buf, 7, sizeof buf);
    for (int i = 0; i < 64; i++) c_write_all(&c, buf, sizeof buf); /* warm up */
    double t0 = now();
    long long bytes = 0;
    while (now() - t0 < secs) {
        for (int i = 0; i < 16; i++) c_write_all(&c, buf, sizeof buf);
        bytes += 16 * (long long)sizeof buf;
    }
    if (c.c) colo_shutdown(c.c, COLO_SHUT_WR);
    else shutdown(c.fd, SHUT_WR);
    char ack;
    c_read_exact(&c, &ack, 1);
    double dt = now() - t0;
    hang_up(&c, pid);
    return (double)bytes / dt / 1e6;
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    if (argc > 1) secs = atof(argv[1]);
    const char *only = argc > 2 ? argv[2] : NULL;
    struct {
        const char *name;
        enum kind k;
        int64_t spin;
    } cases[] = {
        {"tcp", K_TCP, 0},
        {"unix", K_UNIX, 0},
        {"colo", K_COLO, COLO_SPIN_DEFAULT},
        {"colo (spin never)", K_COLO, 0},
        {"colo (spin always)", K_COLO, COLO_SPIN_ALWAYS},
        {"colo msg", K_COLO_MSG, COLO_SPIN_DEFAULT},
    };
    int nc = sizeof cases / sizeof cases[0];
    if (only) {
        for (int i = 0; i < nc; i++)
            if (strcmp(cases[i].name, only) == 0) {
                /* As `colo bench` measures: three slices of a third each, the median slice. */
                double p[3];
                secs /= 3;
                for (int j = 0; j < 3; j++) p[j] = round_trip(cases[i].k, cases[i].spin).p50;
                qsort(p, 3, sizeof p[0], cmp_d);
                printf("%.3f\n", p[1]);
                return 0;
            }
        fprintf(stderr, "bench: no round-trip case \"%s\"\n", only);
        return 2;
    }
    printf("libcolo %s bench, %.1f s per case (C, through libcolo)\n\n", colo_version(), secs);
    printf("64 B round trip\n  %-22s %10s %10s %8s %8s\n", "transport", "p50 us", "p99 us", "x TCP", "x Unix");
    double tcp = 0, unx = 0;
    for (int i = 0; i < nc; i++) {
        struct lat l = round_trip(cases[i].k, cases[i].spin);
        if (i == 0) tcp = l.p50;
        if (i == 1) unx = l.p50;
        printf("  %-22s %10.2f %10.2f %7.2fx ", cases[i].name, l.p50, l.p99, tcp / l.p50);
        print_ratio(i == 0 ? 0 : unx / l.p50); /* the TCP row comes before Unix is measured */
        fflush(stdout);
    }
    printf("\n64 KiB writes, streaming\n  %-22s %10s %8s %8s\n", "transport", "MB/s", "x TCP", "x Unix");
    for (int i = 0; i < nc - 1; i++) {
        if (i == 3) continue; /* spin never: same as default for streaming */
        double mbs = stream(cases[i].k, cases[i].spin);
        if (i == 0) tcp = mbs;
        if (i == 1) unx = mbs;
        printf("  %-22s %10.0f %7.2fx ", cases[i].name, mbs, mbs / tcp);
        print_ratio(i == 0 ? 0 : mbs / unx);
        fflush(stdout);
    }
    printf("\nratios: how many times better than TCP loopback / Unix sockets in this run (latency: p50).\n");
    return 0;
}
