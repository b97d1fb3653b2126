/* A server process that lowers its limit of open files below the descriptors it holds, or to
 * nothing (vsftpd's pre-login process does), then waits in a blocking recv() for a client that
 * writes a moment later: the recv waits and returns the bytes, as over TCP (poll(2) refuses more
 * descriptors than that limit in one call, EINVAL, and the wait must not fail with it). Run with
 * the shim preloaded, as tests/apps/run.sh does; also passes without it. alarm() is the
 * watchdog. */
#define _GNU_SOURCE
#include "scenario.h"
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

int main(void) {
    alarm(20);
    signal(SIGPIPE, SIG_IGN);
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    for (int lim = 0; lim <= 2; lim++) {
        int c = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(c, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
        int s = accept(l, NULL, NULL);
        if (s < 0) die("accept");
        pid_t p = fork();
        if (p == 0) {
            struct rlimit rl = {lim, lim};
            if (setrlimit(RLIMIT_NOFILE, &rl) < 0) _exit(3);
            char b[8];
            ssize_t n = recv(s, b, sizeof b, MSG_PEEK);
            if (n <= 0) {
                fprintf(stderr, "limit %d: recv(MSG_PEEK): %zd %s\n", lim, n, n < 0 ? strerror(errno) : "");
                _exit(4);
            }
            if (read_full(s, b, 8) < 0) _exit(5);
            write_all(s, b, 8);
            _exit(0);
        }
        close(s);
        usleep(300000);
        write_all(c, "USER me\n", 8);
        char b[8];
        CHECK(read_full(c, b, 8) == 0 && memcmp(b, "USER me\n", 8) == 0, "the request comes back");
        int st;
        CHECK(waitpid(p, &st, 0) == p && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child's recv waited and read");
        close(c);
    }
    if (shimmed()) CHECK(segments_settled() == 0, "no segment left open");
    return failures != 0;
}
