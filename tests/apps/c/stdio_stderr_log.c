/* The connection as standard input, output and error of an exec'd program (xinetd starts its
 * services so), with the shim's diagnostics on (COLO_LOG=info, which tests/apps/run.sh sets):
 * no diagnostic line may reach the peer's stream, which holds exactly what the program wrote.
 * Run with the shim preloaded, as tests/apps/run.sh does; also passes without it. alarm() is
 * the watchdog. */
#define _GNU_SOURCE
#include <signal.h>
#include <sys/wait.h>

#include "scenario.h"

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    alarm(30);
    setenv("COLO_LOG", "info", 1);
    for (int round = 0; round < 3; round++) {
        int k, s;
        connected_pair(&k, &s, 0);
        pid_t p = fork();
        if (p < 0) die("fork");
        if (p == 0) {
            dup2(s, 0);
            dup2(s, 1);
            dup2(s, 2);
            close(s);
            close(k);
            execl("/bin/cat", "cat", (char *)NULL);
            _exit(127);
        }
        close(s);
        write_all(k, "hello\n", 6);
        shutdown(k, SHUT_WR);
        char b[4096];
        size_t got = 0;
        for (;;) {
            ssize_t n = read(k, b + got, sizeof b - got);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0 || (got += n) == sizeof b) break;
        }
        if (got != 6 || memcmp(b, "hello\n", 6) != 0) fprintf(stderr, "round %d: the peer read %zu bytes: %.*s\n", round, got, (int)(got < 200 ? got : 200), b);
        CHECK(got == 6 && memcmp(b, "hello\n", 6) == 0, "the peer reads exactly the program's bytes, no diagnostics");
        int st;
        waitpid(p, &st, 0);
        close(k);
    }
    if (failures) return 1;
    printf("stdio_stderr_log: ok\n");
    return 0;
}
