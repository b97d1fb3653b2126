/* Zero-copy calls over an accelerated connection (run with the shim preloaded, as
 * tests/apps/run.sh does; also passes without it, with plain kernel semantics): sendfile() from
 * a regular file with an offset pointer (the file position stays) and without (it moves);
 * splice() from a file through a pipe into the socket; splice() from the socket into a pipe and
 * on into a file; splice at end of stream returns 0. A forked peer checks what it receives and
 * sends on command. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "scenario.h"

/* The file's content and the peer's stream: byte i of either is pattern(i). */
#define FILE_SIZE (3L << 20)

/* The peer. Commands (1 byte + two 64-bit numbers):
 *   'R' from n   read n bytes, which must be pattern(from ..), answer 'Y' or 'N'
 *   'S' from n   send pattern(from ..) n bytes
 *   'F'          shut down writing (EOF for our splice)
 *   'Q'          quit */
static void peer(int port) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(c, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    static unsigned char buf[65536];
    char cmd;
    while (read(c, &cmd, 1) == 1) {
        if (cmd == 'Q') break;
        if (cmd == 'F') {
            shutdown(c, SHUT_WR);
            continue;
        }
        int64_t arg[2];
        if (read_full(c, arg, sizeof arg) < 0) die("peer args");
        long at = arg[0], end = arg[0] + arg[1];
        if (cmd == 'R') {
            int ok = 1;
            while (at < end) {
                long want = end - at < (long)sizeof buf ? end - at : (long)sizeof buf;
                ssize_t n = read(c, buf, want);
                if (n <= 0) die("peer read");
                for (ssize_t i = 0; i < n; i++)
                    if (buf[i] != pattern(at + i)) ok = 0;
                at += n;
            }
            write_all(c, ok ? "Y" : "N", 1);
        } else if (cmd == 'S') {
            while (at < end) {
                long k = end - at < (long)sizeof buf ? end - at : (long)sizeof buf;
                for (long i = 0; i < k; i++) buf[i] = pattern(at + i);
                write_all(c, buf, k);
                at += k;
            }
        }
    }
    exit(0);
}

static int s;

static void ask(char cmd, int64_t from, int64_t n) {
    char m[17];
    m[0] = cmd;
    memcpy(m + 1, &from, 8);
    memcpy(m + 9, &n, 8);
    write_all(s, m, cmd == 'F' || cmd == 'Q' ? 1 : 17);
}

static int verdict(void) {
    char v = 0;
    return read_full(s, &v, 1) == 0 && v == 'Y';
}

