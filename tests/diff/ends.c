/* Calls at the ends of a connection's life and beside it: zero-length calls once the stream is
 * shut down or reset, a write blocked when the peer resets, the send queue as the peer drains,
 * an epoll registration whose only descriptor another thread closes, a listener closed with
 * connections it never accepted, select over accelerated and plain descriptors, and owner
 * fcntls. */
#include "diff.h"
#include <pthread.h>
#include <linux/sockios.h>
#include <sys/select.h>

static volatile sig_atomic_t pipes;
static void on_pipe(int sig) { (void)sig; pipes++; }

static void abort_close(int fd) {
    struct linger l = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close(fd);
}

/* Every zero-length call on `fd`, with the SIGPIPEs they raised. */
static void zero_calls(int fd) {
    char b[4] = {0};
    struct iovec none = {b, 0};
    struct msghdr m = {.msg_iov = &none, .msg_iovlen = 1};
    pipes = 0;
    T("send 0", send(fd, b, 0, 0));
    T("send 0 NOSIGNAL", send(fd, b, 0, MSG_NOSIGNAL));
    T("write 0", write(fd, b, 0));
    T("writev of no iovec", writev(fd, &none, 0));
    T("writev of a zero-length iovec", writev(fd, &none, 1));
    T("sendmsg 0", sendmsg(fd, &m, 0));
    T("recv 0", recv(fd, b, 0, MSG_DONTWAIT));
    T("read 0", read(fd, b, 0));
    T("readv of a zero-length iovec", readv(fd, &none, 1));
    say("  SIGPIPE %d", pipes);
}

static void zero_after_shut_wr(void) {
    int s, c;
    pair(&s, &c);
    signal(SIGPIPE, on_pipe);
    shutdown(c, SHUT_WR);
    zero_calls(c);
    say_error("SO_ERROR", c);
}

static void zero_after_shut_rdwr(void) {
    int s, c;
    pair(&s, &c);
    signal(SIGPIPE, on_pipe);
    shutdown(c, SHUT_RDWR);
    zero_calls(c);
}

static void zero_after_peer_fin(void) {
    int s, c;
    pair(&s, &c);
    signal(SIGPIPE, on_pipe);
    close(s);
    settle(50);
    zero_calls(c);
    say_error("SO_ERROR", c);
}

static void zero_after_peer_reset(void) {
    int s, c;
    pair(&s, &c);
    signal(SIGPIPE, on_pipe);
    abort_close(s);
    settle(50);
    zero_calls(c);
    say_error("SO_ERROR", c);
    zero_calls(c);
}

static void zero_after_shut_rd(void) {
    int s, c;
    pair(&s, &c);
    signal(SIGPIPE, on_pipe);
    shutdown(c, SHUT_RD);
    zero_calls(c);
}

/* A child of a fork shuts the shared connection down for writing: the parent's zero-length
 * calls see it as the child's own would. */
static void zero_after_child_shut_wr(void) {
    int s, c;
    pair(&s, &c);
    signal(SIGPIPE, on_pipe);
    pid_t p = fork();
    if (p == 0) {
        shutdown(c, SHUT_WR);
        _exit(0);
    }
    waitpid(p, NULL, 0);
    zero_calls(c);
    say_error("SO_ERROR", c);
}

static void *send_big(void *fd) {
    static char buf[32 << 20];
    errno = 0;
    ssize_t n = send(*(int *)fd, buf, sizeof buf, MSG_NOSIGNAL);
    say("  blocked send = %s", n < 0 ? ename(errno) : n == 0 ? "0" : n < (ssize_t)sizeof buf ? "part" : "all");
    return NULL;
}

/* A connection whose peer resets while a thread's send waits for room; returns our end. */
static int reset_under_a_waiting_send(void) {
    static int s, c;
    pair(&s, &c);
    pthread_t t;
    pthread_create(&t, NULL, send_big, &c);
    settle(300);
    abort_close(s);
    pthread_join(t, NULL);
    settle(50);
    return c;
}

static void reset_while_a_send_waits(void) {
    /* A send waiting for room when the peer resets: it returns what it moved; the reset stays
     * the socket's error, which SO_ERROR reports (and clears) before the next send. */
    char b[8];
    int c = reset_under_a_waiting_send();
    mask("poll", pmask(c));
    say_error("SO_ERROR", c);
    say_error("SO_ERROR again", c);
    T("send", send(c, "ab", 2, MSG_NOSIGNAL));
    T("recv", recv(c, b, sizeof b, MSG_DONTWAIT));
}

