/* Edges of everyday calls: control messages and msg_flags through sendmsg/recvmsg, MSG_MORE,
 * SIGPIPE delivered, connect after a shutdown, names after the peer's clean close, dup2 and
 * close_range over a connection, sendfile past the end of a file, splice through a pipe without
 * blocking, many small writes read at once, MSG_WAITALL cut short by the peer's close, the waits
 * with nothing to watch, and epoll_pwait2 (its timeouts; through syscall(2)). */
#include "diff.h"
#include <linux/close_range.h>
#include <pthread.h>
#include <sys/select.h>
#include <sys/sendfile.h>
#include <sys/syscall.h>

static void scm_rights(void) {
    /* TCP carries no descriptor: the kernel refuses SCM_RIGHTS with EINVAL, sending nothing. */
    int s, c;
    char b[8];
    pair(&s, &c);
    int fd = 0;
    union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } u;
    memset(&u, 0, sizeof u);
    struct iovec io = {"ab", 2};
    struct msghdr m = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    T("sendmsg SCM_RIGHTS", sendmsg(c, &m, 0));
    cm->cmsg_type = SCM_CREDENTIALS;
    T("sendmsg SCM_CREDENTIALS", sendmsg(c, &m, 0));
    cm->cmsg_level = IPPROTO_TCP;
    cm->cmsg_type = 1;
    T("sendmsg an IPPROTO_TCP cmsg", sendmsg(c, &m, 0));
    m.msg_controllen = 3;
    T("sendmsg a control buffer too short for a header", sendmsg(c, &m, 0));
    settle(50);
    T("recv", recv(s, b, sizeof b, MSG_DONTWAIT));
}

static void recvmsg_out(void) {
    /* What recvmsg writes back: msg_flags (MSG_CMSG_CLOEXEC kept, the rest cleared),
     * msg_controllen (0: TCP adds no control message), msg_namelen (0: no address). */
    int s, c;
    char b[8], ctl[64];
    struct sockaddr_in from;
    pair(&s, &c);
    send(c, "abcd", 4, 0);
    settle(50);
    struct iovec io = {b, 2};
    struct msghdr m = {.msg_name = &from, .msg_namelen = sizeof from, .msg_iov = &io, .msg_iovlen = 1,
                       .msg_control = ctl, .msg_controllen = sizeof ctl, .msg_flags = -1};
    T("recvmsg 2", recvmsg(s, &m, 0));
    say("  msg_flags %#x, msg_controllen %zu, msg_namelen %u", m.msg_flags, (size_t)m.msg_controllen, m.msg_namelen);
    m = (struct msghdr){.msg_name = &from, .msg_namelen = sizeof from, .msg_iov = &io, .msg_iovlen = 1,
                        .msg_control = ctl, .msg_controllen = sizeof ctl, .msg_flags = 0};
    T("recvmsg CMSG_CLOEXEC|PEEK", recvmsg(s, &m, MSG_CMSG_CLOEXEC | MSG_PEEK));
    say("  msg_flags %#x, msg_controllen %zu, msg_namelen %u", m.msg_flags, (size_t)m.msg_controllen, m.msg_namelen);
    m = (struct msghdr){.msg_iov = &io, .msg_iovlen = 1, .msg_flags = -1};
    T("recvmsg WAITALL", recvmsg(s, &m, MSG_WAITALL));
    say("  msg_flags %#x", m.msg_flags);
    m = (struct msghdr){.msg_iov = &io, .msg_iovlen = 1, .msg_flags = -1};
    T("recvmsg empty, DONTWAIT", recvmsg(s, &m, MSG_DONTWAIT));
    say("  msg_flags %#x", m.msg_flags);
    shutdown(c, SHUT_WR);
    settle(50);
    m = (struct msghdr){.msg_iov = &io, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl, .msg_flags = -1};
    T("recvmsg at the end", recvmsg(s, &m, 0));
    say("  msg_flags %#x, msg_controllen %zu", m.msg_flags, (size_t)m.msg_controllen);
}

