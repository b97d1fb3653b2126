/* A one-shot registration modified to no events at all (EPOLL_CTL_MOD with only EPOLLONESHOT),
 * as Erlang's BEAM "deselects" a socket its scheduler reads directly: the kernel reports it no
 * input, so a thread asleep on the set is not woken by the connection's traffic. A forked client
 * makes ROUNDS echo round trips that the main thread serves with blocking reads while another
 * thread sleeps in epoll_wait on the set; the sleeper's voluntary context switches (from
 * /proc/self/task/TID/status) must not grow with the round trips (a wake-up per message is a
 * context switch and kernel calls for nothing). Then the registration is re-armed for input and
 * the client's last byte must end the sleep with it; and, disarmed again, the client's close
 * must end no sleep (TCP reports a peer's close to no interest). A second client's reset, though,
 * must end a sleep on no events with EPOLLERR and EPOLLHUP, as the kernel reports them always.
 * alarm() is the watchdog. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "scenario.h"

#define ROUNDS 400
#define DATA 0x5eed

static int ep, conn;
static pid_t sleeper_tid;
static struct epoll_event got[8];
static int sleep_timeout = -1, nev = -1;

static void *sleeper(void *arg) {
    (void)arg;
    sleeper_tid = (pid_t)syscall(SYS_gettid);
    do nev = epoll_wait(ep, got, 8, sleep_timeout);
    while (nev < 0 && errno == EINTR);
    return NULL;
}

static long switches(pid_t tid) {
    char path[64], line[256];
    long v = -1;
    snprintf(path, sizeof path, "/proc/self/task/%d/status", tid);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "voluntary_ctxt_switches: %ld", &v) == 1) break;
    if (f) fclose(f);
    return v;
}

static int mod(unsigned events) {
    struct epoll_event e = {.events = events, .data.u64 = DATA};
    return epoll_ctl(ep, EPOLL_CTL_MOD, conn, &e);
}

/* Reads exactly n bytes or dies. */
static void read_all(int fd, void *b, size_t n) {
    if (read_full(fd, b, n) < 0) die("read");
}

static void client(struct sockaddr_in *a) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    char b[64] = {0}, go;
    if (s < 0 || connect(s, (struct sockaddr *)a, sizeof *a) < 0) die("connect");
    if (write(s, "s", 1) != 1) die("write");
    read_all(s, &go, 1); /* the server is ready for the round trips */
    for (int i = 0; i < ROUNDS; i++) {
        if (write(s, b, sizeof b) != (ssize_t)sizeof b) die("write");
        read_all(s, b, sizeof b);
    }
    read_all(s, &go, 1); /* re-armed for input: the last byte */
    if (write(s, "e", 1) != 1) die("write");
    read_all(s, &go, 1); /* disarmed again: the close */
    close(s);
    _exit(0);
}

/* Connects, waits for the server's byte, then resets the connection (SO_LINGER 0). */
static void resetter(struct sockaddr_in *a) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    char go;
    if (s < 0 || connect(s, (struct sockaddr *)a, sizeof *a) < 0) die("connect");
    read_all(s, &go, 1);
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(s);
    _exit(0);
}

int main(void) {
    alarm(30);
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    pid_t kid = fork();
    if (kid < 0) die("fork");
    if (kid == 0) client(&a);
    conn = accept(l, NULL, NULL);
    if (conn < 0) die("accept");
    ep = epoll_create1(0);
    struct epoll_event e = {.events = EPOLLIN | EPOLLONESHOT, .data.u64 = DATA}, out[8];
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, conn, &e) == 0, "ADD IN|ONESHOT");
    CHECK(epoll_wait(ep, out, 8, 10000) == 1 && out[0].data.u64 == DATA, "the first byte is reported");
    char b[64];
    read_all(conn, b, 1);
    CHECK(mod(EPOLLONESHOT) == 0, "MOD to no events");

    pthread_t t;
    pthread_create(&t, NULL, sleeper, NULL);
    while (!__atomic_load_n(&sleeper_tid, __ATOMIC_SEQ_CST)) usleep(1000);
    usleep(200000); /* let it fall asleep */
    long before = switches(sleeper_tid);
    if (write(conn, "g", 1) != 1) die("write");
    for (int i = 0; i < ROUNDS; i++) {
        read_all(conn, b, sizeof b);
        if (write(conn, b, sizeof b) != (ssize_t)sizeof b) die("write");
    }
    long after = switches(sleeper_tid);
    fprintf(stderr, "sleeper: %ld voluntary context switches in %d round trips\n", after - before, ROUNDS);
    CHECK(before >= 0 && after - before < ROUNDS / 10, "a registration with no events is not woken by the connection's traffic");
    CHECK(__atomic_load_n(&nev, __ATOMIC_SEQ_CST) == -1, "nothing was reported to no events");

    CHECK(mod(EPOLLIN | EPOLLONESHOT) == 0, "MOD back to IN|ONESHOT");
    if (write(conn, "r", 1) != 1) die("write");
    pthread_join(t, NULL);
    CHECK(nev == 1 && got[0].data.u64 == DATA && (got[0].events & EPOLLIN), "re-armed: the client's byte ends the sleep");
    read_all(conn, b, 1);

    CHECK(mod(EPOLLONESHOT) == 0, "MOD to no events again");
    sleep_timeout = 500;
    sleeper_tid = 0;
    pthread_create(&t, NULL, sleeper, NULL);
    if (write(conn, "c", 1) != 1) die("write");
    int st;
    waitpid(kid, &st, 0);
    pthread_join(t, NULL);
    CHECK(nev == 0, "the client's close is reported to no events as TCP does it: not at all");
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the client ran through");
    ssize_t r = read(conn, b, sizeof b);
    CHECK(r == 0, "then a read finds the end of stream");

    pid_t kid2 = fork();
    if (kid2 < 0) die("fork");
    if (kid2 == 0) resetter(&a);
    int c2 = accept(l, NULL, NULL);
    if (c2 < 0) die("accept");
    struct epoll_event e2 = {.events = EPOLLONESHOT, .data.u64 = DATA + 1};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, c2, &e2) == 0, "ADD the second connection with no events");
    sleep_timeout = 10000;
    pthread_create(&t, NULL, sleeper, NULL);
    usleep(100000);
    if (write(c2, "x", 1) != 1) die("write");
    waitpid(kid2, &st, 0);
    pthread_join(t, NULL);
    CHECK(nev == 1 && got[0].data.u64 == DATA + 1 && (got[0].events & (EPOLLERR | EPOLLHUP)) == (EPOLLERR | EPOLLHUP),
          "the second client's reset is reported to no events: EPOLLERR|EPOLLHUP");
    if (nev == 1) fprintf(stderr, "reset reported as events 0x%x\n", got[0].events);
    return failures ? 1 : 0;
}
