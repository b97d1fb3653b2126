/* An inetd-style parent whose exec'd child (the connection as its standard input and output)
 * read everything the peer sent and exited: right after waitpid, poll must not report the
 * connection readable (nothing is left, and the peer has not closed), as over TCP; a read there
 * would block (CPython's CGI handler drains with `while select(..., 0): read(1)` and hung).
 * Once the peer closes, it is readable (end of stream). alarm() is the watchdog. */
#define _GNU_SOURCE
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>

#include "scenario.h"

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    alarm(30);
    for (int round = 0; round < 6; round++) {
        int k, s;
        connected_pair(&k, &s, 0);
        write_all(k, "0123456789", 10);
        pid_t p = fork();
        if (p < 0) die("fork");
        if (p == 0) {
            dup2(s, 0);
            dup2(s, 1);
            close(s);
            close(k);
            execl("/usr/bin/head", "head", "-c", "10", (char *)NULL);
            _exit(127);
        }
        int st;
        waitpid(p, &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "head -c 10 read the peer's bytes");
        char b[16];
        CHECK(read_full(k, b, 10) == 0 && memcmp(b, "0123456789", 10) == 0, "the peer got head's output");
        int readable = 0;
        for (int i = 0; i < 3; i++) {
            struct pollfd q = {.fd = s, .events = POLLIN};
            if (poll(&q, 1, 0) == 1) readable++;
        }
        if (readable) fprintf(stderr, "round %d: readable in %d of 3 polls right after the child exited\n", round, readable);
        CHECK(readable == 0, "nothing readable right after the child read everything and exited");
        close(k);
        struct pollfd q = {.fd = s, .events = POLLIN};
        CHECK(poll(&q, 1, 5000) == 1 && read(s, b, sizeof b) == 0, "the peer's close: end of stream");
        close(s);
    }
    if (failures) return 1;
    printf("stdio_poll_after_exit: ok\n");
    return 0;
}