static void msg_more(void) {
    /* MSG_MORE holds a partial segment back for the next send; the next send without it goes
     * out with it. Only the order and the total are compared. */
    int s, c;
    char b[16] = {0};
    pair(&s, &c);
    T("send ab MORE", send(c, "ab", 2, MSG_MORE));
    T("send cd MORE", send(c, "cd", 2, MSG_MORE));
    T("send ef", send(c, "ef", 2, 0));
    T("recv WAITALL 6", recv(s, b, 6, MSG_WAITALL));
    say("  bytes '%.6s'", b);
}

static volatile sig_atomic_t pipes;
static void on_pipe(int sig) { (void)sig; pipes++; }

static void sigpipe(void) {
    /* The peer closed: the first write is taken (the peer's reset answers it), the next fails
     * EPIPE and raises SIGPIPE, counted by a handler; MSG_NOSIGNAL raises none. */
    int s, c;
    pair(&s, &c);
    signal(SIGPIPE, on_pipe);
    close(c);
    settle(50);
    T("write (taken)", write(s, "ab", 2));
    settle(50);
    say("  SIGPIPEs %d", pipes);
    T("write again", write(s, "ab", 2));
    say("  SIGPIPEs %d", pipes);
    T("send MSG_NOSIGNAL", send(s, "ab", 2, MSG_NOSIGNAL));
    say("  SIGPIPEs %d", pipes);
    struct iovec io = {"ab", 2};
    T("writev", writev(s, &io, 1));
    say("  SIGPIPEs %d", pipes);
    shutdown(s, SHUT_WR);
    T("send after own SHUT_WR", send(s, "ab", 2, 0));
    say("  SIGPIPEs %d", pipes);
}

static void sigpipe_own_shutdown(void) {
    /* A write after this end's own SHUT_WR, the peer still there: EPIPE and SIGPIPE. */
    int s, c;
    pair(&s, &c);
    signal(SIGPIPE, on_pipe);
    shutdown(c, SHUT_WR);
    T("write after SHUT_WR", write(c, "ab", 2));
    say("  SIGPIPEs %d", pipes);
    T("sendto after SHUT_WR", sendto(c, "ab", 2, 0, NULL, 0));
    say("  SIGPIPEs %d", pipes);
    struct msghdr m = {0};
    struct iovec io = {"ab", 2};
    m.msg_iov = &io;
    m.msg_iovlen = 1;
    T("sendmsg after SHUT_WR", sendmsg(c, &m, 0));
    say("  SIGPIPEs %d", pipes);
}

static void connect_after_shutdown(void) {
    int s, c;
    pair(&s, &c);
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    getpeername(c, (struct sockaddr *)&a, &len);
    shutdown(c, SHUT_WR);
    T("connect after SHUT_WR", connect(c, (struct sockaddr *)&a, sizeof a));
    shutdown(c, SHUT_RDWR);
    T("connect after SHUT_RDWR", connect(c, (struct sockaddr *)&a, sizeof a));
    struct sockaddr un = {.sa_family = AF_UNSPEC};
    T("listen after SHUT_RDWR", listen(c, 4));
    (void)un;
}

