/* The kernel's descriptor table of a program under the shim stays small under a fixed limit of
 * open files (soft = hard, as in most containers). Every fork copies the table up to the highest
 * number open, and every exit walks it: the shim's own descriptors (a connection's control
 * socket, a listener's rendezvous) once sat near the top of the limit (16384 and up), so a
 * program with a handful of descriptors paid for a 32768-slot table in each fork
 * (fork-per-connection servers, postgres). With the shim's descriptors from 1024 up, a program
 * whose own numbers are low has a table of at most 2048 slots (FDSize in /proc/self/status),
 * here and in a forked child, with a connection and a listener open. Passes without the shim
 * (64 slots). alarm() is the watchdog. */
#include <sys/resource.h>
#include <sys/wait.h>

#include "scenario.h"

/* The slots of this process's descriptor table (FDSize), or -1. */
static long fd_slots(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long n = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "FDSize: %ld", &n) == 1) break;
    if (f) fclose(f);
    return n;
}

int main(void) {
    alarm(20);
    /* A fixed limit: the hard one, at most 65536 (lowering it needs no privilege). */
    struct rlimit lim;
    if (getrlimit(RLIMIT_NOFILE, &lim) < 0) die("getrlimit");
    rlim_t n = lim.rlim_max == RLIM_INFINITY || lim.rlim_max > 65536 ? 65536 : lim.rlim_max;
    lim.rlim_cur = lim.rlim_max = n;
    if (setrlimit(RLIMIT_NOFILE, &lim) < 0) die("setrlimit");

    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    int k = socket(AF_INET, SOCK_STREAM, 0);
    if (k < 0 || connect(k, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    int c = accept(l, NULL, NULL);
    if (c < 0) die("accept");
    char b = 'x', r = 0;
    write_all(k, &b, 1);
    CHECK(read(c, &r, 1) == 1 && r == b, "the connection carries a byte");

    if (n < 4096) {
        /* Under a low limit the shim's numbers are within the table's first 2048 slots anyway. */
        printf("skipped: the hard limit of open files (%lu) is too low to tell\n", (unsigned long)n);
        return failures != 0;
    }
    long here = fd_slots();
    fprintf(stderr, "limit %lu: %ld descriptor slots with a listener and a connection open\n", (unsigned long)n, here);
    CHECK(here > 0 && here <= 2048, "the descriptor table has at most 2048 slots");
    int p[2];
    if (pipe(p) < 0) die("pipe");
    pid_t pid = fork();
    if (pid == 0) {
        long child = fd_slots();
        if (write(p[1], &child, sizeof child) != sizeof child) _exit(1);
        _exit(0);
    }
    if (pid < 0) die("fork");
    long child = -1;
    CHECK(read(p[0], &child, sizeof child) == sizeof child, "the child reports its table");
    CHECK(waitpid(pid, NULL, 0) == pid, "waitpid");
    CHECK(child > 0 && child <= 2048, "a forked child's descriptor table has at most 2048 slots");
    close(k);
    close(c);
    close(l);
    if (failures == 0) printf("ok: the descriptor table stays small under a fixed limit (%ld slots, %ld in a child)\n", here, child);
    return failures != 0;
}
