/* A read shutdown is the socket's, not the process's: after the parent's shutdown(SHUT_RD), a
 * forked child holding the same connection sees what the kernel shows every holder of the
 * socket (readable, end of stream, RDHUP). Children already asleep on the connection when the
 * shutdown comes (one in a blocking recv, one in poll, one in epoll_wait, all at once) wake
 * with it, while the peer stays silent: nothing else could wake them. alarm() is each
 * process's watchdog. */
#define _GNU_SOURCE
#include <poll.h>
#include <sys/epoll.h>
#include <sys/wait.h>

#include "scenario.h"

/* The child: waits for the parent's word, then reports what it sees of `c` (0: as expected). */
static int child(int c, int go) {
    char b;
    if (read(go, &b, 1) != 1) return 10;
    struct pollfd p = {.fd = c, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) != 1 || (p.revents & (POLLIN | POLLRDHUP)) != (POLLIN | POLLRDHUP)) {
        fprintf(stderr, "child: poll revents 0x%x\n", p.revents);
        return 11;
    }
    ssize_t n = recv(c, &b, 1, MSG_DONTWAIT);
    if (n != 0) {
        fprintf(stderr, "child: recv %zd (%s)\n", n, n < 0 ? strerror(errno) : "bytes");
        return 12;
    }
    return 0;
}

/* A child asleep on `c` when the shutdown comes, in `how` (0 recv, 1 poll, 2 epoll_wait); it
 * says on `ready` that it is about to sleep. Exit status 0: it woke to end of stream (recv 0) or
 * to IN|RDHUP; killed by its alarm: it slept on. */
static int sleeper(int c, int ready, int how) {
    alarm(10);
    char b;
    int ep = -1;
    if (how == 2) {
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP};
        ep = epoll_create1(0);
        if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev) < 0) return 20;
    }
    if (write(ready, "r", 1) != 1) return 21;
    if (how == 0) {
        ssize_t n = recv(c, &b, 1, 0);
        if (n != 0) {
            fprintf(stderr, "sleeper in recv: %zd (%s)\n", n, n < 0 ? strerror(errno) : "bytes");
            return 22;
        }
        return 0;
    }
    unsigned got;
    if (how == 1) {
        struct pollfd p = {.fd = c, .events = POLLIN | POLLRDHUP};
        if (poll(&p, 1, -1) != 1) return 23;
        got = p.revents;
    } else {
        struct epoll_event ev;
        if (epoll_wait(ep, &ev, 1, -1) != 1) return 24;
        got = ev.events;
    }
    if ((got & (POLLIN | POLLRDHUP)) != (POLLIN | POLLRDHUP)) {
        fprintf(stderr, "sleeper in %s: events 0x%x\n", how == 1 ? "poll" : "epoll_wait", got);
        return 25;
    }
    return 0;
}

/* Three children asleep on one connection (recv, poll, epoll_wait) when the parent shuts down
 * reading; the peer `k` writes nothing meanwhile. */
static void wake_sleepers(struct sockaddr_in *a, int l) {
    int k = socket(AF_INET, SOCK_STREAM, 0);
    if (k < 0 || connect(k, (struct sockaddr *)a, sizeof *a) < 0) die("connect");
    int c = accept(l, NULL, NULL);
    if (c < 0) die("accept");
    write_all(k, "q", 1);
    char b;
    CHECK(read(c, &b, 1) == 1 && b == 'q', "the first byte (sleepers)");
    int ready[2];
    if (pipe(ready) < 0) die("pipe");
    static const char *how[] = {"recv", "poll", "epoll_wait"};
    pid_t pid[3];
    for (int i = 0; i < 3; i++) {
        pid[i] = fork();
        if (pid[i] < 0) die("fork");
        if (pid[i] == 0) _exit(sleeper(c, ready[1], i));
    }
    for (int i = 0; i < 3; i++) CHECK(read(ready[0], &b, 1) == 1, "a sleeper is ready");
    /* Time to fall asleep (were one still awake, it would see the shutdown at its first look:
     * the check would pass without testing the wake-up, never fail wrongly). */
    usleep(200 * 1000);
    CHECK(shutdown(c, SHUT_RD) == 0, "shutdown(SHUT_RD) (sleepers)");
    for (int i = 0; i < 3; i++) {
        int st;
        char what[80];
        snprintf(what, sizeof what, "the child asleep in %s wakes to the read shutdown", how[i]);
        CHECK(waitpid(pid[i], &st, 0) == pid[i] && WIFEXITED(st) && WEXITSTATUS(st) == 0, what);
        if (WIFSIGNALED(st)) fprintf(stderr, "  (killed by signal %d: it slept on)\n", WTERMSIG(st));
    }
    close(ready[0]);
    close(ready[1]);
    close(c);
    close(k);
}

int main(void) {
    alarm(40);
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    int k = socket(AF_INET, SOCK_STREAM, 0);
    if (k < 0 || connect(k, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    int c = accept(l, NULL, NULL);
    if (c < 0) die("accept");
    /* One exchange, so that the connection is in use (and, under the shim, accelerated). */
    write_all(k, "q", 1);
    char b;
    CHECK(read(c, &b, 1) == 1 && b == 'q', "the first byte");
    int go[2];
    if (pipe(go) < 0) die("pipe");
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) _exit(child(c, go[0]));
    CHECK(shutdown(c, SHUT_RD) == 0, "shutdown(SHUT_RD)");
    write_all(go[1], "g", 1);
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child sees the read shutdown");
    close(c);
    close(k);
    wake_sleepers(&a, l);
    close(l);
    if (failures) return 1;
    printf("shut_rd_forked: ok\n");
    return 0;
}
