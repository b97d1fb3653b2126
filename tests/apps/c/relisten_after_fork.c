/* A server that has forked once (a helper that exited), closes its listening socket and at once
 * listens again on the same address (a reload; run with the shim preloaded, as
 * tests/apps/run.sh does; also passes without it). The first listener is gone from the kernel
 * when the second listens, so the second serves colo offers as the first did: its connections
 * are accelerated. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <sys/wait.h>

#include "scenario.h"

static void ping(struct sockaddr_in *a, int l, const char *what) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)a, sizeof *a) < 0) die("connect");
    int s = accept(l, NULL, NULL);
    if (s < 0) die("accept");
    char b[4];
    write_all(c, "ping", 4);
    CHECK(read_full(s, b, 4) == 0 && memcmp(b, "ping", 4) == 0, "the bytes arrive");
    if (shimmed()) CHECK(segments() >= 2, what);
    close(c);
    close(s);
}

int main(void) {
    alarm(30);
    signal(SIGPIPE, SIG_IGN);
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    ping(&a, l, "the first listener's connection is accelerated");
    fflush(NULL);
    pid_t w = fork();
    if (w == 0) _exit(0);
    int st;
    CHECK(waitpid(w, &st, 0) == w && WIFEXITED(st), "the helper exited");
    CHECK(close(l) == 0, "the first listener closed");
    l = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 4) < 0) die("listen again");
    ping(&a, l, "the second listener's connection is accelerated");
    return failures != 0;
}
