/* A server that sets both limits of open files to its connection limit, as memcached does with
 * its -c: every connection must still be accelerated (the shim's descriptors need numbers of
 * their own), while the program sees exactly the limits it set and the kernel still enforces
 * its soft limit on the program's own descriptors. A forked client holds all its connections
 * open at once and counts its segments. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include "scenario.h"

#define LIMIT 64
#define CONNS 40

static void client(struct sockaddr_in *a) {
    int c[CONNS], bad = 0;
    for (int i = 0; i < CONNS; i++) {
        c[i] = socket(AF_INET, SOCK_STREAM, 0);
        if (c[i] < 0 || connect(c[i], (struct sockaddr *)a, sizeof *a) < 0) die("client connect");
    }
    for (int i = 0; i < CONNS; i++) {
        char b;
        if (read(c[i], &b, 1) != 1 || b != 'k') die("client read");
        write_all(c[i], "x", 1);
    }
    int segs = segments();
    if (shimmed() && segs < CONNS) {
        fprintf(stderr, "FAIL client: %d of %d connections accelerated (segments open)\n", segs, CONNS);
        bad = 1;
    }
    for (int i = 0; i < CONNS; i++) close(c[i]);
    exit(bad);
}

int main(void) {
    alarm(30);
    struct rlimit set = {LIMIT, LIMIT}, got;
    if (setrlimit(RLIMIT_NOFILE, &set) < 0) die("setrlimit");
    CHECK(getrlimit(RLIMIT_NOFILE, &got) == 0 && got.rlim_cur == LIMIT && got.rlim_max == LIMIT, "getrlimit reports the limits set");
    CHECK(prlimit(0, RLIMIT_NOFILE, NULL, &got) == 0 && got.rlim_cur == LIMIT && got.rlim_max == LIMIT, "prlimit reports the limits set");
    struct rlimit above = {LIMIT + 1, LIMIT};
    errno = 0;
    CHECK(setrlimit(RLIMIT_NOFILE, &above) < 0 && errno == EINVAL, "a soft limit above the hard one: EINVAL");
    if (getuid() == 0) {
        /* Without CAP_SYS_RESOURCE, no hard limit above the one set, though the process keeps a
         * higher one for the shim. */
        pid_t u = fork();
        if (u == 0) {
            if (setgid(65534) < 0 || setuid(65534) < 0) _exit(2);
            struct rlimit raise = {LIMIT, LIMIT + 1};
            errno = 0;
            _exit(setrlimit(RLIMIT_NOFILE, &raise) < 0 && errno == EPERM ? 0 : 1);
        }
        int st;
        CHECK(u > 0 && waitpid(u, &st, 0) == u && WIFEXITED(st) && WEXITSTATUS(st) == 0, "an unprivileged raise of the hard limit: EPERM");
    }

    /* The soft limit still binds the program's own descriptors: opens fail with EMFILE below it. */
    int fds[LIMIT], n = 0, highest = -1;
    while (n < LIMIT) {
        int f = open("/dev/null", O_RDONLY);
        if (f < 0) break;
        if (f > highest) highest = f;
        fds[n++] = f;
    }
    CHECK(n < LIMIT && errno == EMFILE && highest < LIMIT, "the program's opens stop at its soft limit");
    while (n > 0) close(fds[--n]);

    struct sockaddr_in a;
    int l = loopback_listener(&a, CONNS);
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        /* Not a holder of the listener itself: a process that holds it may be the one that
         * would accept, so its dials wait only briefly for another's accept (the shim's
         * self-accept rule), and a loaded host can take longer than that to get the parent to
         * its first accept. */
        close(l);
        client(&a);
    }
    int c[CONNS];
    for (int i = 0; i < CONNS; i++) {
        c[i] = accept(l, NULL, NULL);
        if (c[i] < 0) die("accept");
        CHECK(c[i] < LIMIT, "an accepted connection within the program's limit");
        write_all(c[i], "k", 1);
    }
    for (int i = 0; i < CONNS; i++) {
        char b;
        CHECK(read(c[i], &b, 1) == 1 && b == 'x', "a byte from each connection");
    }
    if (shimmed()) {
        int segs = segments();
        if (segs < CONNS) fprintf(stderr, "server: %d of %d connections accelerated\n", segs, CONNS);
        CHECK(segs >= CONNS, "every accepted connection accelerated");
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0, "the client saw every connection accelerated");
    for (int i = 0; i < CONNS; i++) close(c[i]);
    close(l);
    if (failures) return 1;
    printf("nofile_lowered: ok\n");
    return 0;
}
