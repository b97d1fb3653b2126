/* Resets: a peer that aborts (SO_LINGER {1,0}, or close with unread data: Linux sends RST) must
 * be seen as the kernel shows it, not as a clean end of stream. */
#include "diff.h"

static void abort_close(int fd) {
    struct linger l = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close(fd);
}

/* getpeername of `fd`: the kernel answers ENOTCONN once a reset closed the socket, not after a
 * FIN (colo's client resets its carrier at a clean close: the server answers from the rings). */
static void peer_name(int fd) {
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    T("getpeername", getpeername(fd, (struct sockaddr *)&a, &len));
}

/* TCP_INFO's tcpi_state of `fd` (the first byte of the kernel's struct tcp_info). */
static void tcp_state(const char *what, int fd) {
    unsigned char i[232];
    socklen_t len = sizeof i;
    memset(i, 0, sizeof i);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, i, &len) < 0) die("TCP_INFO");
    say("  %s: state %d", what, i[0]);
}

static void linger0_poll(void) {
    int s, c;
    pair(&s, &c);
    abort_close(c);
    settle(50);
    mask("poll", pmask(s));
    mask("epoll", emask(s));
}

static void linger0_recv(void) {
    int s, c;
    char b[8];
    pair(&s, &c);
    abort_close(c);
    settle(50);
    T("recv", recv(s, b, sizeof b, 0));
    T("recv again", recv(s, b, sizeof b, MSG_DONTWAIT));
    peer_name(s);
}

static void linger0_send(void) {
    int s, c;
    pair(&s, &c);
    abort_close(c);
    settle(50);
    T("send", send(s, "abcd", 4, MSG_NOSIGNAL));
    T("send again", send(s, "abcd", 4, MSG_NOSIGNAL));
}

static void linger0_so_error(void) {
    int s, c;
    pair(&s, &c);
    abort_close(c);
    settle(50);
    say_error("SO_ERROR", s);
}

static void linger0_pending_bytes(void) {
    /* Bytes the aborting peer sent before its reset: the kernel drops them with the reset. */
    int s, c;
    char b[8];
    pair(&s, &c);
    T("send", send(c, "abcd", 4, 0));
    settle(50);
    abort_close(c);
    settle(50);
    mask("poll", pmask(s));
    T("recv", recv(s, b, sizeof b, MSG_DONTWAIT));
}

static void unread_close(void) {
    /* The peer closes with bytes it never read: Linux answers with RST at once. */
    int s, c;
    char b[8];
    pair(&s, &c);
    T("send to peer", send(s, "abcd", 4, 0));
    settle(50);
    close(c);
    settle(50);
    say_error("SO_ERROR", s);
    mask("poll", pmask(s));
    T("recv", recv(s, b, sizeof b, MSG_DONTWAIT));
    T("send", send(s, "abcd", 4, MSG_NOSIGNAL));
}

static void unread_close_poll(void) {
    int s, c;
    pair(&s, &c);
    T("send to peer", send(s, "abcd", 4, 0));
    settle(50);
    close(c);
    settle(50);
    mask("poll", pmask(s));
    mask("epoll", emask(s));
}

static void blocking_recv_reset(void) {
    /* A blocking recv the peer's reset interrupts. */
    int s, c;
    char b[8];
    pair(&s, &c);
    pid_t p = fork();
    if (p == 0) {
        close(s);
        settle(200);
        abort_close(c);
        _exit(0);
    }
    close(c);
    T("blocking recv", recv(s, b, sizeof b, 0));
    waitpid(p, NULL, 0);
}

static void killed_with_unread(void) {
    /* The peer's process is killed with bytes it never read: its kernel resets. */
    int s, c;
    char b[8];
    pair(&s, &c);
    pid_t p = fork();
    if (p == 0) {
        close(s);
        pause();
        _exit(0);
    }
    close(c);
    T("send to peer", send(s, "abcd", 4, 0));
    settle(50);
    kill(p, SIGKILL);
    waitpid(p, NULL, 0);
    settle(50);
    mask("poll", pmask(s));
    say_error("SO_ERROR", s);
    mask("poll after SO_ERROR", pmask(s));
    T("recv", recv(s, b, sizeof b, MSG_DONTWAIT));
    T("recv again", recv(s, b, sizeof b, MSG_DONTWAIT));
}

