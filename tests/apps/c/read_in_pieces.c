/* A reader that takes each message in pieces (a header byte, a length byte, then the rest, as
 * libmosquitto does), each read filling its buffer with bytes left behind it:
 *  1. the bytes arrive intact and in order, and under the shim the reads ring the connection's
 *     self bell (an eventfd write, counted in /proc/self/io's syscw) once, not once a piece;
 *  2. an edge-triggered waiter that read part of what arrived, and then the rest, gets a new
 *     edge for every later arrival, and no report for the bytes its partial read left;
 *  3. two processes sharing the connection through fork, each polling it (level-triggered) and
 *     reading one byte a wake-up, take every byte between them: neither sleeps while bytes
 *     wait (the self bell one process kept rung is drained by the other), and no poll without
 *     a timeout returns 0 (one whose first look found the byte, taken by the other process
 *     before the look was confirmed, did).
 * A lost edge or wake-up hangs: alarm() is the watchdog. */
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include "scenario.h"

#define MESSAGES 300
#define PAYLOAD 60
#define ET_ROUNDS 5000
#define FORK_ROUNDS 3000
#define BURST 3

/* The write system calls this process has made (every thread), or -1 if not counted. */
static long write_calls(void) {
    FILE *f = fopen("/proc/self/io", "r");
    if (!f) return -1;
    char line[128];
    long n = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "syscw: %ld", &n) == 1) break;
    fclose(f);
    return n;
}

static void pieces(void) {
    int k, c;
    connected_pair(&k, &c, 0);
    static unsigned char all[MESSAGES * (2 + PAYLOAD)];
    for (int m = 0; m < MESSAGES; m++) {
        unsigned char *p = all + m * (2 + PAYLOAD);
        p[0] = 0x30;
        p[1] = PAYLOAD;
        for (int i = 0; i < PAYLOAD; i++) p[2 + i] = pattern(m * PAYLOAD + i);
    }
    write_all(k, all, sizeof all);
    usleep(20000);
    long before = write_calls();
    int bad = 0;
    for (int m = 0; m < MESSAGES; m++) {
        unsigned char h, len, body[256];
        if (read(c, &h, 1) != 1 || read(c, &len, 1) != 1) die("read header");
        if (read_full(c, body, len) != 0) die("read body");
        bad += h != 0x30 || len != PAYLOAD || memcmp(body, all + m * (2 + PAYLOAD) + 2, PAYLOAD) != 0;
    }
    long rings = write_calls() - before;
    printf("pieces: %d messages read in %d pieces, %ld write calls meanwhile\n", MESSAGES, 3 * MESSAGES, rings);
    CHECK(bad == 0, "pieces: every message intact and in order");
    if (shimmed() && before >= 0)
        CHECK(rings < 10, "pieces: the self bell rung once, not once a piece that left bytes");
    close(k);
    close(c);
}

static int et_k, go[2];

static void *et_writer(void *arg) {
    (void)arg;
    unsigned char seq = 0;
    char g;
    for (int i = 0; i < ET_ROUNDS; i++) {
        if (read(go[0], &g, 1) != 1) die("go");
        /* Sometimes at once, sometimes once the waiter is likely asleep. */
        if (i % 3 == 1) usleep(50);
        else if (i % 3 == 2) sched_yield();
        unsigned char two[2] = {seq, (unsigned char)(seq + 1)};
        seq += 2;
        write_all(et_k, two, 2);
    }
    return NULL;
}

