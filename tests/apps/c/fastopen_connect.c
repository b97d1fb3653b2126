/* A client that asks for TCP Fast Open with TCP_FASTOPEN_CONNECT (curl --tcp-fastopen, and
 * TCP_FASTOPEN_NO_COOKIE so that no cookie and no sysctl is needed), to a server in another
 * process that accepts at once. With Fast Open the kernel's connect returns at once and sends
 * no SYN until the first write; under the shim each connection must still be accelerated (a
 * colo segment mapped once the first write returned) and carry every byte both ways, blocking
 * and non-blocking (EINPROGRESS then, as a connect without a cookie says). alarm() is the
 * watchdog. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>

#include "scenario.h"

#ifndef TCP_FASTOPEN_CONNECT
#define TCP_FASTOPEN_CONNECT 30
#endif
#ifndef TCP_FASTOPEN_NO_COOKIE
#define TCP_FASTOPEN_NO_COOKIE 34
#endif

#define ROUNDS 10
#define BYTES (64 * 1024)

int main(void) {
    alarm(25);
    struct sockaddr_in a;
    int l = loopback_listener(&a, 16);
    pid_t server = fork();
    if (server < 0) die("fork");
    if (server == 0) {
        for (;;) {
            int c = accept(l, NULL, NULL);
            if (c < 0) _exit(1);
            echo_until_eof(c);
            close(c);
        }
    }
    close(l);
    int accelerated = 0;
    static unsigned char out[BYTES], in[BYTES];
    for (int r = 0; r < ROUNDS; r++) {
        int nonblocking = r % 2;
        int k = socket(AF_INET, SOCK_STREAM, 0), on = 1;
        if (k < 0) die("socket");
        CHECK(setsockopt(k, IPPROTO_TCP, TCP_FASTOPEN_NO_COOKIE, &on, sizeof on) == 0, "TCP_FASTOPEN_NO_COOKIE set");
        CHECK(setsockopt(k, IPPROTO_TCP, TCP_FASTOPEN_CONNECT, &on, sizeof on) == 0, "TCP_FASTOPEN_CONNECT set");
        if (nonblocking) fcntl(k, F_SETFL, O_NONBLOCK);
        int rc = connect(k, (struct sockaddr *)&a, sizeof a);
        if (rc < 0 && nonblocking && errno == EINPROGRESS) {
            struct pollfd p = {.fd = k, .events = POLLOUT};
            int err = -1;
            socklen_t len = sizeof err;
            CHECK(poll(&p, 1, 10000) == 1, "the non-blocking connect completes");
            CHECK(getsockopt(k, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0, "... without an error");
            rc = 0;
        }
        if (rc < 0) die("connect");
        if (nonblocking) fcntl(k, F_SETFL, 0);
        for (long i = 0; i < BYTES; i++) out[i] = pattern(i + r);
        write_all(k, out, 1);
        if (segments() > 0) accelerated++;
        write_all(k, out + 1, BYTES - 1);
        shutdown(k, SHUT_WR);
        int ok = read_full(k, in, BYTES) == 0;
        for (long i = 0; ok && i < BYTES; i++) ok = in[i] == pattern(i + r);
        CHECK(ok, "every byte comes back, in order");
        char extra;
        CHECK(read(k, &extra, 1) == 0, "... then the end of the stream");
        close(k);
        segments_settled();
    }
    if (shimmed()) {
        if (accelerated != ROUNDS) fprintf(stderr, "accelerated %d of %d\n", accelerated, ROUNDS);
        CHECK(accelerated == ROUNDS, "every Fast Open connection is accelerated");
    }
    kill(server, SIGKILL);
    waitpid(server, NULL, 0);
    if (failures) return 1;
    printf("fastopen_connect: ok\n");
    return 0;
}
