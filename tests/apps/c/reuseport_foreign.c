/* Two unrelated processes listening on one port with SO_REUSEPORT (two instances of a server,
 * an old one and its replacement): only the first owns the port's rendezvous, where every client
 * sends its offer, and the kernel gives each connection to either. One given to the other
 * process is accepted as plain TCP there, and its offer is never answered: the client must go on
 * over TCP at once, not after its whole carrier timeout. COLO_CARRIER_TIMEOUT_MS is set to 20 s,
 * so a client that waits it out trips the watchdog. The three are separate programs (a client
 * forked from a server is served by it, as its own process). Each server greets with its letter and
 * echoes; the client holds every connection open (none is judged short-lived) until it has seen
 * both servers and one accelerated connection to the first, then checks every connection's
 * echo. alarm() is the watchdog. */
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#include "scenario.h"

#define MAX_CONNS 40

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

/* Opens connections one at a time, each kept, until it has seen both servers and an accelerated
 * connection to the first; after one to the second it waits out the time the shim sends the next
 * ones plain, so that later ones are offered again. Then every connection echoes. */
static int client(int port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int c[MAX_CONNS], n = 0, first = 0, second = 0, fast_first = 0;
    while (n < MAX_CONNS && !(second && fast_first)) {
        int before = segments();
        c[n] = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(c[n], (struct sockaddr *)&a, sizeof a) < 0) die("client connect");
        char g;
        if (read(c[n], &g, 1) != 1) die("client greeting");
        n++;
        if (g == 'A') {
            first++;
            fast_first |= segments() > before;
        } else if (g == 'B') {
            second++;
            usleep(1100 * 1000);
        } else {
            fprintf(stderr, "FAIL client: greeting %c\n", g);
            return 1;
        }
    }
    for (int i = 0; i < n; i++) {
        char b[2] = {'0' + i % 10, 0}, r = 0;
        write_all(c[i], b, 1);
        if (read(c[i], &r, 1) != 1 || r != b[0]) {
            fprintf(stderr, "FAIL client: connection %d echoed %c for %c\n", i, r, b[0]);
            return 1;
        }
    }
    fprintf(stderr, "client: %d connections, %d to the first server, %d to the second\n", n, first, second);
    for (int i = 0; i < n; i++) close(c[i]);
    if (!second || (shimmed() && !fast_first)) {
        fprintf(stderr, "FAIL client: never reached %s\n", second ? "the first server accelerated" : "the second server");
        return 1;
    }
    return 0;
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
