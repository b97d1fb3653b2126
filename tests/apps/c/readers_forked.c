/* Two processes reading one connection at once (a fork child and its parent, both reading to
 * the end): over TCP each byte goes to one of them. The writer sends BYTES bytes whose values
 * count up; the readers' totals must add up to BYTES and the sums of their bytes to the sum of
 * what was sent (a byte read twice, or lost, shows in one or the other). alarm() is the
 * watchdog. */
#define _GNU_SOURCE
#include <sys/wait.h>

#include "scenario.h"

#define BYTES (4L << 20)

/* Reads `fd` to its end: how many bytes, and the sum of their values. */
static void drain(int fd, long *n, long *sum) {
    unsigned char b[4096];
    ssize_t r;
    *n = *sum = 0;
    while ((r = read(fd, b, sizeof b)) > 0) {
        *n += r;
        for (ssize_t i = 0; i < r; i++) *sum += b[i];
    }
}

int main(void) {
    alarm(25);
    int k, c;
    connected_pair(&k, &c, 0);
    write_all(c, "x", 1); /* the connection's first use, before the fork */
    char x;
    CHECK(read_full(k, &x, 1) == 0, "the connection carries a byte");
    int p[2];
    if (pipe(p) < 0) die("pipe");
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        close(c);
        long got[2];
        drain(k, &got[0], &got[1]);
        if (write(p[1], got, sizeof got) != sizeof got) _exit(2);
        _exit(0);
    }
    pid_t writer = fork();
    if (writer < 0) die("fork");
    if (writer == 0) {
        close(k);
        static unsigned char out[1 << 16];
        for (long off = 0; off < BYTES; off += sizeof out) {
            for (size_t i = 0; i < sizeof out; i++) out[i] = pattern(off + (long)i);
            write_all(c, out, sizeof out);
        }
        _exit(0);
    }
    close(c);
    long n, sum, got[2] = {-1, -1};
    drain(k, &n, &sum);
    int st;
    CHECK(waitpid(writer, &st, 0) == writer && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the writer exits 0");
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child reader exits 0");
    CHECK(read(p[0], got, sizeof got) == sizeof got, "the child reports what it read");
    long want = 0;
    for (long i = 0; i < BYTES; i++) want += pattern(i);
    CHECK(n + got[0] == BYTES, "every byte is read once: the two readers' counts add up");
    CHECK(sum + got[1] == want, "... and the sums of their bytes add up to what was sent");
    if (n + got[0] != BYTES) fprintf(stderr, "parent %ld + child %ld bytes, sent %ld\n", n, got[0], BYTES);
    if (failures) return 1;
    printf("readers_forked: ok\n");
    return 0;
}
