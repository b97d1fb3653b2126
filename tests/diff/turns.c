/* Blocking calls beside a fork child blocked in the same kind of call on the same connection
 * (under colo the child holds the readers' or the writers' turn): SO_RCVTIMEO / SO_SNDTIMEO end
 * them with EAGAIN, a handler without SA_RESTART with EINTR, and one with SA_RESTART too when a
 * timeout is set (signal(7)). A write may instead end with a partial count (kernel TCP lets it in
 * while the child waits for room): the transcript says only that it ended early. And one
 * timeout covers a whole call, as in the kernel: a MSG_WAITALL read under SO_RCVTIMEO while bytes
 * trickle in more often than the timeout returns what came within it. */
#include "diff.h"
#include <pthread.h>

static void on_usr1(int sig) { (void)sig; }

static void handler(int flags) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
}

static void timeout(int fd, int name, long ms) {
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    if (setsockopt(fd, SOL_SOCKET, name, &tv, sizeof tv) < 0) die("setsockopt");
}

static pthread_t main_thread;
static volatile int kicking;

/* SIGUSR1 to the main thread every 200 ms while `kicking` (again and again: a signal that lands
 * before the main thread is inside its call would be no test). */
static void *kicker(void *arg) {
    (void)arg;
    while (kicking) {
        settle(200);
        if (kicking) pthread_kill(main_thread, SIGUSR1);
    }
    return NULL;
}

/* `call` with SIGUSR1 sent to this thread until it returns. */
#define KICKED(call)                                                            \
    ({                                                                          \
        pthread_t t_;                                                           \
        kicking = 1;                                                            \
        main_thread = pthread_self();                                           \
        if (pthread_create(&t_, NULL, kicker, NULL) != 0) die("pthread_create"); \
        errno = 0;                                                              \
        long r_ = (long)(call);                                                 \
        int e_ = errno;                                                         \
        kicking = 0;                                                            \
        pthread_join(t_, NULL);                                                 \
        errno = e_;                                                             \
        r_;                                                                     \
    })

/* A fork child that runs `f(fd)` (blocking) with its own watchdog; the peer end `other` closed
 * there, so the child's call ends when this process does. Returns once the child is about to
 * call, and has had time to block. */
static pid_t blocked_child(int fd, int other, void (*f)(int)) {
    int p[2];
    if (pipe(p) < 0) die("pipe");
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        alarm(20);
        close(other);
        if (write(p[1], "b", 1) != 1) _exit(2);
        f(fd);
        _exit(0);
    }
    char x;
    if (read(p[0], &x, 1) != 1) die("child");
    close(p[0]);
    close(p[1]);
    settle(200);
    return pid;
}

static void child_reads(int fd) {
    char b[16];
    if (read(fd, b, sizeof b) < 0) _exit(3);
}

/* More than either transport holds for one direction. */
static char big[64 << 20];

static void child_writes(int fd) {
    if (write(fd, big, sizeof big) < 0) _exit(3);
}

static void read_beside_a_blocked_reader(void) {
    int s, c;
    char b[16];
    pair(&s, &c);
    pid_t pid = blocked_child(c, s, child_reads);
    timeout(c, SO_RCVTIMEO, 300);
    T("read with SO_RCVTIMEO 0.3 s", read(c, b, sizeof b));
    timeout(c, SO_RCVTIMEO, 0);
    handler(0);
    T("read, a handler without SA_RESTART", KICKED(read(c, b, sizeof b)));
    timeout(c, SO_RCVTIMEO, 3000);
    handler(SA_RESTART);
    T("read with SO_RCVTIMEO 3 s, a handler with SA_RESTART", KICKED(read(c, b, sizeof b)));
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* What a write of `big` answered: a partial count is kernel TCP's answer for `partial` (EAGAIN,
 * EINTR) once it took some bytes, so both read the same. */
static void wrote(const char *what, long r, int e, int partial) {
    if (r > 0 && r < (long)sizeof big) e = partial, r = -1;
    if (r < 0) say("  %s = -1 %s (or a partial count)", what, ename(e));
    else say("  %s = %ld", what, r);
}

static void write_beside_a_blocked_writer(void) {
    int s, c;
    long r;
    pair(&s, &c);
    pid_t pid = blocked_child(c, s, child_writes);
    timeout(c, SO_SNDTIMEO, 300);
    errno = 0;
    r = write(c, big, sizeof big);
    wrote("write with SO_SNDTIMEO 0.3 s", r, errno, EAGAIN);
    timeout(c, SO_SNDTIMEO, 0);
    handler(0);
    r = KICKED(write(c, big, sizeof big));
    wrote("write, a handler without SA_RESTART", r, errno, EINTR);
    timeout(c, SO_SNDTIMEO, 3000);
    handler(SA_RESTART);
    r = KICKED(write(c, big, sizeof big));
    wrote("write with SO_SNDTIMEO 3 s, a handler with SA_RESTART", r, errno, EINTR);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static int trickle_fd;

/* One byte every 200 ms, five in all. */
static void *trickle(void *arg) {
    (void)arg;
    for (int i = 0; i < 5; i++) {
        settle(200);
        if (write(trickle_fd, "t", 1) != 1) break;
    }
    return NULL;
}

static void waitall_under_one_timeout(void) {
    int s, c;
    char b[16];
    pair(&s, &c);
    trickle_fd = s;
    pthread_t t;
    if (pthread_create(&t, NULL, trickle, NULL) != 0) die("pthread_create");
    timeout(c, SO_RCVTIMEO, 500);
    long r = recv(c, b, 5, MSG_WAITALL);
    say("  recv(5, MSG_WAITALL) with SO_RCVTIMEO 0.5 s, a byte every 0.2 s: %s", r > 0 && r < 5 ? "the bytes of the first 0.5 s" : r == 5 ? "all 5" : "none");
    pthread_join(t, NULL);
}

int main(void) {
    diff_begin();
    RUN(waitall_under_one_timeout);
    RUN(read_beside_a_blocked_reader);
    RUN(write_beside_a_blocked_writer);
    diff_end();
    return 0;
}
