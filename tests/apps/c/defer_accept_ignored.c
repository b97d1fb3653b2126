/* COLO_DEFER_ACCEPT=ignore: a listener's TCP_DEFER_ACCEPT (apache2's default, nginx's `deferred`,
 * h2o, pgbouncer) is kept for getsockopt and not given to the kernel, so the listener accepts a
 * colo client, which sends only once accepted, and the connection is accelerated (without the
 * variable it goes plain: deferred_accept.c). The server, a child, finds its connection
 * acceptable before any byte came (the sign that the kernel defers nothing), answers, and the
 * bytes come back intact. Run with the shim preloaded, as tests/apps/run.sh does. alarm() is
 * the watchdog. */
#define _GNU_SOURCE
#include "scenario.h"
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/wait.h>

int main(void) {
    alarm(30);
    setenv("COLO_DEFER_ACCEPT", "ignore", 1);
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    int five = 5, got = -1;
    socklen_t gl = sizeof got;
    CHECK(setsockopt(l, IPPROTO_TCP, TCP_DEFER_ACCEPT, &five, sizeof five) == 0, "TCP_DEFER_ACCEPT set");
    /* The kernel would report it rounded up to its retransmission steps (7); the shim, as asked. */
    CHECK(getsockopt(l, IPPROTO_TCP, TCP_DEFER_ACCEPT, &got, &gl) == 0 && gl == sizeof got && got >= 5,
          "getsockopt reports the option set");
    int bad = open("/dev/null", O_RDONLY);
    CHECK(setsockopt(bad, IPPROTO_TCP, TCP_DEFER_ACCEPT, &five, sizeof five) == -1 && errno == ENOTSOCK,
          "a descriptor that is no socket: ENOTSOCK, as the kernel says");
    close(bad);
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        /* The server: the connection is acceptable before the client sends anything. */
        struct pollfd p = {.fd = l, .events = POLLIN};
        if (poll(&p, 1, 10000) != 1) _exit(2);
        int s = accept(l, NULL, NULL);
        char b[6];
        if (s < 0) _exit(3);
        write_all(s, "hello\n", 6);
        if (read_full(s, b, 6) < 0 || memcmp(b, "world\n", 6) != 0) _exit(4);
        _exit(0);
    }
    close(l);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    char b[6];
    if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    CHECK(read_full(c, b, 6) == 0 && memcmp(b, "hello\n", 6) == 0, "the server spoke first, unprompted");
    write_all(c, "world\n", 6);
    int st = -1;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the server accepted before any byte and got the answer");
    close(c);
    if (failures == 0) printf("defer_accept_ignored: ok\n");
    return failures != 0;
}
