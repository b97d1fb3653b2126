/* Two unrelated processes listening on one port with SO_REUSEPORT (two instances of a server,
 * an old one and its replacement): only the first holds the port's rendezvous, where every client
 * sends its offer, and the kernel gives each connection to either. The second asks the first
 * for the offers of the connections it accepts (spec/WIRE.md section 3, "Offers for another
 * process's listener"), so every connection is accelerated, whichever process took it, and no
 * client waits out COLO_CARRIER_TIMEOUT_MS (set to 20 s here: such a wait trips the watchdog).
 * The three are separate programs (a client forked
 * from a server is served by it, as its own process). Each server greets with its letter and
 * echoes; the client holds its connections open (none is judged short-lived), counts its
 * segments, and checks every echo. alarm() is the watchdog. */
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#include "scenario.h"

#define CONNS 16

static int reuse_listener(int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (s < 0 || setsockopt(s, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) < 0) die("reuseport socket");
    if (bind(s, (struct sockaddr *)&a, sizeof a) < 0 || listen(s, 64) < 0) die("reuseport listen");
    getsockname(s, (struct sockaddr *)&a, &len);
    return s;
}

static int port_of(int s) {
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    getsockname(s, (struct sockaddr *)&a, &len);
    return ntohs(a.sin_port);
}

static char letter;

static void *greet_and_echo(void *arg) {
    int c = (int)(long)arg;
    write_all(c, &letter, 1);
    echo_until_eof(c);
    close(c);
    return NULL;
}

/* A server blocked in `accept` (its offers wait in the shim's service thread), a thread per
 * connection: each is greeted with `l_letter`, then echoed until its end. Never returns. */
static void serve(int l, char l_letter) {
    letter = l_letter;
    for (;;) {
        int c = accept(l, NULL, NULL);
        pthread_t t;
        if (c < 0) die("accept");
        if (pthread_create(&t, NULL, greet_and_echo, (void *)(long)c) != 0) die("thread");
        pthread_detach(t);
    }
}

/* Waits for the client (`pids[0]`), stops the second server (`pids[1]`) and exits with the
 * client's status. */
static void *end_with_client(void *arg) {
    pid_t *pids = arg;
    int st = 0;
    if (waitpid(pids[0], &st, 0) != pids[0]) die("wait client");
    kill(pids[1], SIGKILL);
    waitpid(pids[1], NULL, 0);
    _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 1);
}

/* Opens CONNS connections, each kept; each must be accelerated (a segment more), and both servers
 * must have been reached (all on one: 2 in 2^CONNS). Then every connection echoes. */
static int client(int port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int c[CONNS], first = 0, second = 0, bad = 0;
    for (int i = 0; i < CONNS; i++) {
        int before = segments();
        char g;
        c[i] = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(c[i], (struct sockaddr *)&a, sizeof a) < 0) die("client connect");
        if (read(c[i], &g, 1) != 1) die("client greeting");
        first += g == 'A';
        second += g == 'B';
        if (shimmed() && segments() <= before) {
            fprintf(stderr, "FAIL client: connection %d (to server %c) not accelerated\n", i, g);
            bad = 1;
        }
    }
    for (int i = 0; i < CONNS; i++) {
        char b = '0' + i % 10, r = 0;
        write_all(c[i], &b, 1);
        if (read(c[i], &r, 1) != 1 || r != b) {
            fprintf(stderr, "FAIL client: connection %d echoed %c for %c\n", i, r, b);
            bad = 1;
        }
    }
    fprintf(stderr, "client: %d connections to the first server, %d to the second\n", first, second);
    for (int i = 0; i < CONNS; i++) close(c[i]);
    if (first + second != CONNS || !first || !second) {
        fprintf(stderr, "FAIL client: greetings from both servers expected\n");
        bad = 1;
    }
    return bad;
}

int main(int argc, char **argv) {
    if (!getenv("COLO_CARRIER_TIMEOUT_MS")) {
        setenv("COLO_CARRIER_TIMEOUT_MS", "20000", 1);
        execv("/proc/self/exe", argv);
        die("re-exec");
    }
    alarm(25);
    if (argc == 3 && strcmp(argv[1], "client") == 0) return client(atoi(argv[2]));
    if (argc == 4 && strcmp(argv[1], "second") == 0) {
        /* The unrelated process: a listener of its own on the same port. */
        int l = reuse_listener(atoi(argv[2])), ready = atoi(argv[3]);
        write_all(ready, "r", 1);
        close(ready);
        alarm(0);
        serve(l, 'B');
    }
    int l = reuse_listener(0), port = port_of(l), ready[2];
    char p[16], r[16];
    snprintf(p, sizeof p, "%d", port);
    if (pipe(ready) < 0) die("pipe");
    snprintf(r, sizeof r, "%d", ready[1]);
    pid_t second = fork();
    if (second == 0) {
        close(l);
        close(ready[0]);
        execl("/proc/self/exe", argv[0], "second", p, r, (char *)NULL);
        die("exec second");
    }
    close(ready[1]);
    char b;
    if (read(ready[0], &b, 1) != 1) die("second server never listened");
    /* The client is another program too (a process forked from a server's is served by it). */
    pid_t cl = fork();
    if (cl == 0) {
        close(l);
        execl("/proc/self/exe", argv[0], "client", p, (char *)NULL);
        die("exec client");
    }
    /* This process serves the first listener from its main thread, as a blocking server does;
     * a thread ends the test with the client's status. */
    static pid_t waited[2];
    waited[0] = cl;
    waited[1] = second;
    pthread_t t;
    if (pthread_create(&t, NULL, end_with_client, waited) != 0) die("thread");
    serve(l, 'A');
}
