/* epoll modes (level, edge, one-shot, RDHUP), two sets on one connection, a set inherited over
 * fork, and the dup family. */
#include "diff.h"
#include <pthread.h>

static int ep_add(int fd, unsigned events) {
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = events, .data.fd = fd};
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    return ep;
}

static void ewait(const char *what, int ep) {
    struct epoll_event out[2];
    int n = epoll_wait(ep, out, 2, 0);
    if (n <= 0) say("  %s = %d", what, n);
    else mask(what, out[0].events);
}

static void level(void) {
    int s, c;
    char b[8];
    pair(&s, &c);
    int ep = ep_add(s, EPOLLIN | EPOLLRDHUP);
    ewait("empty", ep);
    send(c, "abcd", 4, 0);
    settle(50);
    ewait("4 bytes", ep);
    ewait("again (level)", ep);
    T("recv 2", recv(s, b, 2, 0));
    ewait("2 left", ep);
    T("recv 2", recv(s, b, 2, 0));
    ewait("drained", ep);
    shutdown(c, SHUT_WR);
    settle(50);
    ewait("peer's FIN", ep);
}

static void edge(void) {
    int s, c;
    char b[8];
    pair(&s, &c);
    int ep = ep_add(s, EPOLLIN | EPOLLOUT | EPOLLET);
    ewait("first (writable)", ep);
    ewait("again (edge)", ep);
    send(c, "abcd", 4, 0);
    settle(50);
    ewait("4 bytes", ep);
    ewait("again (edge)", ep);
    T("recv 2", recv(s, b, 2, 0));
    ewait("after a partial read", ep);
    send(c, "ef", 2, 0);
    settle(50);
    ewait("more bytes", ep);
}

static void oneshot(void) {
    int s, c;
    pair(&s, &c);
    int ep = ep_add(s, EPOLLIN | EPOLLONESHOT);
    send(c, "abcd", 4, 0);
    settle(50);
    ewait("first", ep);
    ewait("disarmed", ep);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLONESHOT, .data.fd = s};
    T("MOD", epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev));
    ewait("rearmed", ep);
}

static void two_sets(void) {
    int s, c;
    pair(&s, &c);
    int e1 = ep_add(s, EPOLLIN), e2 = ep_add(s, EPOLLIN | EPOLLET);
    send(c, "ab", 2, 0);
    settle(50);
    ewait("set 1 (level)", e1);
    ewait("set 2 (edge)", e2);
    ewait("set 1 again", e1);
    ewait("set 2 again", e2);
}

static void forked_set(void) {
    int s, c;
    char b[8];
    pair(&s, &c);
    int ep = ep_add(s, EPOLLIN);
    pid_t p = fork();
    if (p == 0) {
        struct epoll_event out;
        int n = epoll_wait(ep, &out, 1, 5000);
        _exit(n == 1 && read(s, b, 8) == 3 ? 0 : 1);
    }
    settle(100);
    send(c, "abc", 3, 0);
    int st;
    waitpid(p, &st, 0);
    say("  child saw the bytes through the inherited set: %s", WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "yes" : "no");
}

static void dups(void) {
    int s, c;
    char b[8];
    pair(&s, &c);
    int d = dup(s), d2 = fcntl(s, F_DUPFD_CLOEXEC, 100);
    send(c, "abcdef", 6, 0);
    settle(50);
    T("recv dup", recv(d, b, 2, 0));
    T("recv F_DUPFD", recv(d2, b, 2, 0));
    T("close original", close(s));
    T("recv dup after", recv(d, b, 2, MSG_DONTWAIT));
    T("dup2 over it", dup2(d, d2));
    T("send dup", send(d, "x", 1, 0));
    close(d);
    settle(50);
    mask("peer still open (one dup left)", pmask(c));
    close(d2);
    settle(50);
    mask("peer after the last close", pmask(c));
}

static void *close_later(void *fd) {
    settle(200);
    shutdown(*(int *)fd, SHUT_RDWR);
    return NULL;
}

static void shutdown_from_thread(void) {
    int s, c;
    char b[8];
    pthread_t t;
    pair(&s, &c);
    pthread_create(&t, NULL, close_later, &s);
    T("blocking recv (shutdown by another thread)", recv(s, b, sizeof b, 0));
    pthread_join(t, NULL);
    settle(50);
    mask("peer", pmask(c));
}

int main(void) {
    diff_begin();
    RUN(level);
    RUN(edge);
    RUN(oneshot);
    RUN(two_sets);
    RUN(forked_set);
    RUN(dups);
    RUN(shutdown_from_thread);
    diff_end();
    return 0;
}
