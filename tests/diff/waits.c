/* Waiting: every poll bit (RDNORM, WRNORM, RDBAND, NVAL), select's three sets, the signal-mask
 * waits (ppoll, pselect, epoll_pwait, epoll_pwait2) with a signal pending or coming, epoll
 * registrations changed and removed, a descriptor changed under a thread blocked on it
 * (O_NONBLOCK set, closed; closed under select and pselect), the time select did not sleep,
 * and timeouts the kernel refuses. */
#include "diff.h"
#include <pthread.h>
#include <sys/select.h>

static unsigned pmask_of(int fd, short events) {
    struct pollfd p = {.fd = fd, .events = events};
    return poll(&p, 1, 0) == 1 ? (unsigned short)p.revents : 0;
}

static void poll_bits(void) {
    int s, c;
    char b[8];
    pair(&s, &c);
    short every = POLLIN | POLLPRI | POLLOUT | POLLRDNORM | POLLRDBAND | POLLWRNORM | POLLWRBAND | POLLRDHUP;
    mask("idle, every bit", pmask_of(s, every));
    mask("idle, RDNORM only", pmask_of(s, POLLRDNORM));
    mask("idle, WRNORM only", pmask_of(s, POLLWRNORM));
    mask("idle, no events", pmask_of(s, 0));
    send(c, "ab", 2, 0);
    settle(50);
    mask("bytes, every bit", pmask_of(s, every));
    mask("bytes, RDNORM only", pmask_of(s, POLLRDNORM));
    mask("bytes, RDBAND only", pmask_of(s, POLLRDBAND));
    mask("bytes, PRI only", pmask_of(s, POLLPRI));
    recv(s, b, sizeof b, 0);
    shutdown(c, SHUT_WR);
    settle(50);
    mask("peer's FIN, every bit", pmask_of(s, every));
    mask("peer's FIN, no events", pmask_of(s, 0));
    mask("peer's FIN, RDHUP only", pmask_of(s, POLLRDHUP));
    shutdown(s, SHUT_WR);
    settle(50);
    mask("both shut, every bit", pmask_of(s, every));
    mask("both shut, no events", pmask_of(s, 0));
    mask("both shut, client, OUT only", pmask_of(c, POLLOUT));
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDNORM | EPOLLWRNORM | EPOLLRDBAND}, out;
    epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
    int n = epoll_wait(ep, &out, 1, 0);
    mask("epoll both shut, IN|RDNORM|WRNORM|RDBAND", n == 1 ? out.events : 0);
}

static void poll_closed_fd(void) {
    int s, c, d;
    pair(&s, &c);
    d = dup(c);
    close(d);
    send(c, "a", 1, 0);
    settle(50);
    struct pollfd p[3] = {{.fd = s, .events = POLLIN}, {.fd = d, .events = POLLIN}, {.fd = c, .events = POLLOUT}};
    T("poll with a closed fd", poll(p, 3, 1000));
    mask("revents[0]", (unsigned short)p[0].revents);
    mask("revents[1] (closed)", (unsigned short)p[1].revents);
    mask("revents[2]", (unsigned short)p[2].revents);
    struct pollfd q = {.fd = d, .events = 0};
    T("poll of the closed fd alone, no events", poll(&q, 1, 1000));
    mask("revents", (unsigned short)q.revents);
    close(s);
    struct pollfd r[2] = {{.fd = s, .events = POLLIN}, {.fd = c, .events = POLLIN}};
    settle(50);
    T("poll after closing the server", poll(r, 2, 1000));
    mask("revents[0] (closed)", (unsigned short)r[0].revents);
    mask("revents[1]", (unsigned short)r[1].revents);
    fd_set rd;
    FD_ZERO(&rd);
    FD_SET(s, &rd);
    FD_SET(c, &rd);
    struct timeval tv = {0, 0};
    T("select with a closed fd", select((s > c ? s : c) + 1, &rd, NULL, NULL, &tv));
}

static void select_sets(void) {
    int s, c;
    pair(&s, &c);
    fd_set rd, wr, ex;
    struct timeval tv = {0, 0};
    int top = (s > c ? s : c) + 1;
#define SETS() do { FD_ZERO(&rd); FD_ZERO(&wr); FD_ZERO(&ex); FD_SET(s, &rd); FD_SET(s, &wr); FD_SET(s, &ex); \
                     FD_SET(c, &rd); FD_SET(c, &ex); tv = (struct timeval){0, 0}; } while (0)
