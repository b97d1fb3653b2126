/* dup2 onto a number the shim keeps one of its own descriptors at: with a fixed limit of open
 * files (soft equal to hard from the start) the shim keeps a connection's control socket and
 * self bell below the limit, from 1024 up, where the program may dup2 onto any number. The
 * program gets what the kernel gives: each such number becomes its copy of a pipe, and stays
 * so after the connection closes; the connection keeps carrying bytes both ways, and a read and
 * an epoll_wait asleep on it are woken by the peer's later write, also in a set that holds two
 * numbers of it (the shim's copies of its descriptors stand for the second); and a thread asleep
 * in a read on a connection whose numbers the program takes gets the peer's bytes. The program re-executes
 * itself once with its hard limit lowered to its soft one, so that the shim starts under a
 * fixed limit. alarm() is the watchdog. */
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include "scenario.h"

#define MAXN 64

/* The numbers from 1024 up open on a socket or an eventfd. */
static int high_numbers(int *out) {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d) die("opendir");
    struct dirent *de;
    while ((de = readdir(d)) && n < MAXN) {
        int fd = atoi(de->d_name);
        char p[64], t[128];
        snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
        ssize_t l = readlink(p, t, sizeof t - 1);
        if (fd < 1024 || fd == dirfd(d) || l <= 0) continue;
        t[l] = 0;
        if (!strncmp(t, "socket:", 7) || strstr(t, "eventfd")) out[n++] = fd;
    }
    closedir(d);
    return n;
}

/* dup2s the write end of the pipe `pp` onto each number of `after` not in `before`, checking
 * each is the pipe then; returns how many. */
static int take_new(const int *before, int nb, const int *after, int na, const int *pp) {
    int taken = 0;
    for (int i = 0; i < na; i++) {
        int old = 0;
        for (int j = 0; j < nb; j++) old |= before[j] == after[i];
        if (old) continue;
        taken++;
        CHECK(dup2(pp[1], after[i]) == after[i], "dup2 onto the number returns it");
        CHECK(write(after[i], "z", 1) == 1, "the number writes to the pipe");
        char z;
        CHECK(read(pp[0], &z, 1) == 1 && z == 'z', "what it wrote comes out of the pipe");
    }
    return taken;
}

/* After the connections closed: each number `take_new` took is still the program's pipe, and
 * (if `clean`) the pipe holds nothing the program did not write (`pp[0]` non-blocking). */
static void still_taken(const int *before, int nb, const int *after, int na, const int *pp, int clean) {
    char junk[64];
    ssize_t stray = read(pp[0], junk, sizeof junk);
    CHECK(!clean || (stray < 0 && errno == EAGAIN), "nothing but the program's writes in its pipe");
    for (int i = 0; i < na; i++) {
        int old = 0;
        for (int j = 0; j < nb; j++) old |= before[j] == after[i];
        if (old) continue;
        char z = 0;
        CHECK(write(after[i], "y", 1) == 1 && read(pp[0], &z, 1) == 1 && z == 'y', "the number is still the program's pipe after the connection closed");
    }
}

static int rc, rgot;
static char rbuf[8];
static void *reader(void *arg) {
    (void)arg;
    rgot = read(rc, rbuf, 4);
    return NULL;
}

/* The peer writes `what` after a pause, from a child, while this process sleeps on `c`. */
static void later(int k, const char *what) {
    pid_t p = fork();
    if (p < 0) die("fork");
    if (p == 0) {
        usleep(100000);
        _exit(write(k, what, strlen(what)) == (ssize_t)strlen(what) ? 0 : 1);
    }
}

