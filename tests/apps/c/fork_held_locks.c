/* fork in a loop while another thread drives a listener of a process that serves other network
 * namespaces (COLO_NETNS_DIR, COLO_NETNS_CLIENTS): the thread re-arms the listener's epoll
 * registration, accepts (non-blocking, nothing queued), waits on the epoll set and polls the
 * listener, without end. Under the shim each of these takes the lock of the listener's held set
 * or of the epoll registrations that follow it; a child forked while the thread held one used to
 * find it locked for good at its own first accept or epoll_ctl on the listener, and hung there.
 * Each child does the same calls once and exits; the parent gives it 10 s (the watchdog per
 * child; the whole program has alarm()). One loopback connection is made and echoed first, so
 * that run.sh sees both ends accelerated. */
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/wait.h>

#include "scenario.h"

#define SECONDS 3.0
#define MAX_FORKS 3000

static int l, ep;
static volatile int stop;

/* What touches the listener's held set and its registrations under the shim, once. */
static void drive(int epfd) {
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = l}, out[4];
    if (epoll_ctl(epfd, EPOLL_CTL_MOD, l, &ev) < 0) die("epoll_ctl MOD");
    int c = accept(l, NULL, NULL);
    if (c >= 0) close(c);
    else if (errno != EAGAIN && errno != EWOULDBLOCK) die("accept");
    epoll_wait(epfd, out, 4, 0);
    struct pollfd p = {.fd = l, .events = POLLIN};
    poll(&p, 1, 0);
}

static void *driver(void *arg) {
    while (!stop) drive(ep);
    return arg;
}

/* The child: the same calls on the listener, in the inherited epoll set and in one of its own. */
static void child(void) {
    drive(ep);
    int mine = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.fd = l};
    if (mine < 0 || epoll_ctl(mine, EPOLL_CTL_ADD, l, &ev) < 0) _exit(3);
    drive(mine);
    if (epoll_ctl(mine, EPOLL_CTL_DEL, l, NULL) < 0) _exit(4);
    _exit(0);
}

/* Waits up to 10 s for the child `pid`: 0 if it exited with status 0, else -1 (killed if it
 * still ran). */
static int reap(pid_t pid) {
    int status;
    for (int i = 0; i < 10000; i++) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
        if (r < 0 && errno != EINTR) die("waitpid");
        usleep(1000);
    }
    fprintf(stderr, "child %d still runs after 10 s: killed\n", (int)pid);
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

int main(void) {
    alarm(60);
    char dir[] = "/tmp/colo-fork-held-XXXXXX";
    if (!mkdtemp(dir)) die("mkdtemp");
    /* Read by the shim at the first listen; the clients' network is one no peer here is in. */
    setenv("COLO_NETNS_DIR", dir, 1);
    setenv("COLO_NETNS_CLIENTS", "10.253.0.0/16", 1);
    struct sockaddr_in a;
    l = loopback_listener(&a, 64);

    /* One echoed connection (blocking), before the listener turns non-blocking. */
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    int s = accept(l, NULL, NULL);
    if (s < 0) die("accept");
    write_all(c, "ping", 4);
    char b[4];
    CHECK(read_full(s, b, 4) == 0 && memcmp(b, "ping", 4) == 0, "the connection carried its bytes");
    close(s);
    close(c);

    if (fcntl(l, F_SETFL, O_NONBLOCK) < 0) die("fcntl");
    ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = l};
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev) < 0) die("epoll");
    pthread_t t;
    if (pthread_create(&t, NULL, driver, NULL) != 0) die("pthread_create");
    int forks = 0, hung = 0;
    double until = now() + SECONDS;
    while (now() < until && forks < MAX_FORKS && !hung) {
        pid_t pid = fork();
        if (pid < 0) die("fork");
        if (pid == 0) child();
        forks++;
        if (reap(pid) < 0) hung = 1;
    }
    stop = 1;
    pthread_join(t, NULL);
    CHECK(!hung, "every child forked beside the driving thread got through its accept and epoll calls");
    CHECK(forks >= 50, "at least 50 forks");
    fprintf(stderr, "%d forks, %s\n", forks, hung ? "a child hung" : "none hung");
    /* The rendezvous the shim bound there (each process's own). */
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[600];
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    if (d) closedir(d);
    rmdir(dir);
    return failures ? 1 : 0;
}
