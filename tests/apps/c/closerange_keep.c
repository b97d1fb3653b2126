/* A forked child that closes every descriptor but its connection (os.closerange, closefrom, a
 * daemon's close_range), then writes on it: over TCP the connection is the child's to use, and
 * every byte arrives. The shim's own descriptors of the connection (control socket, self bell)
 * lie in the ranges closed; closing them reset the connection (ECONNRESET in the child, the
 * peer cut short). Three ways: close_range around the connection, closefrom above it, and the
 * raw close_range system call. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <sys/syscall.h>
#include <sys/wait.h>

#include "scenario.h"

#define BYTES (4 * 1024 * 1024)

static void child_writes_after(int how) {
    int k, c;
    connected_pair(&k, &c, 0);
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        int s = c;
        if (how == 0) {
            close_range(3, s - 1, 0);
            close_range(s + 1, ~0U, 0);
        } else if (how == 1) {
            if (s != 3 && dup2(s, 3) != 3) _exit(4);
            if (s != 3) s = 3;
            closefrom(4);
        } else {
            syscall(SYS_close_range, 3, s - 1, 0);
            syscall(SYS_close_range, s + 1, ~0U, 0);
        }
        static unsigned char out[BYTES];
        for (long i = 0; i < BYTES; i++) out[i] = pattern(i + how);
        for (long w = 0; w < BYTES;) {
            ssize_t n = write(s, out + w, BYTES - w);
            if (n <= 0) _exit(2);
            w += n;
        }
        _exit(0);
    }
    close(c);
    static unsigned char got[BYTES];
    char what[96];
    snprintf(what, sizeof what, "%d: the peer reads every byte the child wrote after closing the rest", how);
    CHECK(read_full(k, got, BYTES) == 0, what);
    long bad = -1;
    for (long i = 0; i < BYTES && bad < 0; i++)
        if (got[i] != pattern(i + how)) bad = i;
    snprintf(what, sizeof what, "%d: ... in order", how);
    CHECK(bad < 0, what);
    char b;
    snprintf(what, sizeof what, "%d: ... then the end of the stream", how);
    CHECK(read(k, &b, 1) == 0, what);
    int st;
    snprintf(what, sizeof what, "%d: the child's writes all succeeded (exit 0)", how);
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, what);
    close(k);
}

int main(void) {
    alarm(30);
    for (int how = 0; how < 3; how++) child_writes_after(how);
    if (failures == 0) printf("closerange_keep: ok\n");
    return failures != 0;
}
