/* A server that daemonizes after listen (run with the shim preloaded, as tests/apps/run.sh does;
 * also passes without it): the process that listened forks the daemon and exits at once; the
 * daemon forks two workers that accept (nginx's default). Connections must still be quick (no
 * carrier timeout spent waiting for the gone process to answer) and, under the shim,
 * accelerated. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "scenario.h"

int main(void) {
    alarm(30);
    /* Many short connections in a row: the shim may send such a destination over TCP on
     * purpose (COLO_SHORT_LIVED); this test counts accelerated connections, so opt out. */
    setenv("COLO_SHORT_LIVED", "accelerate", 1);
    int pp[2];
    if (pipe(pp) < 0) die("pipe");
    pid_t a = fork();
    if (a == 0) {
        /* The process that listens, then daemonizes. */
        close(pp[0]);
        int l = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof sa;
        if (bind(l, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(l, 64) < 0) die("listen");
        getsockname(l, (struct sockaddr *)&sa, &len);
        int port = ntohs(sa.sin_port);
        if (fork() != 0) _exit(0); /* the parent leaves at once */
        setsid();
        alarm(30); /* watchdog of the daemon and its workers (fork clears it: set again below) */
        usleep(100000); /* make sure the parent is gone before the workers start */
        int pids[4] = {port, (int)getpid(), 0, 0};
        for (int i = 0; i < 2; i++) {
            pid_t w = fork();
            if (w == 0) {
                alarm(30);
                close(pp[1]);
                pong_worker(l);
            }
            pids[2 + i] = w;
        }
        write_all(pp[1], pids, sizeof pids);
        close(pp[1]);
        for (;;) pause();
    }
    close(pp[1]);
    int st;
    CHECK(waitpid(a, &st, 0) == a && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the listening process exited");
    int info[4];
    if (read(pp[0], info, sizeof info) != sizeof info) die("daemon info");
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(info[0]), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    double slowest = 0;
    int accelerated = 0, seen[2] = {0, 0};
    for (int i = 0; i < 20; i++) {
        double t0 = now();
        int c = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(c, (struct sockaddr *)&sa, sizeof sa) < 0) die("connect");
        write_all(c, "ping", 4);
        char buf[32] = {0};
        ssize_t n = read(c, buf, sizeof buf - 1);
        double dt = now() - t0;
        if (dt > slowest) slowest = dt;
        CHECK(n > 5 && strncmp(buf, "pong ", 5) == 0, "answer");
        int who = atoi(buf + 5);
        for (int k = 0; k < 2; k++)
            if (who == info[2 + k]) seen[k] = 1;
        if (segments() > 0) accelerated++;
        close(c);
    }
    for (int k = 1; k < 4; k++) kill(info[k], SIGKILL);
    /* A connection the daemon's workers did not take in time would have fallen back to TCP after
     * the carrier timeout: "every connection accelerated" is the check (slowest is reported). */
    if (shimmed()) CHECK(accelerated == 20, "every connection accelerated");
    if (failures == 0)
        printf("ok: daemonized server (listener's process gone, 2 workers): 20 connections, slowest %.1f ms%s%s\n",
               slowest * 1000, shimmed() ? ", accelerated" : "", seen[0] && seen[1] ? ", both workers" : "");
    else
        fprintf(stderr, "slowest %.3f s, %d accelerated\n", slowest, accelerated);
    return failures != 0;
}
