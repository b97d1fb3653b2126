/* connect(AF_UNSPEC) on a connected TCP socket disconnects it (Linux: an abortive end, a reset
 * for the peer): the peer's read fails with ECONNRESET, its write after that with EPIPE, and the
 * disconnected socket reads none of the bytes the peer wrote before, the rings' included. A
 * non-blocking connect disconnected so before the program looked at it again (its server has
 * accepted), then connected to a second server: the bytes written then reach the second server,
 * none the first. And a connection a forked child holds too: the peer is told at once, as the
 * kernel resets the socket whoever holds it.
 * Run with the shim preloaded (tests/apps/run.sh); also passes without it. alarm() is the
 * watchdog. */
#define _GNU_SOURCE
#include <poll.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>

#include "scenario.h"

/* Waits up to 5 s for `fd` to be readable, then reads up to `n` bytes without waiting. */
static ssize_t read_when_ready(int fd, char *b, size_t n) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    poll(&p, 1, 5000);
    return recv(fd, b, n, MSG_DONTWAIT);
}

/* A non-blocking connect to a first server, which accepts it, is disconnected before the program
 * looks at it again, then connected to a second server. */
static void reconnected(void) {
    struct sockaddr_in a1, a2;
    int l1 = loopback_listener(&a1, 4), l2 = loopback_listener(&a2, 4), acc[2];
    if (pipe(acc) < 0) die("pipe");
    pid_t first = fork();
    if (first < 0) die("fork");
    if (first == 0) {
        close(l2);
        int s = accept(l1, NULL, NULL);
        write_all(acc[1], "a", 1);
        char b[8];
        _exit(s < 0 || read_when_ready(s, b, sizeof b) > 0);
    }
    close(l1);
    int c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    CHECK(connect(c, (struct sockaddr *)&a1, sizeof a1) == 0 || errno == EINPROGRESS, "a non-blocking connect to the first server");
    char b[8];
    CHECK(read_full(acc[0], b, 1) == 0, "the first server accepted");
    struct sockaddr sa = {.sa_family = AF_UNSPEC};
    CHECK(connect(c, &sa, sizeof sa) == 0, "connect(AF_UNSPEC) disconnects it");
    CHECK(connect(c, (struct sockaddr *)&a2, sizeof a2) == 0 || errno == EINPROGRESS, "connected again, to the second server");
    struct pollfd p = {.fd = c, .events = POLLOUT};
    CHECK(poll(&p, 1, 5000) == 1 && (p.revents & POLLOUT), "writable");
    int s2 = accept(l2, NULL, NULL);
    CHECK(s2 >= 0 && send(c, "hello", 5, 0) == 5, "the bytes written");
    CHECK(read_when_ready(s2, b, sizeof b) == 5 && memcmp(b, "hello", 5) == 0, "the second server reads them");
    int st;
    CHECK(waitpid(first, &st, 0) == first && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the first server reads none of them");
    close(c);
    close(s2);
    close(l2);
}

/* A connection that a forked child holds too is disconnected by its parent. */
static void shared(void) {
    int k, c, go[2];
    connected_pair(&k, &c, 0);
    if (pipe(go) < 0) die("pipe");
    pid_t child = fork();
    if (child < 0) die("fork");
    if (child == 0) {
        /* Holds its copy of the connection until told to end. */
        char x;
        close(k);
        close(go[1]);
        _exit(read(go[0], &x, 1) < 0);
    }
    close(go[0]);
    struct sockaddr sa = {.sa_family = AF_UNSPEC};
    CHECK(connect(c, &sa, sizeof sa) == 0, "connect(AF_UNSPEC) of a connection a child holds too");
    struct pollfd p = {.fd = k, .events = POLLIN};
    CHECK(poll(&p, 1, 5000) == 1, "the peer is told while the child holds its copy");
    char b[8];
    errno = 0;
    CHECK(recv(k, b, sizeof b, MSG_DONTWAIT) == -1 && errno == ECONNRESET, "the peer's read: ECONNRESET");
    close(go[1]);
    int st;
    CHECK(waitpid(child, &st, 0) == child && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child ended");
    close(k);
    close(c);
}

int main(void) {
    alarm(10);
    signal(SIGPIPE, SIG_IGN);
    int k, c;
    connected_pair(&k, &c, 0);
    write_all(k, "ping", 4);
    char b[8];
    CHECK(read_full(c, b, 4) == 0 && memcmp(b, "ping", 4) == 0, "the connection carries bytes");
    write_all(k, "late", 4);
    struct sockaddr sa = {.sa_family = AF_UNSPEC};
    CHECK(connect(c, &sa, sizeof sa) == 0, "connect(AF_UNSPEC) disconnects");
    struct pollfd p = {.fd = k, .events = POLLIN};
    CHECK(poll(&p, 1, 5000) == 1, "the peer is told");
    errno = 0;
    ssize_t r = read(k, b, sizeof b);
    CHECK(r == -1 && errno == ECONNRESET, "the peer's read: ECONNRESET");
    errno = 0;
    r = write(k, "more", 4);
    CHECK(r == -1 && errno == EPIPE, "the peer's write after that: EPIPE");
    r = read(c, b, sizeof b);
    CHECK(r <= 0, "the disconnected socket reads none of the peer's bytes");
    close(k);
    close(c);
    reconnected();
    shared();
    return failures != 0;
}
