/* A launcher that listens, forks a child that execs a server with the listening socket
 * inherited, then closes its own copy and lives on (run with the shim preloaded, as
 * tests/apps/run.sh does; also passes without it). The exec'd image knows nothing of the
 * launcher's rendezvous and claims no offer: the launcher lets go of the rendezvous once only
 * that image holds the socket (a forked worker that did not exec keeps it served:
 * master_closes_listener.c), so the clients after go on over TCP at once instead of each
 * waiting out its carrier timeout. The launcher's own connection before the fork is
 * accelerated. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <sys/wait.h>

#include "scenario.h"

static void echo_one(int l) {
    int c = accept(l, NULL, NULL);
    if (c < 0) die("accept");
    char b[4];
    if (read_full(c, b, 4) == 0) write_all(c, b, 4);
    close(c);
}

/* A connection to `a` that echoes; `accelerated`: checked on shared memory while open. */
static int ping(struct sockaddr_in *a, int accelerated) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)a, sizeof *a) < 0) die("connect");
    char b[4];
    write_all(c, "ping", 4);
    int ok = read_full(c, b, 4) == 0 && memcmp(b, "ping", 4) == 0;
    if (accelerated && shimmed()) CHECK(segments() >= 1, "the launcher's own connection is accelerated");
    close(c);
    return ok;
}

int main(int argc, char **argv) {
    alarm(30);
    signal(SIGPIPE, SIG_IGN);
    if (argc == 4 && strcmp(argv[1], "server") == 0) {
        int l = atoi(argv[2]), ready = atoi(argv[3]);
        write_all(ready, "R", 1);
        close(ready);
        for (int i = 0; i < 2; i++) echo_one(l);
        return 0;
    }
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    pid_t self = fork();
    if (self == 0) {
        echo_one(l);
        _exit(0);
    }
    CHECK(ping(&a, 1), "the launcher's own connection echoes");
    int st;
    CHECK(waitpid(self, &st, 0) == self && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the launcher's echo child exited 0");
    int ready[2];
    if (pipe(ready) < 0) die("pipe");
    fflush(NULL);
    pid_t w = fork();
    if (w == 0) {
        char fd[16], rfd[16];
        close(ready[0]);
        snprintf(fd, sizeof fd, "%d", l);
        snprintf(rfd, sizeof rfd, "%d", ready[1]);
        execl("/proc/self/exe", argv[0], "server", fd, rfd, (char *)NULL);
        _exit(127);
    }
    close(ready[1]);
    char r;
    CHECK(read(ready[0], &r, 1) == 1, "the server image runs");
    CHECK(close(l) == 0, "the launcher closes its copy");
    if (shimmed()) {
        char name[64];
        snprintf(name, sizeof name, "colo/1/127.0.0.1:%d", ntohs(a.sin_port));
        int i = 0;
        while (abstract_bound(name) && i++ < 500) usleep(10000);
        CHECK(!abstract_bound(name), "the rendezvous is let go: only an image that claims nothing holds the listener");
    }
    for (int i = 0; i < 2; i++) CHECK(ping(&a, 0), "the exec'd server echoes");
    CHECK(waitpid(w, &st, 0) == w && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the server exited 0");
    return failures != 0;
}
