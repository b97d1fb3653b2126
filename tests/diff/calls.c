/* Calls on a connected socket beside plain reads and writes: the names of its ends (after a
 * shutdown, after a reset), connect/listen/bind on it, sendto with an address, zero-length
 * vectors, peeks, the queue ioctls, option round trips and bad buffers. */
#include "diff.h"
#include <linux/sockios.h>
#include <pthread.h>

/* Whether getpeername(a) names what getsockname(b) does (no address in the transcript). */
static void names(const char *what, int a, int b) {
    struct sockaddr_storage x, y;
    socklen_t lx = sizeof x, ly = sizeof y;
    memset(&x, 0, sizeof x);
    memset(&y, 0, sizeof y);
    errno = 0;
    int r = getpeername(a, (struct sockaddr *)&x, &lx);
    if (r < 0) {
        say("  %s: getpeername = -1 %s", what, ename(errno));
        return;
    }
    r = getsockname(b, (struct sockaddr *)&y, &ly);
    say("  %s: getpeername = 0, the peer's getsockname = %d, same: %s", what, r,
        lx == ly && memcmp(&x, &y, lx) == 0 ? "yes" : "no");
}

static void names_after_shutdown(void) {
    int s, c;
    char b[4];
    pair(&s, &c);
    T("shutdown(c, SHUT_RDWR)", shutdown(c, SHUT_RDWR));
    settle(50);
    names("client", c, s);
    names("server", s, c);
    T("recv server (EOF)", recv(s, b, sizeof b, 0));
    T("shutdown(s, SHUT_RDWR)", shutdown(s, SHUT_RDWR));
    settle(50);
    names("client after both", c, s);
    names("server after both", s, c);
    T("shutdown(c, SHUT_RDWR) again", shutdown(c, SHUT_RDWR));
}

