/* A fork child closes its copy of a connection the parent dialed but has not used yet (under
 * the shim: still waiting for the server's answer, "pending"). Over TCP a copy's close does
 * nothing to the connection: the parent then reads what the server wrote. alarm() is the
 * watchdog. */
#define _GNU_SOURCE
#include <sys/wait.h>

#include "scenario.h"

int main(void) {
    alarm(20);
    int k, c;
    connected_pair(&k, &c, 0);
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        close(k);
        _exit(0);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child exits 0");
    write_all(c, "hello", 5);
    close(c);
    char b[16];
    size_t n = 0;
    ssize_t r;
    while (n < sizeof b && (r = read(k, b + n, sizeof b - n)) > 0) n += r;
    CHECK(n == 5 && memcmp(b, "hello", 5) == 0, "the parent reads the server's bytes after the child closed its copy");
    if (n != 5) fprintf(stderr, "read %zu bytes\n", n);
    close(k);
    if (failures) return 1;
    printf("pending_forked: ok\n");
    return 0;
}
