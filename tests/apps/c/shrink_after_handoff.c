/* A connection whose ring grew (a bulk write ahead of its reader), handed to a spawned program
 * (posix_spawn, the socket inherited) that keeps it, then closed here: this process lets go of
 * its copy only (the peer must see no end while the program holds it), unmapping the segment.
 * The shrinker, which looks every half second at rings that grew, then read the unmapped ring
 * and killed this process (SIGSEGV in its thread). Here the process lives on, and its other end
 * still works. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <pthread.h>
#include <spawn.h>
#include <sys/wait.h>

#include "scenario.h"

extern char **environ;

#define BYTES (1024 * 1024)

static void *read_all(void *arg) {
    static unsigned char got[BYTES];
    if (read_full(*(int *)arg, got, BYTES) != 0) return NULL;
    for (long i = 0; i < BYTES; i++)
        if (got[i] != pattern(i)) return NULL;
    return got;
}

int main(void) {
    alarm(30);
    int k, c;
    connected_pair(&k, &c, 0);
    /* The accepted end writes ahead of its reader: its ring grows, and the shrinker watches it. */
    static unsigned char buf[BYTES];
    for (long i = 0; i < BYTES; i++) buf[i] = pattern(i);
    /* (The reader is a thread: a fork now would make the ring one the shrinker leaves alone.) */
    pthread_t reader;
    if (pthread_create(&reader, NULL, read_all, &k) != 0) die("pthread_create");
    write_all(c, buf, BYTES);
    void *ok;
    pthread_join(reader, &ok);
    CHECK(ok != NULL, "the bulk write arrived");
    int st;
    /* A program that keeps the connection (it inherits it), then our close of our copy. */
    char *argv[] = {"sleep", "4", NULL};
    pid_t keeper;
    CHECK(posix_spawnp(&keeper, "sleep", NULL, NULL, argv, environ) == 0, "the keeper started");
    usleep(300000); /* it has taken the connection over */
    close(c);
    /* Two looks of the shrinker at least (each half a second). */
    usleep(1600000);
    write_all(k, "x", 1);
    CHECK(1, "this process lived through the shrinker's looks");
    kill(keeper, SIGTERM);
    waitpid(keeper, &st, 0);
    close(k);
    if (failures == 0) printf("shrink_after_handoff: ok\n");
    return failures != 0;
}
