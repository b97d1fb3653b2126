/* dprintf(3) and vdprintf(3) on an accelerated socket (run with the shim preloaded, as
 * tests/apps/run.sh does; also passes without it, with plain kernel semantics): C servers answer
 * with dprintf(fd, ...) (busybox's httpd proxy, inetd's daytime and fakeidentd write so), and
 * glibc writes what they format with its own internal calls. Every byte must reach the peer, in
 * order with the plain writes around it: lines with integer, string and floating-point
 * arguments (more than the registers hold, so some come on the stack), one of 100 KB (several
 * of glibc's buffers), vdprintf, dprintf and vdprintf called by address (the names, not
 * _FORTIFY_SOURCE's __dprintf_chk, which a direct call under -D_FORTIFY_SOURCE=2 is), each
 * returning its count; EPIPE once writing is shut down; no descriptor or memory kept per call; a pipe
 * (not the shim's) still gets its bytes. A thread reads the other end. alarm() is the
 * watchdog. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>

#include "scenario.h"

#define BIG 100000
static char got[4 * BIG];
static size_t got_len;

static void *reader(void *fd) {
    ssize_t n;
    while (got_len < sizeof got && (n = read(*(int *)fd, got + got_len, sizeof got - got_len)) > 0) got_len += n;
    return NULL;
}

/* vdprintf, or (`by_address`) the function named vdprintf, whatever _FORTIFY_SOURCE makes of the
 * direct call. */
static int my_vdprintf(int by_address, int fd, const char *fmt, ...) {
    int (*volatile vdp)(int, const char *, va_list) = vdprintf;
    va_list ap;
    va_start(ap, fmt);
    int r = by_address ? vdp(fd, fmt, ap) : vdprintf(fd, fmt, ap);
    va_end(ap);
    return r;
}

static long rss_kb(void) {
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f && fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    if (f) fclose(f);
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

int main(void) {
    alarm(30);
    signal(SIGPIPE, SIG_IGN);
    int k, s;
    connected_pair(&k, &s, 0);
    if (shimmed()) CHECK(segments() == 2, "the connection accelerated (both ends)");
    pthread_t t;
    pthread_create(&t, NULL, reader, &k);

    /* The bytes the peer must read, in order, built alongside. */
    static char want[4 * BIG];
    size_t want_len = 0;
#define WANT(...) (want_len += snprintf(want + want_len, sizeof want - want_len, __VA_ARGS__))
    int (*volatile dp)(int, const char *, ...) = dprintf;

    CHECK(write(s, "A", 1) == 1, "write before");
    WANT("A");
    int r = dprintf(s, "hello %d %s\n", 42, "world");
    CHECK(r == 15, "dprintf returns its count");
    WANT("hello %d %s\n", 42, "world");
    CHECK(write(s, "Z", 1) == 1, "write after");
    WANT("Z");
    r = dprintf(s, "%d %d %d %d %d %d %d %d %s|", 1, 2, 3, 4, 5, 6, 7, 8, "stack");
    CHECK(r > 0, "dprintf with arguments past the registers");
    WANT("%d %d %d %d %d %d %d %d %s|", 1, 2, 3, 4, 5, 6, 7, 8, "stack");
    r = dp(s, "%.1f %.1f %.1f %.1f %.1f %.1f %.1f %.1f %.1f %.1f %ld|", 0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5,
           9.5, 123456789012L);
    CHECK(r > 0, "dprintf (by address) with floating-point arguments past the registers");
    WANT("%.1f %.1f %.1f %.1f %.1f %.1f %.1f %.1f %.1f %.1f %ld|", 0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5, 9.5,
         123456789012L);
    static char big[BIG + 1];
    for (int i = 0; i < BIG; i++) big[i] = 'a' + i % 26;
    r = dprintf(s, "<%s>", big);
    CHECK(r == BIG + 2, "dprintf of 100 KB returns its count");
    WANT("<%s>", big);
    r = my_vdprintf(0, s, "v%dv%s\n", 7, "dprintf");
    CHECK(r == 11, "vdprintf returns its count");
    WANT("v%dv%s\n", 7, "dprintf");
    r = my_vdprintf(1, s, "%s %.2f %d|", "by address", 2.25, -3);
    CHECK(r == 19, "vdprintf (by address) returns its count");
    WANT("%s %.2f %d|", "by address", 2.25, -3);

    /* Many calls: no descriptor, no memory kept per call (counted once the reader has caught up
     * and waited: a thread's first wait may open what it waits with). */
    usleep(200000);
    int fds_before = descriptors_open();
    long rss_before = rss_kb();
    for (int i = 0; i < 20000; i++) {
        if (dprintf(s, "%05d", i) != 5) {
            CHECK(0, "20000 short dprintf calls");
            break;
        }
        WANT("%05d", i);
    }
    usleep(200000);
    CHECK(descriptors_open() == fds_before, "no descriptor kept by 20000 dprintf calls");
    CHECK(rss_kb() - rss_before < 2048, "no memory kept by 20000 dprintf calls");

    /* A pipe, which the shim does not serve. */
    int pp[2];
    if (pipe(pp) < 0) die("pipe");
    char pb[32] = {0};
    CHECK(dprintf(pp[1], "pipe %d", 5) == 6 && read(pp[0], pb, sizeof pb) == 6 && strcmp(pb, "pipe 5") == 0,
          "dprintf to a pipe");
    close(pp[0]);
    close(pp[1]);

    CHECK(shutdown(s, SHUT_WR) == 0, "shutdown");
    pthread_join(t, NULL);
    CHECK(got_len == want_len, "the peer read as many bytes as were written");
    CHECK(got_len == want_len && memcmp(got, want, want_len) == 0, "the peer read every byte, in order");
    if (got_len != want_len || memcmp(got, want, want_len) != 0)
        fprintf(stderr, "read %zu of %zu bytes: %.40s...\n", got_len, want_len, got);

    /* Writing shut down: EPIPE, as over TCP. */
    r = dprintf(s, "late %d", 1);
    CHECK(r < 0 && errno == EPIPE, "dprintf after shutdown(SHUT_WR): EPIPE");
    close(k);
    close(s);

    if (failures == 0)
        printf("ok: dprintf, vdprintf and 100 KB through dprintf, every byte in order%s\n",
               shimmed() ? " (accelerated)" : "");
    return failures != 0;
}
