/* A server that hands its listening socket to its replacement over a Unix socket and exits
 * (pgbouncer's online restart `-R`, a supervisor that hands its listener on): the replacement
 * never calls listen() on the socket it received, it only accepts on it. The shim makes a
 * listening socket received by `recvmsg` a colo listener of the receiver's (`api::passed`), which
 * takes the rendezvous over at an accept once the old server is gone, so its connections are
 * accelerated again after the first. The four are separate programs: the test, the old server,
 * the new one and the client (a process forked from a server would be served as its own).
 * alarm() is the watchdog. */
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#include "scenario.h"

#define CONNS 4

/* Sends `fd` over the Unix socket `u` (SCM_RIGHTS) with one byte. */
static void send_fd(int u, int fd) {
    char b = 'L', ctl[CMSG_SPACE(sizeof(int))];
    struct iovec v = {.iov_base = &b, .iov_len = 1};
    struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    if (sendmsg(u, &m, 0) != 1) die("sendmsg");
}

/* The descriptor the next message on `u` carries. */
static int recv_fd(int u) {
    char b, ctl[CMSG_SPACE(sizeof(int))];
    struct iovec v = {.iov_base = &b, .iov_len = 1};
    struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
    int fd;
    if (recvmsg(u, &m, 0) != 1) die("recvmsg");
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    if (!c || c->cmsg_type != SCM_RIGHTS) die("no descriptor received");
    memcpy(&fd, CMSG_DATA(c), sizeof fd);
    return fd;
}

/* The old server: listens, hands the listener to the new one over `u`, and exits (it never
 * accepts). */
static int old_server(int u) {
    struct sockaddr_in a;
    int l = loopback_listener(&a, 16);
    send_fd(u, l);
    return 0;
}

static void *greet_and_echo(void *arg) {
    int c = (int)(long)arg;
    write_all(c, "N", 1);
    echo_until_eof(c);
    close(c);
    return NULL;
}

/* The new server: gets the listener over `u`, tells its port back, and greets and echoes each
 * connection, a thread each, until killed. */
__attribute__((noreturn)) static void new_server(int u) {
    int l = recv_fd(u);
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    getsockname(l, (struct sockaddr *)&a, &len);
    int port = ntohs(a.sin_port);
    write_all(u, &port, sizeof port);
    alarm(0);
    for (;;) {
        int c = accept(l, NULL, NULL);
        pthread_t t;
        if (c < 0) die("accept");
        if (pthread_create(&t, NULL, greet_and_echo, (void *)(long)c) != 0) die("thread");
        pthread_detach(t);
    }
}

/* The client: CONNS connections, each kept open (a closed one's segment may be reused by the
 * next), each accelerated (a segment more) and each echoing. */
static int client(int port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int c[CONNS];
    for (int i = 0; i < CONNS; i++) {
        int before = segments();
        char g = 0;
        c[i] = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(c[i], (struct sockaddr *)&a, sizeof a) < 0) die("client connect");
        CHECK(read(c[i], &g, 1) == 1 && g == 'N', "greeted by the new server");
        CHECK(!shimmed() || segments() > before, "connection to the new server accelerated");
    }
    for (int i = 0; i < CONNS; i++) {
        char b = '0' + i, r = 0;
        write_all(c[i], &b, 1);
        CHECK(read(c[i], &r, 1) == 1 && r == b, "echoed");
        close(c[i]);
    }
    return failures != 0;
}

int main(int argc, char **argv) {
    alarm(25);
    if (argc == 3 && strcmp(argv[1], "old") == 0) return old_server(atoi(argv[2]));
    if (argc == 3 && strcmp(argv[1], "new") == 0) new_server(atoi(argv[2]));
    if (argc == 3 && strcmp(argv[1], "client") == 0) return client(atoi(argv[2]));
    int sp[2], port = 0, st = 1;
    char u_old[16], u_new[16];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp) < 0) die("socketpair");
    /* The old server sends on sp[0], the new one receives on sp[1] and answers its port to this
     * process on sp[0] (once the old one is gone). */
    snprintf(u_old, sizeof u_old, "%d", sp[0]);
    snprintf(u_new, sizeof u_new, "%d", sp[1]);
    pid_t new = fork();
    if (new == 0) {
        execl("/proc/self/exe", argv[0], "new", u_new, (char *)NULL);
        die("exec new");
    }
    pid_t old = fork();
    if (old == 0) {
        execl("/proc/self/exe", argv[0], "old", u_old, (char *)NULL);
        die("exec old");
    }
    if (waitpid(old, &st, 0) != old || !WIFEXITED(st) || WEXITSTATUS(st) != 0) die("old server");
    if (read(sp[0], &port, sizeof port) != sizeof port) die("the new server's port");
    /* A first connection finds no rendezvous (the old server took it along): plain TCP, and
     * the new server's accept of it takes the rendezvous over. This process goes on over TCP
     * for a while after finding none, so the client is another one. */
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int first = socket(AF_INET, SOCK_STREAM, 0);
    char g = 0, p[16];
    if (connect(first, (struct sockaddr *)&a, sizeof a) < 0 || read(first, &g, 1) != 1 || g != 'N') die("first connection");
    close(first);
    snprintf(p, sizeof p, "%d", port);
    pid_t cl = fork();
    if (cl == 0) {
        execl("/proc/self/exe", argv[0], "client", p, (char *)NULL);
        die("exec client");
    }
    if (waitpid(cl, &st, 0) != cl) die("wait client");
    kill(new, SIGKILL);
    waitpid(new, NULL, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}
