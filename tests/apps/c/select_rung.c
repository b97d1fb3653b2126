/* select() over many connections whose doorbells were rung and whose bytes were read since, as
 * httperf's loop leaves them: each select must still report every connection writable and none
 * readable, and a peer's close readable (end of stream). `select_rung count N` makes N selects
 * with a zero timeout over the 64 connections (run.sh counts their ppoll system calls: the look
 * at a rung connection's control socket is the look the kernel's poll made, not one more call a
 * connection). A forked peer accepts the 64 connections and reads a byte from each, writes a byte
 * to each while the client sleeps in select, and closes them all when told. alarm() is the watchdog. Runs with and without
 * the shim. */
#include <sys/select.h>
#include <sys/wait.h>

#include "scenario.h"

#define CONNS 64

static void peer(int said, int go) {
    struct sockaddr_in a;
    int l = loopback_listener(&a, CONNS);
    write_all(said, &a, sizeof a);
    int c[CONNS];
    char b;
    for (int i = 0; i < CONNS; i++) {
        if ((c[i] = accept(l, NULL, NULL)) < 0) die("accept");
        if (read(c[i], &b, 1) != 1) die("the client's first byte");
    }
    /* The client is about to sleep in select: it is asleep by the time the bytes come (or they
     * wait for it: the outcome is the same). */
    if (read(go, &b, 1) != 1) die("the client's word");
    usleep(100 * 1000);
    for (int i = 0; i < CONNS; i++)
        if (write(c[i], "x", 1) != 1) die("peer write");
    if (read(go, &b, 1) != 1) die("the client's word");
    for (int i = 0; i < CONNS; i++) close(c[i]);
    exit(0);
}

static void sets(fd_set *r, fd_set *w, const int *s, int *max) {
    FD_ZERO(r);
    FD_ZERO(w);
    *max = 0;
    for (int i = 0; i < CONNS; i++) {
        FD_SET(s[i], r);
        FD_SET(s[i], w);
        if (s[i] > *max) *max = s[i];
    }
}

/* The connections of `s` still open (numbers >= 0) in `r`; returns the highest. */
static int read_set(fd_set *r, const int *s) {
    int max = 0;
    FD_ZERO(r);
    for (int i = 0; i < CONNS; i++) {
        if (s[i] < 0) continue;
        FD_SET(s[i], r);
        if (s[i] > max) max = s[i];
    }
    return max;
}

int main(int argc, char **argv) {
    alarm(30);
    long rounds = argc == 3 && strcmp(argv[1], "count") == 0 ? atol(argv[2]) : 200;
    int said[2], go[2];
    if (pipe(said) < 0 || pipe(go) < 0) die("pipe");
    pid_t pid = fork();
    if (pid == 0) peer(said[1], go[0]);
    struct sockaddr_in a;
    if (read_full(said[0], &a, sizeof a) < 0) die("the peer's address");
    int s[CONNS];
    for (int i = 0; i < CONNS; i++) {
        s[i] = socket(AF_INET, SOCK_STREAM, 0);
        if (s[i] < 0 || connect(s[i], (struct sockaddr *)&a, sizeof a) < 0) die("connect");
        if (write(s[i], "c", 1) != 1) die("write");
    }
    if (write(go[1], "s", 1) != 1) die("tell the peer");
    fd_set r, w;
    int max;
    /* Asleep until the first byte comes: every connection announced, so each byte rings. */
    int got = 0;
    while (got < CONNS) {
        max = read_set(&r, s);
        int n = select(max + 1, &r, NULL, NULL, &(struct timeval){.tv_sec = 10});
        CHECK(n > 0, "select reports the peer's bytes");
        if (n <= 0) break;
        for (int i = 0; i < CONNS; i++) {
            char b;
            if (s[i] >= 0 && FD_ISSET(s[i], &r)) {
                CHECK(read(s[i], &b, 1) == 1 && b == 'x', "the byte is read");
                got++;
                /* Kept aside while the others are waited for. */
                s[i] = -s[i] - 1;
            }
        }
    }
    for (int i = 0; i < CONNS; i++) s[i] = s[i] < 0 ? -s[i] - 1 : s[i];
    int bad = 0;
    for (long k = 0; k < rounds; k++) {
        sets(&r, &w, s, &max);
        int n = select(max + 1, &r, &w, NULL, &(struct timeval){0});
        int writable = 0, readable = 0;
        for (int i = 0; i < CONNS; i++) {
            writable += FD_ISSET(s[i], &w) != 0;
            readable += FD_ISSET(s[i], &r) != 0;
        }
        if (n != CONNS || writable != CONNS || readable != 0) bad++;
    }
    CHECK(bad == 0, "every select: all 64 writable, none readable");
    if (write(go[1], "g", 1) != 1) die("tell the peer");
    int st;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the peer exited 0");
    /* The peer closed every connection: each is readable, and reads end of stream. */
    int ended = 0;
    for (int tries = 0; tries < 100 && ended < CONNS; tries++) {
        max = read_set(&r, s);
        int n = select(max + 1, &r, NULL, NULL, &(struct timeval){.tv_sec = 5});
        if (n <= 0) break;
        for (int i = 0; i < CONNS; i++) {
            char b;
            if (s[i] >= 0 && FD_ISSET(s[i], &r)) {
                CHECK(read(s[i], &b, 1) == 0, "the peer's close reads as end of stream");
                close(s[i]);
                s[i] = -1;
                ended++;
            }
        }
    }
    CHECK(ended == CONNS, "every close seen through select");
    if (failures) fprintf(stderr, "select_rung: %d failures\n", failures);
    return failures ? 1 : 0;
}
