/* Two sockets listening on one port with SO_REUSEPORT, as nginx's `listen ... reuseport` makes
 * (one per worker, all in the master): the kernel spreads the connections over both, but only
 * one can own the port's rendezvous, where every client sends its offer. Every connection must
 * still be accelerated, whichever socket the kernel gave it to (one left without its offer waits
 * out the client's carrier timeout, then goes on over TCP); and after the socket that listened
 * first is closed, the other still serves. A forked client holds all its connections open at
 * once and counts its segments. alarm() is the watchdog. */
#include <poll.h>
#include <sys/wait.h>

#include "scenario.h"

#define ROUND1 16
#define ROUND2 4
#define ALL (ROUND1 + ROUND2)

static int reuse_listener(int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (s < 0 || setsockopt(s, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) < 0) die("reuseport socket");
    if (bind(s, (struct sockaddr *)&a, sizeof a) < 0 || listen(s, 64) < 0) die("reuseport listen");
    return s;
}

/* The client: connections `c[from..to)` opened at once, each answered with 'k'; then all it
 * holds are accelerated (a segment each; the connections stay open, so none is parked or judged
 * short-lived). */
static int client_round(struct sockaddr_in *a, int *c, int from, int to) {
    for (int i = from; i < to; i++) {
        c[i] = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(c[i], (struct sockaddr *)a, sizeof *a) < 0) die("client connect");
    }
    for (int i = from; i < to; i++) {
        char b;
        if (read(c[i], &b, 1) != 1 || b != 'k') die("client read");
    }
    int segs = segments();
    if (!shimmed() || segs >= to) return 0;
    fprintf(stderr, "FAIL client: %d of %d connections accelerated (segments open)\n", segs, to);
    return 1;
}

static void client(int port, int go) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int c[ALL], bad = client_round(&a, c, 0, ROUND1);
    char b;
    if (read(go, &b, 1) != 1) die("client: go");
    bad |= client_round(&a, c, ROUND1, ALL);
    for (int i = 0; i < ALL; i++) {
        write_all(c[i], "x", 1);
        close(c[i]);
    }
    exit(bad);
}

/* Accepts connections `c[from..to)` on whichever of `l[0..nl)` has one and answers 'k' to each;
 * counts what each listener accepted in `got`. */
static void serve_round(int *l, int nl, int *c, int from, int to, int *got) {
    for (int k = from; k < to;) {
        struct pollfd p[2];
        for (int j = 0; j < nl; j++) p[j] = (struct pollfd){.fd = l[j], .events = POLLIN};
        if (poll(p, nl, -1) < 0) die("poll");
        for (int j = 0; j < nl && k < to; j++) {
            if (!(p[j].revents & POLLIN)) continue;
            c[k] = accept(l[j], NULL, NULL);
            if (c[k] < 0) die("accept");
            write_all(c[k++], "k", 1);
            got[j]++;
        }
    }
}

int main(void) {
    alarm(30);
    int first = reuse_listener(0);
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    getsockname(first, (struct sockaddr *)&a, &len);
    int port = ntohs(a.sin_port);
    int l[2] = {first, reuse_listener(port)};
    int go[2];
    if (pipe(go) < 0) die("pipe");
    pid_t pid = fork();
    if (pid == 0) {
        /* Only the server holds the listeners (a copy here would keep the first listening). */
        close(l[0]);
        close(l[1]);
        close(go[1]);
        client(port, go[0]);
    }
    close(go[0]);
    int c[ALL], got[2] = {0, 0};
    serve_round(l, 2, c, 0, ROUND1, got);
    /* Nearly certain: 16 connections' hashes all on one socket is one chance in 32768. */
    CHECK(got[0] > 0 && got[1] > 0, "the kernel gave connections to both listeners");
    if (shimmed()) CHECK(segments() >= ROUND1, "the server's connections are accelerated");
    /* The socket that listened first (and made the rendezvous) closes; the other serves on. */
    close(first);
    write_all(go[1], "g", 1);
    int got2[1] = {0};
    serve_round(&l[1], 1, c, ROUND1, ALL, got2);
    if (shimmed()) CHECK(segments() >= ALL, "... and those the second listener accepted alone");
    for (int k = 0; k < ALL; k++) {
        char b;
        if (read(c[k], &b, 1) != 1 || b != 'x') die("server read");
        close(c[k]);
    }
    int st;
    waitpid(pid, &st, 0);
    if (shimmed()) CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the client's connections were all accelerated, in both rounds");
    else CHECK(WIFEXITED(st), "the client exited");
    if (failures) fprintf(stderr, "reuseport: %d failures (accepted %d and %d)\n", failures, got[0], got[1]);
    return failures ? 1 : 0;
}