#define SHOW(what) say("  %s: server r%d w%d x%d, client r%d x%d", what, FD_ISSET(s, &rd) != 0, FD_ISSET(s, &wr) != 0, \
                       FD_ISSET(s, &ex) != 0, FD_ISSET(c, &rd) != 0, FD_ISSET(c, &ex) != 0)
    SETS();
    T("select idle", select(top, &rd, &wr, &ex, &tv));
    SHOW("idle");
    send(c, "ab", 2, 0);
    settle(50);
    SETS();
    T("select with bytes", select(top, &rd, &wr, &ex, &tv));
    SHOW("bytes");
    shutdown(c, SHUT_WR);
    settle(50);
    SETS();
    T("select after the peer's FIN", select(top, &rd, &wr, &ex, &tv));
    SHOW("FIN");
    struct linger l = {1, 0};
    setsockopt(c, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close(c);
    settle(50);
    FD_ZERO(&rd);
    FD_ZERO(&wr);
    FD_ZERO(&ex);
    FD_SET(s, &rd);
    FD_SET(s, &wr);
    FD_SET(s, &ex);
    tv = (struct timeval){0, 0};
    T("select after the reset", select(s + 1, &rd, &wr, &ex, &tv));
    say("  reset: server r%d w%d x%d", FD_ISSET(s, &rd) != 0, FD_ISSET(s, &wr) != 0, FD_ISSET(s, &ex) != 0);
}

static volatile sig_atomic_t caught;
static void on_signal(int sig) { (void)sig; caught++; }

/* SIGUSR1 handled and blocked; `open_` the mask that unblocks it, `block` one of it alone. */
static void usr1_blocked(sigset_t *block, sigset_t *open_) {
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGUSR1, &sa, NULL);
    sigemptyset(block);
    sigaddset(block, SIGUSR1);
    sigprocmask(SIG_BLOCK, block, open_);
    sigdelset(open_, SIGUSR1);
}

/* SIGUSR1 blocked and pending; each wait unblocks it through its mask: EINTR at once, handled. */
static void masked_waits(void) {
    int s, c;
    pair(&s, &c);
    sigset_t block, open_;
    usr1_blocked(&block, &open_);
    struct timespec ten = {10, 0};

    raise(SIGUSR1);
    struct pollfd p = {.fd = s, .events = POLLIN};
    T("ppoll, signal pending", ppoll(&p, 1, &ten, &open_));
    say("  handled %d", caught);

    raise(SIGUSR1);
    fd_set rd;
    FD_ZERO(&rd);
    FD_SET(s, &rd);
    T("pselect, signal pending", pselect(s + 1, &rd, NULL, NULL, &ten, &open_));
    say("  handled %d", caught);

    raise(SIGUSR1);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = s}, out;
    epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
    T("epoll_pwait, signal pending", epoll_pwait(ep, &out, 1, 10000, &open_));
    say("  handled %d", caught);

    /* Ready and a signal pending: the kernel reports the events, the handler still runs. */
    send(c, "ab", 2, 0);
    settle(50);
    raise(SIGUSR1);
    T("ppoll, ready and a signal pending", ppoll(&p, 1, &ten, &open_));
    say("  handled %d", caught);
    raise(SIGUSR1);
    T("epoll_pwait, ready and a signal pending", epoll_pwait(ep, &out, 1, 10000, &open_));
    say("  handled %d", caught);
    raise(SIGUSR1);
    T("pselect, ready and a signal pending", pselect(s + 1, &rd, NULL, NULL, &ten, &open_));
    say("  handled %d", caught);
    /* A mask that keeps it blocked: the wait just waits. */
    T("ppoll, ready, still blocked", ppoll(&p, 1, &ten, &block));
    say("  handled %d", caught);
    sigset_t now;
    sigprocmask(SIG_SETMASK, NULL, &now);
    say("  SIGUSR1 blocked after: %s", sigismember(&now, SIGUSR1) ? "yes" : "no");
}

static void *signal_later(void *arg) {
    settle(200);
    kill(getpid(), SIGUSR1);
    (void)arg;
    return NULL;
}

