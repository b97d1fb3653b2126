/* connect(AF_UNSPEC) on a connected TCP socket disconnects it (Linux: an abortive end, a reset
 * for the peer): the peer's read fails with ECONNRESET, its write after that with EPIPE, and the
 * disconnected socket reads none of the bytes the peer wrote before. Under the shim only the
 * kernel socket was disconnected: the rings stayed connected, the peer never saw the end and
 * the "disconnected" socket went on reading its bytes. Run with the shim preloaded
 * (tests/apps/run.sh); also passes without it. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <poll.h>
#include <signal.h>

#include "scenario.h"

int main(void) {
    alarm(10);
    signal(SIGPIPE, SIG_IGN);
    int k, c;
    connected_pair(&k, &c, 0);
    write_all(k, "ping", 4);
    char b[8];
    CHECK(read_full(c, b, 4) == 0 && memcmp(b, "ping", 4) == 0, "the connection carries bytes");
    write_all(k, "late", 4);
    struct sockaddr sa = {.sa_family = AF_UNSPEC};
    CHECK(connect(c, &sa, sizeof sa) == 0, "connect(AF_UNSPEC) disconnects");
    struct pollfd p = {.fd = k, .events = POLLIN};
    CHECK(poll(&p, 1, 5000) == 1, "the peer is told");
    errno = 0;
    ssize_t r = read(k, b, sizeof b);
    CHECK(r == -1 && errno == ECONNRESET, "the peer's read: ECONNRESET");
    errno = 0;
    r = write(k, "more", 4);
    CHECK(r == -1 && errno == EPIPE, "the peer's write after that: EPIPE");
    r = read(c, b, sizeof b);
    CHECK(r <= 0, "the disconnected socket reads none of the peer's bytes");
    close(k);
    close(c);
    return failures != 0;
}
