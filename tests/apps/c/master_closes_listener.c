/* A master that listens, forks a worker that accepts, then closes its own copy of the listening
 * socket and lives on (run with the shim preloaded, as tests/apps/run.sh does; also passes
 * without it). The worker's accepts ask the master's offer service for their offers, so the
 * service must keep serving the listener for as long as a worker holds it: every connection is
 * accelerated (a service that had let go of it left each client waiting for its carrier timeout,
 * then on plain TCP). Once the worker exits too, the service lets go of the rendezvous.
 * alarm() is the watchdog. */
#define _GNU_SOURCE
#include <sys/wait.h>

#include "scenario.h"

int main(void) {
    alarm(30);
    signal(SIGPIPE, SIG_IGN);
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    pid_t w = fork();
    if (w == 0) {
        for (int i = 0; i < 2; i++) {
            int c = accept(l, NULL, NULL);
            if (c < 0) die("accept");
            char b[4];
            if (read_full(c, b, 4) == 0) write_all(c, b, 4);
            close(c);
        }
        exit(0);
    }
    CHECK(close(l) == 0, "the master closes its copy");
    for (int i = 0; i < 2; i++) {
        int c = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(c, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
        char b[4];
        write_all(c, "ping", 4);
        CHECK(read_full(c, b, 4) == 0 && memcmp(b, "ping", 4) == 0, "the worker echoes");
        if (shimmed()) CHECK(segments() >= 1, "the connection is accelerated");
        close(c);
    }
    int st;
    CHECK(waitpid(w, &st, 0) == w && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the worker exited 0");
    if (shimmed()) {
        char name[64];
        snprintf(name, sizeof name, "colo/1/127.0.0.1:%d", ntohs(a.sin_port));
        int i = 0;
        while (abstract_bound(name) && i++ < 500) usleep(10000);
        CHECK(!abstract_bound(name), "the rendezvous is let go once no process holds the listener");
    }
    return failures != 0;
}
