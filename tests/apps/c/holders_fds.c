/* Descriptors per connection (issue 23): inheritable connections (sockets without
 * SOCK_CLOEXEC, as hiredis, nginx, memcached and postgres make them) cost the application's
 * socket and the shim's five at most, one (the segment memfd, kept for the handover across exec)
 * more than close-on-exec ones: the holders pages of all of a process's connections live in one
 * memfd of the process (colo-holders), not one per connection.
 * Then a forked child execs itself with the inheritable connections: each still carries bytes
 * both ways, and the child holds one colo-holders descriptor at most too. Run with the shim
 * preloaded, as tests/apps/run.sh does; also passes without it. alarm() is the watchdog. */
#define _GNU_SOURCE
#include "scenario.h"
#include <sys/wait.h>

#define N 20

/* Descriptors of this process: all of them, and those whose link names `what`. */
static int descriptors(const char *what) {
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    char path[300], link[256];
    int found = 0;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, link, sizeof link - 1);
        if (n > 0) {
            link[n] = 0;
            if (!what || strstr(link, what)) found++;
        }
    }
    if (d) closedir(d);
    return found - (what ? 0 : 1); /* the directory's own descriptor */
}

/* The exec'd child: echoes one byte on each inherited connection (fds given on the command line). */
static int child(int argc, char **argv) {
    for (int i = 2; i < argc; i++) {
        int s = atoi(argv[i]);
        char b;
        if (read_full(s, &b, 1) < 0) return 2;
        b++;
        write_all(s, &b, 1);
    }
    if (shimmed() && descriptors("colo-holders") > 1) {
        fprintf(stderr, "FAIL the exec'd child holds %d colo-holders descriptors\n", descriptors("colo-holders"));
        return 3;
    }
    return 0;
}

int main(int argc, char **argv) {
    alarm(30);
    if (argc > 1 && !strcmp(argv[1], "child")) return child(argc, argv);
    struct sockaddr_in a;
    int l = loopback_listener(&a, N);
    /* Nothing is closed before the end: connections that end soon after they are made would
     * make the shim take the program's next ones for short-lived (plain TCP). */
    int c[N], s[N], cloexec_more = 0;
    for (int k = 0; k < 2; k++) {
        int flags = k == 0 ? SOCK_CLOEXEC : 0;
        /* One connection first: the shim's descriptors of the process (its holders file) come
         * with the first. */
        int c0 = socket(AF_INET, SOCK_STREAM | flags, 0);
        if (connect(c0, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
        int s0 = accept4(l, NULL, NULL, flags);
        if (s0 < 0) die("accept");
        int before = descriptors(NULL);
        for (int i = 0; i < N; i++) {
            c[i] = socket(AF_INET, SOCK_STREAM | flags, 0);
            if (connect(c[i], (struct sockaddr *)&a, sizeof a) < 0) die("connect");
            s[i] = accept4(l, NULL, NULL, flags);
            if (s[i] < 0) die("accept");
        }
        int more = descriptors(NULL) - before;
        fprintf(stderr, "%s connections: %d descriptors more for %d ends\n", k == 0 ? "close-on-exec" : "inheritable", more, 2 * N);
        CHECK(more <= 2 * N * (shimmed() ? 4 : 1), "descriptors per connection end: the socket and the shim's three at most");
        CHECK(descriptors("colo-holders") <= 1, "one colo-holders descriptor per process at most");
        if (k == 0) {
            cloexec_more = more;
            continue;
        }
        /* The segment memfd is all an inheritable end holds beyond a close-on-exec one (which
         * closes it once mapped): no descriptor per connection for its holders page. */
        CHECK(more <= cloexec_more + (shimmed() ? 2 * N : 0), "inheritable connections cost the segment memfd more than close-on-exec ones, nothing else");
        /* A fork child execs with the inheritable servers' ends. */
        char *args[N + 3], nums[N][12];
        args[0] = argv[0];
        args[1] = "child";
        for (int i = 0; i < N; i++) {
            snprintf(nums[i], sizeof nums[i], "%d", s[i]);
            args[i + 2] = nums[i];
        }
        args[N + 2] = NULL;
        pid_t p = fork();
        if (p == 0) {
            execv("/proc/self/exe", args);
            _exit(127);
        }
        for (int i = 0; i < N; i++) {
            char b = (char)('a' + i);
            write_all(c[i], &b, 1);
            CHECK(read_full(c[i], &b, 1) == 0 && b == (char)('a' + i + 1), "the exec'd child's answer");
        }
        int st;
        waitpid(p, &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the exec'd child exited 0");
    }
    if (failures) return 1;
    printf("holders_fds: ok\n");
    return 0;
}
