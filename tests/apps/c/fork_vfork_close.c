/* A fork child that runs a program through vfork, whose child closes the descriptors it does
 * not pass on before its exec (CPython's subprocess with close_fds, the default, on a server
 * that forks a handler per connection: socketserver.ForkingTCPServer), then serves the
 * connection itself. The vfork child runs in its parent's memory: nothing it does there may
 * count as the parent's own (its close of the connection is not the parent's close). The
 * vfork child is the first of the forked process to call into the shim after the fork. Run
 * with the shim preloaded, as tests/apps/run.sh does; also passes without it. alarm() is the
 * watchdog. */
#define _GNU_SOURCE
#include <signal.h>
#include <sys/wait.h>

#include "scenario.h"

/* The forked handler: vfork, the child closes `c` and execs true; then echo on `c`. */
static int handler(int c) {
    pid_t v = vfork();
    if (v < 0) return 2;
    if (v == 0) {
        close(c);
        execl("/bin/true", "true", (char *)NULL);
        _exit(127);
    }
    int st;
    if (waitpid(v, &st, 0) != v || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return 3;
    char b[16];
    if (read_full(c, b, 5) < 0 || memcmp(b, "hello", 5) != 0) return 4;
    write_all(c, "HELLO", 5);
    close(c);
    return 0;
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    alarm(20);
    for (int round = 0; round < 3; round++) {
        int k, c;
        connected_pair(&k, &c, 0);
        pid_t h = fork();
        if (h < 0) die("fork");
        if (h == 0) _exit(handler(c));
        /* The parent closes its copy, as a forking server does. */
        close(c);
        write_all(k, "hello", 5);
        char b[16] = {0};
        int got = read_full(k, b, 5);
        CHECK(got >= 0 && memcmp(b, "HELLO", 5) == 0, "the handler answered after its vfork child closed the connection");
        int st;
        waitpid(h, &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the handler served the connection");
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fprintf(stderr, "handler status %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        close(k);
    }
    if (failures) return 1;
    printf("fork_vfork_close: ok\n");
    return 0;
}
