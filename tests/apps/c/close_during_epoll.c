/* Closing connections while another thread waits on them in epoll_wait (run with the shim
 * preloaded, as tests/apps/run.sh does; also passes without it, with plain kernel semantics).
 * A server keeps sending a byte every millisecond on each of CONNS connections until the client
 * (a forked child) closes it. The client registers them all in one epoll set; a reader thread loops in
 * epoll_wait and reads whatever is reported, while the main thread closes the connections one at
 * a time. Each close must reach the server as the end of its connection (it counts them), the
 * reader must go on with the others (no hang, no crash, no event for a closed connection once
 * the close returned), and a set emptied by closes reports nothing. alarm() is the watchdog. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>

#include "scenario.h"

#define CONNS 16

static int ep, fds[CONNS];
static atomic_int closed[CONNS], stop;
static atomic_long reads, late;

/* The server: one connection per client socket, a byte every millisecond on each until its
 * writes fail (the client closed it). Exits with the number of connections that ended so. */
static int server(int l) {
    int c[CONNS];
    for (int i = 0; i < CONNS; i++)
        if ((c[i] = accept(l, NULL, NULL)) < 0) die("accept");
    int ended = 0, done[CONNS] = {0};
    for (int tick = 0; ended < CONNS && tick < 15000; tick++) {
        for (int i = 0; i < CONNS; i++) {
            if (done[i]) continue;
            char b = 'x';
            if (send(c[i], &b, 1, MSG_NOSIGNAL) != 1) {
                done[i] = 1;
                ended++;
                close(c[i]);
            }
        }
        struct timespec ms = {0, 1000 * 1000};
        nanosleep(&ms, NULL);
    }
    return ended;
}

static void *reader(void *arg) {
    while (!atomic_load(&stop)) {
        struct epoll_event ev[CONNS];
        int n = epoll_wait(ep, ev, CONNS, 50);
        if (n < 0) die("epoll_wait");
        for (int k = 0; k < n; k++) {
            int i = (int)ev[k].data.u32;
            /* Reported after its close returned: the kernel never does that. */
            if (atomic_load(&closed[i])) {
                atomic_fetch_add(&late, 1);
                continue;
            }
            char b[256];
            /* The main thread may close it right now: EBADF is then the kernel's answer too. */
            ssize_t r = recv(fds[i], b, sizeof b, MSG_DONTWAIT);
            if (r > 0) atomic_fetch_add(&reads, 1);
        }
    }
    return arg;
}

/* The client (a forked child): returns its failures. */
static int client(struct sockaddr_in a) {
    ep = epoll_create1(EPOLL_CLOEXEC);
    for (int i = 0; i < CONNS; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(fds[i], (struct sockaddr *)&a, sizeof a) < 0) die("connect");
        struct epoll_event want = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &want) < 0) die("epoll_ctl");
    }
    if (shimmed()) CHECK(segments() > 0, "the connections run over shared memory");
    pthread_t t;
    pthread_create(&t, NULL, reader, NULL);
    struct timespec pause = {0, 20 * 1000 * 1000};
    nanosleep(&pause, NULL);
    long before = atomic_load(&reads);
    for (int i = 0; i < CONNS; i++) {
        /* The kernel may still be delivering an event it picked before the close: count as late
         * only events that come after the close returned and a wait has passed. */
        close(fds[i]);
        struct timespec gap = {0, 5 * 1000 * 1000};
        nanosleep(&gap, NULL);
        atomic_store(&closed[i], 1);
    }
    long during = atomic_load(&reads) - before;
    /* The set is empty now: a wait reports nothing. */
    struct epoll_event ev;
    int left = epoll_wait(ep, &ev, 1, 100);
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    CHECK(during > 0, "the reader went on reading the open connections while others closed");
    CHECK(atomic_load(&late) == 0, "no event for a connection after its close returned");
    CHECK(left == 0, "a set emptied by closes reports nothing");
    printf("%d connections closed under a waiting epoll_wait: %ld reads while closing\n", CONNS, during);
    fflush(stdout);
    return failures != 0;
}

int main(void) {
    alarm(25);
    signal(SIGPIPE, SIG_IGN);
    struct sockaddr_in a;
    int l = loopback_listener(&a, CONNS);
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        alarm(20); /* before the parent's: a hung client fails the check below */
        _exit(client(a));
    }
    int ended = server(l);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the client's checks passed");
    CHECK(ended == CONNS, "the server saw every close as the end of its connection");
    return failures != 0;
}