/* SIGUSR1 blocked, unblocked by each wait's mask, sent 200 ms into the wait: EINTR, the
 * handler ran once. The sending thread blocks it too (it inherits the mask), so the waiter
 * takes it. */
static void signal_during_masked_waits(void) {
    int s, c;
    pthread_t t;
    pair(&s, &c);
    sigset_t block, open_;
    usr1_blocked(&block, &open_);
    struct timespec ten = {10, 0};
    struct pollfd p = {.fd = s, .events = POLLIN};
    pthread_create(&t, NULL, signal_later, NULL);
    T("ppoll", ppoll(&p, 1, &ten, &open_));
    say("  handled %d", caught);
    pthread_join(t, NULL);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = s}, out;
    epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
    pthread_create(&t, NULL, signal_later, NULL);
    T("epoll_pwait", epoll_pwait(ep, &out, 1, 10000, &open_));
    say("  handled %d", caught);
    pthread_join(t, NULL);
    pthread_create(&t, NULL, signal_later, NULL);
    T("epoll_pwait2", epoll_pwait2(ep, &out, 1, &ten, &open_));
    say("  handled %d", caught);
    pthread_join(t, NULL);
    fd_set rd;
    FD_ZERO(&rd);
    FD_SET(s, &rd);
    pthread_create(&t, NULL, signal_later, NULL);
    T("pselect", pselect(s + 1, &rd, NULL, NULL, &ten, &open_));
    say("  handled %d", caught);
    pthread_join(t, NULL);
}

static void epoll_changes(void) {
    int s, c;
    char b[8];
    pair(&s, &c);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = s}, out[2];
    T("ADD IN", epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev));
    T("ADD again", epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev));
    T("wait idle", epoll_wait(ep, out, 2, 0));
    ev.events = EPOLLOUT;
    T("MOD to OUT", epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev));
    int n = epoll_wait(ep, out, 2, 0);
    mask("wait after MOD", n == 1 ? out[0].events : 0);
    send(c, "ab", 2, 0);
    settle(50);
    n = epoll_wait(ep, out, 2, 0);
    mask("bytes, OUT only", n == 1 ? out[0].events : 0);
    ev.events = EPOLLIN | EPOLLET;
    T("MOD to IN|ET", epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev));
    n = epoll_wait(ep, out, 2, 0);
    mask("after MOD to IN|ET", n == 1 ? out[0].events : 0);
    T("again (edge)", epoll_wait(ep, out, 2, 0));
    T("MOD again, same", epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev));
    n = epoll_wait(ep, out, 2, 0);
    mask("after a MOD re-arms", n == 1 ? out[0].events : 0);
    T("DEL", epoll_ctl(ep, EPOLL_CTL_DEL, s, NULL));
    T("DEL again", epoll_ctl(ep, EPOLL_CTL_DEL, s, NULL));
    T("MOD unregistered", epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev));
    send(c, "cd", 2, 0);
    settle(50);
    T("wait after DEL", epoll_wait(ep, out, 2, 0));
    T("recv", recv(s, b, sizeof b, 0));
    ev.events = EPOLLIN | EPOLLEXCLUSIVE;
    T("ADD EXCLUSIVE", epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev));
    T("MOD an EXCLUSIVE one", epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev));
    T("DEL EXCLUSIVE", epoll_ctl(ep, EPOLL_CTL_DEL, s, NULL));
    ev.events = EPOLLIN | EPOLLEXCLUSIVE | EPOLLONESHOT;
    T("ADD EXCLUSIVE|ONESHOT", epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev));
    T("ADD the epoll set to itself", epoll_ctl(ep, EPOLL_CTL_ADD, ep, &ev));
    T("ADD a bad fd", epoll_ctl(ep, EPOLL_CTL_ADD, 999, &ev));
    ev.events = EPOLLIN;
    T("ADD with a bad op", epoll_ctl(ep, 99, s, &ev));
    T("wait with maxevents 0", epoll_wait(ep, out, 0, 0));
    T("wait on the socket itself", epoll_wait(s, out, 1, 0));
}

