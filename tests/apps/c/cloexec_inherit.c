/* A connection born close-on-exec (accept4 and socket with SOCK_CLOEXEC, as Python, Go, Rust,
 * node and redis make theirs). Run with the shim preloaded (tests/apps/run.sh):
 * (a) its descriptors, once read, written and polled: on each side, the socket and at most 3 of
 *     the shim's (control socket, doorbell, self bell). The segment memfd is closed once mapped
 *     (such a connection is never handed over across exec as it is), and the readiness fd is
 *     made only when the connection joins an epoll set (which this one then does: one more);
 * (b) made inheritable with dup2 onto a number >= 3 in the middle of a stream, it goes on in the
 *     same image (its epoll registration too) and then across an exec of this program (which
 *     finds it on that number): every byte the client sent arrives in order, before and after
 *     the dup2 and the exec, and so does every byte the server sends back; then end of stream
 *     both ways. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "scenario.h"

#define UP 600000       /* client -> server */
#define DOWN 500000     /* server -> client */
#define UP_BEFORE 150000 /* read before the dup2 */
#define UP_MIDDLE 200000 /* read after it, before the exec */
#define DOWN_BEFORE 100000
#define DOWN_MIDDLE 150000
#define TARGET 100       /* the number dup2 makes inheritable */


static void read_pattern(int fd, long from, long to, long shift, const char *who) {
    static unsigned char buf[65536];
    long at = from;
    while (at < to) {
        long want = to - at < (long)sizeof buf ? to - at : (long)sizeof buf;
        ssize_t n = read(fd, buf, want);
        if (n <= 0) {
            fprintf(stderr, "%s: read at byte %ld: %s\n", who, at, n == 0 ? "end of stream" : strerror(errno));
            exit(1);
        }
        for (ssize_t i = 0; i < n; i++)
            if (buf[i] != pattern(at + i + shift)) {
                fprintf(stderr, "%s: byte %ld differs\n", who, at + i);
                exit(1);
            }
        at += n;
    }
}

static void write_pattern(int fd, long from, long to, long shift) {
    static unsigned char buf[UP];
    for (long i = from; i < to; i++) buf[i - from] = pattern(i + shift);
    write_all(fd, buf, to - from);
}

/* The client (a child): sends all of UP at once, reads all of DOWN, half-closes, expects the end
 * of stream. It counts its own descriptors around the connect and first write (after a first
 * connection, left open). */
static int dial(int port) {
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(c, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    return c;
}

/* A first connection, used and polled with a sleep, so that what the shim makes once per process
 * or per thread (its hang-up watcher, a thread's wake-up eventfd) is not counted for the second. */
static int warm_up(int fd, int write_first) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    char b = 'w';
    if (write_first && write(fd, &b, 1) != 1) die("warm-up write");
    if (!write_first && read(fd, &b, 1) != 1) die("warm-up read");
    return poll(&p, 1, 50);
}

static void client(int port) {
    int first = dial(port);
    warm_up(first, 1);
    int before = descriptors_open();
    int c = dial(port);
    /* Counted once the connection is in use (the shim completes a connect at its first use). */
    write_pattern(c, 0, UP, 0);
    struct pollfd p = {.fd = c, .events = POLLIN | POLLOUT};
    if (poll(&p, 1, 0) < 0) die("poll");
    int held = descriptors_open() - before;
    if (segments() != 2 || held > 4) {
        fprintf(stderr, "client: %d segments, %d descriptors for the connection (at most 1 + 3)\n", segments(), held);
        exit(1);
    }
    printf("ok: client holds %d descriptors for a close-on-exec connection\n", held);
    fflush(stdout);
    read_pattern(c, 0, DOWN, 7, "client");
    shutdown(c, SHUT_WR);
    char b;
    if (read(c, &b, 1) != 0) die("client expected end of stream");
    exit(0);
}

static int wait_ok(pid_t pid) {
    int st;
    return waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int main(int argc, char **argv) {
    alarm(20);
    if (argc == 3 && strcmp(argv[1], "after-exec") == 0) {
        /* The new image: the connection is on TARGET, inherited. */
        read_pattern(TARGET, UP_BEFORE + UP_MIDDLE, UP, 0, "server after exec");
        write_pattern(TARGET, DOWN_BEFORE + DOWN_MIDDLE, DOWN, 7);
        char b;
        if (read(TARGET, &b, 1) != 0) die("server after exec: expected end of stream");
        close(TARGET);
        if (!wait_ok(atoi(argv[2]))) {
            fprintf(stderr, "the client failed\n");
            return 1;
        }
        printf("ok: close-on-exec connection made inheritable by dup2, then exec: bytes intact both ways\n");
        return 0;
    }
    struct sockaddr_in a;
    int l = loopback_listener(&a, 8);
    pid_t cl = fork();
    if (cl == 0) client(ntohs(a.sin_port));
    int first = accept4(l, NULL, NULL, SOCK_CLOEXEC);
    if (first < 0) die("accept4");
    warm_up(first, 0);
    int before = descriptors_open();
    int s = accept4(l, NULL, NULL, SOCK_CLOEXEC);
    if (s < 0) die("accept4");
    struct pollfd p = {.fd = s, .events = POLLIN};
    if (poll(&p, 1, 5000) != 1) die("poll");
    int held = descriptors_open() - before;
    if (segments() != 2) {
        fprintf(stderr, "the connection was not accelerated (is the shim preloaded?)\n");
        return 1;
    }
    if (held > 4) {
        fprintf(stderr, "server: %d descriptors for a close-on-exec connection (at most 1 + 3)\n", held);
        return 1;
    }
    printf("ok: server holds %d descriptors for a close-on-exec connection\n", held);
    fflush(stdout);
    /* In an epoll set (level-triggered): the set itself and at most the readiness fd more, and
     * it reports the bytes waiting, before the dup2 below and after it. */
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = s};
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) < 0) die("epoll");
    struct epoll_event got;
    if (epoll_wait(ep, &got, 1, 5000) != 1 || got.data.fd != s || !(got.events & EPOLLIN)) die("epoll_wait");
    if (descriptors_open() - before - held > 2) {
        fprintf(stderr, "server: %d descriptors more for an epoll set (at most 2)\n", descriptors_open() - before - held);
        return 1;
    }
    read_pattern(s, 0, UP_BEFORE, 0, "server");
    write_pattern(s, 0, DOWN_BEFORE, 7);
    if (fcntl(TARGET, F_GETFD) != -1) die("descriptor 100 is in use");
    if (dup2(s, TARGET) != TARGET) die("dup2");
    /* Still registered, the descriptor reports the bytes the client sent past UP_BEFORE. */
    if (epoll_wait(ep, &got, 1, 5000) != 1 || got.data.fd != s || !(got.events & EPOLLIN)) die("epoll_wait after dup2");
    epoll_ctl(ep, EPOLL_CTL_DEL, s, NULL);
    close(ep);
    close(s);
    read_pattern(TARGET, UP_BEFORE, UP_BEFORE + UP_MIDDLE, 0, "server after dup2");
    write_pattern(TARGET, DOWN_BEFORE, DOWN_BEFORE + DOWN_MIDDLE, 7);
    char pid[16];
    snprintf(pid, sizeof pid, "%d", (int)cl);
    execl("/proc/self/exe", argv[0], "after-exec", pid, (char *)NULL);
    die("exec");
}
