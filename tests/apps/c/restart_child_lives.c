/* A forking server restarted while a child it forked per connection still serves (a Perl or
 * Python fork-per-connection server, a long download, the server killed and started again): the
 * child closed its copy of the listener, so it can never serve the listener's rendezvous, and
 * must not keep the address's rendezvous name once the process that listened is gone. Otherwise
 * the new server finds the name taken, becomes a guest of a holder that never answers, and every
 * client waits for an answer that never comes, then goes on over TCP, for as long as the old
 * child lives. Here the new server's connections are accelerated while the old child still holds
 * its connection. The old server, the new server and the client are separate programs (a client
 * forked from a server would be served as its own process). alarm() is the watchdog;
 * COLO_CARRIER_TIMEOUT_MS is set high, so a client that waits for a holder that never answers
 * trips it instead of going on over TCP. */
#include <signal.h>
#include <sys/wait.h>

#include "scenario.h"

#define CONNS 3

/* The old server: listens on `port`, accepts one connection, forks a child that closes the
 * listener and echoes the connection until its end, and waits for the end of `hold` (the test
 * kills it before). */
static int old_server(int port, int ready) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    if (l < 0 || setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0) die("old socket");
    if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 16) < 0) die("old listen");
    write_all(ready, "r", 1);
    int c = accept(l, NULL, NULL);
    if (c < 0) die("old accept");
    if (fork() == 0) {
        close(l);
        alarm(0);
        echo_until_eof(c);
        _exit(0);
    }
    close(c);
    alarm(0);
    pause();
    return 0;
}

/* The new server: listens on `port` (the old one is gone) and greets and echoes each connection,
 * a child each, until killed. */
static void new_server(int port, int ready) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    if (l < 0 || setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0) die("new socket");
    if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 16) < 0) die("new listen");
    signal(SIGCHLD, SIG_IGN);
    write_all(ready, "r", 1);
    alarm(0);
    for (;;) {
        int c = accept(l, NULL, NULL);
        if (c < 0) die("new accept");
        if (fork() == 0) {
            close(l);
            write_all(c, "N", 1);
            echo_until_eof(c);
            _exit(0);
        }
        close(c);
    }
}

/* The client: CONNS connections to the new server, each kept open, accelerated, and echoing. */
static int client(int port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int c[CONNS];
    for (int i = 0; i < CONNS; i++) {
        int before = segments();
        char g = 0;
        c[i] = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(c[i], (struct sockaddr *)&a, sizeof a) < 0) die("client connect");
        CHECK(read(c[i], &g, 1) == 1 && g == 'N', "greeted by the new server");
        CHECK(!shimmed() || segments() > before, "connection to the new server accelerated");
    }
    for (int i = 0; i < CONNS; i++) {
        char b = '0' + i, r = 0;
        write_all(c[i], &b, 1);
        CHECK(read(c[i], &r, 1) == 1 && r == b, "echoed");
        close(c[i]);
    }
    return failures != 0;
}

/* Starts this program as `role` with `port` and a pipe's write end; returns once it wrote a byte
 * there. */
static pid_t start(const char *self, const char *role, int port) {
    int p[2];
    char b, ps[16], fs[16];
    if (pipe(p) < 0) die("pipe");
    snprintf(ps, sizeof ps, "%d", port);
    snprintf(fs, sizeof fs, "%d", p[1]);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        execl("/proc/self/exe", self, role, ps, fs, (char *)NULL);
        die("exec");
    }
    close(p[1]);
    if (read(p[0], &b, 1) != 1) die(role);
    close(p[0]);
    return pid;
}

int main(int argc, char **argv) {
    if (!getenv("COLO_CARRIER_TIMEOUT_MS")) {
        setenv("COLO_CARRIER_TIMEOUT_MS", "20000", 1);
        execv("/proc/self/exe", argv);
        die("re-exec");
    }
    alarm(25);
    if (argc == 4 && strcmp(argv[1], "old") == 0) return old_server(atoi(argv[2]), atoi(argv[3]));
    if (argc == 4 && strcmp(argv[1], "new") == 0) new_server(atoi(argv[2]), atoi(argv[3]));
    if (argc == 3 && strcmp(argv[1], "client") == 0) return client(atoi(argv[2]));
    struct sockaddr_in a;
    int probe = loopback_listener(&a, 1), port = ntohs(a.sin_port), st = 1;
    close(probe);
    pid_t old = start(argv[0], "old", port);
    /* The connection the old server's child keeps, from this process. */
    int kept = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    char b = 'k', r = 0;
    if (connect(kept, (struct sockaddr *)&(struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)}, sizeof a) < 0) die("kept connect");
    write_all(kept, &b, 1);
    if (read(kept, &r, 1) != 1 || r != b) die("the old child echoes");
    kill(old, SIGKILL);
    waitpid(old, NULL, 0);
    pid_t new = start(argv[0], "new", port);
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    pid_t cl = fork();
    if (cl == 0) {
        execl("/proc/self/exe", argv[0], "client", p, (char *)NULL);
        die("exec client");
    }
    if (waitpid(cl, &st, 0) != cl) die("wait client");
    /* The old child still serves its connection. */
    b = 'z';
    write_all(kept, &b, 1);
    CHECK(read(kept, &r, 1) == 1 && r == b, "the old child still echoes");
    close(kept);
    kill(new, SIGKILL);
    waitpid(new, NULL, 0);
    return (WIFEXITED(st) ? WEXITSTATUS(st) : 1) || failures;
}
