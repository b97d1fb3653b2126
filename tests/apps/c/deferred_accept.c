/* A listener with TCP_DEFER_ACCEPT (pgbouncer's, nginx's `listen ... deferred`) makes a
 * connection acceptable only once the client has sent something; the client's connect is
 * complete before that, as over TCP. Under the shim the client would wait for an accept that
 * cannot come until it sends (with COLO_CARRIER_TIMEOUT_MS at 60 s, until the listener dropped
 * each offer, 5 s, and the alarm() watchdog ends it): such connections go on over plain TCP at
 * once, the bytes intact. A listener without the option still gets shared memory. Run with the
 * shim preloaded, as tests/apps/run.sh does; also passes without it. */
#define _GNU_SOURCE
#include "scenario.h"
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/wait.h>

#define DEFERRED 3

/* The server, a child (the dialing process must not be the one that listens: its own accepts
 * are waited for only briefly, the dialing thread may be the one to accept): each connection
 * sends a line, gets "world" back. */
static void serve(int l) {
    int s = accept(l, NULL, NULL);
    char b[6];
    if (s < 0 || read_full(s, b, 6) < 0 || memcmp(b, "hello\n", 6) != 0) _exit(2);
    write_all(s, "world\n", 6);
    if (read_full(s, b, 1) == 0) _exit(3); /* until the client closes */
    close(s);
}

static int dial(struct sockaddr_in *a) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    char b[6];
    if (connect(c, (struct sockaddr *)a, sizeof *a) < 0) die("connect");
    write_all(c, "hello\n", 6);
    CHECK(read_full(c, b, 6) == 0 && memcmp(b, "world\n", 6) == 0, "the answer comes back");
    return c;
}

int main(void) {
    alarm(10);
    signal(SIGPIPE, SIG_IGN);
    setenv("COLO_CARRIER_TIMEOUT_MS", "60000", 1);
    setenv("COLO_SHORT_LIVED", "accelerate", 1);
    int ports[2];
    if (pipe(ports) < 0) die("pipe");
    fflush(NULL);
    pid_t p = fork();
    if (p == 0) {
        struct sockaddr_in a[2];
        int l = loopback_listener(&a[0], 4), d = loopback_listener(&a[1], 4), secs = 5;
        if (setsockopt(d, IPPROTO_TCP, TCP_DEFER_ACCEPT, &secs, sizeof secs) < 0) _exit(4);
        write_all(ports[1], a, sizeof a);
        serve(l);
        for (int i = 0; i < DEFERRED; i++) serve(d);
        _exit(0);
    }
    struct sockaddr_in a[2];
    if (read_full(ports[0], a, sizeof a) < 0) die("ports");
    int c = dial(&a[0]);
    if (shimmed()) CHECK(segments() >= 1, "a listener without the option: over shared memory");
    close(c);
    for (int i = 0; i < DEFERRED; i++) close(dial(&a[1]));
    int st;
    CHECK(waitpid(p, &st, 0) == p && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the server served every connection");
    return failures != 0;
}
