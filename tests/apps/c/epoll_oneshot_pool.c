/* A pool of threads serving connections through one epoll set with EPOLLET | EPOLLONESHOT, as
 * MariaDB's thread pool does (thread_handling=pool-of-threads): each connection is added
 * edge-triggered and one-shot; a thread woken for it reads the request (non-blocking,
 * polling for it if not there yet), answers, and re-arms it with EPOLL_CTL_MOD. A one-shot
 * registration reports once per arming, so no two threads ever serve one connection at once;
 * every request is answered, and every re-arm succeeds, also when the client closes the
 * connection right after its last answer: the re-arm may race with another thread's wake-up for
 * that end of stream and its close. The client, a separate process, runs CLIENTS threads that
 * each make CONNS connections of ROUNDS request-answer round trips. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include "scenario.h"

#define CLIENTS 4
#define CONNS 60
#define ROUNDS 300
#define WORKERS 3

static int ep;
static struct sockaddr_in addr;
static atomic_int busy[1024];
/* The server's counts, in memory shared with the parent: threads woken for a connection another
 * thread was serving, and failed reads or epoll_ctl calls. */
static atomic_int *doubled, *failed;

static void arm(int fd, int op) {
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET | EPOLLONESHOT, .data.fd = fd};
    if (epoll_ctl(ep, op, fd, &ev) < 0) {
        fprintf(stderr, "epoll_ctl %s fd %d: %s\n", op == EPOLL_CTL_ADD ? "ADD" : "MOD", fd, strerror(errno));
        atomic_fetch_add(failed, 1);
    }
}

/* Reads the 8-byte request on non-blocking `fd`, polling while it is not there: 1 read, 0 end
 * of stream, -1 error. */
static int read_request(int fd, char *b) {
    size_t got = 0;
    while (got < 8) {
        ssize_t n = read(fd, b + got, 8 - got);
        if (n > 0) got += n;
        else if (n == 0) return 0;
        else if (errno == EAGAIN) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            if (poll(&p, 1, 5000) <= 0) return -1;
        } else if (errno != EINTR) return -1;
    }
    return 1;
}

static void *worker(void *arg) {
    (void)arg;
    for (;;) {
        struct epoll_event ev;
        int n = epoll_wait(ep, &ev, 1, -1);
        if (n < 0 && errno == EINTR) continue;
        if (n != 1) die("epoll_wait");
        int fd = ev.data.fd;
        if (atomic_fetch_add(&busy[fd], 1) != 0) atomic_fetch_add(doubled, 1);
        char b[8];
        int r = read_request(fd, b);
        if (r <= 0) {
            if (r < 0) atomic_fetch_add(failed, 1);
            atomic_fetch_sub(&busy[fd], 1);
            epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
            close(fd);
            continue;
        }
        for (int i = 0; i < 8; i++) b[i] ^= 0x20;
        write_all(fd, b, 8);
        atomic_fetch_sub(&busy[fd], 1);
        arm(fd, EPOLL_CTL_MOD);
    }
    return NULL;
}

static void serve(int l) {
    ep = epoll_create1(EPOLL_CLOEXEC);
    pthread_t t;
    for (int i = 0; i < WORKERS; i++) pthread_create(&t, NULL, worker, NULL);
    /* The workers serve until the clients are done; the parent kills this process. */
    for (;;) {
        int c = accept4(l, NULL, NULL, SOCK_NONBLOCK);
        if (c < 0 || c >= 1024) die("accept");
        arm(c, EPOLL_CTL_ADD);
    }
}

static atomic_int lost;

static void *client(void *arg) {
    long id = (long)arg;
    for (int n = 0; n < CONNS; n++) {
        int k = socket(AF_INET, SOCK_STREAM, 0);
        if (k < 0 || connect(k, (struct sockaddr *)&addr, sizeof addr) < 0) die("connect");
        /* An answer the server never sends (a registration it could not re-arm) ends the wait. */
        struct timeval tv = {.tv_sec = 5};
        setsockopt(k, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        for (int i = 0; i < ROUNDS; i++) {
            char q[9], a[8];
            snprintf(q, sizeof q, "%c%07d", (char)('a' + id), i);
            write_all(k, q, 8);
            if (read_full(k, a, 8) != 0) {
                fprintf(stderr, "client %ld: connection %d lost at round %d\n", id, n, i);
                atomic_fetch_add(&lost, 1);
                break;
            }
            int ok = 1;
            for (int j = 0; j < 8; j++) ok &= a[j] == (q[j] ^ 0x20);
            if (!ok) {
                fprintf(stderr, "client %ld: connection %d: wrong answer at round %d\n", id, n, i);
                atomic_fetch_add(&lost, 1);
                break;
            }
        }
        /* Closed right after the last answer: the server's re-arm and the end of stream race. */
        close(k);
    }
    return NULL;
}

int main(void) {
    alarm(60);
    /* Connections of a few milliseconds each: shared memory all the same (the test is of it). */
    setenv("COLO_SHORT_LIVED", "accelerate", 1);
    atomic_int *shared = mmap(NULL, 2 * sizeof(atomic_int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) die("mmap");
    doubled = shared;
    failed = shared + 1;
    int l = loopback_listener(&addr, 16);
    pid_t server = fork();
    if (server < 0) die("fork");
    if (server == 0) serve(l);
    close(l);
    pthread_t t[CLIENTS];
    for (long i = 0; i < CLIENTS; i++) pthread_create(&t[i], NULL, client, (void *)i);
    for (int i = 0; i < CLIENTS; i++) pthread_join(t[i], NULL);
    CHECK(atomic_load(&lost) == 0, "every request of every client is answered, in order");
    CHECK(atomic_load(doubled) == 0, "no thread is woken for a connection another thread serves (one-shot)");
    CHECK(atomic_load(failed) == 0, "every read and re-arm of the server succeeds");
    if (atomic_load(doubled) || atomic_load(failed)) fprintf(stderr, "server: %d double wake-ups, %d failures\n", atomic_load(doubled), atomic_load(failed));
    usleep(300000);
    kill(server, SIGTERM);
    int st;
    waitpid(server, &st, 0);
    if (failures) return 1;
    printf("epoll_oneshot_pool: ok\n");
    return 0;
}
