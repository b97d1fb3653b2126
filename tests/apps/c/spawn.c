/* An accelerated socket inherited by other programs (run with the shim preloaded, as
 * tests/apps/run.sh does; also passes without it, with plain kernel semantics): posix_spawn
 * (the child writes to the fd named on its argv, closes it and exits, and we write on after it),
 * system() running `sh -c 'echo ... >&5'`, vfork + exec, and posix_spawnp after which we close
 * our copies at once (inetd style: the child is the last holder, and its exit is the peer's EOF).
 * A close-on-exec socket is not inherited. The forked peer reads to EOF and checks that every
 * piece arrived intact and in order. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "scenario.h"

extern char **environ;

/* A bulky piece, so that pieces are more than a line: "<tag>:" + 50000 pattern bytes + "\n". */
static void piece(int fd, const char *tag) {
    static char buf[50100];
    int n = snprintf(buf, sizeof buf, "%s:", tag);
    for (int i = 0; i < 50000; i++) buf[n + i] = 'a' + (i * 7 + tag[0]) % 26;
    buf[n + 50000] = '\n';
    write_all(fd, buf, n + 50001);
}

static const char *expected_tags[] = {"A", "B", "C", "D", "E", "F", "G", "H"};

/* The peer reads to EOF: A, B, C, `D:system` (one line from the shell), E, F, G, H. */
static void peer(int port) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(c, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    size_t cap = 1 << 20, len = 0;
    char *all = malloc(cap);
    for (;;) {
        ssize_t n = read(c, all + len, cap - len);
        if (n < 0) die("peer read");
        if (n == 0) break;
        len += n;
        if (len == cap) die("peer: too much");
    }
    /* Build the expected stream and compare. */
    char *want = malloc(cap);
    size_t wl = 0;
    static char p[50100];
    for (int t = 0; t < 8; t++) {
        const char *tag = expected_tags[t];
        if (tag[0] == 'D') {
            wl += sprintf(want + wl, "D:system\n");
            continue;
        }
        int n = sprintf(p, "%s:", tag);
        for (int i = 0; i < 50000; i++) p[n + i] = 'a' + (i * 7 + tag[0]) % 26;
        p[n + 50000] = '\n';
        memcpy(want + wl, p, n + 50001);
        wl += n + 50001;
    }
    if (len != wl || memcmp(all, want, wl) != 0) {
        size_t i = 0;
        while (i < len && i < wl && all[i] == want[i]) i++;
        fprintf(stderr, "FAIL peer: got %zu bytes, expected %zu; first difference at %zu; pieces:", len, wl, i);
        for (size_t j = 0; j < len; j++)
            if (j == 0 || all[j - 1] == '\n') fprintf(stderr, " %c", all[j]);
        fprintf(stderr, "\n");
        exit(1);
    }
    /* Second connection: after "x", EOF must come when the parent closes, not when its
     * long-running child (exec'd, without the close-on-exec socket) exits. */
    c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)&a, sizeof a) < 0) die("connect 2");
    char x;
    if (read(c, &x, 1) != 1) die("peer read x");
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ssize_t n = read(c, &x, 1);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double dt = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    if (n != 0 || dt > 1.5) {
        fprintf(stderr, "FAIL peer: EOF after %.2f s (read %zd): the exec'd child kept the connection\n", dt, n);
        exit(1);
    }
    exit(0);
}

static int wait_ok(pid_t pid) {
    int st;
    return pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int main(int argc, char **argv) {
    /* Child modes: `child FD TAG [close]` writes a piece; `ebadf FD` expects FD not inherited. */
    if (argc >= 4 && strcmp(argv[1], "child") == 0) {
        int fd = atoi(argv[2]);
        usleep(50000); /* let the parent close its copies first (inetd case) */
        piece(fd, argv[3]);
        if (argc >= 5 && strcmp(argv[4], "close") == 0 && close(fd) != 0) die("child close");
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "sleep") == 0) {
        sleep(3);
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "ebadf") == 0) {
        int fd = atoi(argv[2]);
        return write(fd, "X", 1) < 0 && errno == EBADF ? 0 : 1;
    }
    alarm(30);
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 1) < 0) die("listen");
    getsockname(l, (struct sockaddr *)&a, &len);
    pid_t peer_pid = fork();
    if (peer_pid == 0) peer(ntohs(a.sin_port));
    int s = accept(l, NULL, NULL); /* inheritable */
    if (s < 0) die("accept");
    char fd[16], *args[6];
    snprintf(fd, sizeof fd, "%d", s);

    piece(s, "A");

    /* posix_spawn: the child writes B, closes its copy and exits; we go on writing. */
    pid_t ch;
    args[0] = argv[0], args[1] = "child", args[2] = fd, args[3] = "B", args[4] = "close", args[5] = NULL;
    CHECK(posix_spawn(&ch, "/proc/self/exe", NULL, NULL, args, environ) == 0, "posix_spawn");
    CHECK(wait_ok(ch), "posix_spawn child");
    piece(s, "C");

    /* system(): the shell writes to an inherited single-digit fd that is none of ours. */
    int d = 5;
    while (d == s || d == l) d++;
    char cmd[32];
    snprintf(cmd, sizeof cmd, "echo D:system >&%d", d);
    CHECK(dup2(s, d) == d, "dup2 to a free single digit");
    CHECK(system(cmd) == 0, "system()");
    close(d);
    piece(s, "E");

    /* vfork + exec. */
    args[3] = "F", args[4] = NULL;
    pid_t v = vfork();
    if (v == 0) {
        execv("/proc/self/exe", args);
        _exit(127);
    }
    CHECK(wait_ok(v), "vfork child");
    piece(s, "G");

    /* A close-on-exec copy is not inherited. */
    int ce = fcntl(s, F_DUPFD_CLOEXEC, 20);
    char cefd[16];
    snprintf(cefd, sizeof cefd, "%d", ce);
    char *eargs[] = {argv[0], "ebadf", cefd, NULL};
    CHECK(posix_spawn(&ch, "/proc/self/exe", NULL, NULL, eargs, environ) == 0 && wait_ok(ch),
          "a close-on-exec copy is not inherited");
    close(ce);

    /* posix_spawnp with the socket moved to fd 9 by a file action; we close our copy at once:
     * the child is the last holder, and its exit ends the connection. */
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, s, 9);
    args[2] = "9", args[3] = "H", args[4] = NULL;
    CHECK(posix_spawnp(&ch, "/proc/self/exe", &fa, NULL, args, environ) == 0, "posix_spawnp");
    posix_spawn_file_actions_destroy(&fa);
    close(s);
    CHECK(wait_ok(ch), "posix_spawnp child");

    /* A close-on-exec connection and a forked child that execs a long-running program: our
     * close ends the connection at once (the child does not hold it after exec). */
    s = accept4(l, NULL, NULL, SOCK_CLOEXEC);
    if (s < 0) die("accept 2");
    close(l);
    pid_t sl = fork();
    if (sl == 0) {
        execl("/proc/self/exe", argv[0], "sleep", (char *)NULL);
        _exit(127);
    }
    usleep(200000);
    write_all(s, "x", 1);
    close(s);

    CHECK(wait_ok(peer_pid), "the peer got every piece intact, in order, then EOF, and EOF at our close");
    kill(sl, SIGTERM);
    waitpid(sl, NULL, 0);
    if (failures == 0)
        printf("ok: inherited socket across posix_spawn, system(), vfork+exec, posix_spawnp (inetd style)%s\n",
               shimmed() ? " (accelerated)" : "");
    return failures != 0;
}
