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

/* Two numbers of one socket in one set (the kernel keys a registration by file and number):
 * both register, both report, each is modified and deleted on its own. */
static void dups_in_one_set(void) {
    int s, c;
    char b[8];
    pair(&s, &c);
    int d = dup(s), ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = s}, out[4];
    T("add the socket", epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev));
    ev.data.fd = d;
    T("add its dup", epoll_ctl(ep, EPOLL_CTL_ADD, d, &ev));
    T("add its dup again", epoll_ctl(ep, EPOLL_CTL_ADD, d, &ev));
    send(c, "abcd", 4, 0);
    settle(50);
    int n = epoll_wait(ep, out, 4, 0), seen_s = 0, seen_d = 0;
    for (int i = 0; i < n; i++) {
        seen_s += out[i].data.fd == s && (out[i].events & EPOLLIN);
        seen_d += out[i].data.fd == d && (out[i].events & EPOLLIN);
    }
    say("  4 bytes: %d events, the socket's %d, the dup's %d", n, seen_s, seen_d);
    ev.events = EPOLLIN | EPOLLET;
    T("the dup made edge-triggered", epoll_ctl(ep, EPOLL_CTL_MOD, d, &ev));
    T("delete the socket", epoll_ctl(ep, EPOLL_CTL_DEL, s, NULL));
    n = epoll_wait(ep, out, 4, 0);
    say("  after: %d events (%s)", n, n == 1 && out[0].data.fd == d ? "the dup's" : "?");
    T("wait again (edge)", epoll_wait(ep, out, 4, 0));
    T("recv 4 through the dup", recv(d, b, 4, 0));
    send(c, "ef", 2, 0);
    settle(50);
    n = epoll_wait(ep, out, 4, 0);
    say("  2 more bytes: %d events (%s)", n, n == 1 && out[0].data.fd == d ? "the dup's" : "?");
    T("delete the dup", epoll_ctl(ep, EPOLL_CTL_DEL, d, NULL));
    send(c, "g", 1, 0);
    settle(50);
    T("neither registered", epoll_wait(ep, out, 4, 0));
    close(d);
    close(ep);
}

/* A closed number whose socket stays open under a dup: the kernel keeps its registration (it
 * goes with the file's last descriptor, epoll(7)), and reports it with the closed number's data. */
static void closed_dup_in_set(void) {
    int s, c;
    pair(&s, &c);
    int d = dup(s), ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = d}, out[4];
    T("add the dup", epoll_ctl(ep, EPOLL_CTL_ADD, d, &ev));
    T("close the dup", close(d));
    send(c, "abcd", 4, 0);
    settle(50);
    T("events for the closed number", epoll_wait(ep, out, 4, 0));
    close(s);
    close(ep);
}

/* EPOLLEXCLUSIVE (allowed with EPOLLIN and a few others only): registers, reports, ends. */
static void exclusive(void) {
    int s, c;
    char b[8];
    pair(&s, &c);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLEXCLUSIVE, .data.fd = s};
    T("add exclusive", epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev));
    send(c, "abcd", 4, 0);
    settle(50);
    ewait("4 bytes", ep);
    T("recv 4", recv(s, b, 4, 0));
    close(c);
    settle(50);
    ewait("peer closed", ep);
    close(ep);
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
    RUN(dups_in_one_set);
    RUN(closed_dup_in_set);
    RUN(exclusive);
    RUN(shutdown_from_thread);
    diff_end();
    return 0;
}
