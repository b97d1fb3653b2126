/* A fork that comes while another thread changes the handover file (an inheritable connection
 * set up or closed: its record added or dropped) leaves the child a usable file: the child's
 * own first change (its close of an inherited inheritable connection) must not wait forever
 * for a lock the other thread held at the fork. One thread turns close-on-exec off and on
 * without pause on an accelerated connection (its record is dropped and added each time); the
 * main thread forks 300 children that each close their copy of another inheritable accelerated
 * connection and exit; then 300 made by a raw clone system call made as a fork, and 300 by a
 * raw fork system call (x86-64). Each child's alarm() and the parent's are the watchdogs: a
 * child killed by its alarm is a hang. Passes without the shim. */
#define _GNU_SOURCE
#include "scenario.h"
#include <pthread.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>

static volatile int done;

static void *churn(void *arg) {
    int k = *(int *)arg;
    while (!done) {
        fcntl(k, F_SETFD, FD_CLOEXEC);
        fcntl(k, F_SETFD, 0);
    }
    return NULL;
}

/* The ways a child is made as a copy of this process: libc's fork, and the raw system calls
 * the shim also runs its fork handlers around (a clone made as a fork; fork itself on x86-64). */
static pid_t by_fork(void) { return fork(); }
static pid_t by_clone(void) { return (pid_t)syscall(SYS_clone, (long)SIGCHLD, 0L, 0L, 0L, 0L); }
#ifdef SYS_fork
static pid_t by_sys_fork(void) { return (pid_t)syscall(SYS_fork); }
#endif

/* 300 children made by `make` beside the churn, each closing its copies and exiting. */
static void forks(pid_t (*make)(void), const char *how, int c0, int k0, int c1, int k1) {
    int hung = 0, failed = 0;
    for (int i = 0; i < 300; i++) {
        pid_t p = make();
        if (p < 0) die(how);
        if (p == 0) {
            alarm(3);
            close(c0);
            close(k0);
            close(c1);
            close(k1);
            _exit(0);
        }
        int st = 0;
        if (waitpid(p, &st, 0) != p) die("waitpid");
        if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM) {
            hung++;
            break; /* one is enough to tell */
        } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) failed++;
    }
    fprintf(stderr, "%s beside the churn: %d children hung in their close, %d failed otherwise\n", how, hung, failed);
    CHECK(hung == 0, "no child hangs in its first change of the handover file");
    CHECK(failed == 0, "every child exits 0");
}

int main(void) {
    alarm(120);
    int k0, c0, k1, c1;
    connected_pair(&k0, &c0, 0);
    connected_pair(&k1, &c1, 0);
    write_all(k0, "x", 1);
    char b = 0;
    CHECK(read(c0, &b, 1) == 1 && b == 'x', "the inherited connection carries a byte");
    int accelerated = segments() > 0;
    pthread_t t;
    if (pthread_create(&t, NULL, churn, &k1) != 0) die("pthread_create");
    forks(by_fork, "fork", c0, k0, c1, k1);
    forks(by_clone, "clone(SIGCHLD)", c0, k0, c1, k1);
#ifdef SYS_fork
    forks(by_sys_fork, "syscall(SYS_fork)", c0, k0, c1, k1);
#endif
    done = 1;
    pthread_join(t, NULL);
    write_all(k0, "y", 1);
    CHECK(read(c0, &b, 1) == 1 && b == 'y', "the parent's connection still carries bytes");
    if (shimmed()) CHECK(accelerated, "the inherited connection was accelerated");
    close(k0);
    close(c0);
    close(k1);
    close(c1);
    if (failures == 0) printf("ok: 300 forks of each kind beside a thread changing the handover file: no child hangs\n");
    return failures != 0;
}