static void reset_while_a_send_waits_no_look(void) {
    /* As above, with no SO_ERROR look: the next send reports the reset. */
    char b[8];
    int c = reset_under_a_waiting_send();
    T("send", send(c, "ab", 2, MSG_NOSIGNAL));
    T("send again", send(c, "ab", 2, MSG_NOSIGNAL));
    T("recv", recv(c, b, sizeof b, MSG_DONTWAIT));
    say_error("SO_ERROR", c);
}

static void outq_as_the_peer_drains(void) {
    /* SIOCOUTQ/SIOCOUTQNSD count what the peer has not taken: some while it reads nothing,
     * none once it read everything. */
    static char buf[65536];
    int s, c;
    pair(&s, &c);
    long total = 0;
    ssize_t n;
    while ((n = send(c, buf, sizeof buf, MSG_DONTWAIT)) > 0) total += n;
    int q = -1, nsd = -1;
    ioctl(c, SIOCOUTQ, &q);
    ioctl(c, SIOCOUTQNSD, &nsd);
    say("  full: SIOCOUTQ > 0 %s, SIOCOUTQNSD <= SIOCOUTQ %s", q > 0 ? "yes" : "no", nsd <= q ? "yes" : "no");
    long got = 0;
    while (got < total && (n = recv(s, buf, sizeof buf, 0)) > 0) got += n;
    say("  peer read all: %s", got == total ? "yes" : "no");
    settle(100);
    ioctl(c, SIOCOUTQ, &q);
    ioctl(c, SIOCOUTQNSD, &nsd);
    say("  drained: SIOCOUTQ %d, SIOCOUTQNSD %d", q, nsd);
}

static int closed_fd;
static void *close_later(void *arg) {
    (void)arg;
    settle(200);
    close(closed_fd);
    return NULL;
}

static void epoll_wait_on_a_closed_fd(void) {
    /* Another thread closes the only descriptor of a registered connection while epoll_wait
     * sleeps: the registration goes with it; bytes sent after do not wake the wait. */
    int s, c;
    pair(&s, &c);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = 7}, out;
    epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
    closed_fd = s;
    pthread_t t;
    pthread_create(&t, NULL, close_later, NULL);
    T("epoll_wait 700 ms", epoll_wait(ep, &out, 1, 700));
    pthread_join(t, NULL);
    T("send to it", send(c, "ab", 2, MSG_NOSIGNAL));
    T("epoll_wait after", epoll_wait(ep, &out, 1, 300));
    T("poll the peer", pmask(c));
}

static void epoll_wakeup_flag(void) {
    /* EPOLLWAKEUP (needs CAP_BLOCK_SUSPEND, else dropped silently) is never reported. */
    int s, c;
    pair(&s, &c);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLWAKEUP, .data.u32 = 7}, out;
    T("ADD IN|WAKEUP", epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev));
    send(c, "ab", 2, 0);
    settle(50);
    int n = epoll_wait(ep, &out, 1, 1000);
    mask("events", n == 1 ? out.events : 0);
    say("  WAKEUP in events: %s", n == 1 && (out.events & EPOLLWAKEUP) ? "yes" : "no");
    ev.events = EPOLLOUT | EPOLLWAKEUP | EPOLLET;
    T("MOD OUT|WAKEUP|ET", epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev));
    n = epoll_wait(ep, &out, 1, 1000);
    mask("events", n == 1 ? out.events : 0);
    T("again (edge)", epoll_wait(ep, &out, 1, 0));
}

