/* Two real processes: a forked server child and this process as the client. Half-close across
 * processes, and peer death (SIGKILL) seen as end of stream or -ECONNRESET in bounded time. */
#include "t.h"

#include <sys/wait.h>

/* Forks a server child that listens, reports its address through a pipe, accepts one
 * connection and runs `serve` on it. */
static pid_t spawn_server(void (*serve)(colo_conn *), char *addr) {
    int p[2];
    CHECK_EQ(pipe(p), 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        colo_listener *l = NULL;
        char a[COLO_ADDRSTRLEN];
        if (colo_listen("127.0.0.1:0", NULL, &l) != 0) _exit(10);
        colo_listener_addr(l, a, sizeof a);
        if (write(p[1], a, sizeof a) != sizeof a) _exit(11);
        close(p[1]);
        colo_conn *c = NULL;
        if (colo_accept(l, 0, &c, NULL, 0) != 0) _exit(12);
        serve(c);
        colo_close(c);
        colo_listener_close(l);
        _exit(0);
    }
    close(p[1]);
    CHECK_EQ(read(p[0], addr, COLO_ADDRSTRLEN), COLO_ADDRSTRLEN);
    close(p[0]);
    return pid;
}

static void serve_halfclose(colo_conn *c) {
    char buf[64];
    size_t got = 0;
    ssize_t n;
    while ((n = colo_read(c, buf + got, sizeof buf - got)) > 0) got += (size_t)n;
    if (n < 0) _exit(20);
    /* our peer stopped writing; we can still answer */
    if (colo_write_all(c, buf, got) != 0) _exit(21);
    colo_shutdown(c, COLO_SHUT_WR);
}

static void halfclose_across_processes(void) {
    char addr[COLO_ADDRSTRLEN], buf[64];
    pid_t pid = spawn_server(serve_halfclose, addr);
    colo_conn *c = NULL;
    CHECK_EQ(colo_connect(addr, NULL, &c), 0);
    CHECK_EQ(colo_transport(c), COLO_TRANSPORT_SHM);
    CHECK_EQ(colo_write_all(c, "hello", 5), 0);
    CHECK_EQ(colo_shutdown(c, COLO_SHUT_WR), 0);
    t_read_exact(c, buf, 5);
    CHECK(memcmp(buf, "hello", 5) == 0);
    CHECK_EQ(colo_read(c, buf, sizeof buf), 0);
    int st;
    CHECK_EQ(waitpid(pid, &st, 0), pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_EQ(colo_close(c), 0);
}

static void serve_then_hang(colo_conn *c) {
    colo_buf *b;
    void *d;
    if (colo_write_all(c, "ready", 5) != 0) _exit(30);
    if (colo_loan(c, 4, &b, &d) != 0) _exit(31);
    memcpy(d, "msg!", 4);
    if (colo_send(b, 4) != 0) _exit(32);
    pause(); /* until killed */
}

static void peer_death(void) {
    char addr[COLO_ADDRSTRLEN], buf[64];
    pid_t pid = spawn_server(serve_then_hang, addr);
    colo_conn *c = NULL;
    CHECK_EQ(colo_connect(addr, NULL, &c), 0);
    CHECK_EQ(colo_transport(c), COLO_TRANSPORT_SHM);
    t_read_exact(c, buf, 5);
    colo_msg *m;
    const void *p;
    size_t n;
    CHECK_EQ(colo_recv_message(c, &m, &p, &n), 1);
    CHECK(n == 4 && memcmp(p, "msg!", 4) == 0);

    CHECK_EQ(colo_set_read_timeout(c, 10 * 1000 * 1000), 0); /* bounded: never -EAGAIN below */
    double t0 = now_s();
    kill(pid, SIGKILL);
    ssize_t r = colo_read(c, buf, sizeof buf);
    CHECK_EQ(r, -ECONNRESET); /* died without shutting down: not a clean end of stream */
    CHECK(now_s() - t0 < 5.0);
    r = colo_write(c, "x", 1);
    CHECK(r == -EPIPE || r == -ECONNRESET);
    colo_msg *m2;
    r = colo_recv_message(c, &m2, NULL, NULL);
    CHECK_EQ(r, -ECONNRESET); /* the same for messages */
    /* the message we still hold stays readable, and releasing it is fine */
    CHECK(memcmp(p, "msg!", 4) == 0);
    CHECK_EQ(colo_msg_release(m), 0);
    colo_buf *b;
    void *d;
    r = colo_loan(c, 4, &b, &d);
    CHECK(r == -EPIPE || r == -ECONNRESET);
    int st;
    CHECK_EQ(waitpid(pid, &st, 0), pid);
    CHECK(WIFSIGNALED(st));
    CHECK_EQ(colo_close(c), 0);
}

int main(void) {
    watchdog(60);
    RUN(halfclose_across_processes);
    RUN(peer_death);
    t_done("test_process");
    return 0;
}
