/* Socket options that change what calls answer: SO_RCVLOWAT, TCP_CORK, SO_SNDBUF, SO_SNDTIMEO,
 * TCP_INFO. */
#include "diff.h"

static void rcvlowat(void) {
    int s, c, low = 8;
    char b[16];
    pair(&s, &c);
    T("setsockopt SO_RCVLOWAT 8", setsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &low, sizeof low));
    T("send 4", send(c, "abcd", 4, 0));
    settle(50);
    mask("poll below the mark", pmask(s));
    mask("epoll below the mark", emask(s));
    T("send 4 more", send(c, "efgh", 4, 0));
    settle(50);
    mask("poll at the mark", pmask(s));
    T("recv (16)", recv(s, b, sizeof b, MSG_DONTWAIT));
}

static void cork(void) {
    int s, c, one = 1, zero = 0;
    pair(&s, &c);
    T("setsockopt TCP_CORK 1", setsockopt(c, IPPROTO_TCP, TCP_CORK, &one, sizeof one));
    T("send 4", send(c, "abcd", 4, 0));
    settle(20);
    mask("poll server while corked", pmask(s) & POLLIN);
    T("setsockopt TCP_CORK 0", setsockopt(c, IPPROTO_TCP, TCP_CORK, &zero, sizeof zero));
    settle(50);
    mask("poll server uncorked", pmask(s) & POLLIN);
}

static void sndbuf(void) {
    int s, c, size = 4096;
    pair(&s, &c);
    T("setsockopt SO_SNDBUF 4096", setsockopt(c, SOL_SOCKET, SO_SNDBUF, &size, sizeof size));
    static char big[1 << 16];
    long total = 0;
    ssize_t n;
    while ((n = send(c, big, sizeof big, MSG_DONTWAIT)) > 0) total += n;
    say("  queued before EAGAIN under 64 KiB: %s", total < 65536 ? "yes" : "no");
    mask("poll writer full", pmask(c) & POLLOUT);
    long got = 0;
    while (got < total && (n = recv(s, big, sizeof big, 0)) > 0) got += n;
    settle(50);
    mask("poll writer drained", pmask(c) & POLLOUT);
    T("send after the drain", send(c, big, 100, MSG_DONTWAIT));
}

static void sndtimeo(void) {
    int s, c;
    pair(&s, &c);
    struct timeval tv = {0, 200000};
    T("setsockopt SO_SNDTIMEO 0.2 s", setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv));
    static char big[32 << 20]; /* more than either transport buffers for one direction */
    errno = 0;
    ssize_t n = send(c, big, sizeof big, 0);
    say("  first send: %s", n > 0 && n < (ssize_t)sizeof big ? "partial" : n < 0 ? ename(errno) : "all");
    int i = 0;
    while (i < 50 && send(c, big, sizeof big, 0) > 0) i++;
    say("  then EAGAIN: %s", errno == EAGAIN ? "yes" : ename(errno));
}

/* struct tcp_info of <linux/tcp.h> (glibc's is older): tcpi_state at 1, tcpi_bytes_acked at
 * 120, tcpi_bytes_received at 128. */
static void info(const char *what, int fd, int bytes) {
    unsigned char i[232];
    socklen_t len = sizeof i;
    unsigned long long acked, received;
    memset(i, 0, sizeof i);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, i, &len) < 0) die("TCP_INFO");
    memcpy(&acked, i + 120, 8);
    memcpy(&received, i + 128, 8);
    say("  %s: state %d, bytes_acked >= %d: %s, bytes_received >= %d: %s", what, i[0], bytes,
        acked >= (unsigned long long)bytes ? "yes" : "no", bytes, received >= (unsigned long long)bytes ? "yes" : "no");
}

static void tcp_info(void) {
    int s, c;
    static char b[1000];
    pair(&s, &c);
    T("send 1000", send(c, b, sizeof b, 0));
    T("recv", recv(s, b, sizeof b, MSG_WAITALL));
    T("send back 1000", send(s, b, sizeof b, 0));
    T("recv", recv(c, b, sizeof b, MSG_WAITALL));
    settle(100);
    info("client", c, 1000);
    info("server", s, 1000);
    shutdown(c, SHUT_WR);
    settle(100);
    info("client after its SHUT_WR", c, 1000);
    info("server after the client's SHUT_WR", s, 1000);
    shutdown(s, SHUT_WR);
    settle(50);
    info("client after both", c, 1000);
    info("server after both", s, 1000);
}

static void options_before_connect(void) {
    /* Options set on the client before it connects, and on the listener (inherited by the
     * accepted socket), hold once connected. */
    struct sockaddr_in a;
    int l = listener(&a), low = 8;
    struct timeval tv = {0, 200000};
    T("listener SO_RCVLOWAT 8", setsockopt(l, SOL_SOCKET, SO_RCVLOWAT, &low, sizeof low));
    int c = socket(AF_INET, SOCK_STREAM, 0);
    T("client SO_RCVTIMEO 0.2 s", setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
    T("client SO_RCVLOWAT 8", setsockopt(c, SOL_SOCKET, SO_RCVLOWAT, &low, sizeof low));
    if (connect(c, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    int s = accept(l, NULL, NULL);
    if (s < 0) die("accept");
    __atomic_add_fetch(diff_conns, 1, __ATOMIC_SEQ_CST);
    char b[16];
    T("client recv (timeout)", recv(c, b, sizeof b, 0));
    T("send 4 each way", send(c, "abcd", 4, 0) + send(s, "abcd", 4, 0));
    settle(50);
    mask("poll server below its inherited mark", pmask(s));
    mask("poll client below its mark", pmask(c));
}

/* SO_SNDBUF 4096 set before connect on the client, and on the listener (inherited by the
 * accepted socket): each end queues under 64 KiB before EAGAIN once connected, as with the
 * option set on the connected socket (`sndbuf`). */
static void sndbuf_before_connect(void) {
    struct sockaddr_in a;
    int l = listener(&a), size = 4096;
    T("listener SO_SNDBUF 4096", setsockopt(l, SOL_SOCKET, SO_SNDBUF, &size, sizeof size));
    int c = socket(AF_INET, SOCK_STREAM, 0);
    T("client SO_SNDBUF 4096", setsockopt(c, SOL_SOCKET, SO_SNDBUF, &size, sizeof size));
    if (connect(c, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    int s = accept(l, NULL, NULL);
    if (s < 0) die("accept");
    char x = 'x';
    if (write(c, &x, 1) != 1 || read(s, &x, 1) != 1 || write(s, &x, 1) != 1 || read(c, &x, 1) != 1) die("settle");
    __atomic_add_fetch(diff_conns, 1, __ATOMIC_SEQ_CST);
    static char big[1 << 16];
    int ends[2] = {c, s};
    for (int i = 0; i < 2; i++) {
        long total = 0;
        ssize_t n;
        while ((n = send(ends[i], big, sizeof big, MSG_DONTWAIT)) > 0) total += n;
        say("  %s queued before EAGAIN under 64 KiB: %s", i ? "server" : "client", total < 65536 ? "yes" : "no");
        long got = 0;
        while (got < total && (n = recv(ends[1 - i], big, sizeof big, 0)) > 0) got += n;
    }
}

int main(void) {
    diff_begin();
    RUN(rcvlowat);
    RUN(cork);
    RUN(sndbuf);
    RUN(sndtimeo);
    RUN(tcp_info);
    RUN(options_before_connect);
    RUN(sndbuf_before_connect);
    diff_end();
    return 0;
}
