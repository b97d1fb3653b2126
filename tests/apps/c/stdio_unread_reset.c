/* A relayed program that reads part of what the peer sent before the peer reset the connection,
 * then exits; its parent reads on. The peer sends 100 bytes, then closes with bytes it never read
 * (RST). Over TCP the program's reads took the first 5, and the parent reads exactly the other
 * 95, then the reset. Under colo the relay handed all 100 to the program's end; when the reset
 * came it let go of its count, and the parent read all 100 again (5 of them twice). Then a
 * program that reads everything, the reset too: the parent reads nothing more, and end of
 * stream, not the reset again. The connection as standard
 * input (the standard-I/O relay) and as descriptor 7 (the relay of a connection made
 * inheritable). alarm() is the watchdog. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>

#include "scenario.h"

static unsigned char pat(int i) { return (unsigned char)('a' + i % 26); }

/* The exec'd program: waits until the reset has reached the relay, then reads `n` bytes
 * (0: all, to end of stream or error) of its standard input. */
static int reader(long want, int fd) {
    usleep(300000);
    char b[256];
    long got = 0;
    while (want == 0 || got < want) {
        ssize_t r = read(fd, b, want ? (size_t)(want - got) : sizeof b);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        for (ssize_t i = 0; i < r; i++)
            if ((unsigned char)b[i] != pat(got + i)) return 2;
        got += r;
    }
    return 0;
}

static void round_of(int l, struct sockaddr_in *a, long want, long rest, int fd) {
    pid_t cl = fork();
    if (cl < 0) die("fork");
    if (cl == 0) {
        int k = socket(AF_INET, SOCK_STREAM, 0);
        if (k < 0 || connect(k, (struct sockaddr *)a, sizeof *a) < 0) _exit(1);
        usleep(100000);
        unsigned char b[100];
        for (int i = 0; i < 100; i++) b[i] = pat(i);
        if (write(k, b, sizeof b) != (ssize_t)sizeof b) _exit(1);
        usleep(100000);
        /* The server's "ZZ..." unread: RST. */
        close(k);
        _exit(0);
    }
    int s = accept(l, NULL, NULL);
    if (s < 0) die("accept");
    CHECK(write(s, "ZZZZZZZZZZ", 10) == 10, "the server's bytes");
    pid_t r = fork();
    if (r < 0) die("fork");
    if (r == 0) {
        char arg[32], fds[8];
        snprintf(arg, sizeof arg, "%ld", want);
        snprintf(fds, sizeof fds, "%d", fd);
        dup2(s, fd);
        close(s);
        close(l);
        execl("/proc/self/exe", "stdio_unread_reset", "reader", arg, fds, (char *)NULL);
        _exit(127);
    }
    int st;
    waitpid(r, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the program read the first bytes in order");
    waitpid(cl, NULL, 0);
    unsigned char b[256];
    long total = 0;
    int in_order = 1, last = 0;
    for (;;) {
        ssize_t n = read(s, b, sizeof b);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            last = n < 0 ? errno : 0;
            break;
        }
        for (ssize_t i = 0; i < n; i++)
            if (b[i] != pat(100 - rest + total + i)) in_order = 0;
        total += n;
    }
    if (total != rest || !in_order) fprintf(stderr, "the parent read %ld bytes (%s), %ld expected\n", total, in_order ? "in order" : "out of order", rest);
    CHECK(total == rest && in_order, "the parent reads exactly what the program left unread");
    /* The reset is the socket's, reported once: to the parent if the program never read that
     * far, else the parent reads end of stream. */
    if (last != (rest ? ECONNRESET : 0)) fprintf(stderr, "the parent's last read: %s\n", last ? strerror(last) : "end of stream");
    CHECK(last == (rest ? ECONNRESET : 0), "the reset reported once, to whoever read that far first");
    close(s);
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "reader") == 0) return reader(atol(argv[2]), atoi(argv[3]));
    if (shimmed() && !getenv("COLO_SHORT_LIVED")) {
        setenv("COLO_SHORT_LIVED", "accelerate", 1);
        execv("/proc/self/exe", argv);
        die("execv");
    }
    signal(SIGPIPE, SIG_IGN);
    alarm(25);
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    /* On standard input (the standard-I/O relay), and on descriptor 7 (the relay of a
     * connection made inheritable). */
    for (int i = 0; i < 2; i++) {
        round_of(l, &a, 5, 95, 0);
        round_of(l, &a, 0, 0, 0);
        round_of(l, &a, 5, 95, 7);
        round_of(l, &a, 0, 0, 7);
    }
    if (failures) return 1;
    printf("ok\n");
    return 0;
}
