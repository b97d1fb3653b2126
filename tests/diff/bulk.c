/* Volume: sendfile and splice of 32 MB (bytes and counts), a blocking writev of 32 MB that
 * another thread makes non-blocking as it waits, and 200 short connections. */
#include "diff.h"
#include <pthread.h>
#include <sys/sendfile.h>

#define SIZE (32 << 20)

static unsigned sum_until_eof(int fd, long *total) {
    static unsigned char b[1 << 16];
    unsigned h = 2166136261u;
    ssize_t n;
    *total = 0;
    while ((n = read(fd, b, sizeof b)) > 0) {
        for (ssize_t i = 0; i < n; i++) h = (h ^ b[i]) * 16777619u; /* FNV-1a */
        *total += n;
    }
    return h;
}

static void sendfile_big(void) {
    int s, c;
    pair(&s, &c);
    char path[] = "/tmp/colo-diff-XXXXXX";
    int f = mkstemp(path);
    unlink(path);
    static unsigned char b[1 << 16];
    for (int i = 0; i < SIZE / (int)sizeof b; i++) {
        for (unsigned j = 0; j < sizeof b; j++) b[j] = (unsigned char)(i * 7 + j);
        if (write(f, b, sizeof b) != sizeof b) die("write file");
    }
    pid_t p = fork();
    if (p == 0) {
        close(s);
        off_t off = 0;
        long sent = 0;
        ssize_t n;
        int calls = 0;
        while (sent < SIZE && (n = sendfile(c, f, &off, SIZE - sent)) > 0) sent += n, calls++;
        /* A blocking socket takes the whole count in one call, however slow its reader. */
        _exit(sent != SIZE ? 1 : calls == 1 ? 0 : 2);
    }
    close(c);
    long total;
    unsigned h = sum_until_eof(s, &total);
    int st;
    waitpid(p, &st, 0);
    say("  sendfile: %ld bytes, hash %08x, sender: %s", total, h,
        WEXITSTATUS(st) == 0 ? "all in one call" : WEXITSTATUS(st) == 2 ? "all, in more than one call" : "short");
}

/* sendfile's answers about its input: a pipe (with and without an offset), a closed descriptor,
   a file shorter than the count, and its end; the input's errors come before the socket's. */
static void sendfile_inputs(void) {
    int s, c, pp[2];
    pair(&s, &c);
    if (pipe(pp) < 0) die("pipe");
    if (write(pp[1], "abc", 3) != 3) die("write pipe");
    off_t off = 0;
    T("sendfile from a pipe", sendfile(c, pp[0], NULL, 3));
    T("sendfile from a pipe at an offset", sendfile(c, pp[0], &off, 3));
    T("sendfile from a closed descriptor", sendfile(c, 1000, NULL, 3));
    char path[] = "/tmp/colo-diff-XXXXXX";
    int f = mkstemp(path);
    unlink(path);
    if (write(f, "hello", 5) != 5) die("write file");
    off = 2;
    T("sendfile of 100 from 2 of a 5-byte file", sendfile(c, f, &off, 100));
    say("  offset after: %ld", (long)off);
    T("sendfile at its end", sendfile(c, f, &off, 100));
    if (lseek(f, 1, SEEK_SET) != 1) die("lseek");
    T("sendfile from the file position 1", sendfile(c, f, NULL, 100));
    say("  file position after: %ld", (long)lseek(f, 0, SEEK_CUR));
    char b[16] = {0};
    T("recv of the 7 bytes sent", recv(s, b, 7, MSG_WAITALL));
    say("  bytes: %s", b);
    close(f), close(pp[0]), close(pp[1]), close(s), close(c);
}

static void splice_big(void) {
    int s, c, pp[2];
    pair(&s, &c);
    if (pipe(pp) < 0) die("pipe");
    pid_t p = fork();
    if (p == 0) {
        close(s);
        close(pp[0]);
        static unsigned char b[1 << 16];
        pid_t q = fork();
        if (q == 0) {
            close(c);
            for (int i = 0; i < SIZE / (int)sizeof b; i++) {
                for (unsigned j = 0; j < sizeof b; j++) b[j] = (unsigned char)(i * 3 + j);
                if (write(pp[1], b, sizeof b) != sizeof b) _exit(1);
            }
            _exit(0);
        }
        close(pp[1]);
        _exit(0);
    }
    close(pp[1]);
    long moved = 0;
    ssize_t n;
    pid_t r = fork();
    if (r == 0) {
        close(s);
        while ((n = splice(pp[0], NULL, c, NULL, 1 << 16, 0)) > 0) moved += n;
        _exit(moved == SIZE ? 0 : 1);
    }
    close(pp[0]);
    close(c);
    long total;
    unsigned h = sum_until_eof(s, &total);
    int st;
    waitpid(r, &st, 0);
    waitpid(p, NULL, 0);
    say("  splice: %ld bytes, hash %08x, splicer ok: %s", total, h, WEXITSTATUS(st) == 0 ? "yes" : "no");
}

static void *set_nonblocking_later(void *fd) {
    settle(100);
    fcntl(*(int *)fd, F_SETFL, O_NONBLOCK);
    return NULL;
}

/* A blocking writev decides once, at its start, that it may wait: it writes every byte though
 * another thread sets O_NONBLOCK while it waits for room, as the kernel's. */
static void writev_made_nonblocking_as_it_waits(void) {
    int s, c;
    pair(&s, &c);
    static char half[SIZE / 2];
    struct iovec v[2] = {{half, sizeof half}, {half, sizeof half}};
    pid_t p = fork();
    if (p == 0) {
        close(c);
        settle(300);
        long total;
        sum_until_eof(s, &total);
        say("  peer read %ld", total);
        _exit(0);
    }
    close(s);
    pthread_t t;
    pthread_create(&t, NULL, set_nonblocking_later, &c);
    T("writev", writev(c, v, 2));
    pthread_join(t, NULL);
    close(c);
    waitpid(p, NULL, 0);
}

static void short_connections(void) {
    int ok = 0;
    for (int i = 0; i < 200; i++) {
        int s, c;
        char b[8];
        pair(&s, &c);
        if (send(c, "ping", 4, 0) == 4 && recv(s, b, 8, 0) == 4 && send(s, "pong", 4, 0) == 4 && recv(c, b, 8, 0) == 4) {
            close(c);
            if (recv(s, b, 8, 0) == 0) ok++;
        }
        close(s);
    }
    say("  200 short connections, each a ping, a pong and an end of stream: %d", ok);
}

int main(void) {
    diff_begin();
    RUN(sendfile_big);
    RUN(sendfile_inputs);
    RUN(splice_big);
    RUN(writev_made_nonblocking_as_it_waits);
    RUN(short_connections);
    diff_end();
    return 0;
}
