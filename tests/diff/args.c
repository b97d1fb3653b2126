/* Arguments at their edges on a connection: socket timeouts the kernel rounds, clamps or
 * refuses, and shutdown's `how` and its answers as the connection ends. */
#include "diff.h"

/* setsockopt(opt, {sec, usec}) and what getsockopt then says. */
static void timeo(const char *what, int fd, int opt, long sec, long usec) {
    struct timeval tv = {sec, usec};
    errno = 0;
    int r = setsockopt(fd, SOL_SOCKET, opt, &tv, sizeof tv);
    int e = errno;
    memset(&tv, 0, sizeof tv);
    socklen_t len = sizeof tv;
    getsockopt(fd, SOL_SOCKET, opt, &tv, &len);
    if (r < 0) say("  %s = -1 %s, now %ld.%06ld", what, ename(e), (long)tv.tv_sec, (long)tv.tv_usec);
    else say("  %s = 0, now %ld.%06ld", what, (long)tv.tv_sec, (long)tv.tv_usec);
}

static void timeout_values(void) {
    int s, c;
    pair(&s, &c);
    timeo("SO_RCVTIMEO 0.001001", s, SO_RCVTIMEO, 0, 1001);
    timeo("SO_RCVTIMEO 0.000001", s, SO_RCVTIMEO, 0, 1);
    timeo("SO_RCVTIMEO usec 1000000", s, SO_RCVTIMEO, 0, 1000000);
    timeo("SO_RCVTIMEO usec -1", s, SO_RCVTIMEO, 0, -1);
    timeo("SO_RCVTIMEO sec -1", s, SO_RCVTIMEO, -1, 0);
    timeo("SO_SNDTIMEO sec -1", s, SO_SNDTIMEO, -1, 0);
    timeo("SO_RCVTIMEO 0", s, SO_RCVTIMEO, 0, 0);
    struct timeval tv = {1, 0};
    T("SO_RCVTIMEO with optlen 8", setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, 8));
    T("SO_RCVTIMEO with optlen 32", setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, (char[32]){0}, 32));
    socklen_t len = 8;
    T("get SO_RCVTIMEO into 8 bytes", getsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, &len));
    say("  len %u", len);
}

static void negative_timeout_waits(void) {
    /* SO_RCVTIMEO with a negative tv_sec: the kernel stores a timeout of no wait at all (which
     * getsockopt reads as none): a blocking recv fails with EAGAIN at once. The peer sends at
     * 300 ms; a recv that waited for it says so. Then SO_SNDTIMEO likewise, the path full. */
    int s, c;
    char b[8];
    pair(&s, &c);
    struct timeval tv = {-1, 0};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    pid_t p = fork();
    if (p == 0) {
        settle(300);
        send(c, "ab", 2, 0);
        _exit(0);
    }
    T("recv", recv(s, b, sizeof b, 0));
    waitpid(p, NULL, 0);
    drain("recv after", s, 8);
    static char buf[65536];
    while (send(c, buf, sizeof buf, MSG_DONTWAIT) > 0) {
    }
    setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    p = fork();
    if (p == 0) {
        settle(300);
        while (recv(s, buf, sizeof buf, MSG_DONTWAIT) > 0) {
        }
        _exit(0);
    }
    T("send, the path full", send(c, "ab", 2, 0));
    waitpid(p, NULL, 0);
}

static void tiny_timeout_waits(void) {
    /* SO_RCVTIMEO of 1 us, nothing to read: EAGAIN. */
    int s, c;
    char b[8];
    pair(&s, &c);
    struct timeval tv = {0, 1};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    T("recv", recv(s, b, sizeof b, 0));
    T("send", send(c, "ab", 2, 0));
    settle(50);
    T("recv with bytes", recv(s, b, sizeof b, 0));
}

static void shutdown_hows(void) {
    int s, c;
    pair(&s, &c);
    T("shutdown how 3", shutdown(c, 3));
    T("shutdown how -1", shutdown(c, -1));
    T("shutdown SHUT_WR", shutdown(c, SHUT_WR));
    T("shutdown SHUT_WR again", shutdown(c, SHUT_WR));
    T("shutdown SHUT_RD", shutdown(c, SHUT_RD));
    T("shutdown SHUT_RD again", shutdown(c, SHUT_RD));
    settle(50);
    T("peer's shutdown SHUT_RDWR", shutdown(s, SHUT_RDWR));
    settle(50);
    T("shutdown SHUT_RDWR once both ended", shutdown(c, SHUT_RDWR));
}

static void shutdown_after_peer_close(void) {
    int s, c;
    pair(&s, &c);
    close(s);
    settle(50);
    T("shutdown SHUT_RD after the peer's close", shutdown(c, SHUT_RD));
    T("shutdown SHUT_WR", shutdown(c, SHUT_WR));
    settle(50);
    T("shutdown SHUT_RDWR", shutdown(c, SHUT_RDWR));
}

static void shutdown_after_reset(void) {
    int s, c;
    pair(&s, &c);
    struct linger l = {1, 0};
    setsockopt(s, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close(s);
    settle(50);
    T("shutdown SHUT_WR after the peer's reset", shutdown(c, SHUT_WR));
    T("shutdown SHUT_RD", shutdown(c, SHUT_RD));
    say_error("SO_ERROR", c);
}

static void shutdown_after_write_after_close(void) {
    /* The peer closed, a write was taken and answered with a reset. */
    int s, c;
    pair(&s, &c);
    close(s);
    settle(50);
    T("send (taken)", send(c, "ab", 2, MSG_NOSIGNAL));
    settle(50);
    T("shutdown SHUT_WR", shutdown(c, SHUT_WR));
    say_error("SO_ERROR", c);
}

int main(void) {
    diff_begin();
    RUN(timeout_values);
    RUN(negative_timeout_waits);
    RUN(tiny_timeout_waits);
    RUN(shutdown_hows);
    RUN(shutdown_after_peer_close);
    RUN(shutdown_after_reset);
    RUN(shutdown_after_write_after_close);
    diff_end();
    return 0;
}
