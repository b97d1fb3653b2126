/* A connection born close-on-exec whose program makes copies without FD_CLOEXEC and execs
 * nothing for a while (proftpd `dup`s each data connection it opens). Run with the shim
 * preloaded (tests/apps/run.sh); also passes without it, with plain kernel semantics:
 * (a) after `dup` and `F_SETFD 0` the program's descriptors are still the socket it accepted
 *     (the same inode, the same peer address) and carry every byte both ways, in order;
 * (b) then a fork child execs this program, which inherits the copy, writes a trailer and exits;
 *     then another, by syscall(SYS_execve) (an exec the shim sees only as that call); the
 *     parent, which kept the connection as it was, writes its own trailer after that and
 *     closes: the client reads the echo, both children's trailers, the parent's, then end of
 *     stream.
 * alarm() is the watchdog. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "scenario.h"

#define BYTES 1000000
#define CHILD_SAYS "child's trailer\n"
#define PARENT_SAYS "parent's trailer\n"

static ino_t inode(int fd) {
    struct stat st;
    return fstat(fd, &st) == 0 ? st.st_ino : 0;
}

static int same_peer(int fd, const struct sockaddr_in *peer) {
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    return getpeername(fd, (struct sockaddr *)&a, &len) == 0 && a.sin_port == peer->sin_port &&
           a.sin_addr.s_addr == peer->sin_addr.s_addr;
}

/* The client: sends BYTES of the pattern, reads them back, then both trailers and the end. */
static void client(int port) {
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    static unsigned char buf[BYTES];
    for (long i = 0; i < BYTES; i++) buf[i] = pattern(i);
    write_all(c, buf, BYTES);
    memset(buf, 0, BYTES);
    if (read_full(c, buf, BYTES) != 0) die("client: read the echo");
    for (long i = 0; i < BYTES; i++)
        if (buf[i] != pattern(i)) {
            fprintf(stderr, "client: echoed byte %ld differs\n", i);
            exit(1);
        }
    const char *want = CHILD_SAYS CHILD_SAYS PARENT_SAYS;
    char got[80] = {0};
    size_t n = strlen(want);
    if (read_full(c, got, n) != 0 || memcmp(got, want, n) != 0) {
        fprintf(stderr, "client: trailers '%s', expected '%s'\n", got, want);
        exit(1);
    }
    if (read(c, got, 1) != 0) die("client: expected end of stream");
    exit(0);
}

int main(int argc, char **argv) {
    alarm(20);
    if (argc == 3 && strcmp(argv[1], "child") == 0) {
        /* The exec'd image: the copy on the number it was given. */
        int d = atoi(argv[2]);
        write_all(d, CHILD_SAYS, strlen(CHILD_SAYS));
        return 0;
    }
    struct sockaddr_in a, peer;
    socklen_t len = sizeof peer;
    int l = loopback_listener(&a, 4);
    pid_t cl = fork();
    if (cl < 0) die("fork");
    if (cl == 0) client(ntohs(a.sin_port));
    int s = accept4(l, (struct sockaddr *)&peer, &len, SOCK_CLOEXEC);
    if (s < 0) die("accept4");
    ino_t ino = inode(s);
    int d = dup(s); /* no FD_CLOEXEC on the copy */
    if (d < 0) die("dup");
    CHECK(inode(d) == ino && inode(s) == ino, "after dup: both descriptors are the accepted socket");
    CHECK(same_peer(d, &peer), "after dup: the copy's peer is the client");
    if (fcntl(s, F_SETFD, 0) < 0) die("F_SETFD");
    CHECK(inode(s) == ino, "after F_SETFD 0: the descriptor is the accepted socket");
    if (shimmed()) CHECK(segments() == 1, "the connection is still in shared memory");
    /* Read on one descriptor, write on the other, as proftpd's two streams do. */
    static unsigned char buf[65536];
    for (long at = 0; at < BYTES;) {
        ssize_t n = read(d, buf, sizeof buf);
        if (n <= 0) die("server: read");
        write_all(s, buf, n);
        at += n;
    }
    close(s);
    for (int raw = 0; raw < 2; raw++) {
        pid_t ch = fork();
        if (ch < 0) die("fork");
        if (ch == 0) {
            char num[16];
            snprintf(num, sizeof num, "%d", d);
            if (raw) {
                char *args[] = {argv[0], "child", num, NULL};
                syscall(SYS_execve, "/proc/self/exe", args, environ);
            } else {
                execl("/proc/self/exe", argv[0], "child", num, (char *)NULL);
            }
            die("exec");
        }
        int st;
        if (waitpid(ch, &st, 0) != ch || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "the child exec'd by %s failed\n", raw ? "syscall(SYS_execve)" : "execl");
            return 1;
        }
    }
    int st;
    write_all(d, PARENT_SAYS, strlen(PARENT_SAYS));
    close(d);
    if (waitpid(cl, &st, 0) != cl || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "the client failed\n");
        return 1;
    }
    if (failures) return 1;
    printf("ok: copies made inheritable keep the accepted socket; a child's exec (execl, syscall) relays its copy, every byte in order\n");
    return 0;
}
