/* Job control: a process stopped (SIGSTOP) and continued (SIGCONT, no handler) while it sleeps
 * in a call on a connection. No handler runs, yet Linux ends some calls (signal(7),
 * "Interruption of system calls and library functions by stop signals"): a read or write that
 * already moved bytes returns them, a socket call with a timeout (SO_RCVTIMEO/SO_SNDTIMEO)
 * fails with EINTR, and so does epoll_wait; the others (poll, select, a plain blocking recv)
 * are restarted and go on waiting. The stopping process is a fork child; the stop lasts 100 ms. */
#include "diff.h"
#include <pthread.h>
#include <sys/select.h>

/* Stops `who` `after` ms from now for 100 ms, then continues it; then, `then` ms later, sends
 * `bytes` (if any) on `fd` (a descriptor of the connection the child holds). Returns the child. */
static pid_t stop_later(pid_t who, int after, int fd, const char *bytes, int then) {
    pid_t p = fork();
    if (p == 0) {
        settle(after);
        kill(who, SIGSTOP);
        settle(100);
        kill(who, SIGCONT);
        if (bytes) {
            settle(then);
            send(fd, bytes, strlen(bytes), MSG_NOSIGNAL);
        }
        settle(300);
        _exit(0);
    }
    return p;
}

/* recv(8, `flags`) with 3 of 8 bytes there, stopped at 200 ms; the rest comes 300 ms after. */
static void stopped_with_bytes(const char *what, int flags) {
    int s, c;
    char b[9] = {0};
    pair(&s, &c);
    send(c, "abc", 3, 0);
    pid_t p = stop_later(getpid(), 200, c, "defgh", 300);
    T(what, recv(s, b, 8, flags));
    say("  bytes '%s'", b);
    waitpid(p, NULL, 0);
    drain("recv what is left", s, 8);
}

static void stop_waitall_with_bytes(void) {
    /* MSG_WAITALL with 3 of 8 bytes read: the kernel returns the 3 at the stop. */
    stopped_with_bytes("recv 8 WAITALL", MSG_WAITALL);
}

static void stop_plain_recv(void) {
    /* A blocking recv with nothing read: restarted, it returns the bytes sent after. */
    int s, c;
    char b[9] = {0};
    pair(&s, &c);
    pid_t p = stop_later(getpid(), 200, c, "abc", 200);
    T("recv 8", recv(s, b, 8, 0));
    say("  bytes '%s'", b);
    waitpid(p, NULL, 0);
}

static void stop_recv_with_timeout(void) {
    /* SO_RCVTIMEO 5 s, nothing read: EINTR at the stop. */
    int s, c;
    char b[9] = {0};
    pair(&s, &c);
    struct timeval tv = {5, 0};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    pid_t p = stop_later(getpid(), 200, c, "abc", 200);
    T("recv 8 (SO_RCVTIMEO 5 s)", recv(s, b, 8, 0));
    waitpid(p, NULL, 0);
    drain("recv after", s, 8);
}

/* Fills `c`'s send path until a non-blocking send would block; returns the bytes taken. */
static long fill(int c) {
    static char buf[65536];
    long total = 0;
    ssize_t n;
    while ((n = send(c, buf, sizeof buf, MSG_DONTWAIT)) > 0) total += n;
    return total;
}

/* Reads `fd` until `want` bytes came or the stream ends; returns how many. */
static long read_all(int fd, long want) {
    static char buf[65536];
    long got = 0;
    ssize_t n;
    while (got < want && (n = recv(fd, buf, sizeof buf, 0)) > 0) got += n;
    return got;
}

static void stop_send_with_bytes(void) {
    /* A blocking send of 32 MiB to a peer that reads nothing: it moved part when stopped, and the
     * kernel returns that part. */
    static char big[32 << 20];
    int s, c;
    pair(&s, &c);
    pid_t p = stop_later(getpid(), 300, s, NULL, 0);
    errno = 0;
    ssize_t n = send(c, big, sizeof big, 0);
    say("  send 32 MiB = %s", n < 0 ? ename(errno) : n == 0 ? "0" : n < (ssize_t)sizeof big ? "part" : "all");
    waitpid(p, NULL, 0);
    say("  peer reads what was sent: %s", read_all(s, n) == n ? "yes" : "no");
}

