/* What an accept costs a server that forks per connection (inetd-style, postgres), in the
 * parent's page faults. After each fork every page the parent writes costs it a copy-on-write
 * fault, so the shim's accept must write nothing when the client is plain TCP (not under colo:
 * its port is even, and no offer can come). A server that passes no address buffer
 * (accept(l, NULL, NULL)) must cost no more than one that does: the shim used to look at the
 * listener's rendezvous for it, writing the listener's table slot and the offer service's state
 * on every accept. The clients connect with a raw system call (out of the shim's sight: plain
 * TCP); each child closes its copies and exits. The faults of this process alone (getrusage) are
 * counted over ROUNDS accepts of each kind, in the same process (the same layout of memory).
 * alarm() is the watchdog; no time is measured. */
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "scenario.h"

#define ROUNDS 200

/* The parent's faults per accepted connection, over `rounds` connections accepted `with_buffer`
 * or without. */
static double parent_faults(int l, const struct sockaddr_in *a, int with_buffer, int rounds) {
    struct rusage r0, r1;
    getrusage(RUSAGE_SELF, &r0);
    for (int i = 0; i < rounds; i++) {
        int k = socket(AF_INET, SOCK_STREAM, 0);
        if (k < 0 || syscall(SYS_connect, k, (const struct sockaddr *)a, sizeof *a) < 0) die("connect");
        struct sockaddr_in peer;
        socklen_t len = sizeof peer;
        int c = with_buffer ? accept(l, (struct sockaddr *)&peer, &len) : accept(l, NULL, NULL);
        if (c < 0) die("accept");
        pid_t p = fork();
        if (p == 0) {
            close(l);
            close(c);
            close(k);
            _exit(0);
        }
        if (p < 0) die("fork");
        close(c);
        close(k);
        if (waitpid(p, NULL, 0) != p) die("waitpid");
    }
    getrusage(RUSAGE_SELF, &r1);
    return (double)(r1.ru_minflt - r0.ru_minflt + r1.ru_majflt - r0.ru_majflt) / rounds;
}

int main(void) {
    alarm(25);
    /* One accelerated connection first (the runner looks for its lines); closed. */
    int k0, c0;
    connected_pair(&k0, &c0, 0);
    char b = 'x', r = 0;
    write_all(k0, &b, 1);
    CHECK(read(c0, &r, 1) == 1 && r == b, "the accelerated connection carries a byte");
    close(k0);
    close(c0);

    struct sockaddr_in a;
    int l = loopback_listener(&a, 16);
    /* Warm: the first accepts and forks fault in what the later ones share. */
    parent_faults(l, &a, 1, 20);
    parent_faults(l, &a, 0, 20);
    double with = parent_faults(l, &a, 1, ROUNDS);
    double without = parent_faults(l, &a, 0, ROUNDS);
    fprintf(stderr, "parent page faults per accept and fork: %.2f with an address buffer, %.2f without\n", with, without);
    CHECK(!shimmed() || without <= with + 0.5, "an accept without an address buffer costs the forking parent no more page faults than one with");
    close(l);
    return failures != 0;
}
