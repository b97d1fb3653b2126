/* What a fork costs a process under the shim, in page faults. Each page a process writes after
 * a fork costs it a copy-on-write fault (the parent's as the child's), and each page of code the
 * child runs a fault too: a server that forks per connection (postgres, inetd-style and Perl
 * servers) pays them per connection. The shim's fork handlers keep what they write on one page
 * (the linker section colo_fork) and run little code. Here FORKS children that exit at once are
 * forked while a listener is open, after an accelerated connection, and the faults of this
 * process and of its children are counted (getrusage), against the same loop in this program run
 * again without the shim: at most EXTRA more faults per fork (the shim's threads cost a few of
 * them: the child's fork writes each thread's descriptor, the allocator's handlers each arena).
 * Both runs use malloc from two threads first (the shim does, as any real server; the
 * allocator's own fork handlers then write its arenas). alarm() is the watchdog; no time is
 * measured. */
#include <pthread.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include "scenario.h"

#define FORKS 200
#define EXTRA 24

static void *allocate(void *arg) {
    free(malloc(64));
    return arg;
}

/* Faults per fork (this process's and its children's) over FORKS forks. */
static double faults_per_fork(void) {
    pthread_t t;
    free(malloc(64));
    if (pthread_create(&t, NULL, allocate, NULL) != 0 || pthread_join(t, NULL) != 0) die("thread");
    for (int i = 0; i < 20; i++) { /* warm: the first forks fault in what later ones share */
        pid_t p = fork();
        if (p == 0) _exit(0);
        if (p < 0 || waitpid(p, NULL, 0) != p) die("fork");
    }
    struct rusage s0, c0, s1, c1;
    getrusage(RUSAGE_SELF, &s0);
    getrusage(RUSAGE_CHILDREN, &c0);
    for (int i = 0; i < FORKS; i++) {
        pid_t p = fork();
        if (p == 0) _exit(0);
        if (p < 0 || waitpid(p, NULL, 0) != p) die("fork");
    }
    getrusage(RUSAGE_SELF, &s1);
    getrusage(RUSAGE_CHILDREN, &c1);
    return (double)(s1.ru_minflt - s0.ru_minflt + s1.ru_majflt - s0.ru_majflt + c1.ru_minflt - c0.ru_minflt + c1.ru_majflt - c0.ru_majflt) / FORKS;
}

int main(int argc, char **argv) {
    alarm(25);
    if (argc == 2 && strcmp(argv[1], "plain") == 0) {
        printf("%.2f\n", faults_per_fork());
        return 0;
    }
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    int k = socket(AF_INET, SOCK_STREAM, 0);
    if (k < 0 || connect(k, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    int c = accept(l, NULL, NULL);
    char b = 'x', r = 0;
    if (c < 0) die("accept");
    write_all(k, &b, 1);
    CHECK(read(c, &r, 1) == 1 && r == b, "the connection carries a byte");
    /* Closed first: a fork with an inheritable connection open also copies the handover file
     * (service::handover), a cost of its own. */
    close(k);
    close(c);
    double shim = faults_per_fork();
    /* The same loop without the shim: this program again, LD_PRELOAD left out. */
    int p[2];
    if (pipe(p) < 0) die("pipe");
    pid_t plain = fork();
    if (plain == 0) {
        char *env[] = {NULL};
        dup2(p[1], 1);
        execve("/proc/self/exe", (char *[]){argv[0], "plain", NULL}, env);
        _exit(127);
    }
    close(p[1]);
    char out[64] = {0};
    ssize_t n = read(p[0], out, sizeof out - 1);
    int st = 1;
    if (waitpid(plain, &st, 0) != plain || !WIFEXITED(st) || WEXITSTATUS(st) != 0 || n <= 0) die("the plain run");
    double base = atof(out);
    fprintf(stderr, "page faults per fork: %.2f under the shim, %.2f without\n", shim, base);
    CHECK(!shimmed() || shim <= base + EXTRA, "a fork under the shim costs at most EXTRA more page faults than without");
    close(l);
    return failures != 0;
}
