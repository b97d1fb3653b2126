/* A blocking read or write of a connection shared with a fork child, while the child is blocked
 * in the same kind of call (the readers' or the writers' turn is the child's under the shim):
 * over TCP the parent's call waits for the socket as any blocking call does, so SO_RCVTIMEO /
 * SO_SNDTIMEO end it with EAGAIN and a signal handler ends it with EINTR (without SA_RESTART; with
 * it and a timeout set too: signal(7)); with SA_RESTART and no timeout it goes on. Reads: the
 * child blocks in read (nothing sent). Writes: the child blocks in a write bigger than the
 * connection holds (nobody reads), and so does the parent's; kernel TCP lets the parent's in while
 * the child's waits for room, so it may end with a partial count instead. And one timeout covers
 * the wait for the turn and the wait for bytes after it (read_timeout_spans_turn). Each blocking
 * call has a watchdog (alarm) that names it. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>
#include <sys/wait.h>

#include "scenario.h"

static const char *stage = "setting up";
static void hung(int sig) {
    (void)sig;
    static char msg[256];
    int n = snprintf(msg, sizeof msg, "FAIL hung: %s\n", stage);
    if (write(2, msg, n) < 0) _exit(3);
    _exit(2);
}

/* The watchdog for the call `what`; 0 cancels it. Its handler restarts calls (SA_RESTART), so
 * that it does not change what an interrupted call does. */
static void watch(const char *what, unsigned secs) {
    stage = what;
    alarm(secs);
}

static volatile sig_atomic_t handled;
static void on_usr1(int sig) {
    (void)sig;
    handled++;
}

static void handler(int sig, void (*fn)(int), int flags) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, NULL);
}

static void timeout(int fd, int name, long ms) {
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    if (setsockopt(fd, SOL_SOCKET, name, &tv, sizeof tv) < 0) die("setsockopt");
}

static pthread_t main_thread;
static volatile int kicking;
static int kick_fd = -1; /* kicker: after the first kick, writes one byte here (-1: none) */

/* SIGUSR1 to the main thread every 200 ms until `stop_kicks` (again and again: a signal that
 * lands before the main thread is inside its call would be no test). */
static void *kicker(void *arg) {
    (void)arg;
    int first = 1;
    while (kicking) {
        usleep(200000);
        if (!kicking) break;
        pthread_kill(main_thread, SIGUSR1);
        if (first && kick_fd >= 0) {
            usleep(200000);
            write_all(kick_fd, "1", 1);
        }
        first = 0;
    }
    return NULL;
}

static pthread_t kick(void) {
    pthread_t t;
    kicking = 1;
    handled = 0;
    if (pthread_create(&t, NULL, kicker, NULL) != 0) die("pthread_create");
    return t;
}

static void stop_kicks(pthread_t t) {
    kicking = 0;
    pthread_join(t, NULL);
}

/* A connection used once each way before the fork (so decided before it). */
static void used_pair(int *k, int *c) {
    char x;
    connected_pair(k, c, 0);
    write_all(*c, "x", 1);
    write_all(*k, "y", 1);
    if (read_full(*k, &x, 1) < 0 || read_full(*c, &x, 1) < 0) die("first use");
}

/* Waits for the child's word that it is about to block, then gives it time to. */
static void child_blocks(int p) {
    char x;
    if (read(p, &x, 1) != 1) die("child ready");
    usleep(200000);
}

static void reads(void) {
    int k, c, p[2];
    char b[16];
    ssize_t r;
    pthread_t t;
    used_pair(&k, &c);
    if (pipe(p) < 0) die("pipe");
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        /* Blocked in read until the parent's kicker sends "1"; answers with "2" on c, for the
         * parent's read that waited for the readers' turn. */
        watch("the fork child's read", 20);
        write_all(p[1], "r", 1);
        if (read(k, b, sizeof b) <= 0) _exit(4);
        write_all(c, "2", 1);
        _exit(0);
    }
    child_blocks(p[0]);

    timeout(k, SO_RCVTIMEO, 300);
    double t0 = now();
    watch("read with SO_RCVTIMEO 300 ms while the fork child reads", 5);
    r = read(k, b, sizeof b);
    watch("", 0);
    CHECK(r == -1 && errno == EAGAIN, "read with SO_RCVTIMEO: EAGAIN");
    CHECK(now() - t0 >= 0.25, "... after the timeout");
    fprintf(stderr, "read with SO_RCVTIMEO: %zd (%s) after %.0f ms\n", r, r < 0 ? strerror(errno) : "", (now() - t0) * 1000);

    timeout(k, SO_RCVTIMEO, 0);
    handler(SIGUSR1, on_usr1, 0);
    t = kick();
    watch("read interrupted by a handler without SA_RESTART while the fork child reads", 5);
    r = read(k, b, sizeof b);
    watch("", 0);
    stop_kicks(t);
    CHECK(r == -1 && errno == EINTR, "read interrupted (no SA_RESTART): EINTR");
    CHECK(handled >= 1, "... the handler ran");

    timeout(k, SO_RCVTIMEO, 3000);
    handler(SIGUSR1, on_usr1, SA_RESTART);
    t = kick();
    watch("read with SO_RCVTIMEO 3 s interrupted by a handler with SA_RESTART while the fork child reads", 5);
    r = read(k, b, sizeof b);
    watch("", 0);
    stop_kicks(t);
    CHECK(r == -1 && errno == EINTR, "read with a timeout interrupted (SA_RESTART): EINTR");
    CHECK(handled >= 1, "... the handler ran");

    /* SA_RESTART, no timeout: the read goes on. The kicker sends "1" after its first signal: the
     * child's (or, over TCP, perhaps this read's); the child answers "2". */
    timeout(k, SO_RCVTIMEO, 0);
    kick_fd = c;
    t = kick();
    watch("read interrupted by a handler with SA_RESTART while the fork child reads", 10);
    r = read(k, b, sizeof b);
    watch("", 0);
    stop_kicks(t);
    kick_fd = -1;
    CHECK(r == 1 && (b[0] == '1' || b[0] == '2'), "read interrupted (SA_RESTART, no timeout): goes on, gets a byte");
    CHECK(handled >= 1, "... the handler ran");

    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    close(p[0]);
    close(p[1]);
    close(k);
    close(c);
}