static void names_after_close(void) {
    /* The peer closed cleanly: this end still names both ends until it closes too. */
    int s, c;
    pair(&s, &c);
    struct sockaddr_in peer, own, cpeer, cown;
    socklen_t len = sizeof cpeer;
    getpeername(c, (struct sockaddr *)&cpeer, &len);
    len = sizeof cown;
    getsockname(c, (struct sockaddr *)&cown, &len);
    close(c);
    settle(50);
    len = sizeof peer;
    T("getpeername after the peer's close", getpeername(s, (struct sockaddr *)&peer, &len));
    say("  names the peer's end: %s", len == sizeof cown && memcmp(&peer, &cown, len) == 0 ? "yes" : "no");
    len = sizeof own;
    T("getsockname", getsockname(s, (struct sockaddr *)&own, &len));
    say("  names its own end: %s", len == sizeof cpeer && memcmp(&own, &cpeer, len) == 0 ? "yes" : "no");
    char b[4];
    T("recv (end)", recv(s, b, sizeof b, 0));
    len = sizeof peer;
    T("getpeername after reading the end", getpeername(s, (struct sockaddr *)&peer, &len));
    T("send (taken)", send(s, "a", 1, MSG_NOSIGNAL));
    settle(50);
    T("send (reset)", send(s, "a", 1, MSG_NOSIGNAL));
    len = sizeof peer;
    T("getpeername after the reset", getpeername(s, (struct sockaddr *)&peer, &len));
    len = sizeof own;
    T("getsockname after the reset", getsockname(s, (struct sockaddr *)&own, &len));
    say("  port kept: %s", own.sin_port == cpeer.sin_port ? "yes" : "no");
}

static void *recv_thread(void *fd) {
    char b[8];
    errno = 0;
    ssize_t n = recv(*(int *)fd, b, sizeof b, 0);
    say("  thread's blocking recv = %zd %s '%.*s'", n, n < 0 ? ename(errno) : "", n > 0 ? (int)n : 0, b);
    return NULL;
}

static void dup2_while_waiting(void) {
    /* dup2 of another socket onto the number a thread waits in recv on: the recv keeps the
     * socket it started on and gets its bytes; the number now reads the other one. */
    int s, c, s2, c2;
    pthread_t t;
    pair(&s, &c);
    pair(&s2, &c2);
    pthread_create(&t, NULL, recv_thread, &s);
    settle(200);
    T("dup2 onto the waited number", dup2(s2, s) == s);
    settle(100);
    mask("old peer while the recv waits", pmask(c) & ~POLLOUT);
    T("send on the new socket's peer", send(c2, "new", 3, 0));
    settle(50);
    char b[8];
    T("recv on the number", recv(s, b, sizeof b, MSG_DONTWAIT));
    say("  bytes '%.3s'", b);
    ssize_t n = send(c, "old", 3, 0); /* said after the join: the thread's line comes first */
    pthread_join(t, NULL);
    say("  send on the old peer = %zd", n);
    settle(50);
    T("old peer's recv (end)", recv(c, b, sizeof b, MSG_DONTWAIT));
}

static void dup2_onto_itself(void) {
    int s, c;
    pair(&s, &c);
    T("dup2(s, s)", dup2(s, s) == s);
    T("dup3(s, s, 0)", dup3(s, s, 0));
    T("send still", send(c, "ab", 2, 0));
    char b[4];
    T("recv still", recv(s, b, sizeof b, 0));
}

static void close_range_conns(void) {
    /* close_range over both ends: the peer sees the end; CLOSE_RANGE_CLOEXEC only marks. */
    int s, c, s2, c2;
    pair(&s, &c);
    pair(&s2, &c2);
    T("close_range CLOEXEC over the second pair",
      syscall(SYS_close_range, s2 < c2 ? s2 : c2, s2 < c2 ? c2 : s2, CLOSE_RANGE_CLOEXEC));
    say("  FD_CLOEXEC: %s", fcntl(s2, F_GETFD) & FD_CLOEXEC ? "yes" : "no");
    T("send still", send(c2, "ab", 2, 0));
    int lo = s < c ? s : c, hi = s < c ? c : s;
    /* Only the first pair's server end: c stays; move s above everything else first. */
    int moved = dup2(s, 200);
    close(s);
    (void)lo;
    (void)hi;
    T("close_range(200, ~0)", syscall(SYS_close_range, 200, ~0U, 0));
    settle(50);
    T("fcntl of the closed number", fcntl(200, F_GETFD));
    mask("peer after close_range", pmask(c));
    char b[4];
    T("peer's recv (end)", recv(c, b, sizeof b, MSG_DONTWAIT));
    (void)moved;
    T("close_range bad flags", syscall(SYS_close_range, 300, 400, 0x80));
    T("close_range first > last", syscall(SYS_close_range, 400, 300, 0));
}