static void listener_closed_unaccepted(void) {
    /* A listener closed with a connection it never accepted: the kernel resets that one. */
    struct sockaddr_in a;
    int s, c;
    pair(&s, &c);
    int l = listener(&a);
    int u = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(u, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    T("send to the unaccepted", send(u, "hi", 2, MSG_NOSIGNAL));
    settle(100);
    close(l);
    settle(100);
    char b[8];
    struct pollfd p = {.fd = u, .events = POLLIN | POLLOUT | POLLRDHUP};
    T("poll", poll(&p, 1, 3000));
    mask("revents", (unsigned short)p.revents);
    T("recv", recv(u, b, sizeof b, 0));
    T("recv again", recv(u, b, sizeof b, MSG_DONTWAIT));
    T("send", send(u, "x", 1, MSG_NOSIGNAL));
    T("the settled pair still works", send(c, "ok", 2, 0));
    T("recv", recv(s, b, sizeof b, 0));
}

static void select_mixed(void) {
    /* select over a pipe, a Unix socket pair and a connection, each in the read, write and
     * exception sets. */
    int s, c, p[2], u[2];
    pair(&s, &c);
    if (pipe(p) < 0 || socketpair(AF_UNIX, SOCK_STREAM, 0, u) < 0) die("pipe");
    int fds[] = {p[0], p[1], u[0], s};
    const char *names[] = {"pipe r", "pipe w", "unix", "conn"};
    int top = 0;
    for (int i = 0; i < 4; i++) top = fds[i] > top ? fds[i] : top;
    fd_set rd, wr, ex;
#define LOOK(what)                                                                                   \
    do {                                                                                             \
        FD_ZERO(&rd); FD_ZERO(&wr); FD_ZERO(&ex);                                                    \
        for (int i = 0; i < 4; i++) { FD_SET(fds[i], &rd); FD_SET(fds[i], &wr); FD_SET(fds[i], &ex); } \
        struct timeval tv = {0, 0};                                                                  \
        T(what, select(top + 1, &rd, &wr, &ex, &tv));                                                \
        for (int i = 0; i < 4; i++)                                                                  \
            say("    %s r%d w%d x%d", names[i], FD_ISSET(fds[i], &rd) != 0, FD_ISSET(fds[i], &wr) != 0,  \
                FD_ISSET(fds[i], &ex) != 0);                                                         \
    } while (0)
    LOOK("idle");
    write(p[1], "a", 1);
    write(u[1], "b", 1);
    send(c, "c", 1, 0);
    settle(50);
    LOOK("each readable");
    char b[4];
    read(p[0], b, 1);
    read(u[0], b, 1);
    recv(s, b, 1, 0);
    shutdown(c, SHUT_WR);
    settle(50);
    LOOK("the connection's peer shut down writing");
    /* Only exceptions asked: none of them has any. */
    FD_ZERO(&ex);
    for (int i = 0; i < 4; i++) FD_SET(fds[i], &ex);
    struct timeval tv = {0, 200000};
    T("select, exceptions only, 200 ms", select(top + 1, NULL, NULL, &ex, &tv));
    /* A wait over the plain ones that the connection ends. */
    FD_ZERO(&rd);
    FD_SET(p[0], &rd);
    FD_SET(u[0], &rd);
    int s2, c2;
    pair(&s2, &c2);
    FD_SET(s2, &rd);
    top = s2 > top ? s2 : top;
    pid_t k = fork();
    if (k == 0) {
        settle(200);
        send(c2, "z", 1, 0);
        _exit(0);
    }
    tv = (struct timeval){5, 0};
    T("select 5 s, the connection sends at 200 ms", select(top + 1, &rd, NULL, NULL, &tv));
    say("    pipe %d unix %d conn %d", FD_ISSET(p[0], &rd) != 0, FD_ISSET(u[0], &rd) != 0, FD_ISSET(s2, &rd) != 0);
    waitpid(k, NULL, 0);
}

static void owner_fcntls(void) {
    int s, c;
    pair(&s, &c);
    T("F_GETOWN", fcntl(s, F_GETOWN));
    T("F_SETOWN pid", fcntl(s, F_SETOWN, getpid()));
    say("  F_GETOWN is the pid: %s", fcntl(s, F_GETOWN) == getpid() ? "yes" : "no");
    struct f_owner_ex o = {F_OWNER_TID, gettid()};
    T("F_SETOWN_EX tid", fcntl(s, F_SETOWN_EX, &o));
    memset(&o, 0, sizeof o);
    T("F_GETOWN_EX", fcntl(s, F_GETOWN_EX, &o));
    say("  type %s, the tid: %s", o.type == F_OWNER_TID ? "TID" : "other", o.pid == gettid() ? "yes" : "no");
    T("F_SETSIG SIGUSR2", fcntl(s, F_SETSIG, SIGUSR2));
    say("  F_GETSIG is SIGUSR2: %s", fcntl(s, F_GETSIG) == SIGUSR2 ? "yes" : "no");
    T("F_SETOWN 0", fcntl(s, F_SETOWN, 0));
    T("F_GETOWN", fcntl(s, F_GETOWN));
    char b[4];
    T("send", send(c, "ab", 2, 0));
    T("recv", recv(s, b, sizeof b, 0));
}

int main(void) {
    diff_begin();
    RUN(zero_after_shut_wr);
    RUN(zero_after_shut_rdwr);
    RUN(zero_after_peer_fin);
    RUN(zero_after_peer_reset);
    RUN(zero_after_shut_rd);
    RUN(zero_after_child_shut_wr);
    RUN(reset_while_a_send_waits);
    RUN(reset_while_a_send_waits_no_look);
    RUN(outq_as_the_peer_drains);
    RUN(epoll_wait_on_a_closed_fd);
    RUN(epoll_wakeup_flag);
    RUN(listener_closed_unaccepted);
    RUN(select_mixed);
    RUN(owner_fcntls);
    diff_end();
    return 0;
}
