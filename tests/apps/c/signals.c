/* Signals during blocking calls on an accelerated connection (run with the shim preloaded, as
 * tests/apps/run.sh does; also passes without it, with plain kernel semantics): a blocking read
 * interrupted by a handler installed without SA_RESTART fails with EINTR, and with SA_RESTART
 * it goes on and returns the data; poll, epoll_wait and select fail with EINTR whatever the
 * flag; a blocking write into a full connection interrupted without SA_RESTART returns the
 * count written so far. A thread sends SIGUSR1 to the main thread; a forked peer takes commands
 * over a pipe. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "scenario.h"

/* The peer: commands over a pipe. 'D': wait 300 ms, send one byte. 'Z' + long n: wait 200 ms,
 * then read and discard n bytes from the connection. 'Q': quit. */
static void peer(int port, int cmds) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(c, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    char cmd;
    static char buf[65536];
    while (read(cmds, &cmd, 1) == 1) {
        if (cmd == 'Q') break;
        if (cmd == 'D') {
            usleep(300000);
            write_all(c, "d", 1);
        } else if (cmd == 'Z') {
            long n;
            if (read(cmds, &n, sizeof n) != sizeof n) die("peer Z");
            usleep(200000);
            while (n > 0) {
                ssize_t k = read(c, buf, n < (long)sizeof buf ? n : (long)sizeof buf);
                if (k <= 0) die("peer drain");
                n -= k;
            }
        }
    }
    exit(0);
}

static volatile sig_atomic_t handled;
static void on_usr1(int sig) {
    (void)sig;
    handled++;
}

static void handler(int flags) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
}

static pthread_t main_thread;
static volatile int kicking;

/* SIGUSR1 to the main thread every `ms` milliseconds until `stop_kicks` (again and again: a
 * signal that lands before the main thread is inside its call would be no test). */
static void *kicker(void *arg) {
    while (kicking) {
        usleep((long)arg * 1000);
        if (kicking) pthread_kill(main_thread, SIGUSR1);
    }
    return NULL;
}

static pthread_t kick_every(long ms) {
    pthread_t t;
    kicking = 1;
    pthread_create(&t, NULL, kicker, (void *)ms);
    return t;
}

static void stop_kicks(pthread_t t) {
    kicking = 0;
    pthread_join(t, NULL);
}

int main(void) {
    alarm(30);
    main_thread = pthread_self();
    struct sockaddr_in a;
    int l = loopback_listener(&a, 1);
    int cp[2];
    if (pipe(cp) < 0) die("pipe");
    pid_t pid = fork();
    if (pid == 0) {
        close(l);
        close(cp[1]);
        peer(ntohs(a.sin_port), cp[0]);
    }
    close(cp[0]);
    int s = accept(l, NULL, NULL);
    if (s < 0) die("accept");
    if (shimmed()) CHECK(segments() == 1, "connection accelerated");
    char b;
    ssize_t r;
    pthread_t t;
    double t0;

    /* read, no SA_RESTART: EINTR. */
    handler(0);
    handled = 0;
    t = kick_every(100);
    t0 = now();
    r = read(s, &b, 1);
    CHECK(r < 0 && errno == EINTR, "read interrupted (no SA_RESTART): EINTR");
    CHECK(handled >= 1 && now() - t0 < 2, "the handler ran, promptly");
    stop_kicks(t);

    /* recv, no SA_RESTART: EINTR too. */
    handled = 0;
    t = kick_every(100);
    r = recv(s, &b, 1, 0);
    CHECK(r < 0 && errno == EINTR, "recv interrupted (no SA_RESTART): EINTR");
    stop_kicks(t);

    /* read, SA_RESTART: goes on, returns the byte sent after the signal. */
    handler(SA_RESTART);
    handled = 0;
    write_all(cp[1], "D", 1);
    t = kick_every(100);
    r = read(s, &b, 1);
    CHECK(r == 1 && b == 'd', "read interrupted (SA_RESTART): restarted, gets the data");
    CHECK(handled >= 1, "the handler ran (SA_RESTART)");
    stop_kicks(t);

    /* poll, epoll_wait, select: EINTR even with SA_RESTART. */
    handled = 0;
    t = kick_every(100);
    struct pollfd p = {.fd = s, .events = POLLIN};
    r = poll(&p, 1, 5000);
    CHECK(r < 0 && errno == EINTR, "poll interrupted: EINTR");
    stop_kicks(t);

    int ep = epoll_create1(0);
    struct epoll_event e = {.events = EPOLLIN, .data.fd = s}, got;
    epoll_ctl(ep, EPOLL_CTL_ADD, s, &e);
    t = kick_every(100);
    r = epoll_wait(ep, &got, 1, 5000);
    CHECK(r < 0 && errno == EINTR, "epoll_wait interrupted: EINTR");
    stop_kicks(t);
    t = kick_every(100);
    sigset_t none;
    sigemptyset(&none);
    r = epoll_pwait(ep, &got, 1, 5000, &none);
    CHECK(r < 0 && errno == EINTR, "epoll_pwait interrupted: EINTR");
    stop_kicks(t);
    close(ep);

    t = kick_every(100);
    fd_set rs;
    FD_ZERO(&rs);
    FD_SET(s, &rs);
    struct timeval tv = {5, 0};
    r = select(s + 1, &rs, NULL, NULL, &tv);
    CHECK(r < 0 && errno == EINTR, "select interrupted: EINTR");
    stop_kicks(t);
    CHECK(handled >= 4, "the handler ran for each");

    /* A blocking write into a connection nobody reads, no SA_RESTART: the count so far. */
    handler(0);
    long big = 64L << 20;
    char *data = calloc(1, big);
    t = kick_every(200);
    r = write(s, data, big);
    CHECK(r > 0 && r < big, "write interrupted after progress: the count written");
    stop_kicks(t);
    if (r > 0) {
        write_all(cp[1], "Z", 1);
        write_all(cp[1], &r, sizeof r);
    }
    /* The connection still works after all that. */
    handler(SA_RESTART);
    write_all(cp[1], "D", 1);
    CHECK(read(s, &b, 1) == 1 && b == 'd', "the connection still works");

    write_all(cp[1], "Q", 1);
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "peer exit");
    if (failures == 0)
        printf("ok: EINTR without SA_RESTART (read, recv, write), restart with it; poll/epoll/select EINTR%s\n",
               shimmed() ? " (accelerated)" : "");
    return failures != 0;
}
