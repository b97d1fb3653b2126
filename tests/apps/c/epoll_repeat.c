/* A level-triggered EPOLL_CTL_MOD to what a registration already is, as ae-style event loops
 * (redis, wrk) make, is answered by the shim without the kernel. Everything the kernel would do
 * differently must still reach it: a changed registration, a one-shot or edge-triggered re-arm,
 * a change by another thread, through a duplicate of the set or by a forked child sharing it, a
 * set made again at the same number, a descriptor replaced by dup2 or closed past libc's close.
 * Plain descriptors (socket pairs): the shim's business
 * here is only the registrations. Runs with and without the shim; alarm() is the watchdog.
 * `epoll_repeat count N`: one registration modified N times to itself (run.sh counts the
 * system calls under strace). */
#include <errno.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "scenario.h"

static int sv[2];

/* Registers (op) sv[0] in ep with events, data = its own fd (as ae does). */
static int ctl(int ep, int op, unsigned events) {
    struct epoll_event e = {.events = events, .data.u64 = (unsigned)sv[0]};
    return epoll_ctl(ep, op, sv[0], &e);
}

/* Events ready in ep now (0 if none), or -1. */
static int ready_now(int ep, unsigned *events) {
    struct epoll_event e[4];
    int n = epoll_wait(ep, e, 4, 0);
    *events = n > 0 ? e[0].events : 0;
    return n;
}

static void *other_thread(void *ep) {
    CHECK(ctl(*(int *)ep, EPOLL_CTL_MOD, EPOLLIN | EPOLLOUT) == 0, "another thread's MOD to IN|OUT");
    return NULL;
}

