/* One arrival, one edge-triggered report: a peer thread echoes each byte the reader sends, and
 * the reader's EPOLLET set must report the echo once, whether the reader polls the set
 * (timeout 0) or sleeps on it while the byte arrives; a wait right after the report, with
 * nothing new sent, reports nothing, as kernel TCP's. Many rounds, so that the peer's write
 * lands, in some of them, between the loads a report of the rings makes. alarm() is the
 * watchdog. */
#include <pthread.h>
#include "scenario.h"

#define ROUNDS 50000

static int k, c;

static void *echo(void *arg) {
    (void)arg;
    char b;
    while (read(k, &b, 1) == 1) {
        if (b == 'Q') break;
        if (write(k, &b, 1) != 1) die("echo");
    }
    return NULL;
}

/* Rounds of: send a byte, wait for the set to report the echo (polling or sleeping), then ask
 * the set once more; returns how many of those second looks reported. */
static int rounds(int ep, int sleeping) {
    int again = 0;
    for (int i = 0; i < ROUNDS; i++) {
        char b = 'a';
        if (write(c, &b, 1) != 1) die("send");
        struct epoll_event got;
        int n;
        if (sleeping) n = epoll_wait(ep, &got, 1, 5000);
        else
            while ((n = epoll_wait(ep, &got, 1, 0)) == 0) {}
        if (n != 1 || !(got.events & EPOLLIN) || got.data.u64 != 7) die("no report of the echo");
        if (epoll_wait(ep, &got, 1, 0) != 0) again++;
        if (read(c, &b, 1) != 1 || b != 'a') die("read the echo");
    }
    return again;
}

int main(void) {
    alarm(60);
    connected_pair(&k, &c, 0);
    pthread_t t;
    if (pthread_create(&t, NULL, echo, NULL) != 0) die("pthread_create");
    int ep = epoll_create1(0);
    struct epoll_event e = {.events = EPOLLIN | EPOLLET, .data.u64 = 7};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, c, &e) != 0) die("epoll_ctl");
    int polled = rounds(ep, 0), slept = rounds(ep, 1);
    printf("second reports with nothing new: %d of %d polled, %d of %d slept\n", polled, ROUNDS, slept, ROUNDS);
    CHECK(polled == 0, "ET, polled: one report per arrival");
    CHECK(slept == 0, "ET, slept: one report per arrival");
    char q = 'Q';
    if (write(c, &q, 1) != 1) die("quit");
    pthread_join(t, NULL);
    return failures != 0;
}
