/* Connection set-up and tear-down over accelerated sockets (run with the shim preloaded, as
 * tests/apps/run.sh does; also passes without it, with plain kernel semantics): non-blocking
 * connect (EINPROGRESS, then POLLOUT/EPOLLOUT and SO_ERROR 0), refused connects (a closed port,
 * and a port whose colo listener has closed), a connect closed before any I/O, half-close with
 * shutdown(SHUT_WR), SO_LINGER 0 on either side, getsockname/getpeername, a socket made by a
 * raw system call (plain TCP), one connected again after a refusal, one bound to the wildcard
 * address. A forked server handles one connection at a time, its first byte a command. alarm()
 * is the watchdog. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "scenario.h"

/* Under the shim (LD_PRELOAD names it) connections must be accelerated: a segment is open. */
static void addr_str(const struct sockaddr_in *a, char *out, size_t n) {
    char ip[32];
    inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
    snprintf(out, n, "%s:%d", ip, ntohs(a->sin_port));
}

static int port_of(int fd) {
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &len);
    return ntohs(a.sin_port);
}

static int listener(int port) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 16) < 0) die("listen");
    return l;
}

static struct sockaddr_in loopback(int port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    return a;
}

/* ---- the server ----------------------------------------------------------------------------
 * 'P': read "ping", answer "pong" and "<local> <peer>\n" (its view of the addresses), then wait
 *      for EOF.
 * 'H': read to EOF (a half-close), then answer "<count>\n" and 100000 pattern bytes, and close.
 * 'L': close at once with SO_LINGER 0 (an abortive close).
 * 'C': read until EOF or an error (the client closes with SO_LINGER 0); must not hang.
 * 'X': close the second listener (its port is then refused).
 * 'R': the connection must be plain TCP (its socket was made by a raw system call); echo to EOF.
 * 'Q': exit. */
static void server(int l, int l2, int report) {
    int sfail = 0;
    for (;;) {
        int s = accept(l, NULL, NULL);
        if (s < 0) die("accept");
        int accelerated = segments() > 0;
        char cmd;
        if (read(s, &cmd, 1) != 1) {
            /* Closed before any I/O (the offer may have been withdrawn: plain TCP is fine). */
            close(s);
            write_all(report, "d", 1);
            continue;
        }
        if (cmd == 'R') {
            /* From a socket made by a raw system call: plain TCP, echoed. (Counted once the
             * segments of earlier connections are gone; this one's would stay while the client
             * waits for its echo.) */
            if (shimmed() && segments_settled() > 0) {
                fprintf(stderr, "FAIL server: a raw system call's socket was accelerated\n");
                sfail++;
            }
            if (echo_until_eof(s) < 0) sfail++;
            close(s);
            write_all(report, "d", 1);
            continue;
        }
        if (shimmed() && !accelerated) {
            fprintf(stderr, "FAIL server: connection '%c' not accelerated\n", cmd);
            sfail++;
        }
        if (cmd == 'Q') break;
        if (cmd == 'P') {
            char buf[4];
            if (read_full(s, buf, 4) < 0 || memcmp(buf, "ping", 4) != 0) {
                fprintf(stderr, "FAIL server: ping\n");
                sfail++;
            }
            struct sockaddr_in me, peer;
            socklen_t a = sizeof me, b = sizeof peer;
            getsockname(s, (struct sockaddr *)&me, &a);
            getpeername(s, (struct sockaddr *)&peer, &b);
            char line[128], x[48], y[48];
            addr_str(&me, x, sizeof x);
            addr_str(&peer, y, sizeof y);
            snprintf(line, sizeof line, "pong%s %s\n", x, y);
            write_all(s, line, strlen(line));
            char c;
            if (read(s, &c, 1) != 0) {
                fprintf(stderr, "FAIL server: EOF after ping\n");
                sfail++;
            }
        } else if (cmd == 'H') {
            static unsigned char buf[65536];
            long count = 0;
            for (;;) {
                ssize_t n = read(s, buf, sizeof buf);
                if (n < 0 && errno == EINTR) continue;
                if (n < 0) {
                    perror("server H read");
                    sfail++;
                    break;
                }
                if (n == 0) break;
                for (ssize_t i = 0; i < n; i++)
                    if (buf[i] != pattern(count + i)) {
                        fprintf(stderr, "FAIL server: half-close byte %ld\n", count + i);
                        sfail++;
                        break;
                    }
                count += n;
            }
            char line[32];
            snprintf(line, sizeof line, "%ld\n", count);
            write_all(s, line, strlen(line));
            for (long i = 0; i < 100000; i++) buf[i % sizeof buf] = pattern(i);
            unsigned char *big = malloc(100000);
            for (long i = 0; i < 100000; i++) big[i] = pattern(i);
            write_all(s, big, 100000);
            free(big);
        } else if (cmd == 'L') {
            struct linger lg = {1, 0};
            setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        } else if (cmd == 'C') {
            char buf[4096];
            long total = 0;
            ssize_t n;
            while ((n = read(s, buf, sizeof buf)) > 0) total += n;
            if (n < 0 && errno != ECONNRESET) {
                perror("FAIL server: read after the client's abortive close");
                sfail++;
            }
        } else if (cmd == 'X') {
            close(l2);
            l2 = -1;
            write_all(s, "x", 1);
        }
        close(s);
        write_all(report, "d", 1); /* this connection is done */
    }
    exit(sfail != 0);
}