static void *recv_thread(void *fd) {
    char b[8];
    errno = 0;
    ssize_t n = recv(*(int *)fd, b, sizeof b, 0);
    say("  thread's blocking recv = %zd %s", n, n < 0 ? ename(errno) : "");
    return NULL;
}

static void nonblock_while_waiting(void) {
    /* O_NONBLOCK set while another thread waits in a blocking recv: that recv keeps waiting. */
    int s, c;
    pthread_t t;
    pair(&s, &c);
    pthread_create(&t, NULL, recv_thread, &s);
    settle(200);
    T("F_SETFL O_NONBLOCK", fcntl(s, F_SETFL, O_NONBLOCK));
    settle(200);
    say("  sending");
    send(c, "ab", 2, 0);
    pthread_join(t, NULL);
    char b[4];
    T("recv now (non-blocking)", recv(s, b, sizeof b, 0));
}

static void close_while_waiting(void) {
    /* close() while another thread waits in recv on the number: the kernel's recv keeps the
     * socket and waits on; the peer sees no end until it returns. */
    int s, c;
    char b[4];
    pthread_t t;
    pair(&s, &c);
    pthread_create(&t, NULL, recv_thread, &s);
    settle(200);
    int fd = s;
    T("close", close(fd));
    settle(100);
    mask("peer while the recv waits", pmask(c));
    say("  sending");
    ssize_t n = send(c, "ab", 2, 0); /* said after the join: the thread's line may come first */
    pthread_join(t, NULL);
    say("  send = %zd", n);
    settle(50);
    mask("peer after the recv returned", pmask(c));
    T("peer's recv", recv(c, b, sizeof b, MSG_DONTWAIT));
}

static void *poll_thread(void *fd) {
    struct pollfd p = {.fd = *(int *)fd, .events = POLLIN};
    int n = poll(&p, 1, 3000);
    say("  thread's poll = %d", n);
    mask("  thread's revents", (unsigned short)p.revents);
    return NULL;
}

static void close_while_polling(void) {
    /* close() while another thread is in poll on it: the poll goes on watching the socket. */
    int s, c;
    pthread_t t;
    pair(&s, &c);
    pthread_create(&t, NULL, poll_thread, &s);
    settle(200);
    T("close", close(s));
    settle(100);
    say("  sending");
    ssize_t n = send(c, "ab", 2, 0); /* said after the join: the thread's line may come first */
    pthread_join(t, NULL);
    say("  send = %zd", n);
}


static int select_one(int fd, int top, int timed_ms, int use_pselect, fd_set *rd) {
    if (use_pselect) {
        struct timespec ts = {timed_ms / 1000, (timed_ms % 1000) * 1000000L};
        return pselect(top, rd, NULL, NULL, &ts, NULL);
    }
    struct timeval tv = {timed_ms / 1000, (timed_ms % 1000) * 1000L};
    (void)fd;
    return select(top, rd, NULL, NULL, &tv);
}

struct sel { int fd, other, use_pselect; };

static void *select_thread(void *arg) {
    struct sel *a = arg;
    fd_set rd;
    FD_ZERO(&rd);
    FD_SET(a->fd, &rd);
    if (a->other >= 0) FD_SET(a->other, &rd);
    int top = (a->fd > a->other ? a->fd : a->other) + 1;
    errno = 0;
    int n = select_one(a->fd, top, 1500, a->use_pselect, &rd);
    say("  thread's %s = %d %s, closed one set: %d, other set: %d", a->use_pselect ? "pselect" : "select", n,
        n < 0 ? ename(errno) : "", FD_ISSET(a->fd, &rd) != 0, a->other >= 0 && FD_ISSET(a->other, &rd) != 0);
    return NULL;
}

/* close() of a number another thread waits on in select: the kernel checked the sets when the
 * select began, and looking again on a wake-up it finds no file at the number and leaves it out;
 * the select sleeps on (to its timeout, or until another number in it is ready). */