static void sendfile_edges(void) {
    /* sendfile from a 10-byte file: an offset, a count past the end, at the end. */
    int s, c;
    char b[32] = {0};
    pair(&s, &c);
    char path[] = "/tmp/colo-diff-sf.XXXXXX";
    int f = mkstemp(path);
    unlink(path);
    if (write(f, "0123456789", 10) != 10) die("write");
    off_t off = 3;
    T("sendfile offset 3, count 100", sendfile(c, f, &off, 100));
    say("  offset now %ld, file position %ld", (long)off, (long)lseek(f, 0, SEEK_CUR));
    T("sendfile at the end", sendfile(c, f, &off, 100));
    lseek(f, 8, SEEK_SET);
    T("sendfile from the position (8), count 5", sendfile(c, f, NULL, 5));
    say("  file position %ld", (long)lseek(f, 0, SEEK_CUR));
    off = 0;
    T("sendfile count 0", sendfile(c, f, &off, 0));
    off = -1;
    T("sendfile negative offset", sendfile(c, f, &off, 4));
    settle(50);
    T("recv", recv(s, b, sizeof b, MSG_DONTWAIT));
    say("  bytes '%s'", b);
    T("sendfile from the socket", sendfile(c, s, NULL, 4));
    off = 0;
    T("sendfile from the socket at an offset", sendfile(c, s, &off, 4));
    off = -1;
    T("sendfile from the socket at a negative offset", sendfile(c, s, &off, 4));
    int p[2];
    if (pipe(p) < 0) die("pipe");
    off = 0;
    T("sendfile from a pipe at an offset", sendfile(c, p[0], &off, 4));
    shutdown(c, SHUT_WR);
    off = 0;
    T("sendfile after SHUT_WR", sendfile(c, f, &off, 4));
}

static void splice_nonblock(void) {
    /* socket -> pipe -> socket with SPLICE_F_NONBLOCK (which is the pipe's: the socket's own
     * O_NONBLOCK says whether its side waits): EAGAIN with nothing there, the bytes through,
     * and the end of the stream as 0. */
    int s, c, p[2];
    char b[16] = {0};
    pair(&s, &c);
    if (pipe(p) < 0) die("pipe");
    fcntl(s, F_SETFL, O_NONBLOCK);
    T("splice empty non-blocking socket", splice(s, NULL, p[1], NULL, 64, SPLICE_F_NONBLOCK));
    fcntl(s, F_SETFL, 0);
    send(c, "hello", 5, 0);
    settle(50);
    T("splice socket->pipe", splice(s, NULL, p[1], NULL, 64, SPLICE_F_NONBLOCK));
    T("splice pipe->socket", splice(p[0], NULL, s, NULL, 64, SPLICE_F_NONBLOCK));
    settle(50);
    T("recv the echo", recv(c, b, sizeof b, MSG_DONTWAIT));
    say("  bytes '%.5s'", b);
    T("splice empty pipe->socket", splice(p[0], NULL, s, NULL, 64, SPLICE_F_NONBLOCK));
    shutdown(c, SHUT_WR);
    settle(50);
    T("splice at the end", splice(s, NULL, p[1], NULL, 64, SPLICE_F_NONBLOCK));
    loff_t off = 0;
    T("splice with an offset on the socket", splice(s, &off, p[1], NULL, 64, SPLICE_F_NONBLOCK));
}

