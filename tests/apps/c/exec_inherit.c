/* An accelerated connection survives exec (run with the shim preloaded, as tests/apps/run.sh
 * does): in the same process (the server execs itself mid-stream), where the new program image
 * holds the segment (the connection was taken back, not left as a silent TCP socket); and in a
 * forked child that inherits the socket on fd 0 (inetd style) and reads it with glibc's stdio
 * (fread on stdin, past the shim), where the shim relays the connection over a loopback TCP
 * socket: the image holds no segment and fd 0 is a connected TCP socket, whose getpeername
 * still names the client (the kernel's names the relay). Either way bytes in
 * flight across the exec arrive intact and in order. alarm() is the watchdog. */
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "scenario.h"

#define TOTAL 400000
#define BEFORE 150000

static void read_pattern(int fd, long from, long to) {
    static unsigned char buf[65536];
    long at = from;
    while (at < to) {
        long want = to - at < (long)sizeof buf ? to - at : (long)sizeof buf;
        ssize_t n = read(fd, buf, want);
        if (n <= 0) die("read");
        for (ssize_t i = 0; i < n; i++)
            if (buf[i] != pattern(at + i)) {
                fprintf(stderr, "byte %ld differs\n", at + i);
                exit(1);
            }
        at += n;
    }
}

/* The client: sends the pattern, waits for "OK", half-closes, expects EOF. */
static void client(int port) {
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(c, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    unsigned char *data = malloc(TOTAL);
    for (long i = 0; i < TOTAL; i++) data[i] = pattern(i);
    write_all(c, data, TOTAL);
    char ok[2];
    long got = 0;
    while (got < 2) {
        ssize_t n = read(c, ok + got, 2 - got);
        if (n <= 0) die("client read");
        got += n;
    }
    if (memcmp(ok, "OK", 2) != 0) exit(1);
    shutdown(c, SHUT_WR);
    if (read(c, ok, 1) != 0) die("client expected EOF");
    exit(0);
}

/* The server's image after exec: the rest of the pattern, "OK", then EOF. */
static int finish(int fd, long from, const char *who) {
    if (segments() == 0) {
        fprintf(stderr, "%s: the connection was not taken back after exec\n", who);
        return 1;
    }
    read_pattern(fd, from, TOTAL);
    write_all(fd, "OK", 2);
    char b;
    if (read(fd, &b, 1) != 0) die("server expected EOF");
    close(fd);
    return 0;
}

static int listener(int *port) {
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 8) < 0) die("listen");
    getsockname(l, (struct sockaddr *)&a, &len);
    *port = ntohs(a.sin_port);
    return l;
}

static int wait_ok(pid_t pid) {
    int st;
    return waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int main(int argc, char **argv) {
    alarm(20);
    if (argc == 4 && strcmp(argv[1], "same") == 0) {
        /* Same process after exec: finish, then reap the client and run the inetd case. */
        if (finish(atoi(argv[2]), BEFORE, "exec") != 0) return 1;
        if (!wait_ok(atoi(argv[3]))) return 1;
        printf("ok: connection kept across exec (same process)\n");
        fflush(stdout);
        execl("/proc/self/exe", argv[0], "inetd-parent", (char *)NULL);
        die("exec inetd-parent");
    }
    if (argc == 3 && strcmp(argv[1], "inetd") == 0) {
        /* argv[2]: the client's port. fd 0 is now the relay's loopback connection: the kernel
         * names the relay's end as its peer (asked past libc, and so past the shim)... */
        struct sockaddr_in peer;
        socklen_t plen = sizeof peer;
        if (syscall(SYS_getpeername, 0, (struct sockaddr *)&peer, &plen) < 0) die("inetd child: fd 0 is not a connected socket");
        if (ntohs(peer.sin_port) == atoi(argv[2])) {
            fprintf(stderr, "inetd child: the connection on fd 0 was not relayed\n");
            return 1;
        }
        /* ...and getpeername names the connection's peer, the client, as it did before the exec. */
        plen = sizeof peer;
        if (getpeername(0, (struct sockaddr *)&peer, &plen) < 0 || plen != sizeof peer || ntohs(peer.sin_port) != atoi(argv[2])) {
            fprintf(stderr, "inetd child: getpeername on fd 0 does not name the client (port %d, not %s)\n", ntohs(peer.sin_port), argv[2]);
            return 1;
        }
        /* Nor any other connection's segment (one the parent had just closed, not yet unmapped). */
        if (segments() != 0) {
            fprintf(stderr, "inetd child: holds %d colo segments\n", segments());
            return 1;
        }
        static unsigned char buf[TOTAL];
        if (fread(buf, 1, TOTAL, stdin) != TOTAL) die("inetd child: fread");
        for (long i = 0; i < TOTAL; i++)
            if (buf[i] != pattern(i)) {
                fprintf(stderr, "inetd child: byte %ld differs\n", i);
                return 1;
            }
        write_all(0, "OK", 2);
        if (fgetc(stdin) != EOF) die("inetd child: expected EOF");
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "inetd-parent") == 0) {
        int port, l = listener(&port);
        pid_t cl = fork();
        if (cl == 0) client(port);
        int s = accept(l, NULL, NULL); /* inheritable, like inetd's */
        if (s < 0) die("accept");
        if (segments() == 0) {
            fprintf(stderr, "inetd parent: the connection was not accelerated\n");
            return 1;
        }
        struct sockaddr_in peer;
        socklen_t plen = sizeof peer;
        if (getpeername(s, (struct sockaddr *)&peer, &plen) < 0) die("getpeername");
        char cport[16];
        snprintf(cport, sizeof cport, "%d", ntohs(peer.sin_port));
        pid_t ch = fork();
        if (ch == 0) {
            dup2(s, 0);
            close(s);
            execl("/proc/self/exe", argv[0], "inetd", cport, (char *)NULL);
            die("exec inetd");
        }
        close(s);
        if (!wait_ok(ch) || !wait_ok(cl)) return 1;
        printf("ok: connection handed to an exec'd child on fd 0 (inetd style)\n");
        return 0;
    }
    int port, l = listener(&port);
    pid_t cl = fork();
    if (cl == 0) client(port);
    int s = accept(l, NULL, NULL);
    if (s < 0) die("accept");
    if (segments() == 0) {
        fprintf(stderr, "the connection was not accelerated (is the shim preloaded?)\n");
        return 1;
    }
    read_pattern(s, 0, BEFORE);
    char fd[16], pid[16];
    snprintf(fd, sizeof fd, "%d", s);
    snprintf(pid, sizeof pid, "%d", (int)cl);
    execl("/proc/self/exe", argv[0], "same", fd, pid, (char *)NULL);
    die("exec");
}
