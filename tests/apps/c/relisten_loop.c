/* A server that closes its listening socket and listens again on the same address at once, over
 * and over, with no fork (iperf3 -s does so after every test): each new listener serves colo
 * offers as the first did, so every connection is accelerated. The listener's rendezvous must be
 * gone by the time close() returns, whatever the offer service thread was doing at that moment
 * (run with the shim preloaded, as tests/apps/run.sh does; also passes without it). alarm() is
 * the watchdog. */
#define _GNU_SOURCE
#include "scenario.h"
#include <signal.h>

#define ROUNDS 100

int main(void) {
    alarm(30);
    signal(SIGPIPE, SIG_IGN);
    /* Each connection carries one message: the shim would dial plain TCP after a few on
     * purpose (COLO_SHORT_LIVED); this test counts accelerated connections, so opt out. */
    setenv("COLO_SHORT_LIVED", "accelerate", 1);
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4), plain = 0;
    for (int i = 0; i < ROUNDS; i++) {
        int c = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(c, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
        int s = accept(l, NULL, NULL);
        if (s < 0) die("accept");
        char b[4];
        write_all(c, "ping", 4);
        CHECK(read_full(s, b, 4) == 0 && memcmp(b, "ping", 4) == 0, "the bytes arrive");
        if (shimmed() && segments() < 2) plain++;
        close(c);
        close(s);
        CHECK(close(l) == 0, "the listener closed");
        l = socket(AF_INET, SOCK_STREAM, 0);
        int one = 1;
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 4) < 0) die("listen again");
    }
    if (plain) fprintf(stderr, "%d of %d connections were not accelerated\n", plain, ROUNDS);
    CHECK(plain == 0, "every listener's connection is accelerated");
    return failures != 0;
}
