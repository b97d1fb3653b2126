/* Copies of an accelerated socket (run with the shim preloaded, as tests/apps/run.sh does; also
 * passes without it, with plain kernel semantics): dup, dup2, dup3 (O_CLOEXEC), F_DUPFD_CLOEXEC,
 * dup2 over a copy; closing one copy while using another keeps the data flowing, and the peer
 * sees EOF only after the last copy closes; fdopen + fprintf/fgets/fread/fwrite + fclose;
 * shutdown on one copy acts on all of them. A forked peer echoes and tells us (over a pipe) when
 * it reads EOF. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "scenario.h"

/* The peer: two connections. Each: echo until EOF, then report 'E' on the pipe and send "bye". */
static void peer(int port, int report) {
    signal(SIGPIPE, SIG_IGN);
    for (int i = 0; i < 2; i++) {
        int c = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        if (connect(c, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
        static char buf[65536];
        ssize_t n;
        while ((n = read(c, buf, sizeof buf)) > 0) write_all(c, buf, n);
        if (n < 0) die("peer read");
        write_all(report, "E", 1);
        send(c, "bye", 3, MSG_NOSIGNAL);
        close(c);
    }
    exit(0);
}

static int eof_pipe;

/* Whether the peer reported EOF within `ms`. */
static int peer_saw_eof(int ms) {
    struct pollfd p = {.fd = eof_pipe, .events = POLLIN};
    if (poll(&p, 1, ms) != 1) return 0;
    char c;
    return read(eof_pipe, &c, 1) == 1 && c == 'E';
}

/* One echo round trip through `fd`. */
static int echo(int fd, const char *msg) {
    char buf[64];
    size_t n = strlen(msg);
    write_all(fd, msg, n);
    return read_full(fd, buf, n) == 0 && memcmp(buf, msg, n) == 0;
}

int main(void) {
    alarm(30);
    signal(SIGPIPE, SIG_IGN);
    struct sockaddr_in a;
    int l = loopback_listener(&a, 2);
    int pp[2];
    if (pipe(pp) < 0) die("pipe");
    pid_t pid = fork();
    if (pid == 0) {
        close(l);
        close(pp[0]);
        peer(ntohs(a.sin_port), pp[1]);
    }
    close(pp[1]);
    eof_pipe = pp[0];
    int s = accept(l, NULL, NULL);
    if (s < 0) die("accept");
    if (shimmed()) CHECK(segments() == 1, "connection accelerated");

    /* dup, then close the original. */
    int d1 = dup(s);
    CHECK(d1 >= 0, "dup");
    CHECK(close(s) == 0, "close the original");
    CHECK(echo(d1, "one"), "echo through dup after closing the original");
    CHECK(!peer_saw_eof(50), "no EOF while a copy is open (dup)");

    /* dup2 to a chosen number, close the source. */
    CHECK(dup2(d1, 50) == 50, "dup2");
    CHECK(close(d1) == 0, "close the dup");
    CHECK(echo(50, "two"), "echo through dup2");
    CHECK(!peer_saw_eof(50), "no EOF while a copy is open (dup2)");

    /* dup3 with O_CLOEXEC. */
    CHECK(dup3(50, 60, O_CLOEXEC) == 60, "dup3");
    CHECK((fcntl(60, F_GETFD) & FD_CLOEXEC) != 0, "dup3 O_CLOEXEC sets FD_CLOEXEC");
    CHECK((fcntl(50, F_GETFD) & FD_CLOEXEC) == 0, "dup3 leaves the source inheritable");
    CHECK(close(50) == 0, "close the dup2 copy");
    CHECK(echo(60, "three"), "echo through dup3");

    /* F_DUPFD_CLOEXEC at or above 70. */
    int d4 = fcntl(60, F_DUPFD_CLOEXEC, 70);
    CHECK(d4 >= 70, "F_DUPFD_CLOEXEC");
    CHECK((fcntl(d4, F_GETFD) & FD_CLOEXEC) != 0, "F_DUPFD_CLOEXEC sets FD_CLOEXEC");
    CHECK(close(60) == 0, "close the dup3 copy");
    CHECK(echo(d4, "four"), "echo through F_DUPFD_CLOEXEC");
    CHECK(!peer_saw_eof(50), "no EOF while a copy is open (F_DUPFD_CLOEXEC)");

    /* dup2 of another file over a copy: that copy goes, the connection stays. */
    int d5 = dup(d4);
    int nul = open("/dev/null", O_RDWR);
    CHECK(dup2(nul, d5) == d5, "dup2 /dev/null over a copy");
    CHECK(write(d5, "x", 1) == 1, "the replaced number is /dev/null now");
    close(d5);
    close(nul);
    CHECK(echo(d4, "five"), "echo after a copy was replaced");

    /* Two copies used alternately for writing and reading. */
    int d6 = dup(d4);
    write_all(d6, "six", 3);
    char b3[3];
    CHECK(read_full(d4, b3, 3) == 0 && memcmp(b3, "six", 3) == 0, "write on one copy, read on another");
    close(d6);

    /* fdopen + fprintf/fgets/fwrite/fread + fclose on a copy. */
    int d7 = dup(d4);
    FILE *f = fdopen(d7, "r+");
    CHECK(f != NULL, "fdopen");
    if (f) {
        CHECK(fileno(f) == d7, "fileno of the fdopen stream");
        CHECK(fprintf(f, "line %d\n", 1) == 7 && fflush(f) == 0, "fprintf + fflush");
        char line[64];
        CHECK(fgets(line, sizeof line, f) != NULL && strcmp(line, "line 1\n") == 0, "fgets gets the echo");
        static char big[200000], back[200000];
        for (size_t i = 0; i < sizeof big; i++) big[i] = (char)('a' + i % 26);
        /* Write then read in turns (the peer echoes; its buffers hold at most a few ring loads). */
        size_t done = 0, got = 0;
        while (done < sizeof big) {
            size_t k = sizeof big - done < 20000 ? sizeof big - done : 20000;
            if (fwrite(big + done, 1, k, f) != k || fflush(f) != 0) break;
            done += k;
            if (fread(back + got, 1, k, f) != k) break;
            got += k;
        }
        CHECK(done == sizeof big && got == sizeof big && memcmp(big, back, sizeof big) == 0, "fwrite/fread 200 KB");
        CHECK(fclose(f) == 0, "fclose");
        CHECK(fcntl(d7, F_GETFD) < 0 && errno == EBADF, "fclose closed the descriptor");
    }
    CHECK(!peer_saw_eof(50), "no EOF after fclose while a copy is open");
    CHECK(echo(d4, "seven"), "echo after fclose of another copy");

    /* The last copy closes: EOF at the peer. */
    CHECK(close(d4) == 0, "close the last copy");
    CHECK(peer_saw_eof(5000), "EOF at the peer after the last copy closed");

    /* shutdown(SHUT_WR) on a copy acts on the connection: EOF at the peer although the other
     * copy is open, and the other copy still reads the answer. */
    s = accept(l, NULL, NULL);
    if (s < 0) die("accept 2");
    int c2 = dup(s);
    CHECK(echo(s, "hi"), "second connection echo");
    CHECK(shutdown(c2, SHUT_WR) == 0, "shutdown on a copy");
    CHECK(peer_saw_eof(5000), "EOF at the peer after shutdown on a copy");
    char bye[4] = {0};
    CHECK(read_full(s, bye, 3) == 0 && strcmp(bye, "bye") == 0, "the other copy reads the answer");
    CHECK(read(s, bye, 1) == 0, "then EOF");
    close(c2);
    close(s);

    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "peer exit");
    if (failures == 0)
        printf("ok: dup, dup2, dup3, F_DUPFD_CLOEXEC, close one copy, fdopen/fgets/fprintf/fclose, "
               "EOF after the last copy%s\n",
               shimmed() ? " (accelerated)" : "");
    return failures != 0;
}
