/* A pool of threads waiting on one epoll set (a thread pool around one event loop's set), and a
 * writer thread outside it: READERS threads in epoll_wait (level-triggered) on one non-blocking
 * connection to an echo server, each reading under a mutex when woken, and a writer that polls
 * for POLLOUT before every write. Under the shim the readers share the set's wake-up eventfd,
 * registered with the connection once per thread: with eight of them the writer found no place
 * left for its own, and a ring the readers' drains took never reached it (5 of 10 runs stalled).
 * The echo must come back intact and in order. alarm() is the watchdog. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "scenario.h"

#define READERS 12
#define ROUND (32L << 20)

static int fd, ep;
static long got, bad;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void *writer(void *arg) {
    static unsigned char b[65536];
    long at = 0;
    while (at < ROUND) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        if (poll(&p, 1, -1) != 1) die("poll for writing");
        long k = ROUND - at < (long)sizeof b ? ROUND - at : (long)sizeof b;
        for (long i = 0; i < k; i++) b[i] = pattern(at + i);
        ssize_t n = write(fd, b, k);
        if (n < 0 && errno == EAGAIN) continue;
        if (n <= 0) die("write");
        at += n;
    }
    return arg;
}

static void *reader(void *arg) {
    static unsigned char b[65536];
    for (;;) {
        pthread_mutex_lock(&mu);
        int done = got >= ROUND;
        pthread_mutex_unlock(&mu);
        if (done) return arg;
        /* A timeout, so that the readers see the end: the writer's progress is what is checked. */
        struct epoll_event e;
        if (epoll_wait(ep, &e, 1, 100) < 0) die("epoll_wait");
        pthread_mutex_lock(&mu);
        ssize_t n = read(fd, b, sizeof b);
        for (ssize_t i = 0; i < n; i++) bad += b[i] != pattern(got + i);
        if (n > 0) got += n;
        pthread_mutex_unlock(&mu);
        if (n == 0) die("early end of stream");
        if (n < 0 && errno != EAGAIN) die("read");
    }
}

int main(void) {
    alarm(25);
    signal(SIGPIPE, SIG_IGN);
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        _exit(echo_until_eof(accept(l, NULL, NULL)) != 0);
    }
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    fcntl(fd, F_SETFL, O_NONBLOCK);
    ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event want = {.events = EPOLLIN, .data.fd = fd};
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &want) < 0) die("epoll");
    pthread_t w, r[READERS];
    pthread_create(&w, NULL, writer, NULL);
    for (int i = 0; i < READERS; i++) pthread_create(&r[i], NULL, reader, NULL);
    pthread_join(w, NULL);
    for (int i = 0; i < READERS; i++) pthread_join(r[i], NULL);
    CHECK(got == ROUND && bad == 0, "the echo came back intact and in order");
    if (shimmed()) CHECK(segments() > 0, "the connection runs over shared memory");
    close(fd);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the echo server saw the whole stream");
    printf("%ld bytes each way: %d threads in epoll_wait on one set, a writer polling\n", ROUND, READERS);
    return failures != 0;
}