static void killed_while_writing(void) {
    /* The peer's process is killed, with bytes it never read, while a blocking send waits for
     * room: its kernel resets, and that send fails with ECONNRESET, the next with EPIPE. */
    static char buf[65536];
    int s, c;
    pair(&s, &c);
    pid_t p = fork();
    if (p == 0) {
        close(s);
        settle(300);
        kill(getpid(), SIGKILL);
        _exit(0);
    }
    close(c);
    ssize_t n;
    while ((n = send(s, buf, sizeof buf, MSG_NOSIGNAL)) > 0) {
    }
    say("  send until it fails: %s", n < 0 ? ename(errno) : "end");
    T("send again", send(s, buf, 10, MSG_NOSIGNAL));
    waitpid(p, NULL, 0);
    say_error("SO_ERROR", s);
}

static void killed_after_reading(void) {
    /* The peer's process is killed having read everything: its kernel closes with FIN. */
    int s, c;
    char b[8];
    pair(&s, &c);
    pid_t p = fork();
    if (p == 0) {
        close(s);
        pause();
        _exit(0);
    }
    close(c);
    settle(50);
    kill(p, SIGKILL);
    waitpid(p, NULL, 0);
    settle(50);
    mask("poll", pmask(s));
    T("recv", recv(s, b, sizeof b, MSG_DONTWAIT));
}

static void fin_then_unread_close(void) {
    /* The peer shuts down writing (FIN), then closes with bytes it never read (RST): the kernel
     * reads end of stream (the FIN came first) and keeps the reset as EPIPE (a RST in
     * CLOSE_WAIT) for SO_ERROR. */
    int s, c;
    char b[8];
    pair(&s, &c);
    shutdown(c, SHUT_WR);
    settle(50);
    T("send to peer", send(s, "abcd", 4, 0));
    settle(50);
    close(c);
    settle(50);
    mask("poll", pmask(s));
    T("recv", recv(s, b, sizeof b, MSG_DONTWAIT));
    T("recv again", recv(s, b, sizeof b, MSG_DONTWAIT));
    say_error("SO_ERROR", s);
    T("send", send(s, "abcd", 4, MSG_NOSIGNAL));
}

static void fin_then_unread_close_send(void) {
    /* The same, written to first: the write takes the reset, as EPIPE; SO_ERROR is then clear. */
    int s, c;
    char b[8];
    pair(&s, &c);
    T("send from peer", send(c, "xy", 2, 0));
    shutdown(c, SHUT_WR);
    settle(50);
    T("send to peer", send(s, "abcd", 4, 0));
    settle(50);
    close(c);
    settle(50);
    T("send", send(s, "abcd", 4, MSG_NOSIGNAL));
    say_error("SO_ERROR", s);
    T("recv", recv(s, b, sizeof b, MSG_DONTWAIT));
    T("recv again", recv(s, b, sizeof b, MSG_DONTWAIT));
    T("send again", send(s, "abcd", 4, MSG_NOSIGNAL));
}

static void clean_close(void) {
    /* A clean close stays a clean end of stream. */
    int s, c;
    char b[8];
    pair(&s, &c);
    close(c);
    settle(50);
    mask("poll", pmask(s));
    say_error("SO_ERROR", s);
    peer_name(s);
    tcp_state("TCP_INFO", s);
    T("recv", recv(s, b, sizeof b, 0));
    T("send", send(s, "abcd", 4, MSG_NOSIGNAL));
    settle(50);
    mask("poll after send", pmask(s));
    tcp_state("TCP_INFO after send", s);
    peer_name(s);
    T("send again", send(s, "abcd", 4, MSG_NOSIGNAL));
}

int main(void) {
    diff_begin();
    RUN(linger0_poll);
    RUN(linger0_recv);
    RUN(linger0_send);
    RUN(linger0_so_error);
    RUN(linger0_pending_bytes);
    RUN(unread_close);
    RUN(unread_close_poll);
    RUN(fin_then_unread_close);
    RUN(fin_then_unread_close_send);
    RUN(blocking_recv_reset);
    RUN(killed_with_unread);
    RUN(killed_while_writing);
    RUN(killed_after_reading);
    RUN(clean_close);
    diff_end();
    return 0;
}
