/* A fork child that serves one accelerated connection and closes it, after its parent closed
 * its copy, stays single-threaded: the shim drops a process's first closed segment itself
 * instead of starting its reaper thread for it (a fork-per-connection server's child would
 * start a thread for the one segment it closes, then exit). The parent sends its request before the
 * child reads (the read does not sleep), and the child echoes it; its thread count
 * (/proc/self/status) right after its close goes back to the parent. Passes without the shim.
 * alarm() is the watchdog. */
#define _GNU_SOURCE
#include "scenario.h"
#include <sys/wait.h>

static int threads(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    int n = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "Threads: %d", &n) == 1) break;
    if (f) fclose(f);
    return n;
}

int main(void) {
    alarm(20);
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    int k = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (k < 0 || connect(k, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    int s = accept(l, NULL, NULL);
    if (s < 0) die("accept");
    char b = 'x', r = 0;
    write_all(k, &b, 1);
    CHECK(read(s, &r, 1) == 1 && r == b, "the connection carries a byte");

    int go[2], back[2];
    if (pipe(go) < 0 || pipe(back) < 0) die("pipe");
    pid_t c = fork();
    if (c == 0) {
        close(l);
        close(k);
        if (read(go[0], &b, 1) != 1) _exit(2);
        if (read(s, &b, 1) != 1) _exit(3);
        b++;
        write_all(s, &b, 1);
        close(s);
        int n = threads();
        if (write(back[1], &n, sizeof n) != sizeof n) _exit(4);
        _exit(0);
    }
    if (c < 0) die("fork");
    close(s);
    b = 'A';
    write_all(k, &b, 1);
    if (write(go[1], "g", 1) != 1) die("write");
    CHECK(read(k, &r, 1) == 1 && r == 'B', "the child echoes through the connection");
    int n = -1;
    CHECK(read(back[0], &n, sizeof n) == sizeof n, "the child reports");
    int st = 0;
    CHECK(waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child exits 0");
    fprintf(stderr, "the fork child has %d threads after closing its connection\n", n);
    CHECK(n == 1, "a fork child that closed its one connection has one thread");
    close(k);
    close(l);
    if (failures == 0) printf("ok: a fork child that served one connection stays single-threaded\n");
    return failures != 0;
}
