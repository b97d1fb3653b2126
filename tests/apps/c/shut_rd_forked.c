/* A read shutdown is the socket's, not the process's: after the parent's shutdown(SHUT_RD), a
 * forked child holding the same connection sees what the kernel shows every holder of the
 * socket (readable, end of stream, RDHUP), and the SO_ERROR a peer's reset leaves is reported
 * once among them. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <poll.h>
#include <sys/wait.h>

#include "scenario.h"

/* The child: waits for the parent's word, then reports what it sees of `c` (0: as expected). */
static int child(int c, int go) {
    char b;
    if (read(go, &b, 1) != 1) return 10;
    struct pollfd p = {.fd = c, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) != 1 || (p.revents & (POLLIN | POLLRDHUP)) != (POLLIN | POLLRDHUP)) {
        fprintf(stderr, "child: poll revents 0x%x\n", p.revents);
        return 11;
    }
    ssize_t n = recv(c, &b, 1, MSG_DONTWAIT);
    if (n != 0) {
        fprintf(stderr, "child: recv %zd (%s)\n", n, n < 0 ? strerror(errno) : "bytes");
        return 12;
    }
    return 0;
}

int main(void) {
    alarm(20);
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    int k = socket(AF_INET, SOCK_STREAM, 0);
    if (k < 0 || connect(k, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    int c = accept(l, NULL, NULL);
    if (c < 0) die("accept");
    /* One exchange, so that the connection is in use (and, under the shim, accelerated). */
    write_all(k, "q", 1);
    char b;
    CHECK(read(c, &b, 1) == 1 && b == 'q', "the first byte");
    int go[2];
    if (pipe(go) < 0) die("pipe");
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) _exit(child(c, go[0]));
    CHECK(shutdown(c, SHUT_RD) == 0, "shutdown(SHUT_RD)");
    write_all(go[1], "g", 1);
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child sees the read shutdown");
    close(c);
    close(k);
    close(l);
    if (failures) return 1;
    printf("shut_rd_forked: ok\n");
    return 0;
}