int main(int argc, char **argv) {
    alarm(20);
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0) die("socketpair");
    int ep = epoll_create(16);
    if (ep < 0) die("epoll_create");
    unsigned ev;
    char b[8];

    if (argc == 3 && strcmp(argv[1], "count") == 0) {
        CHECK(ctl(ep, EPOLL_CTL_ADD, EPOLLIN) == 0, "ADD");
        for (int i = atoi(argv[2]); i > 0; i--) CHECK(ctl(ep, EPOLL_CTL_MOD, EPOLLIN) == 0, "MOD to itself");
        return failures ? 1 : 0;
    }

    /* Level-triggered: repeats change nothing; reports stay right. */
    CHECK(ctl(ep, EPOLL_CTL_ADD, EPOLLIN) == 0, "ADD IN");
    CHECK(ready_now(ep, &ev) == 0, "nothing ready yet");
    for (int i = 0; i < 3; i++) CHECK(ctl(ep, EPOLL_CTL_MOD, EPOLLIN) == 0, "MOD IN to itself");
    CHECK(write(sv[1], "x", 1) == 1, "peer writes");
    CHECK(ready_now(ep, &ev) == 1 && ev == EPOLLIN, "readable once the peer wrote");
    CHECK(ctl(ep, EPOLL_CTL_MOD, EPOLLIN) == 0, "MOD IN to itself while readable");
    CHECK(ready_now(ep, &ev) == 1 && ev == EPOLLIN, "still readable (level-triggered)");
    CHECK(read(sv[0], b, sizeof b) == 1, "read");
    CHECK(ready_now(ep, &ev) == 0, "nothing ready after the read");

    /* A change reaches the kernel, and so does the change back. */
    CHECK(ctl(ep, EPOLL_CTL_MOD, EPOLLIN | EPOLLOUT) == 0, "MOD to IN|OUT");
    CHECK(ready_now(ep, &ev) == 1 && ev == EPOLLOUT, "writable reported");
    CHECK(ctl(ep, EPOLL_CTL_MOD, EPOLLIN | EPOLLOUT) == 0, "MOD IN|OUT to itself");
    CHECK(ctl(ep, EPOLL_CTL_MOD, EPOLLIN) == 0, "MOD back to IN");
    CHECK(ready_now(ep, &ev) == 0, "writable no longer reported");

    /* Another thread changes the registration; this thread's MOD to IN must take effect. */
    int ep3 = epoll_create1(EPOLL_CLOEXEC);
    CHECK(ctl(ep3, EPOLL_CTL_ADD, EPOLLIN) == 0, "ADD IN (set for two threads)");
    CHECK(ctl(ep3, EPOLL_CTL_MOD, EPOLLIN) == 0, "MOD IN to itself (set for two threads)");
    pthread_t t;
    pthread_create(&t, NULL, other_thread, &ep3);
    pthread_join(t, NULL);
    CHECK(ready_now(ep3, &ev) == 1 && ev == EPOLLOUT, "the other thread's IN|OUT reported");
    CHECK(ctl(ep3, EPOLL_CTL_MOD, EPOLLIN) == 0, "MOD back to IN after the other thread's");
    CHECK(ready_now(ep3, &ev) == 0, "writable no longer reported after the other thread's change");
    close(ep3);

    /* One-shot and edge-triggered: a MOD to the same re-arms. */
    CHECK(ctl(ep, EPOLL_CTL_MOD, EPOLLIN | EPOLLONESHOT) == 0, "MOD to IN|ONESHOT");
    CHECK(write(sv[1], "y", 1) == 1, "peer writes again");
    CHECK(ready_now(ep, &ev) == 1 && ev == EPOLLIN, "one-shot reported");
    CHECK(ready_now(ep, &ev) == 0, "one-shot disarmed");
    CHECK(ctl(ep, EPOLL_CTL_MOD, EPOLLIN | EPOLLONESHOT) == 0, "MOD to the same one-shot");
    CHECK(ready_now(ep, &ev) == 1 && ev == EPOLLIN, "one-shot re-armed");
    CHECK(ctl(ep, EPOLL_CTL_MOD, EPOLLIN | EPOLLET) == 0, "MOD to IN|ET");
    CHECK(ready_now(ep, &ev) == 1 && ev == EPOLLIN, "edge reported");
    CHECK(ready_now(ep, &ev) == 0, "edge reported once");
    CHECK(ctl(ep, EPOLL_CTL_MOD, EPOLLIN | EPOLLET) == 0, "MOD to the same edge");
    CHECK(ready_now(ep, &ev) == 1 && ev == EPOLLIN, "edge re-armed");
    CHECK(read(sv[0], b, sizeof b) == 1, "read again");

    /* A set made again at the same number has none of the old set's registrations (libev's
     * child modifies each fd and adds it on ENOENT). A set made after the fork: the shim
     * remembers nothing in one made before it. */
    int old = epoll_create1(0);
    CHECK(ctl(old, EPOLL_CTL_ADD, EPOLLIN) == 0, "ADD IN (set to be made again)");
    CHECK(ctl(old, EPOLL_CTL_MOD, EPOLLIN) == 0, "MOD IN to itself (set to be made again)");
    close(old);
    int again = epoll_create1(0);
    CHECK(again == old, "the new set takes the old number");
    errno = 0;
    CHECK(ctl(again, EPOLL_CTL_MOD, EPOLLIN) == -1 && errno == ENOENT, "MOD in the new set: ENOENT");
    CHECK(ctl(again, EPOLL_CTL_ADD, EPOLLIN) == 0, "ADD in the new set");

    /* A descriptor replaced by dup2 is not the registered one. */
    int spare[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, spare) < 0) die("socketpair");
    int keep = dup(sv[0]); /* the registered socket stays open: its registration stays too */
    CHECK(ctl(again, EPOLL_CTL_MOD, EPOLLIN) == 0, "MOD IN to itself before dup2");
    CHECK(dup2(spare[0], sv[0]) == sv[0], "dup2 onto the registered number");
    errno = 0;
    CHECK(ctl(again, EPOLL_CTL_MOD, EPOLLIN) == -1 && errno == ENOENT, "MOD of the replaced descriptor: ENOENT");
    close(keep);

    /* A change through a duplicate of the set; the MOD back through the original must take
     * effect. */
    int ep5 = epoll_create1(EPOLL_CLOEXEC);
    CHECK(ctl(ep5, EPOLL_CTL_ADD, EPOLLIN) == 0, "ADD IN (set to duplicate)");
    CHECK(ctl(ep5, EPOLL_CTL_MOD, EPOLLIN) == 0, "MOD IN to itself (set to duplicate)");
    int ep5dup = dup(ep5);
    CHECK(ctl(ep5dup, EPOLL_CTL_MOD, EPOLLIN | EPOLLOUT) == 0, "MOD to IN|OUT through the duplicate");
    CHECK(ctl(ep5, EPOLL_CTL_MOD, EPOLLIN) == 0, "MOD back to IN through the original");
    CHECK(ready_now(ep5, &ev) == 0, "writable no longer reported after the duplicate's change");
    close(ep5dup);
    close(ep5);

    /* A descriptor closed past libc's close (syscall(SYS_close)) and its number taken by a new
     * socket pair: the new one is not registered. */
    int gone[2], fresh[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, gone) < 0) die("socketpair");
    struct epoll_event ge = {.events = EPOLLIN, .data.u64 = (unsigned)gone[0]};
    CHECK(epoll_ctl(again, EPOLL_CTL_ADD, gone[0], &ge) == 0, "ADD (to be closed past libc)");
    CHECK(epoll_ctl(again, EPOLL_CTL_MOD, gone[0], &ge) == 0, "MOD to itself (to be closed past libc)");
    syscall(SYS_close, gone[0]);
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fresh) < 0) die("socketpair");
    CHECK(fresh[0] == gone[0], "the new socket takes the closed number");
    errno = 0;
    CHECK(epoll_ctl(again, EPOLL_CTL_MOD, fresh[0], &ge) == -1 && errno == ENOENT, "MOD of the new socket: ENOENT");

    /* A forked child changes the shared set; the parent's MOD to IN must take effect. */
    int ep2 = epoll_create1(EPOLL_CLOEXEC);
    CHECK(ctl(ep2, EPOLL_CTL_ADD, EPOLLIN) == 0, "ADD IN (set for the fork)");
    CHECK(ctl(ep2, EPOLL_CTL_MOD, EPOLLIN) == 0, "MOD IN to itself (set for the fork)");
    pid_t pid = fork();
    if (pid == 0) _exit(ctl(ep2, EPOLL_CTL_MOD, EPOLLIN | EPOLLOUT) == 0 ? 0 : 1);
    int status = -1;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0, "child's MOD");
    CHECK(ready_now(ep2, &ev) == 1 && ev == EPOLLOUT, "the child's IN|OUT reported in the parent");
    CHECK(ctl(ep2, EPOLL_CTL_MOD, EPOLLIN) == 0, "parent's MOD back to IN");
    CHECK(ready_now(ep2, &ev) == 0, "writable no longer reported after the child's change");
    close(ep2);

    if (failures == 0) printf("epoll_repeat: ok\n");
    return failures ? 1 : 0;
}
