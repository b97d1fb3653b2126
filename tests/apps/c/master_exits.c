/* Workers whose master exits (run with the shim preloaded, as tests/apps/run.sh does; also
 * passes without it): the process that listens forks two workers that accept, then exits
 * without forking again (so no process takes its offer service over before a fork). The first
 * worker to need an offer takes the service over (the lineage's owner word decides which), the
 * other asks it. Then the worker that serves is killed, and the one left must take the service
 * over in turn. Every connection must be answered and, under the shim, accelerated (a client
 * that spent its carrier timeout would have gone on over TCP). alarm() is the watchdog. */
#define _GNU_SOURCE
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "scenario.h"

/* Whether process `pid` runs the shim's offer service thread. */
static int serves(int pid) {
    char path[320], comm[32];
    snprintf(path, sizeof path, "/proc/%d/task", pid);
    DIR *d = opendir(path);
    struct dirent *e;
    int found = 0;
    while (d && (e = readdir(d))) {
        snprintf(path, sizeof path, "/proc/%d/task/%s/comm", pid, e->d_name);
        FILE *f = fopen(path, "r");
        if (f && fgets(comm, sizeof comm, f) && strncmp(comm, "colo-offers", 11) == 0) found = 1;
        if (f) fclose(f);
    }
    if (d) closedir(d);
    return found;
}

/* `n` connections to `sa`: each must be answered "pong <pid>" quickly; counts accelerated ones. */
static int round_of(struct sockaddr_in *sa, int n, double *slowest) {
    int accelerated = 0;
    for (int i = 0; i < n; i++) {
        double t0 = now();
        int c = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(c, (struct sockaddr *)sa, sizeof *sa) < 0) die("connect");
        write_all(c, "ping", 4);
        char buf[32] = {0};
        ssize_t got = read(c, buf, sizeof buf - 1);
        double dt = now() - t0;
        if (dt > *slowest) *slowest = dt;
        CHECK(got > 5 && strncmp(buf, "pong ", 5) == 0, "answer");
        if (segments() > 0) accelerated++;
        close(c);
    }
    return accelerated;
}

int main(void) {
    alarm(30);
    /* Many short connections in a row: the shim may send such a destination over TCP on
     * purpose (COLO_SHORT_LIVED); this test counts accelerated connections, so opt out. */
    setenv("COLO_SHORT_LIVED", "accelerate", 1);
    int pp[2];
    if (pipe(pp) < 0) die("pipe");
    pid_t m = fork();
    if (m == 0) {
        /* The master: listens, forks the workers, exits. */
        close(pp[0]);
        struct sockaddr_in sa;
        int l = loopback_listener(&sa, 64);
        int info[3] = {ntohs(sa.sin_port), 0, 0};
        for (int i = 0; i < 2; i++) {
            pid_t w = fork();
            if (w == 0) {
                alarm(30);
                close(pp[1]);
                pong_worker(l);
            }
            info[1 + i] = w;
        }
        write_all(pp[1], info, sizeof info);
        _exit(0);
    }
    close(pp[1]);
    int st, info[3];
    CHECK(waitpid(m, &st, 0) == m && WIFEXITED(st), "the master exited");
    if (read(pp[0], info, sizeof info) != sizeof info) die("worker info");
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(info[0]), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    double slowest = 0;
    int accelerated = round_of(&sa, 10, &slowest);
    int server = serves(info[1]) ? 1 : serves(info[2]) ? 2 : 0;
    if (shimmed()) CHECK(server != 0 && !(serves(info[1]) && serves(info[2])), "exactly one worker took the service over");
    /* Kill the worker that serves (or the first): the other must take over, or keep serving. */
    int victim = server ? server : 1;
    kill(info[victim], SIGKILL);
    usleep(50000);
    accelerated += round_of(&sa, 10, &slowest);
    int left = 3 - victim;
    if (shimmed()) CHECK(serves(info[left]), "the worker left took the service over");
    kill(info[left], SIGKILL);
    if (shimmed()) CHECK(accelerated == 20, "every connection accelerated");
    if (failures == 0)
        printf("ok: master gone before its workers accept: 20 connections, slowest %.1f ms%s\n", slowest * 1000,
               shimmed() ? ", accelerated, the service taken over twice" : "");
    else
        fprintf(stderr, "slowest %.3f s, %d accelerated\n", slowest, accelerated);
    return failures != 0;
}