static void small_writes_one_read(void) {
    /* 100 writes of 10 bytes, then one read of 4096 once they all arrived: one read takes all
     * that is queued. */
    int s, c;
    static char b[4096];
    pair(&s, &c);
    int one = 1;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    for (int i = 0; i < 100; i++) send(c, "0123456789", 10, 0);
    settle(100);
    T("one read", recv(s, b, sizeof b, MSG_DONTWAIT));
    int ok = 1;
    for (int i = 0; i < 1000; i++) ok &= b[i] == '0' + i % 10;
    say("  in order: %s", ok ? "yes" : "no");
    T("next read", recv(s, b, sizeof b, MSG_DONTWAIT));
}

struct ending { int fd, abort; };

static void *end_later(void *arg) {
    struct ending *e = arg;
    settle(200);
    if (e->abort) setsockopt(e->fd, SOL_SOCKET, SO_LINGER, &(struct linger){1, 0}, sizeof(struct linger));
    close(e->fd);
    return NULL;
}

/* MSG_WAITALL for 8 with 3 there, then the peer closes (or resets): the 3 bytes, then the end
 * (or the reset). */
static void waitall_cut(int abort) {
    int s, c;
    char b[8] = {0};
    pthread_t t;
    pair(&s, &c);
    send(c, "abc", 3, 0);
    struct ending e = {c, abort};
    pthread_create(&t, NULL, end_later, &e);
    T("recv WAITALL 8", recv(s, b, 8, MSG_WAITALL));
    say("  bytes '%.3s'", b);
    pthread_join(t, NULL);
    T("recv again", recv(s, b, 8, MSG_WAITALL));
}
static void waitall_cut_by_close(void) { waitall_cut(0); }
static void waitall_cut_by_reset(void) { waitall_cut(1); }

static void mixed_vectors(void) {
    int s, c;
    char a[3] = {0}, b[3] = {0}, d[8] = {0};
    pair(&s, &c);
    struct iovec w[5] = {{"", 0}, {"ab", 2}, {"", 0}, {"cde", 3}, {NULL, 0}};
    T("writev 0+2+0+3+0", writev(c, w, 5));
    settle(50);
    struct iovec r[4] = {{a, 0}, {a, 3}, {d, 0}, {b, 3}};
    T("readv 0+3+0+3", readv(s, r, 4));
    say("  '%.3s' '%.2s'", a, b);
    struct iovec big = {d, 8};
    struct msghdr m = {.msg_iov = &big, .msg_iovlen = 1};
    T("recvmsg, nothing left", recvmsg(s, &m, MSG_DONTWAIT));
    T("writev with a NULL base of length 0 only", writev(c, &w[4], 1));
    static struct iovec many[1025];
    volatile int neg = -1, over = 1025;
    T("writev iovcnt -1", writev(c, many, neg));
    T("writev iovcnt 1025", writev(c, many, over));
}

static void poll_nothing(void) {
    /* No descriptor to watch: a timed sleep that returns 0. */
    int s, c;
    pair(&s, &c);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    T("poll(NULL, 0, 100)", poll(NULL, 0, 100));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    say("  slept: %s", (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000 >= 90 ? "yes" : "no");
    struct pollfd p = {.fd = -1, .events = POLLIN};
    T("poll one fd -1, 50 ms", poll(&p, 1, 50));
    T("select nothing, 50 ms", select(0, NULL, NULL, NULL, &(struct timeval){0, 50000}));
    int ep = epoll_create1(0);
    struct epoll_event ev;
    T("epoll_wait on an empty set, 50 ms", epoll_wait(ep, &ev, 1, 50));
}

static void epoll_pwait2_timeouts(void) {
    int s, c;
    pair(&s, &c);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = s}, out;
    epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
    struct timespec z = {0, 0}, short_ = {0, 50000000}, bad = {0, 2000000000};
    T("epoll_pwait2 zero timeout", epoll_pwait2(ep, &out, 1, &z, NULL));
    T("epoll_pwait2 50 ms", epoll_pwait2(ep, &out, 1, &short_, NULL));
    T("epoll_pwait2 bad timeout", epoll_pwait2(ep, &out, 1, &bad, NULL));
    T("epoll_pwait2 negative timeout", epoll_pwait2(ep, &out, 1, &(struct timespec){-1, 0}, NULL));
    send(c, "ab", 2, 0);
    settle(50);
    T("epoll_pwait2 NULL timeout, ready", epoll_pwait2(ep, &out, 1, NULL, NULL));
    mask("events", out.events);
}

