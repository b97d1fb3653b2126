/* A listener's maker that hands it to a child, closes its own copy and then chroots into a
 * directory without /proc (a supervisor that confines itself): the child goes on accepting, and
 * its connections stay accelerated. The maker's shim looks each second whether a process of its
 * lineage still holds the listener, through /proc; where it cannot see /proc that says nothing,
 * and the listener stays served (were it taken for gone, each later client would wait its
 * carrier timeout and go on over TCP). The maker is also the client, from inside the chroot.
 * Needs root for chroot (skipped without it); passes without the shim. alarm() is the watchdog
 * of both. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "scenario.h"

enum { ROUNDS = 5 };

/* The child: echoes each connection until its end of stream and ends its own, keeping it open until the last
 * (each accelerated one holds a colo segment until then); then sends how many segments it holds
 * on `tell`, and removes the maker's root `dir`, which the maker no longer sees. */
static void server(int l, int tell, const char *dir) {
    int held[ROUNDS + 1];
    for (int i = 0; i < ROUNDS + 1; i++) {
        held[i] = accept(l, NULL, NULL);
        if (held[i] < 0) die("accept");
        if (echo_until_eof(held[i]) < 0 || shutdown(held[i], SHUT_WR) < 0) die("echo");
    }
    int accelerated = segments();
    if (write(tell, &accelerated, sizeof accelerated) != sizeof accelerated) die("tell");
    rmdir(dir);
    for (int i = 0; i < ROUNDS + 1; i++) close(held[i]);
}

/* One connection: a byte each way, 64 KiB echoed, end of stream both ways, the bytes compared. */
static void client_round(const struct sockaddr_in *a) {
    static char out[65536], in[sizeof out];
    for (size_t i = 0; i < sizeof out; i++) out[i] = (char)(i * 7 + 1);
    int k = socket(AF_INET, SOCK_STREAM, 0);
    char b = 'x';
    if (k < 0 || connect(k, (const struct sockaddr *)a, sizeof *a) < 0) die("connect");
    CHECK(write(k, &b, 1) == 1 && read(k, &b, 1) == 1 && b == 'x', "the first byte echoed");
    CHECK(write(k, out, sizeof out) == (ssize_t)sizeof out, "64 KiB written");
    CHECK(read_full(k, in, sizeof in) == 0 && memcmp(in, out, sizeof out) == 0, "64 KiB echoed intact");
    shutdown(k, SHUT_WR);
    CHECK(read(k, &b, 1) == 0, "end of stream after ours");
    close(k);
}

int main(void) {
    alarm(30);
    if (geteuid() != 0) {
        printf("skipped: chroot needs root\n");
        return 0;
    }
    char dir[] = "/tmp/colo-chroot.XXXXXX";
    if (!mkdtemp(dir)) die("mkdtemp");
    struct sockaddr_in a;
    int l = loopback_listener(&a, 16);
    int p[2];
    if (pipe(p) < 0) die("pipe");
    pid_t child = fork();
    if (child < 0) die("fork");
    if (child == 0) {
        alarm(30); /* a fork does not inherit the parent's */
        close(p[0]);
        server(l, p[1], dir);
        _exit(0);
    }
    close(p[1]);
    close(l);
    /* A first connection while the maker still sees /proc. */
    client_round(&a);
    if (chroot(dir) < 0 || chdir("/") < 0) die("chroot");
    /* The maker's shim looks at a listener it closed each second: let it look in the chroot. */
    usleep(2500 * 1000);
    for (int i = 0; i < ROUNDS; i++) client_round(&a);
    int accelerated = -1, st;
    CHECK(read_full(p[0], &accelerated, sizeof accelerated) == 0, "the server's count");
    CHECK(waitpid(child, &st, 0) == child && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the server ended well");
    if (shimmed()) {
        printf("connections accelerated: %d of %d (%d after the maker's chroot)\n", accelerated, ROUNDS + 1, ROUNDS);
        CHECK(accelerated == ROUNDS + 1, "every connection accelerated, those after the maker's chroot too");
    }
    return failures ? 1 : 0;
}
