/* An inetd-style server that puts its connection on descriptors 0, 1 and 2 with dup2 and talks
 * through glibc stdio, with no exec (run with the shim preloaded, as tests/apps/run.sh does; also
 * passes without it, with plain kernel semantics). stdio reads and writes those numbers through
 * calls internal to libc: under the shim every byte must still arrive, in order, both ways.
 * Covered: output buffered in stdout before the dup2 goes out first, bytes stdin had read ahead
 * from its old descriptor are read first, stderr stays unbuffered (no flush, yet the client
 * sees it before it answers), and stdout is flushed at exit. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <sys/wait.h>

#include "scenario.h"

/* The server child, forked per connection after accept (as inetd): its old stdin is a pipe
 * holding "xy\nzz", of which it reads one byte. */
static void server(int c, int old_in) {
    char line[256];
    if (dup2(old_in, 0) < 0) die("dup2 pipe");
    close(old_in);
    if (fgetc(stdin) != 'x') die("fgetc");     /* stdin now holds "y\nzz" read ahead */
    setvbuf(stdout, NULL, _IOFBF, 4096);
    fputs("pre:", stdout);                      /* buffered, not flushed */
    if (dup2(c, 0) < 0 || dup2(c, 1) < 0 || dup2(c, 2) < 0) die("dup2");
    close(c);
    while (fgets(line, sizeof line, stdin)) {
        if (strcmp(line, "end\n") == 0) break;
        for (char *p = line; *p; p++)
            if (*p == 'a') *p = 'b';
        fputs(line, stdout);
        fflush(stdout);
        fputs("E\n", stderr);                   /* unbuffered: no flush */
    }
    printf("bye\n");                            /* flushed by exit */
    exit(0);
}

/* Reads exactly strlen(want) bytes from `fd` and compares them. */
static int expect(int fd, const char *want) {
    char buf[256];
    size_t n = strlen(want);
    return read_full(fd, buf, n) == 0 && memcmp(buf, want, n) == 0;
}

/* The client child: its checks' failures are its exit status. */
static void client(struct sockaddr_in a) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    if (shimmed()) CHECK(segments() == 1, "connection accelerated");
    CHECK(expect(c, "pre:y\nE\n"), "stdout's earlier bytes, then stdin's read-ahead line, then stderr's");
    write_all(c, "aaa\n", 4);
    CHECK(expect(c, "zzbbb\nE\n"), "the rest of the read-ahead joined to the connection's first line");
    write_all(c, "bab\n", 4);
    CHECK(expect(c, "bbb\nE\n"), "a second line");
    write_all(c, "end\n", 4);
    CHECK(expect(c, "bye\n"), "stdout flushed at exit");
    char x;
    CHECK(read(c, &x, 1) == 0, "end of stream after the server exits");
    exit(failures != 0);
}

int main(void) {
    alarm(30);
    signal(SIGPIPE, SIG_IGN);
    struct sockaddr_in a;
    int l = loopback_listener(&a, 1);
    int in[2];
    if (pipe(in) < 0) die("pipe");
    write_all(in[1], "xy\nzz", 5);
    close(in[1]);
    fflush(NULL);
    pid_t cl = fork();
    if (cl == 0) {
        close(l);
        client(a);
    }
    int c = accept(l, NULL, NULL);
    if (c < 0) die("accept");
    if (shimmed()) CHECK(segments() == 1, "connection accelerated (server side)");
    pid_t sv = fork();
    if (sv == 0) {
        close(l);
        server(c, in[0]);
    }
    close(c);
    close(in[0]);
    int st;
    CHECK(waitpid(sv, &st, 0) == sv && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the server exited 0");
    CHECK(waitpid(cl, &st, 0) == cl && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the client's checks passed");
    return failures != 0;
}
