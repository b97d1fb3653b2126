/* Shutdowns: SHUT_WR both ways (end of stream, writes after it), SHUT_RD (Linux never tells the
 * peer: its writes keep succeeding), non-blocking EAGAIN and POLLOUT. */
#include "diff.h"
#include <pthread.h>

static void shut_wr(void) {
    int s, c;
    char b[8];
    pair(&s, &c);
    T("send", send(c, "abc", 3, 0));
    T("shutdown(c, SHUT_WR)", shutdown(c, SHUT_WR));
    settle(50);
    mask("poll server", pmask(s));
    mask("poll client", pmask(c));
    T("recv server", recv(s, b, sizeof b, 0));
    T("recv server at EOF", recv(s, b, sizeof b, 0));
    T("send client after SHUT_WR", send(c, "x", 1, MSG_NOSIGNAL));
    T("send server", send(s, "def", 3, 0));
    settle(50);
    T("recv client", recv(c, b, sizeof b, 0));
    T("shutdown(s, SHUT_WR)", shutdown(s, SHUT_WR));
    settle(50);
    mask("poll server after both", pmask(s));
    mask("poll client after both", pmask(c));
    T("recv client at EOF", recv(c, b, sizeof b, 0));
}

static void shut_rd(void) {
    int s, c;
    char b[8];
    pair(&s, &c);
    T("shutdown(s, SHUT_RD)", shutdown(s, SHUT_RD));
    settle(50);
    mask("poll server", pmask(s));
    mask("poll client", pmask(c));
    T("recv server", recv(s, b, sizeof b, MSG_DONTWAIT));
    T("send client", send(c, "abcd", 4, MSG_NOSIGNAL));
    settle(50);
    T("send client again", send(c, "efgh", 4, MSG_NOSIGNAL));
    T("send server", send(s, "xy", 2, MSG_NOSIGNAL));
    settle(50);
    T("recv client", recv(c, b, sizeof b, MSG_DONTWAIT));
}

static void shut_rd_queued(void) {
    /* Bytes that arrived before SHUT_RD, and after it. */
    int s, c;
    char b[8];
    pair(&s, &c);
    T("send client", send(c, "abcd", 4, 0));
    settle(50);
    T("shutdown(s, SHUT_RD)", shutdown(s, SHUT_RD));
    mask("poll server", pmask(s));
    T("recv server", recv(s, b, sizeof b, MSG_DONTWAIT));
    T("send client after", send(c, "efgh", 4, MSG_NOSIGNAL));
    settle(50);
    T("recv server after", recv(s, b, sizeof b, MSG_DONTWAIT));
    T("shutdown(s, SHUT_WR)", shutdown(s, SHUT_WR));
    settle(50);
    mask("poll server after SHUT_WR", pmask(s));
    mask("poll client after SHUT_WR", pmask(c));
}

static void *shut_rd_later(void *fd) {
    settle(200);
    shutdown(*(int *)fd, SHUT_RD);
    return NULL;
}

static void shut_rd_blocked_reader(void) {
    /* A thread blocked in recv when another shuts reading down: it returns end of stream. */
    int s, c;
    char b[8];
    pthread_t t;
    pair(&s, &c);
    pthread_create(&t, NULL, shut_rd_later, &s);
    T("blocking recv", recv(s, b, sizeof b, 0));
    pthread_join(t, NULL);
    T("send client", send(c, "abcd", 4, MSG_NOSIGNAL));
}

static void nonblocking_full(void) {
    int s, c;
    pair(&s, &c);
    fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_NONBLOCK);
    static char big[1 << 16];
    long total = 0;
    ssize_t n;
    while ((n = send(c, big, sizeof big, 0)) > 0) total += n;
    say("  filled: last = -1 %s, some taken: %s", ename(errno), total > 0 ? "yes" : "no");
    mask("poll client full", pmask(c));
    /* Drain everything; the writer is writable again. */
    fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
    long got = 0;
    for (int i = 0; i < 1000 && got < total; i++) {
        while ((n = recv(s, big, sizeof big, 0)) > 0) got += n;
        settle(1);
    }
    say("  drained all: %s", got == total ? "yes" : "no");
    settle(50);
    mask("poll client drained", pmask(c));
    mask("poll server drained", pmask(s));
}

static void nonblocking_connect(void) {
    struct sockaddr_in a;
    int l = listener(&a);
    int c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int r = connect(c, (struct sockaddr *)&a, sizeof a);
    say("  connect = %s", r == 0 ? "0" : ename(errno));
    /* Accepted before the poll: this one thread is both ends (under colo the connect completes
     * once the server took the offer). */
    int s = accept(l, NULL, NULL);
    struct pollfd p = {.fd = c, .events = POLLOUT};
    T("poll OUT", poll(&p, 1, 5000));
    int e = -1;
    socklen_t len = sizeof e;
    getsockopt(c, SOL_SOCKET, SO_ERROR, &e, &len);
    say("  SO_ERROR = %d", e);
    T("send", send(c, "ok", 2, 0));
    char b[4];
    T("recv", recv(s, b, 4, 0));
    __atomic_add_fetch(diff_conns, 1, __ATOMIC_SEQ_CST);
}

static void refused(void) {
    struct sockaddr_in a;
    int l = listener(&a);
    close(l);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    T("connect refused", connect(c, (struct sockaddr *)&a, sizeof a));
}

int main(void) {
    diff_begin();
    RUN(shut_wr);
    RUN(shut_rd);
    RUN(shut_rd_queued);
    RUN(shut_rd_blocked_reader);
    RUN(nonblocking_full);
    RUN(nonblocking_connect);
    RUN(refused);
    diff_end();
    return 0;
}
