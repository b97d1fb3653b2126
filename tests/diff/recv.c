/* Reading: recv flags and edge cases, readv/recvmsg/recvmmsg, FIONREAD, poll with a negative
 * fd, and signals during a wait. */
#include "diff.h"

static void msg_trunc(void) {
    /* recv(NULL, n, MSG_TRUNC) discards n bytes and returns n. */
    int s, c;
    char b[16];
    pair(&s, &c);
    T("send", send(c, "abcdefgh", 8, 0));
    settle(50);
    T("recv(NULL, 3, MSG_TRUNC)", recv(s, NULL, 3, MSG_TRUNC));
    T("recv", recv(s, b, sizeof b, MSG_DONTWAIT));
    say("  bytes '%.5s'", b);
}

static void zero_length(void) {
    int s, c;
    char b[4];
    pair(&s, &c);
    T("recv(0, DONTWAIT) empty", recv(s, b, 0, MSG_DONTWAIT));
    T("send", send(c, "ab", 2, 0));
    settle(50);
    T("recv(0, DONTWAIT) with bytes", recv(s, b, 0, MSG_DONTWAIT));
    T("read(0)", read(s, b, 0));
    T("send(0)", send(c, b, 0, 0));
    shutdown(c, SHUT_WR);
    settle(50);
    T("recv 2", recv(s, b, 4, 0));
    T("recv(0, DONTWAIT) at EOF", recv(s, b, 0, MSG_DONTWAIT));
}

static void peek_waitall_dontwait(void) {
    int s, c;
    char b[16] = {0};
    pair(&s, &c);
    T("recv DONTWAIT empty", recv(s, b, sizeof b, MSG_DONTWAIT));
    T("send", send(c, "hello", 5, 0));
    settle(50);
    int n = -1;
    T("FIONREAD", ioctl(s, FIONREAD, &n));
    say("  FIONREAD n = %d", n);
    T("peek", recv(s, b, 3, MSG_PEEK));
    say("  bytes '%.3s'", b);
    T("peek again", recv(s, b, sizeof b, MSG_PEEK));
    pid_t p = fork();
    if (p == 0) {
        settle(100);
        send(c, "world", 5, 0);
        _exit(0);
    }
    T("recv WAITALL 10", recv(s, b, 10, MSG_WAITALL));
    say("  bytes '%.10s'", b);
    waitpid(p, NULL, 0);
}

static void waitall_with_dontwait(void) {
    /* MSG_WAITALL with MSG_DONTWAIT on a blocking socket: DONTWAIT wins, the bytes there come
     * back at once, then EAGAIN. */
    int s, c;
    char b[16] = {0};
    pair(&s, &c);
    T("send", send(c, "abc", 3, 0));
    settle(50);
    T("recv WAITALL|DONTWAIT 8", recv(s, b, 8, MSG_WAITALL | MSG_DONTWAIT));
    say("  bytes '%.3s'", b);
    T("recv WAITALL|DONTWAIT 8 empty", recv(s, b, 8, MSG_WAITALL | MSG_DONTWAIT));
}

static void vectors(void) {
    int s, c;
    char a[4], b[4], d[8];
    pair(&s, &c);
    struct iovec w[3] = {{"abc", 3}, {"", 0}, {"defgh", 5}};
    T("writev", writev(c, w, 3));
    settle(50);
    struct iovec r[2] = {{a, 4}, {b, 4}};
    T("readv", readv(s, r, 2));
    say("  bytes '%.4s' '%.4s'", a, b);
    struct msghdr m = {.msg_iov = w, .msg_iovlen = 3};
    T("sendmsg", sendmsg(c, &m, 0));
    settle(50);
    struct iovec r2[1] = {{d, 8}};
    struct msghdr rm = {.msg_iov = r2, .msg_iovlen = 1};
    T("recvmsg", recvmsg(s, &rm, 0));
    say("  bytes '%.8s' flags %d", d, rm.msg_flags);
    static struct iovec many[1025];
    for (int i = 0; i < 1025; i++) many[i] = (struct iovec){"z", 1};
    T("writev 1024", writev(c, many, 1024));
    T("writev 1025", writev(c, many, 1025));
}

static void recvmmsg_fill(void) {
    /* 40 bytes waiting, 4 messages of 16: 16+16+8, then EAGAIN. */
    int s, c;
    char b[4][16] = {{0}};
    pair(&s, &c);
    T("send 40", send(c, "0123456789abcdefghijklmnopqrstuvwxyzABCD", 40, 0));
    settle(50);
    struct iovec v[4];
    struct mmsghdr mm[4];
    memset(mm, 0, sizeof mm);
    for (int i = 0; i < 4; i++) {
        v[i] = (struct iovec){b[i], 16};
        mm[i].msg_hdr.msg_iov = &v[i];
        mm[i].msg_hdr.msg_iovlen = 1;
    }
    T("recvmmsg", recvmmsg(s, mm, 4, MSG_DONTWAIT, NULL));
    for (int i = 0; i < 4; i++) say("  msg %d len %u", i, mm[i].msg_len);
    say("  bytes '%.16s' '%.16s' '%.8s'", b[0], b[1], b[2]);
    T("recvmmsg again", recvmmsg(s, mm, 4, MSG_DONTWAIT, NULL));
    T("send 4", send(c, "wxyz", 4, 0));
    settle(50);
    T("recvmmsg WAITFORONE", recvmmsg(s, mm, 4, MSG_WAITFORONE, NULL));
}

