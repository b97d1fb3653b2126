/* A fork child's handover file (the record of inheritable connections an exec takes back) is
 * made only when the child changes a record and keeps others. A fork-per-connection server's
 * child inherits its one connection without SOCK_CLOEXEC (postgres, inetd-style servers) and
 * at its close has no record left, so it needs no copy of its own (a memfd, a reopening through
 * /proc, two moves). The file stands as at the fork until someone changes it, and the first
 * change after a fork, on either side, goes to a fresh copy:
 * (a) a fork child that closes its one inheritable connection holds no handover file;
 * (b) a fork child that execs itself after its parent made a new inheritable connection and
 *     closed its copy of the shared one still takes that one back: a byte goes through it both
 *     ways in the new image.
 * Passes without the shim. alarm() is the watchdog. */
#define _GNU_SOURCE
#include "scenario.h"
#include <sys/wait.h>

/* Descriptors of this process whose link names the handover file. */
static int handover_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    char path[300], link[256];
    int found = 0;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, link, sizeof link - 1);
        if (n > 0) {
            link[n] = 0;
            if (strstr(link, "colo-handover")) found++;
        }
    }
    if (d) closedir(d);
    return found;
}

int main(int argc, char **argv) {
    alarm(20);
    if (argc > 2 && !strcmp(argv[1], "exec")) {
        /* The exec'd image: echo one byte, plus one, on the inherited connection. */
        int s = atoi(argv[2]);
        char b;
        if (read(s, &b, 1) != 1) return 2;
        b++;
        write_all(s, &b, 1);
        return 0;
    }
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    /* The client's end close-on-exec, the server's inheritable. */
    int k = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (k < 0 || connect(k, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    int s = accept(l, NULL, NULL);
    if (s < 0) die("accept");
    char b = 'x', r = 0;
    write_all(k, &b, 1);
    CHECK(read(s, &r, 1) == 1 && r == b, "the connection carries a byte");

    /* (a) */
    int p[2];
    if (pipe(p) < 0) die("pipe");
    pid_t c = fork();
    if (c == 0) {
        close(s);
        int n = handover_fds();
        if (write(p[1], &n, sizeof n) != sizeof n) _exit(1);
        _exit(0);
    }
    if (c < 0) die("fork");
    int n = -1;
    CHECK(read(p[0], &n, sizeof n) == sizeof n, "the child reports");
    CHECK(waitpid(c, NULL, 0) == c, "waitpid");
    fprintf(stderr, "a fork child that closed its one inheritable connection holds %d handover descriptors\n", n);
    CHECK(n == 0, "a fork child that closed its one inheritable connection holds no handover file");

    /* (b) */
    int go[2];
    if (pipe(go) < 0) die("pipe");
    c = fork();
    if (c == 0) {
        char num[12];
        snprintf(num, sizeof num, "%d", s);
        if (read(go[0], &b, 1) != 1) _exit(8);
        execl("/proc/self/exe", argv[0], "exec", num, (char *)NULL);
        _exit(9);
    }
    if (c < 0) die("fork");
    int k2 = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (k2 < 0 || connect(k2, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    int s2 = accept(l, NULL, NULL);
    if (s2 < 0) die("accept");
    close(s);
    if (write(go[1], "g", 1) != 1) die("write");
    b = 'A';
    write_all(k, &b, 1);
    CHECK(read(k, &r, 1) == 1 && r == 'B', "the exec'd child took its connection back: a byte both ways");
    int st = 0;
    CHECK(waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the exec'd child exits 0");
    close(k2);
    close(s2);
    close(k);
    close(l);
    if (failures == 0) printf("ok: a fork child makes a handover file only when it must, and one exec'd after its parent's changes takes its connection back\n");
    return failures != 0;
}
