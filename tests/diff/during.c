/* What another thread does to a connection while a blocking call waits on it: O_NONBLOCK set
 * under a send or a MSG_WAITALL read that already moved bytes (the kernel fixes the call's
 * timeout at its start: the call goes on to the end), and a write shutdown under a waiting
 * send. */
#include "diff.h"
#include <pthread.h>

#define BIG (32 << 20)

static int wfd;
static ssize_t wn;
static int we;

static void *send_big(void *arg) {
    static char buf[BIG];
    (void)arg;
    errno = 0;
    wn = send(wfd, buf, sizeof buf, MSG_NOSIGNAL);
    we = errno;
    return NULL;
}

static const char *how_much(ssize_t n, int e, ssize_t all) {
    return n < 0 ? ename(e) : n == 0 ? "0" : n < all ? "part" : "all";
}

/* Reads `fd` until `want` bytes came, the stream ended or a second passed without a byte. */
static long read_for(int fd, long want) {
    static char buf[65536];
    struct timeval tv = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    long got = 0;
    ssize_t n;
    while (got < want && (n = recv(fd, buf, sizeof buf, 0)) > 0) got += n;
    return got;
}

static void nonblock_under_a_waiting_send(void) {
    int s, c;
    pair(&s, &c);
    wfd = c;
    pthread_t t;
    pthread_create(&t, NULL, send_big, NULL);
    settle(300);
    T("F_SETFL O_NONBLOCK", fcntl(c, F_SETFL, O_NONBLOCK));
    long got = read_for(s, BIG);
    pthread_join(t, NULL);
    say("  the send = %s", how_much(wn, we, BIG));
    say("  peer read what it sent: %s", got == wn ? "yes" : "no");
}

static void nonblock_under_a_waiting_waitall(void) {
    int s, c;
    char b[9] = {0};
    pair(&s, &c);
    send(c, "abc", 3, 0);
    pid_t p = fork();
    if (p == 0) {
        settle(400);
        send(c, "de", 2, 0);
        settle(200);
        send(c, "fgh", 3, 0);
        _exit(0);
    }
    struct { int fd; char *b; } arg = {s, b};
    void *(*setter)(void *) = ({
        void *f(void *a_) {
            typeof(arg) *a = a_;
            settle(200);
            fcntl(a->fd, F_SETFL, O_NONBLOCK);
            return NULL;
        }
        f;
    });
    pthread_t t;
    pthread_create(&t, NULL, setter, &arg);
    T("recv 8 WAITALL", recv(s, b, 8, MSG_WAITALL));
    say("  bytes '%s'", b);
    pthread_join(t, NULL);
    waitpid(p, NULL, 0);
    settle(50);
    drain("recv the rest", s, 8);
}

static void shut_wr_under_a_waiting_send(void) {
    /* The path full and a send of 10 waiting for room (nothing moved): a SHUT_WR by another
     * thread ends it with EPIPE; the peer reads what was sent before, then the end. */
    static char buf[65536];
    int s, c;
    pair(&s, &c);
    long filled = 0;
    ssize_t n;
    while ((n = send(c, buf, sizeof buf, MSG_DONTWAIT)) > 0) filled += n;
    wfd = c;
    pthread_t t;
    void *(*sender)(void *) = ({
        void *f(void *a) {
            (void)a;
            errno = 0;
            wn = send(wfd, "0123456789", 10, MSG_NOSIGNAL);
            we = errno;
            return NULL;
        }
        f;
    });
    pthread_create(&t, NULL, sender, NULL);
    settle(300);
    T("shutdown SHUT_WR", shutdown(c, SHUT_WR));
    pthread_join(t, NULL);
    if (wn < 0) say("  the waiting send = -1 %s", ename(we));
    else say("  the waiting send = %zd", wn);
    long got = read_for(s, filled + 10);
    say("  peer read: %s", got == filled ? "what was sent before" : got == filled + 10 ? "all, the 10 too" : "other");
    T("then", recv(s, buf, 8, MSG_DONTWAIT));
}

int main(void) {
    diff_begin();
    RUN(nonblock_under_a_waiting_send);
    RUN(nonblock_under_a_waiting_waitall);
    RUN(shut_wr_under_a_waiting_send);
    diff_end();
    return 0;
}
