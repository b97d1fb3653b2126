/* The holders pages (slots of the holders file) of connections whose every holder died without
 * closing come back (issue 23: memory per connection). A forking server: each accepted connection goes to a child, the parent
 * closes its copy, and the child exits without closing its own (the kernel closes it), ROUNDS
 * times. Under the shim each connection's holders page is a slot of the process's holders file
 * (colo-holders); the slots of those dead children must be taken back (every 1,024 allocations),
 * and their memory given back to the kernel: the file's slots in use (its bitmap, at its start)
 * and the memory pages it holds stay far below one a round. Run with the shim preloaded, as tests/apps/run.sh does;
 * also passes without it (no file to look at). alarm() is the watchdog. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "scenario.h"

#define ROUNDS 1600

/* The descriptor of this process's holders file, or -1. */
static int holders_file(void) {
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    char path[300], link[256];
    int fd = -1;
    while (d && (e = readdir(d))) {
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, link, sizeof link - 1);
        if (n > 0) {
            link[n] = 0;
            if (strstr(link, "colo-holders")) fd = atoi(e->d_name);
        }
    }
    if (d) closedir(d);
    return fd;
}

int main(int argc, char **argv) {
    (void)argc;
    /* Every connection accelerated: a run of short connections would otherwise go plain TCP. */
    if (shimmed() && !getenv("COLO_SHORT_LIVED")) {
        setenv("COLO_SHORT_LIVED", "accelerate", 1);
        execv("/proc/self/exe", argv);
        die("execv");
    }
    alarm(120);
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    for (int round = 0; round < ROUNDS; round++) {
        int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
        int s = accept4(l, NULL, NULL, SOCK_CLOEXEC);
        if (s < 0) die("accept");
        char b = 'x';
        write_all(c, &b, 1);
        if (read_full(s, &b, 1) < 0) die("read");
        int go[2];
        if (pipe(go) < 0) die("pipe");
        pid_t p = fork();
        if (p < 0) die("fork");
        if (p == 0) {
            /* Holds the connection until the parent closed its copy, then exits with it open. */
            close(go[1]);
            if (read(go[0], &b, 1) < 0) _exit(1);
            _exit(0);
        }
        close(go[0]);
        close(s);
        close(go[1]);
        int st;
        waitpid(p, &st, 0);
        close(c);
    }
    int fd = holders_file();
    if (shimmed()) {
        CHECK(fd >= 0, "the process has a holders file");
        unsigned char bitmap[4096];
        struct stat st;
        if (fd >= 0 && pread(fd, bitmap, sizeof bitmap, 0) == (ssize_t)sizeof bitmap && fstat(fd, &st) == 0) {
            int used = 0;
            for (size_t i = 0; i < sizeof bitmap; i++) used += __builtin_popcount(bitmap[i]);
            long held = (long)st.st_blocks * 512 / 4096;
            fprintf(stderr, "%d connections handed to children that exited with them: %d slots in use, %ld pages of memory\n",
                    ROUNDS, used, held);
            CHECK(used < ROUNDS / 2, "the slots of dead holders were taken back");
            CHECK(held <= used + 2, "memory pages without a slot in use hold no memory");
        } else {
            CHECK(0, "the holders file can be read");
        }
    }
    close(l);
    if (failures) return 1;
    printf("holders_reclaim: ok\n");
    return 0;
}
