/* Two exec'd programs read one connection side by side as their standard input (each relayed),
 * one fast, one slow, while the peer sends 8 MiB and shuts down writing. Over TCP each byte goes
 * to one of them: their counts add up to 8 MiB exactly. Under colo, relays that took a byte off
 * the ring only after handing it on both handed on the bytes the other had peeked (the counts
 * added up to 9.7 to 10.8 MiB). alarm() is the watchdog. */
#define _GNU_SOURCE
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include "scenario.h"

#define TOTAL (8 << 20)

/* The exec'd program: counts its standard input to end of stream into its slot of the shared
 * counts (a memfd on descriptor 3). */
static int reader(int slow) {
    static char b[65536];
    long t = 0;
    ssize_t n;
    while ((n = read(0, b, sizeof b)) != 0) {
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return 2;
        t += n;
        if (slow) usleep(200);
    }
    long *counts = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, 3, 0);
    if (counts == MAP_FAILED) return 3;
    counts[slow] = t;
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "reader") == 0) return reader(atoi(argv[2]));
    if (shimmed() && !getenv("COLO_SHORT_LIVED")) {
        setenv("COLO_SHORT_LIVED", "accelerate", 1);
        execv("/proc/self/exe", argv);
        die("execv");
    }
    signal(SIGPIPE, SIG_IGN);
    alarm(60);
    for (int round = 0; round < 2; round++) {
        int k, s;
        connected_pair(&k, &s, 0);
        char q;
        /* In use before the fork (under the shim: accelerated at both ends). */
        CHECK(write(k, "q", 1) == 1 && read(s, &q, 1) == 1, "the first byte");
        int mfd = memfd_create("counts", 0);
        if (mfd < 0 || ftruncate(mfd, 4096) < 0) die("memfd");
        long *counts = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
        if (counts == MAP_FAILED) die("mmap");
        pid_t r[2];
        for (int i = 0; i < 2; i++) {
            r[i] = fork();
            if (r[i] < 0) die("fork");
            if (r[i] == 0) {
                close(k);
                dup2(s, 0);
                dup2(mfd, 3);
                close(s);
                execl("/proc/self/exe", "stdio_side_by_side", "reader", i ? "1" : "0", (char *)NULL);
                _exit(127);
            }
        }
        close(s);
        close(mfd);
        static char b[TOTAL];
        memset(b, 'x', sizeof b);
        write_all(k, b, sizeof b);
        shutdown(k, SHUT_WR);
        int ok = 1;
        for (int i = 0; i < 2; i++) {
            int st;
            waitpid(r[i], &st, 0);
            ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
        }
        CHECK(ok, "the readers read to end of stream");
        if (counts[0] + counts[1] != TOTAL) fprintf(stderr, "round %d: %ld + %ld bytes read, %d sent\n", round, counts[0], counts[1], TOTAL);
        CHECK(counts[0] + counts[1] == TOTAL, "each byte went to one reader");
        close(k);
    }
    if (failures) return 1;
    printf("ok\n");
    return 0;
}