int main(void) {
    alarm(30);
    signal(SIGPIPE, SIG_IGN);
    char path[] = "/tmp/colo-sendfile-XXXXXX";
    int f = mkstemp(path);
    if (f < 0) die("mkstemp");
    unlink(path);
    unsigned char *data = malloc(FILE_SIZE);
    for (long i = 0; i < FILE_SIZE; i++) data[i] = pattern(i);
    write_all(f, data, FILE_SIZE);
    lseek(f, 0, SEEK_SET);

    struct sockaddr_in a;
    int l = loopback_listener(&a, 1);
    pid_t pid = fork();
    if (pid == 0) {
        close(l);
        peer(ntohs(a.sin_port));
    }
    s = accept(l, NULL, NULL);
    if (s < 0) die("accept");
    if (shimmed()) CHECK(segments() == 1, "connection accelerated");

    /* sendfile with an offset: the whole file; the file position does not move. */
    ask('R', 0, FILE_SIZE);
    off_t off = 0;
    long sent = 0;
    while (sent < FILE_SIZE) {
        ssize_t n = sendfile(s, f, &off, FILE_SIZE - sent);
        if (n <= 0) break;
        sent += n;
    }
    CHECK(sent == FILE_SIZE && off == FILE_SIZE, "sendfile with offset sent the whole file");
    CHECK(lseek(f, 0, SEEK_CUR) == 0, "sendfile with offset leaves the file position");
    CHECK(verdict(), "peer got the file intact (sendfile with offset)");

    /* sendfile without an offset, from the middle: the file position moves. */
    lseek(f, 1000000, SEEK_SET);
    ask('R', 1000000, 500000);
    sent = 0;
    while (sent < 500000) {
        ssize_t n = sendfile(s, f, NULL, 500000 - sent);
        if (n <= 0) break;
        sent += n;
    }
    CHECK(sent == 500000 && lseek(f, 0, SEEK_CUR) == 1500000, "sendfile without offset moves the file position");
    CHECK(verdict(), "peer got the range intact (sendfile without offset)");

    /* splice: file -> pipe -> socket. */
    int p[2];
    if (pipe(p) < 0) die("pipe");
    ask('R', 0, FILE_SIZE);
    loff_t foff = 0;
    long moved = 0;
    int bad = 0;
    while (moved < FILE_SIZE) {
        ssize_t in = splice(f, &foff, p[1], NULL, FILE_SIZE - moved, SPLICE_F_MOVE);
        if (in <= 0) {
            bad = 1;
            break;
        }
        while (in > 0) {
            ssize_t out = splice(p[0], NULL, s, NULL, in, SPLICE_F_MOVE | SPLICE_F_MORE);
            if (out <= 0) {
                perror("splice pipe -> socket");
                bad = 1;
                break;
            }
            in -= out;
            moved += out;
        }
        if (bad) break;
    }
    CHECK(!bad && moved == FILE_SIZE && foff == FILE_SIZE, "splice file -> pipe -> socket moved the whole file");
    CHECK(verdict(), "peer got the file intact (splice)");

    /* splice: socket -> pipe -> file (a second file), then compare. */
    char path2[] = "/tmp/colo-splice-XXXXXX";
    int g = mkstemp(path2);
    if (g < 0) die("mkstemp 2");
    unlink(path2);
    long want = 2L << 20;
    ask('S', 0, want);
    moved = 0;
    loff_t goff = 0;
    while (moved < want) {
        ssize_t in = splice(s, NULL, p[1], NULL, want - moved, SPLICE_F_MOVE);
        if (in <= 0) {
            perror("splice socket -> pipe");
            break;
        }
        while (in > 0) {
            ssize_t out = splice(p[0], NULL, g, &goff, in, SPLICE_F_MOVE);
            if (out <= 0) die("splice pipe -> file");
            in -= out;
            moved += out;
        }
    }
    CHECK(moved == want && goff == want, "splice socket -> pipe -> file moved everything");
    unsigned char *back = malloc(want);
    CHECK(pread(g, back, want, 0) == want && memcmp(back, data, want) == 0, "the spliced file is intact");

    /* splice socket -> pipe, then read the pipe; at end of stream splice returns 0. */
    ask('S', 7, 1000);
    ask('F', 0, 0);
    long got = 0;
    int same = 1;
    for (;;) {
        ssize_t in = splice(s, NULL, p[1], NULL, 65536, 0);
        if (in < 0) {
            perror("splice socket -> pipe (2)");
            same = 0;
            break;
        }
        if (in == 0) break;
        if (read_full(p[0], back, in) < 0) die("pipe read");
        for (ssize_t i = 0; i < in; i++)
            if (back[i] != pattern(7 + got + i)) same = 0;
        got += in;
    }
    CHECK(got == 1000 && same, "splice socket -> pipe, then 0 at end of stream");

    /* A splice with no pipe on either side is refused (EINVAL), as by the kernel. */
    loff_t z = 0;
    errno = 0;
    CHECK(splice(f, &z, s, NULL, 10, 0) < 0 && errno == EINVAL, "splice file -> socket without a pipe: EINVAL");

    ask('Q', 0, 0);
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "peer exit");
    if (failures == 0)
        printf("ok: sendfile (with and without offset), splice file -> pipe -> socket and socket -> pipe -> file%s\n",
               shimmed() ? " (accelerated)" : "");
    return failures != 0;
}