static void poll_negative_fd(void) {
    int s, c;
    pair(&s, &c);
    send(c, "a", 1, 0);
    settle(50);
    struct pollfd p[3] = {{.fd = s, .events = POLLIN}, {.fd = -1, .events = POLLIN, .revents = 0x7f}, {.fd = c, .events = POLLOUT}};
    T("poll", poll(p, 3, 0));
    mask("revents[0]", p[0].revents);
    mask("revents[1] (fd -1)", (unsigned short)p[1].revents);
    mask("revents[2]", p[2].revents);
    struct pollfd q[1] = {{.fd = -1, .events = POLLIN, .revents = 0x7f}};
    T("poll only -1", poll(q, 1, 0));
    mask("revents (fd -1 alone)", (unsigned short)q[0].revents);
}

static void on_signal(int sig) { (void)sig; }

static void restart_with_timeout(void) {
    /* SA_RESTART does not restart a socket call with a timeout (signal(7)): EINTR at once. */
    int s, c;
    char b[4];
    pair(&s, &c);
    struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART};
    sigaction(SIGUSR1, &sa, NULL);
    struct timeval tv = {3, 0};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    pid_t me = getpid(), p = fork();
    if (p == 0) {
        settle(200);
        kill(me, SIGUSR1);
        _exit(0);
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    T("recv (SO_RCVTIMEO 3 s, signal at 0.2 s)", recv(s, b, sizeof b, 0));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double took = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    say("  returned before the timeout: %s", took < 2.5 ? "yes" : "no");
    waitpid(p, NULL, 0);
}

/* With an SA_RESTART handler of SIGUSR1 installed: a child sends this process SIGUSR1 at 0.2 s,
 * then `bytes` on `c` `ms` later. Its pid, for waitpid. */
static pid_t signal_then_send(int c, int ms, const char *bytes) {
    struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART};
    sigaction(SIGUSR1, &sa, NULL);
    pid_t me = getpid(), p = fork();
    if (p == 0) {
        settle(200);
        kill(me, SIGUSR1);
        settle(ms);
        send(c, bytes, strlen(bytes), 0);
        _exit(0);
    }
    return p;
}

static void restart_without_timeout(void) {
    /* SA_RESTART without a timeout: the recv is restarted and returns the bytes. */
    int s, c;
    char b[4];
    pair(&s, &c);
    pid_t p = signal_then_send(c, 200, "ab");
    T("recv (restarted)", recv(s, b, sizeof b, 0));
    waitpid(p, NULL, 0);
}

static void peek_waitall_signal(void) {
    /* MSG_PEEK|MSG_WAITALL for 8 with 3 there: an SA_RESTART handler ends it with the 3 (the
     * kernel restarts only a call that has nothing); the bytes stay. */
    int s, c;
    char b[8] = {0};
    pair(&s, &c);
    T("send", send(c, "abc", 3, 0));
    settle(50);
    pid_t p = signal_then_send(c, 2000, "defgh");
    T("peek WAITALL 8 (3 there, signal at 0.2 s)", recv(s, b, 8, MSG_PEEK | MSG_WAITALL));
    say("  bytes '%.3s'", b);
    T("recv 3", recv(s, b, 3, 0));
    waitpid(p, NULL, 0);
}

static void eintr_without_restart(void) {
    int s, c;
    char b[4];
    pair(&s, &c);
    struct sigaction sa = {.sa_handler = on_signal, .sa_flags = 0};
    sigaction(SIGUSR1, &sa, NULL);
    pid_t me = getpid(), p = fork();
    if (p == 0) {
        settle(200);
        kill(me, SIGUSR1);
        _exit(0);
    }
    T("recv (no SA_RESTART)", recv(s, b, sizeof b, 0));
    waitpid(p, NULL, 0);
}

static void rcvtimeo(void) {
    int s, c;
    char b[4];
    pair(&s, &c);
    struct timeval tv = {0, 200000};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    T("recv (SO_RCVTIMEO 0.2 s)", recv(s, b, sizeof b, 0));
}

int main(void) {
    diff_begin();
    RUN(msg_trunc);
    RUN(zero_length);
    RUN(peek_waitall_dontwait);
    RUN(waitall_with_dontwait);
    RUN(vectors);
    RUN(recvmmsg_fill);
    RUN(poll_negative_fd);
    RUN(restart_with_timeout);
    RUN(restart_without_timeout);
    RUN(peek_waitall_signal);
    RUN(eintr_without_restart);
    RUN(rcvtimeo);
    diff_end();
    return 0;
}
