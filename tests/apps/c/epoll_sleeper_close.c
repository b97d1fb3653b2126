/* A connection closed by one thread while another sleeps in epoll_wait on a set it is registered
 * in (an event loop's poll thread, and a worker that finishes a response and closes: Erlang's
 * gen_tcp after file:sendfile). In the kernel an epoll set holds no reference to its sockets,
 * so the close ends the connection at once: the peer reads the bytes, then end of stream, while
 * the sleeper sleeps on. Run with the shim preloaded (tests/apps/run.sh); also passes without it.
 * Three registrations: level-triggered, edge-triggered, one-shot. Then the sleeper is woken
 * through a pipe in the same set, which is all it reports. alarm() is the watchdog (a client
 * that never sees the end of stream waits until it fires). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "scenario.h"

static int ep;
static struct epoll_event got[4];
static int reported;

static void *sleeper(void *arg) {
    (void)arg;
    reported = epoll_wait(ep, got, 4, -1);
    return NULL;
}

/* The client: reads "hello" and the end of stream, then exits 0. */
static void client(int port) {
    alarm(20);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    char buf[16];
    if (read_full(c, buf, 5) != 0 || memcmp(buf, "hello", 5) != 0) die("client: read hello");
    if (read(c, buf, 1) != 0) die("client: expected end of stream");
    exit(0);
}

static int one(unsigned events, const char *name) {
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    pid_t cl = fork();
    if (cl < 0) die("fork");
    if (cl == 0) client(ntohs(a.sin_port));
    int s = accept(l, NULL, NULL);
    if (s < 0) die("accept");
    close(l);
    int wake[2];
    if (pipe(wake) < 0) die("pipe");
    ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = events, .data.fd = s};
    struct epoll_event wev = {.events = EPOLLIN, .data.fd = wake[0]};
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, wake[0], &wev) < 0) die("epoll_ctl");
    reported = -2;
    pthread_t t;
    if (pthread_create(&t, NULL, sleeper, NULL) != 0) die("pthread_create");
    /* Asleep before the close (a sleeper that has not started yet sees no connection at all). */
    usleep(100000);
    write_all(s, "hello", 5);
    close(s);
    int st;
    int ok = waitpid(cl, &st, 0) == cl && WIFEXITED(st) && WEXITSTATUS(st) == 0;
    CHECK(ok, name);
    if (write(wake[1], "w", 1) != 1) die("write");
    pthread_join(t, NULL);
    CHECK(reported == 1 && got[0].data.fd == wake[0], "the sleeper reports its pipe only");
    close(ep);
    close(wake[0]);
    close(wake[1]);
    return ok;
}

int main(void) {
    alarm(20);
    one(EPOLLIN, "level-triggered: the client read the bytes and the end of stream");
    one(EPOLLIN | EPOLLET, "edge-triggered: the client read the bytes and the end of stream");
    one(EPOLLIN | EPOLLONESHOT, "one-shot: the client read the bytes and the end of stream");
    if (failures) return 1;
    printf("ok: a close while another thread sleeps in epoll_wait ends the connection at once\n");
    return 0;
}