static int send_fd;
/* Sends "1" on send_fd 500 ms after it starts, "2" 750 ms later. */
static void *sender(void *arg) {
    (void)arg;
    usleep(500000);
    write_all(send_fd, "1", 1);
    usleep(750000);
    write_all(send_fd, "2", 1);
    return NULL;
}

/* One timeout covers the whole read, the wait for the readers' turn and then for bytes: the
 * child, blocked in read, takes "1" at 500 ms and exits, and "2" comes at 1250 ms; a read with
 * SO_RCVTIMEO 1 s made meanwhile ends with EAGAIN (at 1 s), where a timeout counted again from
 * the turn would have it wait for "2". (Over TCP the parent's read may take "1" itself.) */
static void read_timeout_spans_turn(void) {
    int k, c, p[2];
    char b[16];
    pthread_t t;
    used_pair(&k, &c);
    if (pipe(p) < 0) die("pipe");
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        watch("the fork child's read (timeout spanning the turn)", 20);
        write_all(p[1], "r", 1);
        _exit(read(k, b, sizeof b) == 1 ? 0 : 4);
    }
    child_blocks(p[0]);
    timeout(k, SO_RCVTIMEO, 1000);
    send_fd = c;
    if (pthread_create(&t, NULL, sender, NULL) != 0) die("pthread_create");
    double t0 = now();
    watch("read with SO_RCVTIMEO 1 s, the turn free at 500 ms", 5);
    ssize_t r = read(k, b, sizeof b);
    watch("", 0);
    fprintf(stderr, "read with SO_RCVTIMEO 1 s, the turn free at 500 ms: %zd (%s) after %.0f ms\n", r,
            r < 0 ? strerror(errno) : "", (now() - t0) * 1000);
    CHECK((r == -1 && errno == EAGAIN) || (r == 1 && b[0] == '1'),
          "a read that waited for the turn and then for bytes: EAGAIN at its one timeout");
    pthread_join(t, NULL);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    close(p[0]);
    close(p[1]);
    close(k);
    close(c);
}

/* More than a connection holds (kernel TCP's buffers or the shim's rings). */
#define BIG (64L << 20)

/* A write of BIG bytes that ended early: -1 with `err`, or a partial count (kernel TCP lets a
 * write in while another waits for room: it takes what fits, then waits). */
static int ended(ssize_t r, int err) { return (r == -1 && errno == err) || (r > 0 && r < BIG); }

static void writes(void) {
    int k, c, p[2];
    ssize_t r;
    pthread_t t;
    static char out[BIG];
    used_pair(&k, &c);
    if (pipe(p) < 0) die("pipe");
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        /* Blocked in a write of more than the connection holds; nobody reads c. */
        watch("the fork child's write", 20);
        close(c);
        write_all(p[1], "w", 1);
        r = write(k, out, BIG);
        _exit(0);
    }
    child_blocks(p[0]);

    timeout(k, SO_SNDTIMEO, 300);
    double t0 = now();
    watch("write with SO_SNDTIMEO 300 ms while the fork child writes", 5);
    r = write(k, out, BIG);
    watch("", 0);
    CHECK(ended(r, EAGAIN), "write with SO_SNDTIMEO: EAGAIN (or a partial count)");
    CHECK(r > 0 || now() - t0 >= 0.25, "... after the timeout");
    fprintf(stderr, "write with SO_SNDTIMEO: %zd (%s) after %.0f ms\n", r, r < 0 ? strerror(errno) : "", (now() - t0) * 1000);

    timeout(k, SO_SNDTIMEO, 0);
    handler(SIGUSR1, on_usr1, 0);
    t = kick();
    watch("write interrupted by a handler without SA_RESTART while the fork child writes", 5);
    r = write(k, out, BIG);
    watch("", 0);
    stop_kicks(t);
    CHECK(ended(r, EINTR), "write interrupted (no SA_RESTART): EINTR (or a partial count)");
    CHECK(r > 0 || handled >= 1, "... the handler ran");

    timeout(k, SO_SNDTIMEO, 3000);
    handler(SIGUSR1, on_usr1, SA_RESTART);
    t = kick();
    watch("write with SO_SNDTIMEO 3 s interrupted by a handler with SA_RESTART while the fork child writes", 5);
    r = write(k, out, BIG);
    watch("", 0);
    stop_kicks(t);
    CHECK(ended(r, EINTR), "write with a timeout interrupted (SA_RESTART): EINTR (or a partial count)");
    CHECK(r > 0 || handled >= 1, "... the handler ran");

    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    close(p[0]);
    close(p[1]);
    close(k);
    close(c);
}

int main(void) {
    main_thread = pthread_self();
    handler(SIGALRM, hung, SA_RESTART);
    signal(SIGPIPE, SIG_IGN);
    reads();
    read_timeout_spans_turn();
    writes();
    if (failures) return 1;
    printf("turn_waits: ok%s\n", shimmed() ? " (accelerated)" : "");
    return 0;
}
