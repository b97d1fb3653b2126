/* fork while another thread is inside a read or a write of a connection: the child gets one
 * thread, and its copy of the connection must work as the kernel's socket does. Over TCP the
 * child can write where a parent's thread waits to read, read where one waits to write, and
 * close either. Two rounds: a parent thread blocked in read(k) (nothing sent), then one blocked
 * in write(c) (the peer end k not read, so the ring fills). Each child does its calls with an
 * alarm() of its own (a hang kills it: the parent sees the signal), then the parent lets its
 * thread finish and checks the bytes. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#include "scenario.h"

static int k, c;
static char got[16];
static ssize_t got_n;
static volatile long wrote;

static void *reader(void *arg) {
    (void)arg;
    got_n = read(k, got, sizeof got);
    return NULL;
}

#define BLOCKED_WRITE (16L << 20)

static void *writer(void *arg) {
    (void)arg;
    static unsigned char out[1 << 16];
    for (size_t i = 0; i < sizeof out; i++) out[i] = 'w';
    while (wrote < BLOCKED_WRITE) {
        size_t want = BLOCKED_WRITE - wrote < (long)sizeof out ? (size_t)(BLOCKED_WRITE - wrote) : sizeof out;
        ssize_t n = write(c, out, want); /* short after a stop, as over TCP */
        if (n <= 0) break;
        wrote += n;
    }
    return NULL;
}

/* The child's watchdog: the parent may be stopped by it. */
static void child_timed_out(int sig) {
    (void)sig;
    kill(getppid(), SIGCONT);
    _exit(9);
}

/* Runs `child` in a fork child with a watchdog; whether it exited 0. `meanwhile` (if any) runs
 * in the parent first. */
static int in_child(int (*child)(void), void (*meanwhile)(void)) {
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        signal(SIGALRM, child_timed_out);
        alarm(10);
        _exit(child());
    }
    if (meanwhile) meanwhile();
    int st;
    if (waitpid(pid, &st, 0) != pid) return 0;
    if (WIFSIGNALED(st)) fprintf(stderr, "child killed by signal %d\n", WTERMSIG(st));
    if (WIFEXITED(st) && WEXITSTATUS(st) != 0) fprintf(stderr, "child exit status %d\n", WEXITSTATUS(st));
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* Parent's thread blocked in read(k): the child writes on k and reads it back from c; sends on c
 * the bytes the parent's read waits for; once the parent says its read returned (`go`), sends
 * more and reads them off k itself; shuts k down for writing and closes both. */
static int go[2];
static pthread_t t;

/* In the parent: once its thread's read returned, the child goes on. */
static void reader_returned(void) {
    pthread_join(t, NULL);
    if (write(go[1], "g", 1) != 1) die("write");
}

static int child_of_reader(void) {
    char b[8];
    if (write(k, "to-c", 4) != 4) return 2;
    if (read(c, b, sizeof b) != 4 || memcmp(b, "to-c", 4) != 0) return 3;
    if (write(c, "to-k", 4) != 4) return 6;
    if (read(go[0], b, 1) != 1) return 7;
    if (write(c, "again", 5) != 5) return 8;
    if (read(k, b, sizeof b) != 5 || memcmp(b, "again", 5) != 0) return 9;
    if (shutdown(k, SHUT_WR) < 0) return 4;
    if (read(c, b, sizeof b) != 0) return 5;
    close(k);
    close(c);
    return 0;
}

static volatile int draining;

static void *drainer(void *arg) {
    (void)arg;
    char b[1 << 16];
    while (draining) {
        struct pollfd p = {.fd = k, .events = POLLIN};
        if (poll(&p, 1, 50) > 0 && recv(k, b, sizeof b, MSG_DONTWAIT) == 0) break;
    }
    return NULL;
}

/* Parent's thread blocked in write(c), the ring full: the child's non-blocking write gets
 * EAGAIN or takes bytes (never waits), a poll answers, a read of k takes bytes; then, with a
 * thread of its own reading k (so that both writers make progress, as over TCP), a blocking
 * write of its own on c returns; and closing both ends returns. */
static int child_of_writer(void) {
    char b[4096];
    struct pollfd p[2] = {{.fd = c, .events = POLLOUT}, {.fd = k, .events = POLLIN}};
    if (poll(p, 2, 1000) < 1 || !(p[1].revents & POLLIN)) return 2;
    ssize_t n = send(c, "x", 1, MSG_DONTWAIT);
    if (!(n == 1 || (n < 0 && errno == EAGAIN))) return 3;
    if (read(k, b, sizeof b) <= 0) return 4;
    draining = 1;
    pthread_t t;
    pthread_create(&t, NULL, drainer, NULL);
    int ok = write(c, "ZZZZ", 4) == 4;
    draining = 0;
    pthread_join(t, NULL);
    if (!ok) return 5;
    close(k);
    close(c);
    return 0;
}

int main(void) {
    alarm(40);
    connected_pair(&k, &c, 0);
    write_all(c, "x", 1);
    char x;
    CHECK(read_full(k, &x, 1) == 0, "the connection carries a byte");

    pthread_create(&t, NULL, reader, NULL);
    usleep(200000);
    if (pipe(go) < 0) die("pipe");
    CHECK(in_child(child_of_reader, reader_returned), "a child forked while a thread reads writes, reads and closes its copy");
    CHECK(got_n == 4 && memcmp(got, "to-k", 4) == 0, "the parent's blocked read gets the bytes the child sent for it");

    pthread_create(&t, NULL, writer, NULL);
    usleep(300000);
    CHECK(wrote < BLOCKED_WRITE, "the writer is blocked (the ring is full)");
    CHECK(in_child(child_of_writer, NULL), "a child forked while a thread writes polls, writes, reads and closes its copy");
    /* Drain k until the writer is done; every byte is one of the writes' ('w', or the child's). */
    static unsigned char b[1 << 16];
    long total = 0, bad = 0;
    int flags = fcntl(k, F_GETFL);
    fcntl(k, F_SETFL, flags | O_NONBLOCK);
    double until = now() + 20;
    while (now() < until) {
        ssize_t n = read(k, b, sizeof b);
        if (n > 0) {
            for (ssize_t i = 0; i < n; i++) bad += b[i] != 'w' && b[i] != 'x' && b[i] != 'Z';
            total += n;
        } else if (wrote >= BLOCKED_WRITE) {
            break;
        } else {
            usleep(1000);
        }
    }
    pthread_join(t, NULL);
    CHECK(wrote == BLOCKED_WRITE, "the parent's blocked write finishes");
    CHECK(bad == 0, "every byte read is one written");
    close(k);
    close(c);
    if (failures) return 1;
    printf("ok\n");
    return 0;
}
