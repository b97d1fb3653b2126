/* Two threads polling one socket: a reader that polls for POLLIN before every read and a writer
 * that polls for POLLOUT before every write, on one non-blocking connection to an echo server
 * (blocking reads and writes; the client is a forked child). With the shim, both threads slept
 * on the connection's one doorbell, and the first to wake emptied it before the other had
 * looked: the other slept on with its condition true, and the echo stalled for good (2 of 3
 * runs of this program hung before the fix). Each round moves ROUND bytes each way and checks
 * them. alarm() is the watchdog. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "scenario.h"

#define ROUNDS 4
#define ROUND (32L << 20)

static int fd;


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

/* Echoes each of ROUNDS connections until its client closes. */
static void echo_server(int l) {
    for (int round = 0; round < ROUNDS; round++) {
        int c = accept(l, NULL, NULL);
        if (c < 0) die("accept");
        static char b[65536];
        ssize_t n;
        while ((n = read(c, b, sizeof b)) > 0)
            for (ssize_t o = 0; o < n;) {
                ssize_t w = write(c, b + o, n - o);
                if (w <= 0) die("echo write");
                o += w;
            }
        close(c);
    }
}

/* The client (a forked child): a reader and a writer thread per connection. */
static int client(struct sockaddr_in a) {
    for (int round = 0; round < ROUNDS; round++) {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
        fcntl(fd, F_SETFL, O_NONBLOCK);
        pthread_t t;
        pthread_create(&t, NULL, writer, NULL);
        static unsigned char b[65536];
        long at = 0, bad = 0;
        while (at < ROUND) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            if (poll(&p, 1, -1) != 1) die("poll for reading");
            ssize_t n = read(fd, b, sizeof b);
            if (n < 0 && errno == EAGAIN) continue;
            if (n <= 0) die("read");
            for (ssize_t i = 0; i < n; i++) bad += b[i] != pattern(at + i);
            at += n;
        }
        pthread_join(t, NULL);
        CHECK(bad == 0, "the echo came back intact and in order");
        if (round == 0 && shimmed()) CHECK(segments() > 0, "the connection runs over shared memory");
        close(fd);
    }
    return failures != 0;
}

int main(void) {
    alarm(25);
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        alarm(15); /* before the parent's: a stalled echo fails the check below */
        _exit(client(a));
    }
    echo_server(l);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the client moved every round");
    printf("%d rounds of %ld bytes each way through two polling threads\n", ROUNDS, ROUND);
    return failures != 0;
}