static void select_close(int use_pselect, int with_other) {
    int s, c, s2 = -1, c2 = -1;
    pthread_t t;
    pair(&s, &c);
    if (with_other) pair(&s2, &c2);
    struct sel a = {s, s2, use_pselect};
    pthread_create(&t, NULL, select_thread, &a);
    settle(200);
    T("close", close(s));
    settle(100);
    /* Bytes toward the closed number: the socket is still open (the select holds it) and wakes
     * the select, which finds no file there. */
    ssize_t n = send(c, "ab", 2, 0);
    if (with_other) {
        settle(100);
        send(c2, "cd", 2, 0);
    }
    pthread_join(t, NULL);
    say("  send = %zd", n);
}
static void select_closed_while_sleeping(void) { select_close(0, 0); }
static void pselect_closed_while_sleeping(void) { select_close(1, 0); }
static void select_closed_beside_a_ready_one(void) { select_close(0, 1); }

static void select_timeout_left(void) {
    /* Linux's select writes the time it did not sleep back into the timeval (pselect and
     * ppoll, through glibc, leave theirs). */
    int s, c;
    pair(&s, &c);
    fd_set rd;
    FD_ZERO(&rd);
    FD_SET(s, &rd);
    struct timeval tv = {0, 100000};
    T("select, nothing comes", select(s + 1, &rd, NULL, NULL, &tv));
    say("  left %ld.%06ld", (long)tv.tv_sec, (long)tv.tv_usec);
    send(c, "ab", 2, 0);
    settle(50);
    FD_SET(s, &rd);
    tv = (struct timeval){5, 0};
    T("select, ready", select(s + 1, &rd, NULL, NULL, &tv));
    say("  left more than 4 s: %s, less than 5 s: %s", tv.tv_sec >= 4 ? "yes" : "no",
        tv.tv_sec < 5 ? "yes" : "no");
    tv = (struct timeval){0, 2000000};
    FD_SET(s, &rd);
    T("select, 2,000,000 us, ready", select(s + 1, &rd, NULL, NULL, &tv));
    say("  left more than 1 s: %s", tv.tv_sec >= 1 ? "yes" : "no");
    struct timespec ts = {5, 0};
    FD_SET(s, &rd);
    T("pselect, ready", pselect(s + 1, &rd, NULL, NULL, &ts, NULL));
    say("  timespec %ld.%09ld", (long)ts.tv_sec, ts.tv_nsec);
    struct pollfd p = {.fd = s, .events = POLLIN};
    T("ppoll, ready", ppoll(&p, 1, &ts, NULL));
    say("  timespec %ld.%09ld", (long)ts.tv_sec, ts.tv_nsec);
}

static void bad_timeouts(void) {
    int s, c;
    pair(&s, &c);
    fd_set rd;
    struct pollfd p = {.fd = s, .events = POLLIN};
    struct timespec bad_ns = {0, 1000000000}, neg = {-1, 0};
    T("ppoll tv_nsec 1e9", ppoll(&p, 1, &bad_ns, NULL));
    T("ppoll tv_sec -1", ppoll(&p, 1, &neg, NULL));
    FD_ZERO(&rd);
    FD_SET(s, &rd);
    T("pselect tv_nsec 1e9", pselect(s + 1, &rd, NULL, NULL, &bad_ns, NULL));
    FD_SET(s, &rd);
    T("pselect tv_sec -1", pselect(s + 1, &rd, NULL, NULL, &neg, NULL));
    struct timeval tneg = {-1, 0}, uneg = {0, -1};
    FD_SET(s, &rd);
    T("select tv_sec -1", select(s + 1, &rd, NULL, NULL, &tneg));
    FD_SET(s, &rd);
    T("select tv_usec -1", select(s + 1, &rd, NULL, NULL, &uneg));
    FD_SET(s, &rd);
    T("select nfds -1", select(-1, &rd, NULL, NULL, &(struct timeval){0, 0}));
    volatile nfds_t many = 1 << 30;
    T("poll nfds past the limit", poll(&p, many, 0));
}

int main(void) {
    diff_begin();
    RUN(poll_bits);
    RUN(poll_closed_fd);
    RUN(select_sets);
    RUN(masked_waits);
    RUN(signal_during_masked_waits);
    RUN(epoll_changes);
    RUN(nonblock_while_waiting);
    RUN(close_while_waiting);
    RUN(close_while_polling);
    RUN(select_closed_while_sleeping);
    RUN(pselect_closed_while_sleeping);
    RUN(select_closed_beside_a_ready_one);
    RUN(select_timeout_left);
    RUN(bad_timeouts);
    diff_end();
    return 0;
}