int main(int argc, char **argv) {
    alarm(30);
    setvbuf(stdout, NULL, _IONBF, 0);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) die("getrlimit");
    if (argc < 2) {
        rl.rlim_cur = rl.rlim_cur < 4096 ? 4096 : rl.rlim_cur;
        if (rl.rlim_max != RLIM_INFINITY && rl.rlim_cur > rl.rlim_max) rl.rlim_cur = rl.rlim_max;
        rl.rlim_max = rl.rlim_cur;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) die("setrlimit");
        execl("/proc/self/exe", argv[0], "fixed", (char *)NULL);
        die("exec");
    }
    int before[MAXN], after[MAXN], nb = 0, na;
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    nb = high_numbers(before);
    int k = socket(AF_INET, SOCK_STREAM, 0);
    if (k < 0 || connect(k, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    int c = accept(l, NULL, NULL);
    if (c < 0) die("accept");
    /* Sleep once on each end, so that any descriptor a sleep takes is open too. */
    later(c, "w");
    char w;
    if (read(k, &w, 1) != 1) die("first read");
    later(k, "w");
    if (read(c, &w, 1) != 1) die("first read");
    while (wait(NULL) > 0) {}
    /* Two numbers of the connection in one epoll set: the shim's copies of its descriptors stand
     * for the second. */
    int cd = dup(c), ep0 = epoll_create1(0);
    struct epoll_event e0 = {.events = EPOLLIN, .data.u64 = 1}, e1 = {.events = EPOLLIN, .data.u64 = 2};
    if (cd < 0 || epoll_ctl(ep0, EPOLL_CTL_ADD, c, &e0) != 0 || epoll_ctl(ep0, EPOLL_CTL_ADD, cd, &e1) != 0) die("epoll set");
    /* A sleep on the set: any descriptor it takes is open too. */
    later(k, "s");
    if (epoll_wait(ep0, &e0, 1, 5000) != 1 || read(c, &w, 1) != 1) die("first epoll_wait");
    while (wait(NULL) > 0) {}
    na = high_numbers(after);
    int pp[2];
    if (pipe(pp) != 0 || fcntl(pp[0], F_SETFL, O_NONBLOCK) != 0) die("pipe");
    int taken = take_new(before, nb, after, na, pp);
    printf("numbers from 1024 up taken with dup2: %d\n", taken);
    CHECK(!shimmed() || taken > 0, "the shim's descriptors were found (fixed limit)");
    for (int round = 0; round < 100; round++) {
        char r[4] = {0};
        CHECK(write(k, "abc", 3) == 3, "send");
        struct pollfd pf = {.fd = c, .events = POLLIN};
        CHECK(poll(&pf, 1, 5000) == 1, "poll reports the bytes");
        CHECK(read(c, r, 3) == 3 && !memcmp(r, "abc", 3), "the bytes arrive");
        CHECK(write(c, r, 3) == 3 && read(k, r, 3) == 3 && !memcmp(r, "abc", 3), "and go back");
    }
    char lb[8] = {0};
    later(k, "late");
    CHECK(read(c, lb, 4) == 4 && !memcmp(lb, "late", 4), "a read asleep on the connection is woken");
    int ep = epoll_create1(0);
    struct epoll_event e = {.events = EPOLLIN, .data.u64 = 9};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, c, &e) == 0, "epoll_ctl");
    later(k, "ep");
    CHECK(epoll_wait(ep, &e, 1, 5000) == 1 && e.data.u64 == 9, "an epoll_wait asleep on it is woken");
    CHECK(read(c, lb, 2) == 2 && !memcmp(lb, "ep", 2), "the bytes it reported");
    later(k, "2x");
    struct epoll_event two[4];
    int got = 0, n;
    while (got != 3 && (n = epoll_wait(ep0, two, 4, 5000)) > 0)
        for (int i = 0; i < n; i++) got |= (int)two[i].data.u64;
    CHECK(got == 3, "the set with both numbers reports both");
    CHECK(read(c, lb, 2) == 2 && !memcmp(lb, "2x", 2), "the bytes it reported");
    while (wait(NULL) > 0) {}
    close(ep0);
    close(cd);
    close(ep);
    close(c);
    close(k);
    close(l);
    still_taken(before, nb, after, na, pp, 1);

    /* A thread asleep in a read on another connection while the program takes that
     * connection's numbers: the read gets the peer's bytes, and the shim's close of what it held
     * there, once that read returns, closes none of the program's files. */
    l = loopback_listener(&a, 4);
    nb = high_numbers(before);
    k = socket(AF_INET, SOCK_STREAM, 0);
    if (k < 0 || connect(k, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    if ((rc = accept(l, NULL, NULL)) < 0) die("accept");
    pthread_t t;
    if (pthread_create(&t, NULL, reader, NULL) != 0) die("pthread_create");
    usleep(100000); /* the reader is asleep by now, most likely; the checks hold either way */
    na = high_numbers(after);
    taken = take_new(before, nb, after, na, pp);
    printf("numbers taken under a sleeping read: %d\n", taken);
    CHECK(write(k, "abcd", 4) == 4, "the peer sends");
    pthread_join(t, NULL);
    CHECK(rgot == 4 && !memcmp(rbuf, "abcd", 4), "the sleeping read gets the bytes");
    close(rc);
    close(k);
    close(l);
    usleep(100000); /* the relay's end of the connection goes too */
    /* (The sleeping thread's wake-up eventfd, if the program took its number, may be rung once
     * more: docs/LIMITS.md, "Descriptors per connection".) */
    still_taken(before, nb, after, na, pp, 0);
    printf("%s\n", failures ? "FAILED" : "ok");
    return failures != 0;
}