static void names_after_reset(void) {
    int s, c;
    pair(&s, &c);
    struct linger l = {1, 0};
    setsockopt(c, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close(c);
    settle(50);
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    T("getpeername", getpeername(s, (struct sockaddr *)&a, &len));
    len = sizeof a;
    T("getsockname", getsockname(s, (struct sockaddr *)&a, &len));
    T("shutdown(SHUT_RDWR)", shutdown(s, SHUT_RDWR));
}

static void shut_rdwr(void) {
    /* SHUT_RDWR: reads end, writes fail EPIPE, the peer sees the end of the stream. */
    int s, c;
    char b[8];
    pair(&s, &c);
    T("send to client", send(s, "ab", 2, 0));
    settle(50);
    T("shutdown(c, SHUT_RDWR)", shutdown(c, SHUT_RDWR));
    settle(50);
    mask("poll client", pmask(c));
    mask("epoll client", emask(c));
    mask("poll server", pmask(s));
    T("recv client", recv(c, b, sizeof b, MSG_DONTWAIT));
    T("recv client again", recv(c, b, sizeof b, MSG_DONTWAIT));
    T("send client", send(c, "x", 1, MSG_NOSIGNAL));
    say_error("SO_ERROR client", c);
    T("recv server", recv(s, b, sizeof b, MSG_DONTWAIT));
    T("send server", send(s, "cd", 2, MSG_NOSIGNAL));
    settle(50);
    T("send server again", send(s, "cd", 2, MSG_NOSIGNAL));
    say_error("SO_ERROR server", s);
    mask("poll server after its sends", pmask(s));
}

static void write_after_close(void) {
    /* The peer closed having read everything: the kernel takes one write, the peer's reset
     * answers it (EPIPE in CLOSE_WAIT), which SO_ERROR reports once, then poll no more. */
    int s, c;
    char b[4];
    pair(&s, &c);
    close(c);
    settle(50);
    T("send (taken)", send(s, "ab", 2, MSG_NOSIGNAL));
    settle(50);
    mask("poll", pmask(s));
    say_error("SO_ERROR", s);
    mask("poll after SO_ERROR", pmask(s));
    T("recv", recv(s, b, sizeof b, MSG_DONTWAIT));
    T("send again", send(s, "ab", 2, MSG_NOSIGNAL));
    say_error("SO_ERROR", s);
}

static void connected_calls(void) {
    /* connect, listen and bind on a connected socket; sendto and sendmsg naming an address. */
    int s, c;
    char b[16];
    pair(&s, &c);
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    getpeername(c, (struct sockaddr *)&a, &len);
    T("connect again", connect(c, (struct sockaddr *)&a, sizeof a));
    T("connect server to the client", connect(s, (struct sockaddr *)&a, sizeof a));
    T("listen", listen(c, 4));
    struct sockaddr_in any = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    T("bind", bind(c, (struct sockaddr *)&any, sizeof any));
    int v = -1;
    len = sizeof v;
    getsockopt(c, SOL_SOCKET, SO_ACCEPTCONN, &v, &len);
    say("  SO_ACCEPTCONN = %d", v);
    T("sendto with the peer's address", sendto(c, "ab", 2, 0, (struct sockaddr *)&a, sizeof a));
    struct sockaddr_in other = {.sin_family = AF_INET, .sin_port = htons(9), .sin_addr.s_addr = htonl(0x7f000002)};
    T("sendto with another address", sendto(c, "cd", 2, 0, (struct sockaddr *)&other, sizeof other));
    struct iovec io = {"ef", 2};
    struct msghdr m = {.msg_name = &other, .msg_namelen = sizeof other, .msg_iov = &io, .msg_iovlen = 1};
    T("sendmsg with an address", sendmsg(c, &m, 0));
    T("sendto with a short address", sendto(c, "gh", 2, 0, (struct sockaddr *)&other, 3));
    settle(50);
    struct sockaddr_in from;
    socklen_t flen = sizeof from;
    memset(&from, 0xff, sizeof from);
    T("recvfrom", recvfrom(s, b, sizeof b, MSG_DONTWAIT, (struct sockaddr *)&from, &flen));
    say("  bytes '%.8s', from length %u", b, flen);
    T("connect AF_INET after the peer left", (close(s), settle(50), connect(c, (struct sockaddr *)&a, sizeof a)));
}

static void zero_vectors(void) {
    int s, c;
    char a[4] = {0}, b[4] = {0};
    pair(&s, &c);
    struct iovec none[2] = {{a, 0}, {b, 0}};
    T("writev of zero-length iovecs", writev(c, none, 2));
    T("writev of no iovec", writev(c, none, 0));
    T("readv of zero-length iovecs, empty", readv(s, none, 2));
    struct msghdr m = {.msg_iov = none, .msg_iovlen = 2};
    T("sendmsg of zero-length iovecs", sendmsg(c, &m, 0));
    T("send 0 with MSG_DONTWAIT", send(c, a, 0, MSG_DONTWAIT));
    T("send NULL 0", send(c, NULL, 0, 0));
    T("send 3", send(c, "xyz", 3, 0));
    settle(50);
    T("readv of zero-length iovecs, with bytes", readv(s, none, 2));
    struct iovec mixed[3] = {{a, 0}, {b, 2}, {a, 0}};
    T("readv 0+2+0", readv(s, mixed, 3));
    say("  bytes '%.2s'", b);
    struct msghdr rm = {.msg_iov = none, .msg_iovlen = 2};
    T("recvmsg of zero-length iovecs", recvmsg(s, &rm, MSG_DONTWAIT));
    say("  msg_flags %d", rm.msg_flags);
    T("read NULL 0", read(s, NULL, 0));
    drain("recv the rest", s, 4);
}

static void *send_later(void *fd) {
    settle(200);
    send(*(int *)fd, "def", 3, 0);
    return NULL;
}

static void peek_waitall(void) {
    /* MSG_PEEK|MSG_WAITALL waits for the whole length and leaves the bytes. */
    int s, c;
    char b[8] = {0};
    pthread_t t;
    pair(&s, &c);
    T("send 3", send(c, "abc", 3, 0));
    settle(50);
    pthread_create(&t, NULL, send_later, &c);
    T("recv PEEK|WAITALL 6", recv(s, b, 6, MSG_PEEK | MSG_WAITALL));
    say("  bytes '%.6s'", b);
    pthread_join(t, NULL);
    T("peek 2", recv(s, b, 2, MSG_PEEK));
    T("recv 1", recv(s, b, 1, 0));
    T("peek 8", recv(s, b, 8, MSG_PEEK | MSG_DONTWAIT));
    say("  bytes '%.5s'", b);
    T("recv 8", recv(s, b, 8, MSG_DONTWAIT));
    say("  bytes '%.5s'", b);
    T("peek empty", recv(s, b, 8, MSG_PEEK | MSG_DONTWAIT));
    shutdown(c, SHUT_WR);
    settle(50);
    T("peek at EOF", recv(s, b, 8, MSG_PEEK | MSG_DONTWAIT));
    T("peek WAITALL at EOF", recv(s, b, 8, MSG_PEEK | MSG_WAITALL));
}

static void peek_off(void) {
    /* SO_PEEK_OFF: each peek starts where the last one ended; a read moves it back. */
    int s, c, off = 0;
    char b[8] = {0};
    pair(&s, &c);
    T("setsockopt SO_PEEK_OFF 0", setsockopt(s, SOL_SOCKET, SO_PEEK_OFF, &off, sizeof off));
    T("send 6", send(c, "abcdef", 6, 0));
    settle(50);
    T("peek 2", recv(s, b, 2, MSG_PEEK));
    say("  bytes '%.2s'", b);
    T("peek 2", recv(s, b, 2, MSG_PEEK));
    say("  bytes '%.2s'", b);
    socklen_t len = sizeof off;
    T("getsockopt SO_PEEK_OFF", getsockopt(s, SOL_SOCKET, SO_PEEK_OFF, &off, &len));
    say("  SO_PEEK_OFF = %d", off);
    T("recv 1", recv(s, b, 1, 0));
    len = sizeof off;
    getsockopt(s, SOL_SOCKET, SO_PEEK_OFF, &off, &len);
    say("  SO_PEEK_OFF after a read = %d", off);
    T("peek 8", recv(s, b, 8, MSG_PEEK | MSG_DONTWAIT));
    say("  bytes '%.1s'", b);
    drain("recv the rest", s, 8);
}

/* ioctl(fd, req, &n) and n. */
static void ioc(const char *what, int fd, unsigned long req) {
    int n = -1;
    T(what, ioctl(fd, req, &n));
    say("  n = %d", n);
}

static void queue_ioctls(void) {
    int s, c;
    char b[8];
    pair(&s, &c);
    T("send 5", send(c, "hello", 5, 0));
    settle(50);
    ioc("SIOCINQ server", s, SIOCINQ);
    ioc("SIOCOUTQ client", c, SIOCOUTQ);
    ioc("SIOCOUTQNSD client", c, SIOCOUTQNSD);
    ioc("SIOCATMARK server", s, SIOCATMARK);
    T("recv", recv(s, b, sizeof b, 0));
    ioc("SIOCINQ drained", s, SIOCINQ);
    ioc("SIOCATMARK drained", s, SIOCATMARK);
    T("FIONBIO 1", ioctl(s, FIONBIO, &(int){1}));
    T("recv (FIONBIO)", recv(s, b, sizeof b, 0));
    say("  O_NONBLOCK = %s", fcntl(s, F_GETFL) & O_NONBLOCK ? "yes" : "no");
}

static void opt(const char *what, int fd, int level, int name) {
    int v = -12345;
    socklen_t len = sizeof v;
    errno = 0;
    if (getsockopt(fd, level, name, &v, &len) < 0) say("  %s = -1 %s", what, ename(errno));
    else say("  %s = %d (len %u)", what, v, len);
}

static void setopt(const char *what, int fd, int level, int name, int v) {
    T(what, setsockopt(fd, level, name, &v, sizeof v));
}

static void option_round_trips(void) {
    int s, c;
    pair(&s, &c);
    opt("SO_TYPE", c, SOL_SOCKET, SO_TYPE);
    opt("SO_PROTOCOL", c, SOL_SOCKET, SO_PROTOCOL);
    opt("SO_DOMAIN", c, SOL_SOCKET, SO_DOMAIN);
    opt("SO_ACCEPTCONN server", s, SOL_SOCKET, SO_ACCEPTCONN);
    opt("SO_KEEPALIVE", c, SOL_SOCKET, SO_KEEPALIVE);
    setopt("set SO_KEEPALIVE 1", c, SOL_SOCKET, SO_KEEPALIVE, 1);
    opt("SO_KEEPALIVE", c, SOL_SOCKET, SO_KEEPALIVE);
    setopt("set TCP_KEEPIDLE 30", c, IPPROTO_TCP, TCP_KEEPIDLE, 30);
    opt("TCP_KEEPIDLE", c, IPPROTO_TCP, TCP_KEEPIDLE);
    setopt("set TCP_KEEPINTVL 5", c, IPPROTO_TCP, TCP_KEEPINTVL, 5);
    opt("TCP_KEEPINTVL", c, IPPROTO_TCP, TCP_KEEPINTVL);
    setopt("set TCP_KEEPCNT 3", c, IPPROTO_TCP, TCP_KEEPCNT, 3);
    opt("TCP_KEEPCNT", c, IPPROTO_TCP, TCP_KEEPCNT);
    setopt("set TCP_USER_TIMEOUT 1234", c, IPPROTO_TCP, TCP_USER_TIMEOUT, 1234);
    opt("TCP_USER_TIMEOUT", c, IPPROTO_TCP, TCP_USER_TIMEOUT);
    setopt("set TCP_NODELAY 1", c, IPPROTO_TCP, TCP_NODELAY, 1);
    opt("TCP_NODELAY", c, IPPROTO_TCP, TCP_NODELAY);
    setopt("set TCP_QUICKACK 0", c, IPPROTO_TCP, TCP_QUICKACK, 0);
    opt("TCP_QUICKACK", c, IPPROTO_TCP, TCP_QUICKACK);
    setopt("set SO_RCVBUF 8192", c, SOL_SOCKET, SO_RCVBUF, 8192);
    opt("SO_RCVBUF", c, SOL_SOCKET, SO_RCVBUF);
    setopt("set SO_SNDBUF 8192", c, SOL_SOCKET, SO_SNDBUF, 8192);
    opt("SO_SNDBUF", c, SOL_SOCKET, SO_SNDBUF);
    setopt("set SO_RCVLOWAT 3", c, SOL_SOCKET, SO_RCVLOWAT, 3);
    opt("SO_RCVLOWAT", c, SOL_SOCKET, SO_RCVLOWAT);
    setopt("set SO_RCVLOWAT 0", c, SOL_SOCKET, SO_RCVLOWAT, 0);
    opt("SO_RCVLOWAT after 0", c, SOL_SOCKET, SO_RCVLOWAT);
    setopt("set SO_RCVLOWAT -1", c, SOL_SOCKET, SO_RCVLOWAT, -1);
    opt("SO_RCVLOWAT after -1", c, SOL_SOCKET, SO_RCVLOWAT);
    struct linger l = {1, 7};
    T("set SO_LINGER {1,7}", setsockopt(c, SOL_SOCKET, SO_LINGER, &l, sizeof l));
    memset(&l, 0, sizeof l);
    socklen_t len = sizeof l;
    T("SO_LINGER", getsockopt(c, SOL_SOCKET, SO_LINGER, &l, &len));
    say("  {%d, %d}", l.l_onoff, l.l_linger);
    struct timeval tv = {1, 500000};
    T("set SO_RCVTIMEO 1.5 s", setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
    memset(&tv, 0, sizeof tv);
    len = sizeof tv;
    T("SO_RCVTIMEO", getsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, &len));
    say("  %ld.%06ld", (long)tv.tv_sec, (long)tv.tv_usec);
    opt("SO_ERROR", c, SOL_SOCKET, SO_ERROR);
    setopt("set SO_ERROR", c, SOL_SOCKET, SO_ERROR, 1);
    int v = 0;
    len = 2;
    T("SO_TYPE into 2 bytes", getsockopt(c, SOL_SOCKET, SO_TYPE, &v, &len));
    say("  len %u", len);
    T("setsockopt SO_RCVLOWAT short", setsockopt(c, SOL_SOCKET, SO_RCVLOWAT, &v, 2));
    T("getsockopt bad level", getsockopt(c, 12345, 1, &v, &len));
}

static void maxseg(void) {
    /* Linux bounds the MSS by half the largest window the peer advertised, which grows as
     * bytes flow. */
    int s, c;
    pair(&s, &c);
    opt("TCP_MAXSEG", c, IPPROTO_TCP, TCP_MAXSEG);
    opt("TCP_MAXSEG server", s, IPPROTO_TCP, TCP_MAXSEG);
    setopt("set TCP_MAXSEG 1000", c, IPPROTO_TCP, TCP_MAXSEG, 1000);
    setopt("set TCP_MAXSEG 10", c, IPPROTO_TCP, TCP_MAXSEG, 10);
}

static void bad_buffers(void) {
    /* A buffer the process cannot reach: the kernel fails the call with EFAULT. */
    int s, c;
    pair(&s, &c);
    void *bad = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    T("send from a bad buffer", send(c, bad, 4, 0));
    T("write from a bad buffer", write(c, bad, 4));
    T("send 4", send(c, "abcd", 4, 0));
    settle(50);
    T("recv into a bad buffer", recv(s, bad, 4, 0));
    T("read into a bad buffer", read(s, bad, 4));
    drain("recv the bytes", s, 8);
}

static void bad_vectors(void) {
    int s, c;
    char b[8];
    pair(&s, &c);
    struct iovec *badv = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    T("writev with a bad iovec array", writev(c, badv, 2));
    T("send 4", send(c, "abcd", 4, 0));
    settle(50);
    T("readv with a bad iovec array", readv(s, badv, 2));
    struct msghdr m = {.msg_iov = badv, .msg_iovlen = 1};
    T("recvmsg with a bad iovec array", recvmsg(s, &m, 0));
    T("recvmsg with a bad msghdr", recvmsg(s, (struct msghdr *)badv, 0));
    T("recv 8", recv(s, b, sizeof b, MSG_DONTWAIT));
}

static void linger_unread(void) {
    /* SO_LINGER {1, 1}, closed with bytes it never read: the kernel resets at once. */
    int s, c;
    char b[8];
    pair(&s, &c);
    struct linger l = {1, 1};
    setsockopt(c, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    T("send to client", send(s, "abcd", 4, 0));
    settle(50);
    T("close client", close(c));
    settle(50);
    mask("poll server", pmask(s));
    T("recv server", recv(s, b, sizeof b, MSG_DONTWAIT));
    T("send server", send(s, "x", 1, MSG_NOSIGNAL));
}

static void linger_unsent(void) {
    /* SO_LINGER {1, 5}, closed with bytes the peer has yet to read: every byte arrives, then
     * the end of the stream (no reset, as with SO_LINGER {1, 0}). */
    int s, c;
    pair(&s, &c);
    struct linger l = {1, 5};
    setsockopt(c, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    fcntl(c, F_SETFL, O_NONBLOCK);
    static char big[1 << 16];
    long total = 0;
    ssize_t n;
    for (int i = 0; i < 64 && (n = send(c, big, sizeof big, 0)) > 0; i++) total += n;
    pid_t p = fork();
    if (p == 0) {
        close(c);
        settle(300);
        long got = 0;
        while ((n = recv(s, big, sizeof big, 0)) > 0) got += n;
        _exit(got == total && n == 0 ? 0 : 1);
    }
    close(s);
    /* Whether the kernel's close waits depends on how much of it the peer's receive buffer took
     * (autotuned), so the transcript says nothing of the wait. */
    T("close client", close(c));
    int st;
    waitpid(p, &st, 0);
    say("  peer read every byte, then the end: %s", WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "yes" : "no");
}

static void accepted_flags(void) {
    struct sockaddr_in a;
    int l = listener(&a);
    fcntl(l, F_SETFL, O_NONBLOCK);
    int c1 = socket(AF_INET, SOCK_STREAM, 0), c2 = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c1, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    struct pollfd p = {.fd = l, .events = POLLIN};
    poll(&p, 1, 5000);
    int s1 = accept(l, NULL, NULL);
    if (s1 < 0) die("accept");
    say("  accept on a non-blocking listener: O_NONBLOCK %s, FD_CLOEXEC %s", fcntl(s1, F_GETFL) & O_NONBLOCK ? "yes" : "no",
        fcntl(s1, F_GETFD) & FD_CLOEXEC ? "yes" : "no");
    if (connect(c2, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    poll(&p, 1, 5000);
    int s2 = accept4(l, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (s2 < 0) die("accept4");
    say("  accept4 NONBLOCK|CLOEXEC: O_NONBLOCK %s, FD_CLOEXEC %s", fcntl(s2, F_GETFL) & O_NONBLOCK ? "yes" : "no",
        fcntl(s2, F_GETFD) & FD_CLOEXEC ? "yes" : "no");
    say("  F_GETFL access mode O_RDWR: %s", (fcntl(s2, F_GETFL) & O_ACCMODE) == O_RDWR ? "yes" : "no");
    char b[4];
    T("recv on the accept4 one", recv(s2, b, sizeof b, 0));
    T("accept with nothing waiting", accept(l, NULL, NULL));
    T("accept4 with bad flags", accept4(l, NULL, NULL, 0x40000000));
    T("send c1", send(c1, "ab", 2, 0));
    T("send c2", send(c2, "cd", 2, 0));
    T("recv s1", recv(s1, b, sizeof b, 0));
    T("recv s2", recv(s2, b, sizeof b, MSG_WAITALL));
    __atomic_add_fetch(diff_conns, 2, __ATOMIC_SEQ_CST);
}

int main(void) {
    diff_begin();
    RUN(names_after_shutdown);
    RUN(names_after_reset);
    RUN(shut_rdwr);
    RUN(write_after_close);
    RUN(connected_calls);
    RUN(zero_vectors);
    RUN(peek_waitall);
    RUN(peek_off);
    RUN(queue_ioctls);
    RUN(option_round_trips);
    RUN(maxseg);
    RUN(bad_buffers);
    RUN(bad_vectors);
    RUN(linger_unread);
    RUN(linger_unsent);
    RUN(accepted_flags);
    diff_end();
    return 0;
}
