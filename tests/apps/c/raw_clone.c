/* A server whose worker is made by a raw `clone` system call that copies the process as `fork`
 * does, past libc's fork handlers (vsftpd makes its session processes with
 * `syscall(__NR_clone, CLONE_NEWIPC | SIGCHLD)`), then by such a clone with
 * `CLONE_PARENT_SETTID`, then by a raw `fork` system call (`syscall(SYS_fork)`, where the
 * architecture has one), and accepts on the listener it inherited,
 * while the master that listens lives on. The worker's connections must be accelerated, as a
 * forked worker's are: it asks the master's offer service for each offer, never taking the
 * copy of the master's service in its memory (whose thread does not run in it) for its own.
 * Run with the shim preloaded (tests/apps/run.sh); also passes without it. alarm() is the
 * watchdog. */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "scenario.h"

enum { CONNS = 4 };

/* The worker: accepts CONNS connections, echoes a ping on each, and keeps them open until the
 * client closes them. Exits 0 if all echoed and, under the shim, are on shared memory. */
static int worker(int l) {
    int c[CONNS], before = segments(), bad = 0;
    for (int i = 0; i < CONNS; i++) {
        c[i] = accept(l, NULL, NULL);
        char b[4];
        if (c[i] < 0 || read_full(c[i], b, 4) != 0) return 2;
        write_all(c[i], b, 4);
    }
    if (shimmed() && segments() != before + CONNS) bad |= 4;
    for (int i = 0; i < CONNS; i++) {
        char b;
        if (read(c[i], &b, 1) != 0) bad |= 8;
        close(c[i]);
    }
    return bad;
}

/* The client: CONNS connections to `a` open at once, each pinged. Exits 0 if all echoed and,
 * under the shim, are on shared memory. */
static int client(struct sockaddr_in *a) {
    int c[CONNS], before = segments(), bad = 0;
    for (int i = 0; i < CONNS; i++) {
        c[i] = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(c[i], (struct sockaddr *)a, sizeof *a) < 0) return 2;
        write_all(c[i], "ping", 4);
        char b[4];
        if (read_full(c[i], b, 4) != 0 || memcmp(b, "ping", 4) != 0) bad |= 4;
    }
    if (shimmed() && segments() != before + CONNS) bad |= 8;
    for (int i = 0; i < CONNS; i++) close(c[i]);
    return bad;
}

static void reaped(pid_t pid, const char *who) {
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st), who);
    if (WEXITSTATUS(st) != 0) fprintf(stderr, "FAIL %s: exit status %d\n", who, WEXITSTATUS(st));
    failures += WEXITSTATUS(st) != 0;
}

/* One master with its worker made by `raw_fork` (a raw system call that copies the process as
 * fork does) and a forked client, all reaped. */
static void scenario(long (*raw_fork)(void)) {
    struct sockaddr_in a;
    int l = loopback_listener(&a, 16);
    long w = raw_fork();
    if (w < 0) die("raw fork");
    if (w == 0) _exit(worker(l));
    pid_t k = fork();
    if (k < 0) die("fork");
    if (k == 0) {
        close(l);
        _exit(client(&a));
    }
    reaped(k, "the client's connections echoed (on shared memory under the shim)");
    reaped((pid_t)w, "the raw fork worker's connections echoed (on shared memory under the shim)");
    close(l);
}

static long by_clone(void) { return syscall(SYS_clone, (long)SIGCHLD, 0L, 0L, 0L, 0L); }
/* A clone made as a fork with a flag fork cannot give: the shim runs its work and colo's fork
 * handlers around the system call itself. */
static pid_t clone_tid;
static long by_clone_settid(void) { return syscall(SYS_clone, (long)(CLONE_PARENT_SETTID | SIGCHLD), 0L, &clone_tid, 0L, 0L); }
#ifdef SYS_fork
static long by_fork(void) { return syscall(SYS_fork); }
#endif

int main(void) {
    alarm(30);
    signal(SIGPIPE, SIG_IGN);
    scenario(by_clone);
    scenario(by_clone_settid);
#ifdef SYS_fork
    scenario(by_fork);
#endif
    return failures != 0;
}