static void raw_epoll_pwait2(void) {
    /* epoll_pwait2 through syscall(2), as programs built before libc had a wrapper make it. */
    int s, c;
    pair(&s, &c);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = s}, out;
    epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
    struct timespec z = {0, 0}, bad = {0, 2000000000};
    T("zero timeout, idle", syscall(SYS_epoll_pwait2, ep, &out, 1, &z, NULL, 8));
    T("bad timeout", syscall(SYS_epoll_pwait2, ep, &out, 1, &bad, NULL, 8));
    sigset_t none;
    sigemptyset(&none);
    T("a mask with a bad sigset size", syscall(SYS_epoll_pwait2, ep, &out, 1, &z, &none, 4));
    send(c, "ab", 2, 0);
    settle(50);
    T("no timeout, ready", syscall(SYS_epoll_pwait2, ep, &out, 1, NULL, NULL, 8));
    mask("events", out.events);
}


static void recv_flag_mixes(void) {
    /* MSG_TRUNC with MSG_PEEK (counted, nothing copied or consumed), with MSG_WAITALL, on an
     * empty connection; flags TCP ignores. */
    int s, c;
    char b[8] = {0};
    pair(&s, &c);
    send(c, "abcdef", 6, 0);
    settle(50);
    T("recv(NULL, 3, PEEK|TRUNC)", recv(s, NULL, 3, MSG_PEEK | MSG_TRUNC));
    T("recv(b, 2, PEEK|TRUNC)", recv(s, b, 2, MSG_PEEK | MSG_TRUNC));
    say("  b '%.2s'", b);
    T("recv(NULL, 2, TRUNC|WAITALL)", recv(s, NULL, 2, MSG_TRUNC | MSG_WAITALL));
    T("recv 8", recv(s, b, 8, MSG_DONTWAIT));
    say("  bytes '%.4s'", b);
    T("recv(NULL, 3, TRUNC|DONTWAIT), empty", recv(s, NULL, 3, MSG_TRUNC | MSG_DONTWAIT));
    T("recv(b, 0, PEEK|DONTWAIT), empty", recv(s, b, 0, MSG_PEEK | MSG_DONTWAIT));
    T("send with MSG_CONFIRM", send(c, "gh", 2, MSG_CONFIRM));
    T("send with MSG_EOR", send(c, "ij", 2, MSG_EOR));
    settle(50);
    T("recv with MSG_CMSG_CLOEXEC", recv(s, b, 8, MSG_CMSG_CLOEXEC | MSG_DONTWAIT));
    say("  bytes '%.4s'", b);
}

int main(void) {
    diff_begin();
    RUN(scm_rights);
    RUN(recvmsg_out);
    RUN(msg_more);
    RUN(sigpipe);
    RUN(sigpipe_own_shutdown);
    RUN(connect_after_shutdown);
    RUN(names_after_close);
    RUN(dup2_while_waiting);
    RUN(dup2_onto_itself);
    RUN(close_range_conns);
    RUN(sendfile_edges);
    RUN(splice_nonblock);
    RUN(small_writes_one_read);
    RUN(waitall_cut_by_close);
    RUN(waitall_cut_by_reset);
    RUN(mixed_vectors);
    RUN(poll_nothing);
    RUN(epoll_pwait2_timeouts);
    RUN(raw_epoll_pwait2);
    RUN(recv_flag_mixes);
    diff_end();
    return 0;
}
