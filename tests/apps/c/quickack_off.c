/* A client that turns TCP_QUICKACK off before connect (haproxy's health checks and its
 * `option smart-connect`: the handshake's last ACK is held back to ride with the first bytes),
 * to a server in another process that accepts at once, alternating with connections that do
 * not. The kernel holds that ACK up to 200 ms and the server end waits unaccepted meanwhile;
 * under the shim every connection must still be accelerated (a colo segment mapped once the
 * first write returned), the ones without the option too, and carry every byte both ways,
 * blocking and non-blocking. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>

#include "scenario.h"


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
        int nonblocking = r / 2 % 2;
        int k = socket(AF_INET, SOCK_STREAM, 0), off = 0;
        if (k < 0) die("socket");
        if (r % 2 == 0) CHECK(setsockopt(k, IPPROTO_TCP, TCP_QUICKACK, &off, sizeof off) == 0, "TCP_QUICKACK turned off");
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
        CHECK(accelerated == ROUNDS, "every connection is accelerated, with TCP_QUICKACK off or not");
    }
    kill(server, SIGKILL);
    waitpid(server, NULL, 0);
    if (failures) return 1;
    printf("quickack_off: ok\n");
    return 0;
}
