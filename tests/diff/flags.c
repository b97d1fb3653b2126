/* What a socket carries beyond its bytes: status flags shared by every descriptor of one open
 * socket (dup, fork), options an accepted socket inherits from its listener, low-water marks
 * seen through every wait, a non-blocking connect refused, and a half-closed connection's
 * readiness on both sides over time. */
#include "diff.h"
#include <pthread.h>
#include <sys/select.h>

static void nonblock_shared_by_dup(void) {
    /* O_NONBLOCK is the open socket's, not the number's: set through a dup, the original reads
     * non-blocking too; FIONBIO likewise. FD_CLOEXEC is the number's own. */
    int s, c;
    char b[4];
    pair(&s, &c);
    int d = dup(s);
    T("F_SETFL O_NONBLOCK on the dup", fcntl(d, F_SETFL, O_NONBLOCK));
    say("  original O_NONBLOCK: %s", fcntl(s, F_GETFL) & O_NONBLOCK ? "yes" : "no");
    T("recv on the original", recv(s, b, sizeof b, 0));
    T("FIONBIO 0 on the original", ioctl(s, FIONBIO, &(int){0}));
    say("  dup O_NONBLOCK: %s", fcntl(d, F_GETFL) & O_NONBLOCK ? "yes" : "no");
    T("F_SETFD FD_CLOEXEC on the dup", fcntl(d, F_SETFD, FD_CLOEXEC));
    say("  original FD_CLOEXEC: %s", fcntl(s, F_GETFD) & FD_CLOEXEC ? "yes" : "no");
    pid_t p = fork();
    if (p == 0) {
        fcntl(s, F_SETFL, O_NONBLOCK);
        _exit(0);
    }
    waitpid(p, NULL, 0);
    say("  after a fork child set it: O_NONBLOCK %s", fcntl(d, F_GETFL) & O_NONBLOCK ? "yes" : "no");
    T("recv on the dup", recv(d, b, sizeof b, 0));
}

static void listener_options_inherited(void) {
    /* An accepted socket starts with its listener's options: low-water mark, timeouts,
     * keepalive, no-delay, linger. */
    struct sockaddr_in a;
    int l = listener(&a), low = 4, one = 1;
    struct timeval tv = {0, 300000};
    struct linger lg = {1, 3};
    setsockopt(l, SOL_SOCKET, SO_RCVLOWAT, &low, sizeof low);
    setsockopt(l, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(l, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(l, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(l, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    int s = accept(l, NULL, NULL);
    if (s < 0) die("accept");
    __atomic_add_fetch(diff_conns, 1, __ATOMIC_SEQ_CST);
    int v;
    socklen_t len = sizeof v;
    getsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &v, &len);
    say("  SO_RCVLOWAT %d", v);
    len = sizeof v;
    getsockopt(s, SOL_SOCKET, SO_KEEPALIVE, &v, &len);
    say("  SO_KEEPALIVE %d", v);
    len = sizeof v;
    getsockopt(s, IPPROTO_TCP, TCP_NODELAY, &v, &len);
    say("  TCP_NODELAY %d", v);
    memset(&lg, 0, sizeof lg);
    len = sizeof lg;
    getsockopt(s, SOL_SOCKET, SO_LINGER, &lg, &len);
    say("  SO_LINGER {%d, %d}", lg.l_onoff, lg.l_linger);
    memset(&tv, 0, sizeof tv);
    len = sizeof tv;
    getsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, &len);
    say("  SO_RCVTIMEO %ld.%06ld", (long)tv.tv_sec, (long)tv.tv_usec);
    char b[8];
    T("recv, nothing comes (the inherited timeout)", recv(s, b, sizeof b, 0));
    send(c, "ab", 2, 0);
    settle(50);
    mask("poll below the inherited mark", pmask(s) & POLLIN);
    send(c, "cd", 2, 0);
    settle(50);
    mask("poll at the mark", pmask(s) & POLLIN);
    T("recv", recv(s, b, sizeof b, 0));
}

static void rcvlowat_select(void) {
    int s, c, low = 8;
    char b[16];
    pair(&s, &c);
    setsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &low, sizeof low);
    send(c, "abcd", 4, 0);
    settle(50);
    fd_set rd;
    FD_ZERO(&rd);
    FD_SET(s, &rd);
    T("select below the mark", select(s + 1, &rd, NULL, NULL, &(struct timeval){0, 0}));
    send(c, "efgh", 4, 0);
    settle(50);
    FD_SET(s, &rd);
    T("select at the mark", select(s + 1, &rd, NULL, NULL, &(struct timeval){0, 0}));
    T("recv", recv(s, b, sizeof b, MSG_DONTWAIT));
    send(c, "ij", 2, 0);
    shutdown(c, SHUT_WR);
    settle(50);
    FD_SET(s, &rd);
    T("select below the mark, then the end", select(s + 1, &rd, NULL, NULL, &(struct timeval){0, 0}));
    T("recv below the mark at the end", recv(s, b, sizeof b, 0));
}

static void *send_in_steps(void *fd) {
    for (int i = 0; i < 3; i++) {
        settle(100);
        send(*(int *)fd, "abc", 3, 0);
    }
    return NULL;
}

static void rcvlowat_blocking(void) {
    /* A blocking recv waits until the mark's bytes are there (or the length asked, if less). */
    int s, c, low = 8;
    char b[16] = {0};
    pthread_t t;
    pair(&s, &c);
    setsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &low, sizeof low);
    pthread_create(&t, NULL, send_in_steps, &c);
    T("blocking recv 16, mark 8", recv(s, b, sizeof b, 0));
    pthread_join(t, NULL);
    T("recv the rest", recv(s, b, sizeof b, MSG_DONTWAIT));
    pthread_create(&t, NULL, send_in_steps, &c);
    T("blocking recv 2, mark 8", recv(s, b, 2, 0));
    pthread_join(t, NULL);
}

