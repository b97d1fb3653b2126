/* A daemon that closes every descriptor number up to its limit in a loop (dante's danted after it
 * listens; a forked child keeping only its connection, as inetd-style servers do before exec),
 * under a fixed limit (soft = hard, as systemd's LimitNOFILE= and containers set it), where the
 * shim's own descriptors lie within the numbers closed. Over TCP those numbers are not open, so
 * the loop closes only the program's own; the listener then accepts, the child's connection
 * carries every byte, and so does a program the child executes on it. The shim's descriptors
 * closed under it left the listener plain TCP and cut the child's connection short. alarm() is
 * the watchdog. */
#define _GNU_SOURCE
#include <sys/resource.h>
#include <sys/wait.h>

#include "scenario.h"

#define BYTES (4 * 1024 * 1024)

/* Closes every number from 3 to the limit but `keep`; returns how many closes succeeded. */
static int close_all_but(int keep) {
    long max = sysconf(_SC_OPEN_MAX);
    int closed = 0;
    for (int fd = 3; fd < max; fd++)
        if (fd != keep && close(fd) == 0) closed++;
    return closed;
}

static void listener_after_the_loop(void) {
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    CHECK(close_all_but(l) == 0, "listener: the loop closed nothing of the program's (none other open)");
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        int k = socket(AF_INET, SOCK_STREAM, 0);
        char b[5];
        if (k < 0 || connect(k, (struct sockaddr *)&a, sizeof a) < 0) _exit(2);
        write_all(k, "ping", 4);
        _exit(read_full(k, b, 4) == 0 && memcmp(b, "pong", 4) == 0 ? 0 : 3);
    }
    int c = accept(l, NULL, NULL);
    char b[5];
    CHECK(c >= 0 && read_full(c, b, 4) == 0 && memcmp(b, "ping", 4) == 0, "listener: the request arrives");
    if (shimmed()) CHECK(segments() >= 1, "listener: the connection accepted after the loop is accelerated");
    write_all(c, "pong", 4);
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "listener: the client got its answer");
    close(c);
    close(l);
}

static void child_keeps_its_connection(void) {
    int k, c;
    connected_pair(&k, &c, 0);
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        int closed = close_all_but(c);
        static unsigned char out[BYTES];
        for (long i = 0; i < BYTES; i++) out[i] = pattern(i);
        for (long w = 0; w < BYTES;) {
            ssize_t n = write(c, out + w, BYTES - w);
            if (n <= 0) _exit(2);
            w += n;
        }
        /* The client end is the only other descriptor the program opened. */
        _exit(closed == 1 ? 0 : 4);
    }
    close(c);
    static unsigned char got[BYTES];
    CHECK(read_full(k, got, BYTES) == 0, "child: the peer reads every byte the child wrote after the loop");
    long bad = -1;
    for (long i = 0; i < BYTES && bad < 0; i++)
        if (got[i] != pattern(i)) bad = i;
    CHECK(bad < 0, "child: ... in order");
    char b;
    CHECK(read(k, &b, 1) == 0, "child: ... then the end of the stream");
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
          "child: its writes all succeeded and its loop closed only the program's descriptor");
    close(k);
}

/* inetd's way: the child makes the connection its descriptors 0 and 1, closes every other
 * number, and executes a program (this one again) that answers on them. */
static void exec_after_the_loop(const char *self) {
    int k, c;
    connected_pair(&k, &c, 0);
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        if (dup2(c, 0) != 0 || dup2(c, 1) != 1) _exit(2);
        close_all_but(-1);
        execl(self, self, "answer", (char *)NULL);
        _exit(3);
    }
    close(c);
    write_all(k, "ping", 4);
    char b[5];
    CHECK(read_full(k, b, 4) == 0 && memcmp(b, "pong", 4) == 0, "exec: the program run after the loop answers on the connection");
    CHECK(read(k, b, 1) == 0, "exec: ... then the end of the stream");
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "exec: the program ran to its end");
    close(k);
}

int main(int argc, char **argv) {
    if (argc > 1) { /* "answer": the program exec_after_the_loop runs */
        char b[4];
        if (read_full(0, b, 4) != 0 || memcmp(b, "ping", 4) != 0) return 4;
        write_all(1, "pong", 4);
        return 0;
    }
    alarm(30);
    /* Fixed at the kernel's most (fs.nr_open), so that even root's shim finds no number above
     * it; a user that may not raise its hard limit fixes it where it is. */
    struct rlimit fixed;
    FILE *f = fopen("/proc/sys/fs/nr_open", "r");
    if (!f || fscanf(f, "%lu", &fixed.rlim_max) != 1) die("fs.nr_open");
    fclose(f);
    fixed.rlim_cur = fixed.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &fixed) != 0) {
        if (getrlimit(RLIMIT_NOFILE, &fixed) != 0) die("getrlimit");
        fixed.rlim_cur = fixed.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &fixed) != 0) die("setrlimit");
    }
    close_all_but(-1); /* what the test's parent left open */
    listener_after_the_loop();
    child_keeps_its_connection();
    exec_after_the_loop(argv[0]);
    if (failures == 0) printf("close_loop_keep: ok\n");
    return failures != 0;
}
