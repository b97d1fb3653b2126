/* A process that changes its credentials while it holds an accelerated connection, the way
 * proftpd's session process does after a login: it keeps capabilities across a change to a user
 * (PR_SET_KEEPCAPS), raises them again in its own thread with capset, then switches its
 * effective user id back and forth (setresuid). glibc applies each set*id call to every thread
 * of the process, and aborts the process when they do not all succeed alike; capabilities and
 * PR_SET_KEEPCAPS are per thread, so a thread the shim runs (started while the process was
 * still root, before the capset) failed where the application's thread succeeded, and the
 * process died of SIGABRT. Here the connection's reader first sleeps in a blocking read (which
 * is what starts the shim's hang-up watcher), then does that sequence, then answers on the
 * connection. Needs root for the credentials part; without it, only the connection is checked.
 * Also passes without the shim. alarm() is the watchdog of both processes. */
#define _GNU_SOURCE
#include <linux/capability.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "scenario.h"

/* Sets this thread's effective and permitted capabilities to CAP_SETUID and CAP_SETGID with
 * the raw system call, as libcap's cap_set_proc does (it goes around libc). */
static int capset_setid(void) {
    struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct d[2] = {{0}};
    d[0].effective = d[0].permitted = (1u << CAP_SETUID) | (1u << CAP_SETGID);
    return (int)syscall(SYS_capset, &h, d);
}

/* The session process: sleeps in a read of the connection until the server writes, then
 * drops to `nobody` keeping its capabilities, raises them, takes root as its effective user
 * again and answers with what that returned. Exits 0 (a death by signal is the failure). */
static void session(struct sockaddr_in *a) {
    int k = socket(AF_INET, SOCK_STREAM, 0);
    char go[2];
    if (k < 0 || connect(k, (struct sockaddr *)a, sizeof *a) < 0) die("connect");
    if (read_full(k, go, 2) < 0) die("read go");
    char answer = 'n';
    if (geteuid() == 0) {
        if (prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0) die("PR_SET_KEEPCAPS");
        if (setresuid(65534, 65534, 65534) != 0) die("setresuid(nobody)");
        if (capset_setid() != 0) die("capset");
        answer = setresuid(-1, 0, -1) == 0 && geteuid() == 0 ? 'y' : 'f';
        if (setresuid(-1, 65534, -1) != 0) answer = 'f';
    }
    write_all(k, &answer, 1);
    char c;
    if (read(k, &c, 1) != 0) answer = 'e';
    close(k);
    exit(answer == 'f' || answer == 'e');
}

int main(void) {
    alarm(20);
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        close(l);
        session(&a);
    }
    int s = accept(l, NULL, NULL);
    if (s < 0) die("accept");
    /* Long enough for the session's read to give up spinning and sleep. */
    usleep(300000);
    write_all(s, "go", 2);
    char answer = 0;
    CHECK(read_full(s, &answer, 1) == 0, "the session answered (it did not die)");
    CHECK(answer == 'y' || (answer == 'n' && geteuid() != 0), "setresuid back to root after capset succeeded");
    close(s);
    int st;
    if (waitpid(pid, &st, 0) != pid) die("waitpid");
    CHECK(!WIFSIGNALED(st), "the session process was not killed by a signal (glibc's set*id abort)");
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the session process exited 0");
    if (WIFSIGNALED(st)) fprintf(stderr, "session killed by signal %d\n", WTERMSIG(st));
    printf("creds_threads: %s\n", failures ? "FAIL" : "ok");
    return failures != 0;
}