static void notsent_lowat(void) {
    /* TCP_NOTSENT_LOWAT: an idle connection is writable; the option round-trips. */
    int s, c, v = 16384;
    pair(&s, &c);
    T("setsockopt TCP_NOTSENT_LOWAT 16384", setsockopt(c, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &v, sizeof v));
    socklen_t len = sizeof v;
    v = 0;
    T("getsockopt", getsockopt(c, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &v, &len));
    say("  TCP_NOTSENT_LOWAT %d", v);
    mask("poll idle", pmask(c));
    mask("epoll idle", emask(c));
    fd_set wr;
    FD_ZERO(&wr);
    FD_SET(c, &wr);
    T("select idle for writing", select(c + 1, NULL, &wr, NULL, &(struct timeval){0, 0}));
    T("send 100", send(c, "x", 1, 0));
    settle(50);
    mask("poll after a small write the peer took", pmask(c) & POLLOUT);
}

static void refused_nonblocking(void) {
    /* A non-blocking connect to a port nobody listens on: EINPROGRESS or ECONNREFUSED at once,
     * then the refusal through poll and SO_ERROR (read once), and a second connect. */
    struct sockaddr_in a;
    int l = listener(&a);
    close(l);
    int c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    errno = 0;
    int r = connect(c, (struct sockaddr *)&a, sizeof a);
    int e = errno;
    say("  connect = %s", r == 0 ? "0" : e == EINPROGRESS || e == ECONNREFUSED ? "EINPROGRESS or ECONNREFUSED" : ename(e));
    struct pollfd p = {.fd = c, .events = POLLOUT | POLLIN};
    poll(&p, 1, 2000);
    if (e == EINPROGRESS) {
        mask("poll", (unsigned short)p.revents);
        say_error("SO_ERROR", c);
        say_error("SO_ERROR again", c);
    } else {
        /* The refusal came at once: poll and SO_ERROR have nothing more to say. */
        say("  poll = OUT|ERR|HUP");
        say("  SO_ERROR = ECONNREFUSED");
        say("  SO_ERROR again = 0");
    }
    T("connect again", connect(c, (struct sockaddr *)&a, sizeof a));
    char b[4];
    T("recv", recv(c, b, sizeof b, 0));
    T("send", send(c, "a", 1, MSG_NOSIGNAL));
}

static void half_closed_over_time(void) {
    /* After the client's SHUT_WR: each side's readiness, then after the server's bytes, then
     * after the server's own SHUT_WR, then after both closed their reading. */
    int s, c;
    char b[8];
    pair(&s, &c);
    shutdown(c, SHUT_WR);
    settle(50);
    mask("client after its SHUT_WR", pmask(c));
    mask("server", pmask(s));
    send(s, "ab", 2, 0);
    settle(50);
    mask("client with the server's bytes", pmask(c));
    mask("client epoll", emask(c));
    T("server recv (end)", recv(s, b, sizeof b, 0));
    mask("server after reading the end", pmask(s));
    T("client recv", recv(c, b, sizeof b, 0));
    shutdown(s, SHUT_WR);
    settle(50);
    mask("client after the server's SHUT_WR", pmask(c));
    mask("server", pmask(s));
    mask("client epoll", emask(c));
    mask("server epoll", emask(s));
    T("client recv (end)", recv(c, b, sizeof b, 0));
    close(s);
    settle(50);
    mask("client after the server's close", pmask(c));
    T("client send", send(c, "x", 1, MSG_NOSIGNAL));
    say_error("client SO_ERROR", c);
}


