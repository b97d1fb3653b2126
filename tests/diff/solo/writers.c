/* Two processes writing to one connection at the same moment: over TCP each call's bytes stay
 * contiguous (a call below the socket's buffer is queued whole under the socket's lock),
 * whichever program holds the socket. The reader checks every record: a header (writer, length)
 * and that many bytes of the writer's own. In exec_writer, writer B is this program exec'd again
 * ("writer FD"), so its copy of the connection crossed an exec. */
#include "../diff.h"

#define RECORDS 20000

static void write_records(int fd, char id, unsigned seed) {
    unsigned char rec[520];
    for (int i = 0; i < RECORDS; i++) {
        seed = seed * 1103515245 + 12345;
        unsigned len = 1 + (seed >> 16) % 512;
        rec[0] = id;
        rec[1] = len & 0xff;
        rec[2] = len >> 8;
        memset(rec + 3, id, len);
        if (write(fd, rec, len + 3) != (ssize_t)(len + 3)) die("write");
    }
}

static int read_full(int fd, unsigned char *b, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, b + got, n - got);
        if (r <= 0) return got == 0 ? 0 : -1;
        got += r;
    }
    return 1;
}

static void writers(int exec_b) {
    int s, c;
    pair(&s, &c);
    pid_t a = fork();
    if (a == 0) {
        close(s);
        write_records(c, 'A', 1);
        _exit(0);
    }
    pid_t b = fork();
    if (b == 0) {
        close(s);
        if (!exec_b) {
            write_records(c, 'B', 2);
            _exit(0);
        }
        char fd[16];
        snprintf(fd, sizeof fd, "%d", c);
        execl("/proc/self/exe", "writers", "writer", fd, (char *)NULL);
        _exit(127);
    }
    close(c);
    unsigned char h[3], body[520];
    int counts[2] = {0, 0}, bad = 0, r;
    while ((r = read_full(s, h, 3)) == 1) {
        unsigned len = h[1] | h[2] << 8;
        if ((h[0] != 'A' && h[0] != 'B') || len == 0 || len > 512 || read_full(s, body, len) != 1) {
            bad = 1;
            break;
        }
        for (unsigned i = 0; i < len; i++)
            if (body[i] != h[0]) bad = 1;
        if (bad) break;
        counts[h[0] - 'A']++;
    }
    waitpid(a, NULL, 0);
    int st;
    waitpid(b, &st, 0);
    say("  records intact: %s", bad ? "no" : "yes");
    say("  records of A %d, of B %d", counts[0], counts[1]);
    if (exec_b) say("  the exec'd writer exits %d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

static void two_writers(void) { writers(0); }
static void exec_writer(void) { writers(1); }

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "writer") == 0) {
        write_records(atoi(argv[2]), 'B', 2);
        return 0;
    }
    diff_begin();
    RUN(two_writers);
    RUN(exec_writer);
    diff_end();
    return 0;
}
