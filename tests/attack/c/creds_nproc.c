/* A reader asleep on an accelerated connection while its process drops privileges for good and
 * cannot start a thread afterwards (RLIMIT_NPROC reached by the new uid: another user with the
 * same uid, nobody here, can hold that many processes): the peer's death must still end the
 * read. The shim ends its hang-up watcher's thread around each set*id call and starts another
 * after it; when that start fails, a sleeper must not go back to a futex sleep only the watcher
 * could end. Run as root under the shim by t_rt_creds_nproc.sh; alarm() is the watchdog. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include "../../apps/c/scenario.h"

static int k;
static ssize_t got = -2;

static void *reader(void *unused) {
    (void)unused;
    char b[8];
    got = read(k, b, sizeof b);
    return NULL;
}

int main(void) {
    alarm(15);
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    pid_t p = fork();
    if (p < 0) die("fork");
    if (p == 0) {
        /* The peer: accepts, and dies without a byte or a close once the privileges dropped. */
        int s = accept(l, NULL, NULL);
        if (s < 0) die("accept");
        usleep(800000);
        kill(getpid(), SIGKILL);
    }
    close(l);
    k = socket(AF_INET, SOCK_STREAM, 0);
    if (k < 0 || connect(k, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    pthread_t t;
    if (pthread_create(&t, NULL, reader, NULL) != 0) die("pthread_create");
    /* Long enough for the reader to give up spinning and sleep (which starts the watcher). */
    usleep(300000);
    struct rlimit none = {0, 0};
    CHECK(setrlimit(RLIMIT_NPROC, &none) == 0, "RLIMIT_NPROC 0");
    CHECK(setresgid(65534, 65534, 65534) == 0 && setresuid(65534, 65534, 65534) == 0, "privileges dropped to nobody");
    pthread_t u;
    int e = pthread_create(&u, NULL, reader, NULL);
    CHECK(e != 0, "no thread can start any more");
    pthread_join(t, NULL);
    waitpid(p, NULL, 0);
    CHECK(got == 0, "the peer's death ended the sleeping read (end of stream)");
    printf("creds_nproc: %s\n", failures ? "FAIL" : "ok");
    return failures != 0;
}
