/* An inetd-style server that keeps its copy of the connection: it forks a child that makes the
 * connection its standard output (dup2 onto 1) and execs a program writing through glibc's
 * stdio (this program again, "program N"), waits for the child, then writes a trailer itself.
 * Over TCP the trailer follows every byte the program wrote: the program's writes were in the
 * socket before it exited. Under colo the program's standard output is relayed (a relay process
 * carries it into the rings), and the trailer must still come last: the client reads until end
 * of stream and checks that the stream is the program's bytes, then the trailer. ROUNDS
 * connections, one after the other (half of them accepted close-on-exec), all accelerated (COLO_SHORT_LIVED=accelerate), each
 * program's standard output relayed (the program checks). alarm() is the watchdog. */
#define _GNU_SOURCE
#include <sys/stat.h>
#include <sys/wait.h>

#include "scenario.h"

#ifndef ROUNDS
#define ROUNDS 30
#endif
#define LINES 2000

/* The exec'd program: LINES numbered lines on stdout (glibc's stdio, fully buffered on a
 * socket), flushed at exit. `ino` is the inode of the parent's socket: under the shim, standard
 * output must be another (the relay's loopback connection), or the case is not tested (exit 3). */
static int program(int round, unsigned long ino) {
    struct stat st;
    if (shimmed() && (fstat(1, &st) < 0 || st.st_ino == ino)) return 3;
    for (int i = 0; i < LINES; i++) printf("round %d line %d of the program\n", round, i);
    return 0;
}

static int check_stream(const char *got, size_t n, int round) {
    static char want[LINES * 48 + 64];
    size_t w = 0;
    for (int i = 0; i < LINES; i++) w += sprintf(want + w, "round %d line %d of the program\n", round, i);
    w += sprintf(want + w, "TRAILER %d\n", round);
    if (n != w || memcmp(got, want, w) != 0) {
        size_t at = 0;
        while (at < n && at < w && got[at] == want[at]) at++;
        fprintf(stderr, "round %d: %zu bytes, %zu expected; first difference at %zu: \"%.30s\"\n", round, n, w, at,
                at < n ? got + at : "(end)");
        return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "program") == 0) return program(atoi(argv[2]), strtoul(argv[3], NULL, 10));
    /* Every round accelerated: a run of short connections would otherwise go plain TCP. */
    if (shimmed() && !getenv("COLO_SHORT_LIVED")) {
        setenv("COLO_SHORT_LIVED", "accelerate", 1);
        execv("/proc/self/exe", argv);
        die("execv");
    }
    alarm(120);
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    static char got[LINES * 48 + 64 + 4096];
    int intact = 0;
    for (int round = 0; round < ROUNDS; round++) {
        int k = socket(AF_INET, SOCK_STREAM, 0);
        if (k < 0 || connect(k, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
        /* The second half of the rounds accepts close-on-exec: the connection becomes inheritable
         * only in the forked child, by its dup2 onto 1. */
        int c = accept4(l, NULL, NULL, round < ROUNDS / 2 ? 0 : SOCK_CLOEXEC);
        if (c < 0) die("accept");
        /* One byte first, so that the connection is in use (under the shim: accelerated at both
         * ends) before the fork. */
        char q;
        write_all(k, "q", 1);
        CHECK(read(c, &q, 1) == 1 && q == 'q', "the first byte");
        pid_t pid = fork();
        if (pid < 0) die("fork");
        if (pid == 0) {
            close(k);
            close(l);
            /* The connection's own socket, before the dup2 (which may relay it at once). */
            char r[16], ino[32];
            struct stat st;
            snprintf(r, sizeof r, "%d", round);
            snprintf(ino, sizeof ino, "%lu", fstat(c, &st) == 0 ? (unsigned long)st.st_ino : 0UL);
            if (dup2(c, 1) < 0) _exit(126);
            close(c);
            execl("/proc/self/exe", "stdio_trailer", "program", r, ino, (char *)NULL);
            _exit(127);
        }
        int st;
        CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "the program exits 0 (under the shim: its standard output relayed)");
        char trailer[32];
        int tn = snprintf(trailer, sizeof trailer, "TRAILER %d\n", round);
        write_all(c, trailer, tn);
        close(c);
        size_t n = 0;
        ssize_t r;
        while (n < sizeof got && (r = read(k, got + n, sizeof got - n)) > 0) n += r;
        intact += check_stream(got, n, round);
        close(k);
    }
    close(l);
    fprintf(stderr, "%d of %d streams had the program's bytes, then the trailer\n", intact, ROUNDS);
    CHECK(intact == ROUNDS, "every trailer follows the program's bytes");
    if (failures) return 1;
    printf("stdio_trailer: ok\n");
    return 0;
}