static void edges_after_partial_reads(void) {
    int c;
    connected_pair(&et_k, &c, SOCK_NONBLOCK);
    if (pipe(go) != 0) die("pipe");
    int ep = epoll_create1(0);
    struct epoll_event e = {.events = EPOLLIN | EPOLLET, .data.u64 = 9};
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, c, &e) != 0) die("epoll_ctl");
    pthread_t t;
    if (pthread_create(&t, NULL, et_writer, NULL) != 0) die("pthread_create");
    unsigned char want = 0;
    int order = 0, extra = 0;
    for (int i = 0; i < ET_ROUNDS; i++) {
        if (write(go[1], "g", 1) != 1) die("go");
        struct epoll_event got;
        /* New bytes come: an edge, whatever is left unread from earlier rounds. */
        int n = epoll_wait(ep, &got, 1, -1);
        if (n != 1 || !(got.events & EPOLLIN) || got.data.u64 != 9) die("no edge for new bytes");
        unsigned char b;
        if (read(c, &b, 1) != 1) die("read one");
        order += b != want++;
        /* A partial read is no new arrival: nothing to report. */
        if (epoll_wait(ep, &got, 1, 0) != 0) extra++;
        /* Then the rest, to EAGAIN (kernel TCP gives no edge for bytes that arrive while
         * earlier ones wait unread). */
        while (read(c, &b, 1) == 1) order += b != want++;
        if (errno != EAGAIN) die("read to EAGAIN");
    }
    pthread_join(t, NULL);
    printf("ET: %d rounds, %d bytes out of order, %d reports with nothing new\n", ET_ROUNDS, order, extra);
    CHECK(order == 0 && want == (unsigned char)(2 * ET_ROUNDS), "ET: every byte, in order");
    CHECK(extra == 0, "ET: no report after a partial read with nothing new");
    close(ep);
    close(c);
    close(et_k);
    close(go[0]);
    close(go[1]);
}

struct shared {
    atomic_long taken;
    atomic_long sum;
};

/* Polls `c` (level-triggered, no timeout) and reads one byte a wake-up until end of stream. */
static void take_bytes(int c, struct shared *s) {
    for (;;) {
        struct pollfd p = {.fd = c, .events = POLLIN};
        int n = poll(&p, 1, -1);
        if (n != 1) {
            fprintf(stderr, "poll returned %d, revents %#x, %ld taken\n", n, p.revents, atomic_load(&s->taken));
            die("poll");
        }
        unsigned char b;
        ssize_t r = read(c, &b, 1);
        if (r == 0) return;
        if (r == 1) {
            atomic_fetch_add(&s->sum, b);
            atomic_fetch_add(&s->taken, 1);
        } else if (errno != EAGAIN) {
            die("read");
        }
    }
}

static void forked_pollers(void) {
    int k, c;
    connected_pair(&k, &c, SOCK_NONBLOCK);
    struct shared *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED) die("mmap");
    pid_t pollers[2];
    for (int i = 0; i < 2; i++) {
        pollers[i] = fork();
        if (pollers[i] < 0) die("fork");
        if (pollers[i] == 0) {
            alarm(25);
            close(k);
            take_bytes(c, s);
            _exit(0);
        }
    }
    close(c);
    long sum = 0;
    for (int i = 0; i < FORK_ROUNDS; i++) {
        unsigned char burst[BURST];
        for (int j = 0; j < BURST; j++) {
            burst[j] = pattern(i * BURST + j);
            sum += burst[j];
        }
        write_all(k, burst, BURST);
        /* Every byte taken before the next burst: a poller asleep over bytes hangs here. */
        while (atomic_load(&s->taken) < (long)(i + 1) * BURST) usleep(20);
    }
    shutdown(k, SHUT_WR);
    int st1, st2;
    waitpid(pollers[0], &st1, 0);
    waitpid(pollers[1], &st2, 0);
    printf("forked pollers: %ld of %d bytes taken\n", atomic_load(&s->taken), FORK_ROUNDS * BURST);
    CHECK(atomic_load(&s->taken) == FORK_ROUNDS * BURST && atomic_load(&s->sum) == sum, "fork: every byte taken once");
    CHECK(WIFEXITED(st1) && WEXITSTATUS(st1) == 0 && WIFEXITED(st2) && WEXITSTATUS(st2) == 0, "fork: both pollers saw the end");
    close(k);
}

int main(void) {
    alarm(25);
    setvbuf(stdout, NULL, _IONBF, 0);
    pieces();
    edges_after_partial_reads();
    forked_pollers();
    return failures != 0;
}