static void stop_send_with_timeout(void) {
    /* SO_SNDTIMEO 5 s, the path full, nothing moved: EINTR at the stop. */
    int s, c;
    pair(&s, &c);
    long filled = fill(c);
    struct timeval tv = {5, 0};
    setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    pid_t p = stop_later(getpid(), 200, s, NULL, 0);
    T("send 10 (SO_SNDTIMEO 5 s)", send(c, "0123456789", 10, 0));
    waitpid(p, NULL, 0);
    say("  peer reads what was sent: %s", read_all(s, filled) == filled ? "yes" : "no");
}

static void stop_poll(void) {
    /* poll, ppoll and select are restarted: each returns when the bytes come. */
    int s, c;
    char b[8];
    pair(&s, &c);
    pid_t p = stop_later(getpid(), 200, c, "ab", 200);
    struct pollfd q = {.fd = s, .events = POLLIN};
    T("poll 5 s", poll(&q, 1, 5000));
    mask("revents", (unsigned short)q.revents);
    waitpid(p, NULL, 0);
    T("recv", recv(s, b, sizeof b, 0));
    p = stop_later(getpid(), 200, c, "cd", 200);
    struct timespec ts = {5, 0};
    T("ppoll 5 s", ppoll(&q, 1, &ts, NULL));
    waitpid(p, NULL, 0);
    T("recv", recv(s, b, sizeof b, 0));
    p = stop_later(getpid(), 200, c, "ef", 200);
    fd_set rd;
    FD_ZERO(&rd);
    FD_SET(s, &rd);
    struct timeval tv = {5, 0};
    T("select 5 s", select(s + 1, &rd, NULL, NULL, &tv));
    waitpid(p, NULL, 0);
    T("recv", recv(s, b, sizeof b, 0));
}

static void stop_epoll_wait(void) {
    /* epoll_wait, epoll_pwait and epoll_pwait2 fail with EINTR at the stop (signal(7)); a poll
     * of the epoll set's own descriptor is restarted as any poll. */
    int s, c;
    char b[8];
    pair(&s, &c);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = s}, out;
    epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
    pid_t p = stop_later(getpid(), 200, c, "ab", 200);
    T("epoll_wait 5 s", epoll_wait(ep, &out, 1, 5000));
    waitpid(p, NULL, 0);
    T("epoll_wait after", epoll_wait(ep, &out, 1, 5000));
    T("recv", recv(s, b, sizeof b, 0));
    p = stop_later(getpid(), 200, c, "ab", 200);
    T("epoll_pwait 5 s", epoll_pwait(ep, &out, 1, 5000, NULL));
    waitpid(p, NULL, 0);
    T("recv", recv(s, b, sizeof b, 0));
    p = stop_later(getpid(), 200, c, "cd", 200);
    struct timespec ts = {5, 0};
    T("epoll_pwait2 5 s", epoll_pwait2(ep, &out, 1, &ts, NULL));
    waitpid(p, NULL, 0);
    T("recv", recv(s, b, sizeof b, 0));
    p = stop_later(getpid(), 200, c, "ef", 200);
    struct pollfd q = {.fd = ep, .events = POLLIN};
    T("poll of the epoll set 5 s", poll(&q, 1, 5000));
    mask("revents", (unsigned short)q.revents);
    waitpid(p, NULL, 0);
    T("recv", recv(s, b, sizeof b, 0));
}

static void stop_while_a_thread_reads(void) {
    /* The stop reaches every thread; a thread's MSG_WAITALL recv that has bytes returns them. */
    int s, c;
    pair(&s, &c);
    send(c, "abc", 3, 0);
    pid_t p = stop_later(getpid(), 200, c, "defgh", 300);
    char b[9] = {0};
    pthread_t t;
    struct { int fd; char *b; ssize_t n; int e; } arg = {s, b, 0, 0};
    void *(*reader)(void *) = ({
        void *f(void *a_) {
            typeof(arg) *a = a_;
            errno = 0;
            a->n = recv(a->fd, a->b, 8, MSG_WAITALL);
            a->e = errno;
            return NULL;
        }
        f;
    });
    pthread_create(&t, NULL, reader, &arg);
    pthread_join(t, NULL);
    if (arg.n < 0) say("  thread's recv 8 WAITALL = -1 %s", ename(arg.e));
    else say("  thread's recv 8 WAITALL = %zd '%s'", arg.n, b);
    waitpid(p, NULL, 0);
    drain("recv the rest", s, 8);
}

