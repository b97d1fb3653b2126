/* What every scenario program of the differential suite shares. A program runs named scenarios
 * and prints a transcript on stdout of everything it observed (return values, errno names, event
 * masks, bytes); tests/diff/run.sh runs it on plain TCP and under `colo run`, and diffs the two.
 * Nothing in a transcript may depend on timing, addresses or descriptor numbers.
 *
 * A scenario is a function; `RUN(f)` runs it in a forked child with its own watchdog (alarm),
 * so a hang or a crash shows as that scenario's line, and the next scenario still runs. The last
 * line is the number of connections the program made, which run.sh compares with the number the
 * shim's log (COLO_LOG=info) says it accelerated: a comparison of two plain runs proves nothing. */
#ifndef COLO_DIFF_H
#define COLO_DIFF_H
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Connections made, shared by the scenario children (a MAP_SHARED counter). */
static int *diff_conns;

static const char *ename(int e) {
    switch (e) {
#define E(x) case x: return #x;
        E(EAGAIN) E(EPIPE) E(ECONNRESET) E(EINTR) E(EINVAL) E(ENOTCONN) E(EBADF) E(EFAULT) E(EEXIST) E(ENOENT)
        E(ECONNREFUSED) E(ETIMEDOUT) E(EPROTO) E(EOPNOTSUPP) E(EINPROGRESS) E(EISCONN) E(ENOBUFS)
        E(ENOPROTOOPT) E(EALREADY) E(EDESTADDRREQ) E(EMSGSIZE) E(ENOTSOCK) E(EADDRINUSE) E(ENOTTY) E(EPERM)
        E(ESPIPE) E(ENOSYS) E(EMFILE) E(EISDIR) E(EOVERFLOW) E(ECONNABORTED) E(EDOM)
#undef E
    default: {
        static char other[16];
        snprintf(other, sizeof other, "errno %d", e);
        return other;
    }
    }
}

static void say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

/* `what = r` or `what = -1 ENAME` (errno read right after the call). */
#define T(what, call)                                                            \
    do {                                                                         \
        errno = 0;                                                               \
        long r_ = (long)(call);                                                  \
        int e_ = errno;                                                          \
        if (r_ < 0) say("  %s = %ld %s", what, r_, ename(e_));                   \
        else say("  %s = %ld", what, r_);                                        \
    } while (0)

/* The event mask `m` by names, in a fixed order. */
__attribute__((unused)) static void mask(const char *what, unsigned m) {
    static const struct { unsigned bit; const char *name; } names[] = {
        {POLLIN, "IN"}, {POLLPRI, "PRI"}, {POLLOUT, "OUT"}, {POLLERR, "ERR"}, {POLLHUP, "HUP"},
        {POLLNVAL, "NVAL"}, {POLLRDNORM, "RDNORM"}, {POLLRDBAND, "RDBAND"}, {POLLWRNORM, "WRNORM"},
        {POLLWRBAND, "WRBAND"}, {POLLRDHUP, "RDHUP"},
    };
    char b[160] = "";
    for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++)
        if (m & names[i].bit) {
            if (b[0]) strcat(b, "|");
            strcat(b, names[i].name);
        }
    say("  %s = %s", what, b[0] ? b : "0");
}

/* poll(fd, every event, 0) */
__attribute__((unused)) static unsigned pmask(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLPRI | POLLOUT | POLLRDHUP};
    return poll(&p, 1, 0) == 1 ? (unsigned)p.revents : 0;
}

/* One epoll_wait on a fresh set (level-triggered, every event). */
__attribute__((unused)) static unsigned emask(int fd) {
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLPRI | EPOLLOUT | EPOLLRDHUP, .data.fd = fd}, out;
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    int n = epoll_wait(ep, &out, 1, 0);
    close(ep);
    return n == 1 ? out.events : 0;
}

/* getsockopt(SO_ERROR) of `fd` (which reports and clears it). */
__attribute__((unused)) static int so_error(int fd) {
    int e = -1;
    socklen_t len = sizeof e;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len);
    return e;
}

/* Says `what = ENAME` (or 0): the SO_ERROR of `fd`, which reading reports and clears. */
__attribute__((unused)) static void say_error(const char *what, int fd) {
    int e = so_error(fd);
    say("  %s = %s", what, e ? ename(e) : "0");
}

static void die(const char *what) {
    printf("  DIED %s: %s\n", what, strerror(errno));
    fflush(stdout);
    exit(1);
}

static int listener(struct sockaddr_in *a) {
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    socklen_t len = sizeof *a;
    *a = (struct sockaddr_in){.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (l < 0 || bind(l, (struct sockaddr *)a, sizeof *a) < 0 || listen(l, 16) < 0) die("listen");
    getsockname(l, (struct sockaddr *)a, &len);
    return l;
}

/* A connected pair in this process: *srv is the accepted end, *cli the dialing one. Both are
 * blocking. One byte is sent each way first, so the connection is settled (under colo: the
 * server claimed the offer) before the scenario starts. */
static void pair(int *srv, int *cli) {
    struct sockaddr_in a;
    int l = listener(&a);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    int s = accept(l, NULL, NULL);
    if (s < 0) die("accept");
    close(l);
    char x = 'x';
    if (write(c, &x, 1) != 1 || read(s, &x, 1) != 1 || write(s, &x, 1) != 1 || read(c, &x, 1) != 1) die("settle");
    __atomic_add_fetch(diff_conns, 1, __ATOMIC_SEQ_CST);
    *srv = s;
    *cli = c;
}

/* Sleeps `ms` milliseconds (to let the far end's action reach this end: a kernel's loopback
 * segment, or a flag in shared memory; both are immediate, the sleep is margin). */
__attribute__((unused)) static void settle(int ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) < 0 && errno == EINTR) {}
}

static void run_one(const char *name, void (*f)(void)) {
    say("== %s", name);
    pid_t p = fork();
    if (p == 0) {
        alarm(20);
        f();
        fflush(stdout);
        _exit(0);
    }
    int st;
    waitpid(p, &st, 0);
    if (WIFSIGNALED(st)) say("  KILLED by signal %d%s", WTERMSIG(st), WTERMSIG(st) == SIGALRM ? " (watchdog)" : "");
    else if (WEXITSTATUS(st) != 0) say("  EXIT %d", WEXITSTATUS(st));
}
#define RUN(f) run_one(#f, f)

static void diff_begin(void) {
    diff_conns = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
}
static void diff_end(void) { say("connections %d", *diff_conns); }

/* Prints up to `n` bytes read from `fd` (non-blocking), as text. */
__attribute__((unused)) static void drain(const char *what, int fd, size_t n) {
    char b[4096];
    if (n > sizeof b) n = sizeof b;
    errno = 0;
    ssize_t r = recv(fd, b, n, MSG_DONTWAIT);
    if (r < 0) say("  %s = -1 %s", what, ename(errno));
    else say("  %s = %zd '%.*s'", what, r, (int)r, b);
}
#endif
