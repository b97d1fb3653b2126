/* A set*id call while another thread sleeps in a read of an accelerated connection: the shim
 * ends its hang-up watcher's thread before each such call (see creds_threads.c) and wakes that
 * reader, which must sleep on, read the peer's bytes when they come, and still see the peer's
 * death (killed, so no end of stream is written: only the hang-up tells) as end of stream.
 * As root the effective ids go to nobody and back; otherwise they are set to what they are,
 * which goes through the same calls. Also passes without the shim. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#include "scenario.h"

static int k;
static char got[8];
static ssize_t first = -2, second = -2;

static void *reader(void *unused) {
    (void)unused;
    first = read(k, got, 5);
    second = read(k, got + 5, 3);
    return NULL;
}

int main(void) {
    alarm(20);
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    pid_t p = fork();
    if (p < 0) die("fork");
    if (p == 0) {
        /* The peer: writes after the set*id calls, then dies without closing. */
        int s = accept(l, NULL, NULL);
        if (s < 0) die("accept");
        usleep(600000);
        write_all(s, "hello", 5);
        usleep(300000);
        kill(getpid(), SIGKILL);
    }
    close(l);
    k = socket(AF_INET, SOCK_STREAM, 0);
    if (k < 0 || connect(k, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    pthread_t t;
    if (pthread_create(&t, NULL, reader, NULL) != 0) die("pthread_create");
    /* Long enough for the reader to give up spinning and sleep (which starts the watcher). */
    usleep(300000);
    uid_t uid = geteuid() == 0 ? 65534 : geteuid();
    gid_t gid = geteuid() == 0 ? 65534 : getegid();
    CHECK(seteuid(uid) == 0 && seteuid(0 == getuid() ? 0 : uid) == 0, "seteuid there and back");
    usleep(100000);
    CHECK(setegid(gid) == 0 && setegid(getgid()) == 0, "setegid there and back");
    pthread_join(t, NULL);
    waitpid(p, NULL, 0);
    CHECK(first == 5 && memcmp(got, "hello", 5) == 0, "the sleeping reader read the peer's bytes");
    CHECK(second == 0, "the peer's death ended the reader's next read (end of stream)");
    printf("creds_sleeper: %s\n", failures ? "FAIL" : "ok");
    return failures != 0;
}
