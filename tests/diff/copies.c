/* sendfile to a connection where the kernel's answer depends on more than the bytes: to a full
 * connection, and from inputs that are not regular files (directories, /dev/null, /proc). */
#include "diff.h"
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/eventfd.h>

/* Fills the non-blocking `c` until its send fails with EAGAIN (the peer reads nothing). */
static long fill(int c) {
    static char big[1 << 16];
    long total = 0;
    ssize_t n;
    while ((n = send(c, big, sizeof big, MSG_DONTWAIT)) > 0) total += n;
    return total;
}

static int tmpfile_with(const char *text) {
    char path[] = "/tmp/colo-diff-cp.XXXXXX";
    int f = mkstemp(path);
    if (f < 0) die("mkstemp");
    unlink(path);
    size_t n = strlen(text);
    if (write(f, text, n) != (ssize_t)n) die("write");
    return f;
}

static void sendfile_full(void) {
    /* A connection that takes nothing now: the kernel reads the file first, so a file at its
     * end answers 0 (blocking or not) and only bytes to send meet the full socket. */
    int s, c;
    pair(&s, &c);
    int f = tmpfile_with("0123456789");
    fcntl(c, F_SETFL, O_NONBLOCK);
    fill(c);
    off_t off = 10;
    T("non-blocking, full, file at its end", sendfile(c, f, &off, 100));
    off = 4;
    T("non-blocking, full, 6 bytes left", sendfile(c, f, &off, 100));
    say("  offset after: %ld", (long)off);
    T("non-blocking, full, count 0", sendfile(c, f, &off, 0));
    T("non-blocking, full, from the position (10, its end)", sendfile(c, f, NULL, 5));
    fcntl(c, F_SETFL, 0);
    off = 10;
    T("blocking, full, file at its end", sendfile(c, f, &off, 100));
    off = 30;
    T("blocking, full, past its end", sendfile(c, f, &off, 100));
    say("  offset after: %ld", (long)off);
}

static void sendfile_odd_inputs(void) {
    /* Inputs the kernel cannot splice from, or that answer so: a directory, a file opened for
     * writing only, an eventfd, /dev/zero, /dev/null, an epoll set, a file in append mode. */
    int s, c;
    pair(&s, &c);
    int d = open("/tmp", O_RDONLY | O_DIRECTORY);
    off_t off = 0;
    T("a directory", sendfile(c, d, NULL, 4));
    T("a directory at an offset", sendfile(c, d, &off, 4));
    T("a directory, count 0", sendfile(c, d, &off, 0));
    char path[] = "/tmp/colo-diff-wo.XXXXXX";
    int w = mkstemp(path);
    int wo = open(path, O_WRONLY);
    unlink(path);
    T("a file open for writing only", sendfile(c, wo, &off, 4));
    close(w);
    int e = eventfd(1, 0);
    T("an eventfd", sendfile(c, e, NULL, 8));
    int z = open("/dev/zero", O_RDONLY);
    off = 0;
    T("/dev/zero", sendfile(c, z, &off, 4));
    int nul = open("/dev/null", O_RDONLY);
    T("/dev/null", sendfile(c, nul, NULL, 4));
    T("/dev/null, count 0", sendfile(c, nul, NULL, 0));
    int ep = epoll_create1(0);
    T("an epoll set", sendfile(c, ep, NULL, 4));
    int ap = tmpfile_with("abc");
    fcntl(ap, F_SETFL, O_APPEND);
    off = 0;
    T("a file in append mode", sendfile(c, ap, &off, 3));
    settle(50);
    char b[64] = {0};
    T("the peer reads", recv(s, b, sizeof b - 1, MSG_DONTWAIT));
    for (int i = 0; i < 63; i++) if (b[i] == 0) b[i] = '.'; else if (b[i] == '\n') b[i] = '|';
    say("  bytes '%s'", b);
}

static void sendfile_from_proc(void) {
    /* A file of /proc the kernel does not splice from (a process's own): EINVAL. */
    int s, c;
    char b[8] = {0};
    pair(&s, &c);
    int pf = open("/proc/self/comm", O_RDONLY);
    T("/proc/self/comm", sendfile(c, pf, NULL, 3));
    settle(50);
    T("the peer reads", recv(s, b, sizeof b, MSG_DONTWAIT));
}

int main(void) {
    diff_begin();
    RUN(sendfile_full);
    RUN(sendfile_odd_inputs);
    RUN(sendfile_from_proc);
    diff_end();
    return 0;
}
