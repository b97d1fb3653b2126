/* A client that sets, before connect, an option that holds the TCP handshake back until its
 * first write, to a server in another process that accepts at once: TCP_FASTOPEN_CONNECT (curl
 * --tcp-fastopen; with TCP_FASTOPEN_NO_COOKIE, so that no cookie and no sysctl is needed, the
 * kernel's connect sends no SYN until the first write), and TCP_QUICKACK turned off (haproxy's
 * health checks: the kernel holds the handshake's last ACK up to 200 ms to ride with the first
 * bytes, and the server end waits unaccepted meanwhile); in turn with connections that set
 * neither. Under the shim every connection must be accelerated (a colo segment mapped once the
 * first write returned) and carry every byte both ways, blocking and non-blocking (a Fast Open
 * connect may say EINPROGRESS then, as one without a cookie does). alarm() is the watchdog. */
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

#define ROUNDS 12
#define BYTES (64 * 1024)

static unsigned char out[BYTES], in[BYTES];

int main(void) {
    int accelerated = 0;
    struct sockaddr_in a;
    alarm(25);
    pid_t server = fork_echo_server(loopback_listener(&a, 16));
    for (int r = 0; r < ROUNDS; r++) {
        int held = r % 3, nonblocking = r / 3 % 2;
        int k = socket(AF_INET, SOCK_STREAM, 0), on = 1, off = 0;
        if (k < 0) die("socket");
        if (held == 1) {
            CHECK(setsockopt(k, IPPROTO_TCP, TCP_FASTOPEN_NO_COOKIE, &on, sizeof on) == 0, "TCP_FASTOPEN_NO_COOKIE set");
            CHECK(setsockopt(k, IPPROTO_TCP, TCP_FASTOPEN_CONNECT, &on, sizeof on) == 0, "TCP_FASTOPEN_CONNECT set");
        } else if (held == 2) {
            CHECK(setsockopt(k, IPPROTO_TCP, TCP_QUICKACK, &off, sizeof off) == 0, "TCP_QUICKACK turned off");
        }
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
        else if (shimmed()) fprintf(stderr, "round %d (option %d, %s) not accelerated\n", r, held, nonblocking ? "non-blocking" : "blocking");
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
    if (shimmed()) CHECK(accelerated == ROUNDS, "every connection is accelerated, with or without an option that holds the handshake back");
    kill(server, SIGKILL);
    waitpid(server, NULL, 0);
    if (failures) return 1;
    printf("handshake_held: ok\n");
    return 0;
}
