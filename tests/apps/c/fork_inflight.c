/* A thread of the parent is inside one long call on a connection never shared before (a
 * MSG_WAITALL read of 4 MB, or a blocking write of 16 MB) when the process forks; the child then
 * reads (or writes) the same end. Over TCP every byte is read once and every byte written
 * arrives. Under colo the call under way took no turn (the connection was not shared when it
 * began): the fork takes the turn on its behalf, and the child waits for it, rather than both
 * processes consuming (or producing) one ring at once. Checks, per round: reads: the parent's
 * call and the child's reads together got exactly the bytes sent; writes: the reader gets the
 * 16 MB plus the child's 1 MB, every 'Z' of it. Watchdogs: alarm() in both. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include "scenario.h"

#define BIG (4L << 20)
#define ROUNDS 8
static int k, c;
static unsigned char rbuf[BIG];
static ssize_t got_n;
static void *reader(void *a) { (void)a; got_n = recv(k, rbuf, BIG, MSG_WAITALL); return NULL; }

static int reads(void) {
    connected_pair(&k, &c, 0);
    pthread_t t;
    pthread_create(&t, NULL, reader, NULL);
    usleep(100000);
    int p[2];
    if (pipe(p) < 0) die("pipe");
    pid_t pid = fork();
    if (pid == 0) {
        alarm(20);
        static unsigned char b[1 << 16];
        ssize_t n;
        long total = 0;
        while ((n = read(k, b, sizeof b)) > 0) total += n;
        _exit(write(p[1], &total, sizeof total) == sizeof total ? 0 : 2);
    }
    close(p[1]);
    static unsigned char out[1 << 16];
    const long SEND = 2 * BIG;
    int reset = 0;
    for (long sent = 0; sent < SEND && !reset;) {
        ssize_t w = write(c, out, sizeof out);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            /* The parent's own connection broken under it (the ring found corrupt). */
            fprintf(stderr, "reads: the parent's write on c failed: %s\n", strerror(errno));
            reset = 1;
        } else {
            sent += w;
        }
    }
    shutdown(c, SHUT_WR);
    long child_total = 0;
    if (read(p[0], &child_total, sizeof child_total) != sizeof child_total) child_total = -1;
    pthread_join(t, NULL);
    waitpid(pid, NULL, 0);
    long total = (got_n > 0 ? got_n : 0) + child_total;
    if (total != SEND || got_n < 0) fprintf(stderr, "reads: parent's call %zd, child %ld: %ld of %ld sent\n", got_n, child_total, total, SEND);
    close(k); close(c); close(p[0]);
    return !reset && total == SEND;
}

#define WBIG (16L << 20)
#define ZS (1L << 20)
static ssize_t wrote_n;
static void *writer(void *a) {
    (void)a;
    static unsigned char b[WBIG];
    memset(b, 'w', WBIG);
    wrote_n = write(c, b, WBIG);
    return NULL;
}

static int writes(void) {
    connected_pair(&k, &c, 0);
    wrote_n = 0;
    pthread_t t;
    pthread_create(&t, NULL, writer, NULL);
    usleep(200000);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(20);
        static unsigned char z[ZS];
        memset(z, 'Z', sizeof z);
        _exit(write(c, z, sizeof z) == sizeof z ? 0 : 3);
    }
    static unsigned char b[1 << 16];
    long total = 0, zs = 0;
    int st = 0, child_done = 0, idle = 0;
    while (!(child_done && wrote_n != 0 && idle > 100)) {
        ssize_t n = recv(k, b, sizeof b, MSG_DONTWAIT);
        if (n > 0) {
            for (ssize_t i = 0; i < n; i++) zs += b[i] == 'Z';
            total += n;
            idle = 0;
            continue;
        }
        if (!child_done && waitpid(pid, &st, WNOHANG) == pid) child_done = 1;
        idle++;
        usleep(1000);
    }
    pthread_join(t, NULL);
    if (total != WBIG + ZS || zs != ZS)
        fprintf(stderr, "writes: parent's call %zd, child exit %d: read %ld of %ld, 'Z' %ld of %ld\n", wrote_n, WEXITSTATUS(st), total, WBIG + ZS, zs, ZS);
    close(k); close(c);
    return total == WBIG + ZS && zs == ZS;
}

int main(void) {
    alarm(25);
    int bad_r = 0, bad_w = 0;
    for (int r = 0; r < ROUNDS; r++) bad_r += !reads();
    for (int r = 0; r < ROUNDS; r++) bad_w += !writes();
    fprintf(stderr, "rounds with bytes read twice: %d of %d; with bytes written lost: %d of %d\n", bad_r, ROUNDS, bad_w, ROUNDS);
    CHECK(bad_r == 0, "reads: every byte read once, by the parent's call or the child");
    CHECK(bad_w == 0, "writes: every byte of both writers arrives");
    if (failures) return 1;
    printf("ok\n");
    return 0;
}
