/* A connection an exec'd child takes as its standard input and output (inetd style): the child
 * reads part of what the peer sent and exits, and the parent, which kept its copy, reads on. Over
 * TCP the bytes the child never read stay in the socket for the parent. Children: `head -c 5`
 * (reads 5 bytes, echoes them), `true` (reads nothing), `cat` to /dev/null (reads everything). */
#include "diff.h"
#include <fcntl.h>

#define N 100000

/* The client sends "HELLO" and N pattern bytes and shuts down writing; the child runs `argv`
 * (standard output the connection unless `quiet`); the parent waits for it, reads to end of
 * stream, and says how much it read and whether that was the request's tail, byte for byte;
 * then what the client read back. */
static void child_reads_part(char *const argv[], int quiet) {
    int s, c;
    static unsigned char b[N + 4096], want[N + 5];
    pair(&s, &c);
    memcpy(want, "HELLO", 5);
    for (long i = 0; i < N; i++) want[5 + i] = (unsigned char)((i * 2654435761u) >> 13);
    for (size_t o = 0; o < sizeof want;) {
        ssize_t w = write(c, want + o, sizeof want - o);
        if (w <= 0) die("write");
        o += w;
    }
    T("shutdown(client, SHUT_WR)", shutdown(c, SHUT_WR));
    pid_t p = fork();
    if (p == 0) {
        int null = open("/dev/null", O_RDWR);
        close(c);
        dup2(s, 0);
        dup2(quiet ? null : s, 1);
        close(s);
        execvp(argv[0], argv);
        _exit(127);
    }
    int st;
    T("the child exits 0", waitpid(p, &st, 0) == p && WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    size_t n = 0;
    ssize_t r;
    while (n < sizeof b && (r = read(s, b + n, sizeof b - n)) > 0) n += r;
    say("  parent read = %zu", n);
    say("  ... the request's last %zu bytes = %d", n, n <= sizeof want && memcmp(b, want + sizeof want - n, n) == 0);
    T("write server", write(s, "DONE", 4));
    close(s);
    char e[64];
    n = 0;
    while (n < sizeof e - 1 && (r = read(c, e + n, sizeof e - 1 - n)) > 0) n += r;
    e[n] = 0;
    say("  client read = %s", e);
}

static void head5(void) {
    char *const argv[] = {"head", "-c", "5", NULL};
    child_reads_part(argv, 0);
}

static void reads_nothing(void) {
    char *const argv[] = {"true", NULL};
    child_reads_part(argv, 0);
}

static void reads_all(void) {
    char *const argv[] = {"cat", NULL};
    child_reads_part(argv, 1);
}

int main(void) {
    diff_begin();
    RUN(head5);
    RUN(reads_nothing);
    RUN(reads_all);
    diff_end();
    return 0;
}