static void options_set_by_a_fork_child(void) {
    /* Socket options are the socket's, one for every process holding it: set by a fork child,
     * the parent's calls follow them. */
    int s, c, low = 4;
    char b[8];
    pair(&s, &c);
    pid_t p = fork();
    if (p == 0) {
        struct timeval tv = {0, 200000};
        setsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &low, sizeof low);
        setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        _exit(0);
    }
    waitpid(p, NULL, 0);
    int v = 0;
    socklen_t len = sizeof v;
    getsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &v, &len);
    say("  SO_RCVLOWAT %d", v);
    T("recv, nothing comes (the child's timeout)", recv(s, b, sizeof b, 0));
    send(c, "ab", 2, 0);
    settle(50);
    mask("poll below the child's mark", pmask(s) & POLLIN);
    T("recv below the mark, until the timeout", recv(s, b, sizeof b, 0));
}

static void shutdown_by_a_fork_child(void) {
    /* shutdown is the socket's: a child's SHUT_WR ends the parent's writing too. */
    int s, c;
    char b[8];
    pair(&s, &c);
    pid_t p = fork();
    if (p == 0) {
        shutdown(s, SHUT_WR);
        _exit(0);
    }
    waitpid(p, NULL, 0);
    settle(50);
    T("peer reads the end", recv(c, b, sizeof b, MSG_DONTWAIT));
    T("parent's send after the child's SHUT_WR", send(s, "a", 1, MSG_NOSIGNAL));
    mask("parent's poll", pmask(s));
}


static void *send_later(void *fd) {
    settle(300);
    send(*(int *)fd, "ab", 2, 0);
    return NULL;
}

static void timeout_cleared_by_a_fork_child(void) {
    /* The parent's SO_RCVTIMEO of 0.1 s, cleared by a child: the parent's recv waits for the
     * bytes that come 0.3 s later. */
    int s, c;
    char b[8];
    pthread_t t;
    pair(&s, &c);
    struct timeval tv = {0, 100000};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    T("recv (the parent's timeout)", recv(s, b, sizeof b, 0));
    pid_t p = fork();
    if (p == 0) {
        struct timeval none = {0, 0};
        setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
        _exit(0);
    }
    waitpid(p, NULL, 0);
    pthread_create(&t, NULL, send_later, &c);
    T("recv (no timeout now)", recv(s, b, sizeof b, 0));
    pthread_join(t, NULL);
}


static void listener_nonblock_by_a_fork_child(void) {
    /* O_NONBLOCK set on a listener by a fork child: the parent's accept no longer waits; then a
     * connection, accepted. */
    struct sockaddr_in a;
    int l = listener(&a);
    pid_t p = fork();
    if (p == 0) {
        fcntl(l, F_SETFL, O_NONBLOCK);
        _exit(0);
    }
    waitpid(p, NULL, 0);
    T("accept, nothing waiting", accept(l, NULL, NULL));
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    struct pollfd q = {.fd = l, .events = POLLIN};
    T("poll the listener", poll(&q, 1, 5000));
    int s = accept(l, NULL, NULL);
    say("  accept: %s", s >= 0 ? "a socket" : ename(errno));
    if (s < 0) return;
    __atomic_add_fetch(diff_conns, 1, __ATOMIC_SEQ_CST);
    char b[4];
    T("send", send(c, "ab", 2, 0));
    T("recv", recv(s, b, sizeof b, MSG_WAITALL));
}

int main(void) {
    diff_begin();
    RUN(nonblock_shared_by_dup);
    RUN(listener_options_inherited);
    RUN(rcvlowat_select);
    RUN(rcvlowat_blocking);
    RUN(notsent_lowat);
    RUN(refused_nonblocking);
    RUN(half_closed_over_time);
    RUN(options_set_by_a_fork_child);
    RUN(shutdown_by_a_fork_child);
    RUN(timeout_cleared_by_a_fork_child);
    RUN(listener_nonblock_by_a_fork_child);
    diff_end();
    return 0;
}