static void stop_peek_waitall_with_bytes(void) {
    /* MSG_PEEK|MSG_WAITALL with 3 of 8 bytes there: the kernel returns the 3 peeked at the stop. */
    stopped_with_bytes("recv 8 PEEK|WAITALL", MSG_PEEK | MSG_WAITALL);
}

static void stop_send_nothing_moved(void) {
    /* A blocking send with the path full and no timeout: restarted, it completes once the peer
     * reads. */
    int s, c;
    pair(&s, &c);
    long filled = fill(c);
    pid_t p = fork();
    if (p == 0) {
        pid_t parent = getppid();
        settle(200);
        kill(parent, SIGSTOP);
        settle(100);
        kill(parent, SIGCONT);
        settle(200);
        _exit(read_all(s, filled + 10) == filled + 10 ? 0 : 1);
    }
    errno = 0;
    ssize_t n = send(c, "0123456789", 10, 0);
    int e = errno, st;
    waitpid(p, &st, 0);
    if (n < 0) say("  send 10 = -1 %s", ename(e));
    else say("  send 10 = %zd", n);
    say("  peer reads what was sent: %s", WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "yes" : "no");
}

static void stop_accept_with_timeout(void) {
    /* accept with SO_RCVTIMEO on the listener fails with EINTR at the stop; without, it goes on
     * to take the connection made after. */
    struct sockaddr_in a;
    int l = listener(&a);
    struct timeval tv = {5, 0};
    setsockopt(l, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    pid_t me = getpid(), p = stop_later(me, 200, -1, NULL, 0);
    T("accept (SO_RCVTIMEO 5 s)", accept(l, NULL, NULL));
    waitpid(p, NULL, 0);
    tv = (struct timeval){0, 0};
    setsockopt(l, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    p = fork();
    if (p == 0) {
        settle(200);
        kill(me, SIGSTOP);
        settle(100);
        kill(me, SIGCONT);
        settle(200);
        int c = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(c, (struct sockaddr *)&a, sizeof a) < 0) _exit(1);
        send(c, "hi", 2, 0);
        char x;
        recv(c, &x, 1, 0);
        _exit(0);
    }
    int s = accept(l, NULL, NULL);
    say("  accept (no timeout) took a connection: %s", s >= 0 ? "yes" : ename(errno));
    char b[4] = {0};
    T("recv 2 WAITALL", recv(s, b, 2, MSG_WAITALL));
    send(s, "k", 1, 0);
    waitpid(p, NULL, 0);
    __atomic_add_fetch(diff_conns, 1, __ATOMIC_SEQ_CST);
}

static void stop_splice_waiting(void) {
    /* splice from the connection into a pipe, nothing there: restarted, it moves the bytes sent
     * after. */
    int s, c, pp[2];
    char b[8];
    pair(&s, &c);
    if (pipe(pp) < 0) die("pipe");
    pid_t p = stop_later(getpid(), 200, c, "abc", 200);
    T("splice 8 into a pipe", splice(s, NULL, pp[1], NULL, 8, 0));
    waitpid(p, NULL, 0);
    T("read the pipe", read(pp[0], b, sizeof b));
}

int main(void) {
    diff_begin();
    RUN(stop_waitall_with_bytes);
    RUN(stop_plain_recv);
    RUN(stop_recv_with_timeout);
    RUN(stop_send_with_bytes);
    RUN(stop_send_with_timeout);
    RUN(stop_poll);
    RUN(stop_epoll_wait);
    RUN(stop_while_a_thread_reads);
    RUN(stop_peek_waitall_with_bytes);
    RUN(stop_send_nothing_moved);
    RUN(stop_accept_with_timeout);
    RUN(stop_splice_waiting);
    diff_end();
    return 0;
}
