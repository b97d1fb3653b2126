/* Connections in an epoll set (issue 23: at most two descriptors of the shim's a connection).
 * Each end of a close-on-exec connection registered in an epoll set costs its socket and two
 * descriptors of the shim's: its control socket (the doorbell) and its self bell, both
 * registered in the application's set in the socket's place. And one event per registration in a batch, whichever of
 * the two the kernel reported: a thread asleep in a level-triggered epoll_wait (8 events) on N
 * connections, while their peers write and the main thread re-registers each written one with
 * EPOLL_CTL_MOD (which rings the self bell of a set with a sleeper), never sees a connection
 * twice in one batch, and reads every byte in order. Run with the shim preloaded, as
 * tests/apps/run.sh does; also passes without it. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sys/epoll.h>

#include "scenario.h"

#define N 20
#define ROUNDS 400

static int cli[N], srv[N], ep;
static long got[N], bad, twice, total;
static volatile int stop;

static void *sleeper(void *arg) {
    struct epoll_event evs[8];
    unsigned char b[256];
    while (!stop) {
        int k = epoll_wait(ep, evs, 8, 100);
        if (k < 0) die("epoll_wait");
        for (int i = 0; i < k; i++) {
            for (int j = 0; j < i; j++) twice += evs[j].data.u32 == evs[i].data.u32;
            int c = evs[i].data.u32;
            ssize_t n;
            while ((n = read(srv[c], b, sizeof b)) > 0) {
                for (ssize_t x = 0; x < n; x++) bad += b[x] != pattern(got[c] + x);
                got[c] += n;
                __atomic_add_fetch(&total, n, __ATOMIC_RELEASE);
            }
            if (n == 0) die("early end of stream");
            if (errno != EAGAIN) die("read");
        }
    }
    return arg;
}

int main(void) {
    alarm(60);
    int before = descriptors_open();
    for (int i = 0; i < N; i++) {
        struct sockaddr_in a;
        int l = loopback_listener(&a, 4);
        cli[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (cli[i] < 0 || connect(cli[i], (struct sockaddr *)&a, sizeof a) < 0) die("connect");
        srv[i] = accept4(l, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (srv[i] < 0) die("accept");
        close(l);
    }
    ep = epoll_create1(EPOLL_CLOEXEC);
    int cep = epoll_create1(EPOLL_CLOEXEC);
    for (int i = 0; i < N; i++) {
        struct epoll_event e = {.events = EPOLLIN, .data.u32 = i};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, srv[i], &e) < 0 || epoll_ctl(cep, EPOLL_CTL_ADD, cli[i], &e) < 0) die("epoll_ctl");
    }
    /* Each connection: its two sockets and, under the shim, two of the shim's at each end; a
     * few of the shim's own (the holders file, a set's wake-up eventfd) and the two sets. */
    int used = descriptors_open() - before;
    printf("descriptors for %d connections in epoll sets: %d\n", N, used);
    CHECK(used <= N * (2 + 2 * 2) + 16, "at most two of the shim's descriptors a connection's end");

    pthread_t t;
    if (pthread_create(&t, NULL, sleeper, NULL)) die("pthread_create");
    long sent[N] = {0}, all = 0;
    for (int r = 0; r < ROUNDS; r++) {
        int i = (r * 7) % N;
        unsigned char b[3];
        for (int x = 0; x < 3; x++) b[x] = pattern(sent[i] + x);
        write_all(cli[i], b, sizeof b);
        sent[i] += sizeof b;
        all += sizeof b;
        struct epoll_event e = {.events = EPOLLIN, .data.u32 = i};
        if (epoll_ctl(ep, EPOLL_CTL_MOD, srv[i], &e) < 0) die("epoll_ctl MOD");
        if (r % 8 == 7)
            while (__atomic_load_n(&total, __ATOMIC_ACQUIRE) < all) usleep(100);
    }
    while (__atomic_load_n(&total, __ATOMIC_ACQUIRE) < all) usleep(1000);
    stop = 1;
    pthread_join(t, NULL);
    for (int i = 0; i < N; i++) CHECK(got[i] == sent[i], "every byte read");
    CHECK(bad == 0, "bytes in order");
    printf("batches with a connection twice: %ld\n", twice);
    CHECK(twice == 0, "one event a connection in a batch");
    for (int i = 0; i < N; i++) {
        close(cli[i]);
        close(srv[i]);
    }
    close(ep);
    close(cep);
    if (failures) return 1;
    printf("epoll_fds: ok\n");
    return 0;
}
