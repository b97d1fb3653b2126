/* Signal-driven I/O on a connection (`F_SETOWN` and `O_ASYNC`): the kernel sends SIGIO (or the
 * `F_SETSIG` signal) when bytes arrive. Bytes on the rings reach no kernel socket, so the shim
 * relays such a connection over loopback TCP from then on (as one passed to another process),
 * whose socket signals: a reader that found nothing and sleeps until its signal is woken by the
 * peer's bytes, and gets every byte in order; then again with FIOASYNC, whose `int *` the shim
 * reads as the kernel does (one it cannot read: EFAULT). Run with the shim preloaded
 * (tests/apps/run.sh); also passes without it. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/wait.h>

#include "scenario.h"

enum { ROUNDS = 20 };
static volatile sig_atomic_t got;
static void on_signal(int s) {
    (void)s;
    got++;
}

static void fill(char *b, size_t n, int round) {
    for (size_t i = 0; i < n; i++) b[i] = (char)(i * 7 + round);
}

/* One connection made signal-driven by F_SETFL (`by_ioctl` 0) or by FIOASYNC (1), read in
 * ROUNDS rounds while `during` (SIGIO and SIGRTMIN + 1 unblocked) is the mask in sigsuspend. */
static void session(int by_ioctl, sigset_t *during) {
    int k, c, go[2];
    connected_pair(&k, &c, 0);
    if (pipe(go) < 0) die("pipe");
    static char b[64 * 1024], want[sizeof b];
    pid_t w = fork();
    if (w < 0) die("fork");
    if (w == 0) {
        /* The peer: writes each round's bytes when told to. */
        close(c);
        close(go[1]);
        for (int round = 0; round < ROUNDS; round++) {
            char cmd;
            if (read_full(go[0], &cmd, 1) != 0) _exit(2);
            fill(b, 1 + (size_t)round * 3000, round);
            write_all(k, b, 1 + (size_t)round * 3000);
        }
        _exit(0);
    }
    close(k);
    close(go[0]);
    CHECK(fcntl(c, F_SETOWN, getpid()) == 0, "F_SETOWN");
    if (by_ioctl) {
        int on = 1;
        errno = 0;
        CHECK(ioctl(c, FIOASYNC, (int *)8) == -1 && errno == EFAULT, "FIOASYNC with an address it cannot read: EFAULT");
        CHECK(ioctl(c, FIOASYNC, &on) == 0 && fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_NONBLOCK) == 0, "FIOASYNC");
    } else {
        CHECK(fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_ASYNC | O_NONBLOCK) == 0, "F_SETFL O_ASYNC");
    }
    CHECK(fcntl(c, F_GETFL) & O_ASYNC, "F_GETFL says O_ASYNC");
    for (int round = 0; round < ROUNDS; round++) {
        if (round == ROUNDS / 2) CHECK(fcntl(c, F_SETSIG, SIGRTMIN + 1) == 0, "F_SETSIG");
        size_t n = 1 + (size_t)round * 3000, have = 0;
        int told = 0, ok = 1;
        while (have < n) {
            int seen = got;
            ssize_t r = read(c, b + have, n - have);
            if (r > 0) {
                have += (size_t)r;
            } else if (r < 0 && errno == EAGAIN) {
                if (!told) write_all(go[1], "w", 1);
                told = 1;
                /* Asleep until a signal: only the kernel's for the peer's bytes can come. */
                while (got == seen) sigsuspend(during);
            } else {
                ok = 0;
                break;
            }
        }
        fill(want, n, round);
        CHECK(ok && told && memcmp(b, want, n) == 0, "woken by the signal for the peer's bytes, every byte in order");
    }
    int st;
    CHECK(waitpid(w, &st, 0) == w && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the writer exited 0");
    close(c);
    close(go[1]);
}

int main(void) {
    alarm(20);
    signal(SIGPIPE, SIG_IGN);
    sigset_t block, during;
    sigemptyset(&block);
    sigaddset(&block, SIGIO);
    sigaddset(&block, SIGRTMIN + 1);
    sigprocmask(SIG_BLOCK, &block, &during);
    signal(SIGIO, on_signal);
    signal(SIGRTMIN + 1, on_signal);
    session(0, &during);
    session(1, &during);
    return failures != 0;
}
