/* POLLRDNORM and POLLWRNORM (and EPOLLRDNORM, EPOLLWRNORM) over an accelerated connection, as
 * the kernel's TCP reports them: with POLLIN and POLLOUT. Varnish waits for its non-blocking
 * backend connect with poll(POLLWRNORM) alone, then reads SO_ERROR; a connection that never
 * reports it times out. A forked peer listens (its own offer service), accepts and echoes.
 * alarm() is the watchdog. Runs with and without the shim. */
#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/wait.h>

#include "scenario.h"

static void peer(int said) {
    struct sockaddr_in a;
    int l = loopback_listener(&a, 1);
    write_all(said, &a, sizeof a);
    int c = accept(l, NULL, NULL);
    if (c < 0) die("accept");
    char cmd;
    /* Each byte read is sent back; end of stream ends the peer. */
    while (read(c, &cmd, 1) == 1)
        if (write(c, &cmd, 1) != 1) die("peer write");
    exit(0);
}

int main(void) {
    alarm(30);
    int said[2];
    if (pipe(said) < 0) die("pipe");
    pid_t pid = fork();
    if (pid == 0) peer(said[1]);
    struct sockaddr_in a;
    if (read_full(said[0], &a, sizeof a) < 0) die("the peer's address");

    /* As varnish's VTCP_connect: non-blocking connect, poll for POLLWRNORM alone (3.5 s there). */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    fcntl(s, F_SETFL, O_NONBLOCK);
    int rc = connect(s, (struct sockaddr *)&a, sizeof a);
    CHECK(rc == 0 || errno == EINPROGRESS, "non-blocking connect starts");
    struct pollfd p = {.fd = s, .events = POLLWRNORM};
    rc = poll(&p, 1, 5000);
    CHECK(rc == 1, "poll(POLLWRNORM) after a non-blocking connect reports the connection");
    CHECK(p.revents == POLLWRNORM, "... as POLLWRNORM, nothing else");
    int err = -1;
    socklen_t len = sizeof err;
    CHECK(getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0, "SO_ERROR then says connected");

    /* Both write bits asked: both reported (tcp_poll sets them together). */
    p = (struct pollfd){.fd = s, .events = POLLOUT | POLLWRNORM};
    CHECK(poll(&p, 1, 5000) == 1 && p.revents == (POLLOUT | POLLWRNORM), "poll(POLLOUT|POLLWRNORM): both");

    /* Nothing to read yet: POLLRDNORM alone stays quiet. */
    p = (struct pollfd){.fd = s, .events = POLLRDNORM};
    CHECK(poll(&p, 1, 50) == 0, "poll(POLLRDNORM) with nothing to read: times out");
    int ep = epoll_create1(0);
    struct epoll_event e = {.events = EPOLLRDNORM, .data.u64 = 7};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, s, &e) == 0, "epoll_ctl ADD EPOLLRDNORM");
    CHECK(epoll_wait(ep, &e, 1, 50) == 0, "epoll_wait(EPOLLRDNORM) with nothing to read: times out");

    if (write(s, "x", 1) != 1) die("write");
    p = (struct pollfd){.fd = s, .events = POLLRDNORM};
    rc = poll(&p, 1, 5000);
    CHECK(rc == 1 && p.revents == POLLRDNORM, "poll(POLLRDNORM) with the echo waiting: POLLRDNORM");
    p = (struct pollfd){.fd = s, .events = POLLIN | POLLRDNORM | POLLWRNORM};
    rc = poll(&p, 1, 5000);
    CHECK(rc == 1 && p.revents == (POLLIN | POLLRDNORM | POLLWRNORM), "poll(POLLIN|POLLRDNORM|POLLWRNORM): all three");
    e = (struct epoll_event){0};
    rc = epoll_wait(ep, &e, 1, 5000);
    CHECK(rc == 1 && e.events == EPOLLRDNORM && e.data.u64 == 7, "epoll_wait(EPOLLRDNORM) with the echo waiting: EPOLLRDNORM");
    e = (struct epoll_event){.events = EPOLLWRNORM | EPOLLET, .data.u64 = 8};
    CHECK(epoll_ctl(ep, EPOLL_CTL_MOD, s, &e) == 0, "epoll_ctl MOD EPOLLWRNORM|EPOLLET");
    e = (struct epoll_event){0};
    rc = epoll_wait(ep, &e, 1, 5000);
    CHECK(rc == 1 && e.events == EPOLLWRNORM && e.data.u64 == 8, "epoll_wait(EPOLLWRNORM): EPOLLWRNORM");
    char b;
    CHECK(read(s, &b, 1) == 1 && b == 'x', "the echo is read");

    /* The peer's end of stream is readable as POLLRDNORM too. */
    shutdown(s, SHUT_WR);
    p = (struct pollfd){.fd = s, .events = POLLRDNORM};
    rc = poll(&p, 1, 5000);
    CHECK(rc == 1 && (p.revents & POLLRDNORM), "the peer's end of stream: POLLRDNORM");
    CHECK(read(s, &b, 1) == 0, "... and read() returns 0");
    close(ep);
    close(s);
    int st;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the peer exited 0");
    if (failures) fprintf(stderr, "poll_norm: %d failures\n", failures);
    return failures ? 1 : 0;
}
