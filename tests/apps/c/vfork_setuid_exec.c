/* A vfork child that becomes another user (setgid, setuid to nobody) and executes a program
 * with a connection born inheritable (socket and accept without SOCK_CLOEXEC), as an
 * inetd-style server runs a service as its user. The program, not preloaded, gets a socket that
 * carries its bytes both ways, and none of the connection's shared memory (no colo-seg memfd
 * among its descriptors): the new user could otherwise read and write the rings of a connection
 * whose peer trusted root (tests/attack/t_rt_exec_setuid.sh, made with fork). The parent's copy
 * of the connection works on afterwards. Needs root for the change of user (else only the
 * connection is made). alarm() is the watchdog. */
#define _GNU_SOURCE
#include <sys/wait.h>
#include "scenario.h"

/* Reads a line (up to `n` - 1 bytes) from `fd` into `buf`. */
static void read_line(int fd, char *buf, size_t n) {
    size_t got = 0;
    while (got + 1 < n) {
        ssize_t r = read(fd, buf + got, 1);
        if (r != 1) break;
        if (buf[got++] == '\n') break;
    }
    buf[got] = 0;
}

int main(void) {
    alarm(30);
    setvbuf(stdout, NULL, _IONBF, 0);
    int k, c;
    connected_pair(&k, &c, 0);
    if (getuid() != 0) {
        printf("not root: no change of user to test\n");
        return 0;
    }
    char script[256];
    snprintf(script, sizeof script,
             "echo uid=$(id -u) seg=$(ls -l /proc/self/fd/ | grep -c colo-seg) >&%d; read x <&%d; echo got $x >&%d", c, c, c);
    char *argv[] = {"sh", "-c", script, NULL};
    /* Not preloaded: what it gets is the kernel's socket, or the shim's descriptors beside it. */
    char *envp[] = {"PATH=/usr/bin:/bin", NULL};
    pid_t p = vfork();
    if (p < 0) die("vfork");
    if (p == 0) {
        if (setgid(65534) != 0 || setuid(65534) != 0) _exit(126);
        execve("/bin/sh", argv, envp);
        _exit(127);
    }
    char line[128];
    read_line(k, line, sizeof line);
    printf("the service says: %s", line);
    CHECK(!strcmp(line, "uid=65534 seg=0\n"), "the service runs as nobody and holds no segment");
    CHECK(write(k, "ping\n", 5) == 5, "send to the service");
    read_line(k, line, sizeof line);
    CHECK(!strcmp(line, "got ping\n"), "the service's reply");
    int st;
    CHECK(waitpid(p, &st, 0) == p && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the service exits 0");
    CHECK(write(c, "parent\n", 7) == 7, "the parent sends on its copy");
    read_line(k, line, sizeof line);
    CHECK(!strcmp(line, "parent\n"), "the client reads the parent's bytes");
    CHECK(write(k, "back\n", 5) == 5, "the client answers");
    read_line(c, line, sizeof line);
    CHECK(!strcmp(line, "back\n"), "the parent reads the answer");
    printf("%s\n", failures ? "FAILED" : "ok");
    return failures != 0;
}