static int sync_fd;

static void wait_done(void) {
    char c;
    CHECK(read(sync_fd, &c, 1) == 1, "server finished the connection");
}

static int dial(int port) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = loopback(port);
    if (connect(c, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    return c;
}

/* On connected `c`: "ping" answered "pong" and the addresses line, over shared memory when
 * shimmed; closes `c` (the whole answer read, so the close is a FIN, not a reset). */
static void ping_accelerated(int c, const char *what) {
    char buf[128];
    size_t got = 0;
    write_all(c, "Pping", 5);
    while (got < sizeof buf && (got == 0 || buf[got - 1] != '\n') && read(c, buf + got, 1) == 1) got++;
    if (got < 5 || memcmp(buf, "pong", 4) != 0 || buf[got - 1] != '\n') {
        fprintf(stderr, "FAIL %s: no pong\n", what);
        failures++;
    }
    if (shimmed() && segments() != 1) {
        fprintf(stderr, "FAIL %s: not accelerated\n", what);
        failures++;
    }
    close(c);
    wait_done();
}

int main(void) {
    alarm(30);
    /* Many short connections in a row: the shim may send such a destination over TCP on
     * purpose (COLO_SHORT_LIVED); this test counts accelerated connections, so opt out. */
    setenv("COLO_SHORT_LIVED", "accelerate", 1);
    signal(SIGPIPE, SIG_IGN);
    int pipefd[2];
    if (pipe(pipefd) < 0) die("pipe");
    pid_t pid = fork();
    if (pid == 0) {
        /* The server listens itself (a listener inherited from us would be served by our shim). */
        alarm(30); /* its own watchdog: it waits in accept if we die */
        close(pipefd[0]);
        /* The shim's own descriptors (rendezvous, offer service) stay out of the numbers the
         * program uses: a dup2 onto a number it believes free must not close one of them. So
         * no descriptor below 64 opens but the two listeners. */
        char was_open[64];
        for (int fd = 0; fd < 64; fd++) was_open[fd] = fcntl(fd, F_GETFD) >= 0;
        int l = listener(0), l2 = listener(0);
        for (int fd = 0; fd < 64; fd++) {
            if (!was_open[fd] && fd != l && fd != l2 && fcntl(fd, F_GETFD) >= 0) {
                fprintf(stderr, "FAIL: descriptor %d is open and is not the program's (listeners %d, %d)\n", fd, l, l2);
                exit(1);
            }
        }
        int ports[2] = {port_of(l), port_of(l2)};
        write_all(pipefd[1], ports, sizeof ports);
        server(l, l2, pipefd[1]);
    }
    close(pipefd[1]);
    sync_fd = pipefd[0];
    int ports[2];
    if (read_full(sync_fd, ports, sizeof ports) < 0) die("server ports");
    int port = ports[0], port2 = ports[1];
    struct sockaddr_in a = loopback(port);

    /* 1. Non-blocking connect, POLLOUT, SO_ERROR; addresses; data both ways. */
    int c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int r = connect(c, (struct sockaddr *)&a, sizeof a);
    CHECK(r == 0 || (r < 0 && errno == EINPROGRESS), "non-blocking connect: 0 or EINPROGRESS");
    struct pollfd p = {.fd = c, .events = POLLOUT};
    CHECK(poll(&p, 1, 5000) == 1 && (p.revents & POLLOUT) && !(p.revents & (POLLERR | POLLHUP)),
          "non-blocking connect: POLLOUT");
    int err = -1;
    socklen_t elen = sizeof err;
    CHECK(getsockopt(c, SOL_SOCKET, SO_ERROR, &err, &elen) == 0 && err == 0, "non-blocking connect: SO_ERROR 0");
    CHECK(write(c, "Pping", 5) == 5, "write after a non-blocking connect");
    char line[128] = {0};
    size_t got = 0;
    while (got < sizeof line - 1 && (got == 0 || line[got - 1] != '\n')) {
        p.events = POLLIN;
        if (poll(&p, 1, 5000) != 1) break;
        ssize_t n = read(c, line + got, sizeof line - 1 - got);
        if (n <= 0) break;
        got += n;
    }
    struct sockaddr_in me, peer;
    socklen_t ml = sizeof me, pl = sizeof peer;
    CHECK(getsockname(c, (struct sockaddr *)&me, &ml) == 0 && ml == sizeof me, "getsockname");
    CHECK(getpeername(c, (struct sockaddr *)&peer, &pl) == 0 && pl == sizeof peer, "getpeername");
    char x[48], y[48], expect[128];
    addr_str(&peer, x, sizeof x);
    addr_str(&me, y, sizeof y);
    snprintf(expect, sizeof expect, "pong%s %s\n", x, y);
    CHECK(strcmp(line, expect) == 0, "the server's addresses are ours swapped");
    CHECK(peer.sin_port == htons(port) && peer.sin_addr.s_addr == htonl(INADDR_LOOPBACK), "peer is the listener");
    if (shimmed()) CHECK(segments() == 1, "connection accelerated");
    close(c);
    wait_done();
    if (shimmed()) {
        /* A background thread unmaps closed segments: give it a moment. */
        for (int i = 0; i < 200 && segments() != 0; i++) usleep(10000);
        CHECK(segments() == 0, "segment released after close");
    }

    /* 2. The same with epoll: EPOLLOUT after EINPROGRESS. */
    c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    r = connect(c, (struct sockaddr *)&a, sizeof a);
    CHECK(r == 0 || (r < 0 && errno == EINPROGRESS), "non-blocking connect (epoll): EINPROGRESS");
    int ep = epoll_create1(0);
    struct epoll_event e = {.events = EPOLLOUT, .data.u64 = 99};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, c, &e) == 0, "epoll_ctl ADD on a connecting socket");
    struct epoll_event got_e;
    CHECK(epoll_wait(ep, &got_e, 1, 5000) == 1 && (got_e.events & EPOLLOUT) && got_e.data.u64 == 99, "EPOLLOUT");
    elen = sizeof err;
    err = -1;
    CHECK(getsockopt(c, SOL_SOCKET, SO_ERROR, &err, &elen) == 0 && err == 0, "SO_ERROR 0 (epoll)");
    CHECK(write(c, "Pping", 5) == 5, "write (epoll)");
    e.events = EPOLLIN;
    epoll_ctl(ep, EPOLL_CTL_MOD, c, &e);
    CHECK(epoll_wait(ep, &got_e, 1, 5000) == 1 && (got_e.events & EPOLLIN), "EPOLLIN for the answer");
    char buf[128];
    ssize_t n = read(c, buf, sizeof buf);
    CHECK(n >= 4 && memcmp(buf, "pong", 4) == 0, "answer (epoll)");
    close(ep);
    close(c);
    wait_done();

    /* 3. Refused: a port nobody listens on, blocking and non-blocking. */
    int t = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in any = loopback(0);
    bind(t, (struct sockaddr *)&any, sizeof any);
    int closed_port = port_of(t);
    close(t);
    struct sockaddr_in ca = loopback(closed_port);
    c = socket(AF_INET, SOCK_STREAM, 0);
    r = connect(c, (struct sockaddr *)&ca, sizeof ca);
    CHECK(r < 0 && errno == ECONNREFUSED, "blocking connect to a closed port: ECONNREFUSED");
    close(c);
    c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    r = connect(c, (struct sockaddr *)&ca, sizeof ca);
    if (r < 0 && errno == EINPROGRESS) {
        p.fd = c;
        p.events = POLLOUT;
        CHECK(poll(&p, 1, 5000) == 1 && (p.revents & (POLLERR | POLLHUP)), "refused: POLLERR");
        elen = sizeof err;
        CHECK(getsockopt(c, SOL_SOCKET, SO_ERROR, &err, &elen) == 0 && err == ECONNREFUSED, "refused: SO_ERROR");
    } else {
        CHECK(r < 0 && errno == ECONNREFUSED, "non-blocking connect to a closed port: ECONNREFUSED");
    }
    close(c);

    /* 4. A port whose (colo) listener has been closed is refused too. */
    c = dial(port);
    write_all(c, "X", 1);
    CHECK(read(c, buf, 1) == 1, "second listener closed");
    close(c);
    wait_done();
    struct sockaddr_in a2 = loopback(port2);
    c = socket(AF_INET, SOCK_STREAM, 0);
    r = connect(c, (struct sockaddr *)&a2, sizeof a2);
    CHECK(r < 0 && errno == ECONNREFUSED, "connect to a closed colo listener: ECONNREFUSED");
    close(c);

    /* 5. Connected and closed before any I/O: the server sees EOF. */
    c = dial(port);
    close(c);
    wait_done();

    /* 6. Half-close: we send, shut down writing; the server reads EOF and still answers. */
    c = dial(port);
    long total = 300000;
    unsigned char *data = malloc(total);
    data[0] = 'H';
    for (long i = 0; i < total - 1; i++) data[i + 1] = pattern(i);
    write_all(c, data, total);
    CHECK(shutdown(c, SHUT_WR) == 0, "shutdown(SHUT_WR)");
    CHECK(send(c, "z", 1, MSG_NOSIGNAL) < 0 && errno == EPIPE, "send after SHUT_WR: EPIPE");
    char num[32] = {0};
    size_t k = 0;
    while (k < sizeof num - 1 && read(c, num + k, 1) == 1 && num[k] != '\n') k++;
    CHECK(atol(num) == total - 1, "server read everything before EOF");
    unsigned char *back = malloc(100000);
    CHECK(read_full(c, back, 100000) == 0, "answer after our half-close");
    int same = 1;
    for (long i = 0; i < 100000; i++)
        if (back[i] != pattern(i)) same = 0;
    CHECK(same, "answer intact");
    CHECK(read(c, buf, 1) == 0, "EOF after the answer");
    close(c);
    wait_done();
    free(data);
    free(back);

    /* 8. The server closed: as over kernel TCP, the first write after our EOF is taken (the
     * peer answers it with a reset) and a later one fails with EPIPE. */
    c = dial(port);
    write_all(c, "E", 1);
    wait_done();
    CHECK(read(c, buf, 1) == 0, "EOF from the closed server");
    CHECK(send(c, "a", 1, MSG_NOSIGNAL) == 1, "first write after the peer closed: taken");
    usleep(50000); /* the peer's reset arrives */
    r = send(c, "b", 1, MSG_NOSIGNAL);
    CHECK(r < 0 && (errno == EPIPE || errno == ECONNRESET), "a later write: EPIPE");
    close(c);

    /* 7. The server closes with SO_LINGER 0: we see EOF or ECONNRESET, no hang. */
    c = dial(port);
    write_all(c, "L", 1);
    n = read(c, buf, sizeof buf);
    CHECK(n == 0 || (n < 0 && errno == ECONNRESET), "peer's abortive close: EOF or ECONNRESET");
    close(c);
    wait_done();

    /* 8. We close with SO_LINGER 0 after sending: the server must not hang. */
    c = dial(port);
    write_all(c, "Cabc", 4);
    struct linger lg = {1, 0};
    CHECK(setsockopt(c, SOL_SOCKET, SO_LINGER, &lg, sizeof lg) == 0, "SO_LINGER 0");
    close(c);
    wait_done();

    /* 9. A socket the shim did not see made (a raw system call) stays plain TCP, bytes intact
     * both ways. */
    c = (int)syscall(SYS_socket, AF_INET, SOCK_STREAM, 0);
    CHECK(c >= 0 && connect(c, (struct sockaddr *)&a, sizeof a) == 0, "raw socket: connect");
    data = malloc(200001);
    back = malloc(200000);
    data[0] = 'R';
    for (long i = 0; i < 200000; i++) data[i + 1] = pattern(i);
    write_all(c, data, 200001);
    CHECK(shutdown(c, SHUT_WR) == 0, "raw socket: shutdown(SHUT_WR)");
    CHECK(read_full(c, back, 200000) == 0 && memcmp(back, data + 1, 200000) == 0, "raw socket: echo intact");
    CHECK(read(c, buf, 1) == 0, "raw socket: EOF after the echo");
    close(c);
    wait_done();
    free(data);
    free(back);

    /* 10. A socket whose connect was refused may connect again (Linux allows it), and is then
     * accelerated like any other. (`ping_accelerated` counts segments: none of earlier
     * connections may be left.) */
    segments_settled();
    c = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(connect(c, (struct sockaddr *)&ca, sizeof ca) < 0 && errno == ECONNREFUSED, "refused, then...");
    CHECK(connect(c, (struct sockaddr *)&a, sizeof a) == 0, "...the same socket connects");
    ping_accelerated(c, "the reconnected socket");

    /* 11. A socket the application bound to a port on the wildcard address is accelerated too
     * (the kernel picks the source address at connect). */
    segments_settled();
    c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in wild = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    CHECK(bind(c, (struct sockaddr *)&wild, sizeof wild) == 0, "bind to the wildcard address");
    int wild_port = port_of(c);
    CHECK(connect(c, (struct sockaddr *)&a, sizeof a) == 0, "connect from the wildcard address");
    CHECK(port_of(c) == wild_port, "the bound port kept");
    ping_accelerated(c, "the wildcard-bound socket");

    c = dial(port);
    write_all(c, "Q", 1);
    close(c);
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "server exit");
    if (failures == 0)
        printf("ok: non-blocking connect (poll, epoll), refused, half-close, SO_LINGER 0, addresses, raw, reconnected and wildcard-bound sockets%s\n",
               shimmed() ? " (accelerated)" : "");
    return failures != 0;
}
