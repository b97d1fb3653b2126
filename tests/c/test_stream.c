/* Streams: listen/accept/connect, read/write/peek, large transfers, the pollable fds,
 * non-blocking mode, timeouts, shutdown and close, addresses, and the TCP fallback both ways. */
#include "t.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

static int readable(int fd, int ms) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, ms);
}

static void basics(void) {
    char addr[COLO_ADDRSTRLEN], peer[COLO_ADDRSTRLEN], buf[64];
    colo_listener *l = t_listen(NULL, addr);
    CHECK(strncmp(addr, "127.0.0.1:", 10) == 0);
    CHECK_EQ(colo_listener_is_colo(l), 1);
    int lfd = colo_listener_fileno(l);
    CHECK(lfd >= 0);

    /* non-blocking accept with nothing pending */
    colo_conn *c = NULL, *s = NULL;
    CHECK_EQ(colo_listener_set_nonblocking(l, 1), 0);
    CHECK_EQ(colo_accept(l, 0, &s, NULL, 0), -EAGAIN);
    CHECK_EQ(colo_listener_set_nonblocking(l, 0), 0);

    t_pair(l, addr, NULL, &c, &s);
    CHECK_EQ(colo_transport(c), COLO_TRANSPORT_SHM);
    CHECK_EQ(colo_transport(s), COLO_TRANSPORT_SHM);
    CHECK(colo_fileno(c) >= 0);
    CHECK(colo_fileno(s) >= 0);

    /* addresses: the server's local address is the listener's */
    CHECK(colo_local_addr(s, buf, sizeof buf) > 0);
    CHECK(strcmp(buf, addr) == 0);
    CHECK(colo_peer_addr(c, peer, sizeof peer) > 0);
    CHECK(strcmp(peer, addr) == 0);
    CHECK(colo_peer_addr(s, buf, sizeof buf) > 0);
    CHECK(strncmp(buf, "127.0.0.1:", 10) == 0);
    CHECK(colo_local_addr(c, buf, sizeof buf) > 0);

    /* bytes both ways, peek leaves them */
    CHECK_EQ(colo_write(c, "hello", 5), 5);
    CHECK_EQ(colo_peek(s, buf, sizeof buf), 5);
    CHECK(memcmp(buf, "hello", 5) == 0);
    CHECK_EQ(colo_read(s, buf, 3), 3);
    CHECK(memcmp(buf, "hel", 3) == 0);
    CHECK_EQ(colo_read(s, buf, sizeof buf), 2);
    CHECK(memcmp(buf, "lo", 2) == 0);
    CHECK_EQ(colo_write_all(s, "world", 5), 0);
    t_read_exact(c, buf, 5);
    CHECK(memcmp(buf, "world", 5) == 0);

    /* half-close: the server reads EOF, can still write; our writes then fail */
    CHECK_EQ(colo_shutdown(c, COLO_SHUT_WR), 0);
    CHECK_EQ(colo_read(s, buf, sizeof buf), 0);
    CHECK_EQ(colo_write(c, "x", 1), -EPIPE);
    CHECK_EQ(colo_write_all(s, "after", 5), 0);
    t_read_exact(c, buf, 5);
    CHECK(memcmp(buf, "after", 5) == 0);

    /* close: the client reads EOF; the server stays writable only until it notices */
    CHECK_EQ(colo_close(s), 0);
    CHECK_EQ(colo_read(c, buf, sizeof buf), 0);
    CHECK_EQ(colo_close(c), 0);
    CHECK_EQ(colo_listener_close(l), 0);
}

struct bulk {
    colo_conn *c;
    size_t total;
    int ok;
};

static void *bulk_reader(void *arg) {
    struct bulk *b = arg;
    static uint8_t buf[1 << 16];
    size_t got = 0;
    for (;;) {
        ssize_t n = colo_read(b->c, buf, sizeof buf);
        if (n < 0) return NULL;
        if (n == 0) break;
        for (ssize_t i = 0; i < n; i++)
            if (buf[i] != pattern(got + (size_t)i)) return NULL;
        got += (size_t)n;
    }
    b->ok = got == b->total;
    return NULL;
}

static void large_transfer(void) {
    char addr[COLO_ADDRSTRLEN];
    colo_options o;
    colo_options_init(&o);
    o.ring_capacity = 1 << 16; /* small ring: many wrap-arounds */
    colo_listener *l = t_listen(&o, addr);
    struct t_echo e;
    t_echo_start(&e, l);
    colo_conn *c = NULL;
    CHECK_EQ(colo_connect(addr, &o, &c), 0);
    CHECK_EQ(colo_transport(c), COLO_TRANSPORT_SHM);
    struct bulk b = {c, 8u << 20, 0};
    pthread_t th;
    pthread_create(&th, NULL, bulk_reader, &b);
    size_t chunk = 100003; /* odd size: writes straddle the ring's end */
    uint8_t *buf = malloc(chunk);
    for (size_t sent = 0; sent < b.total;) {
        size_t n = b.total - sent < chunk ? b.total - sent : chunk;
        for (size_t i = 0; i < n; i++) buf[i] = pattern(sent + i);
        CHECK_EQ(colo_write_all(c, buf, n), 0);
        sent += n;
    }
    free(buf);
    CHECK_EQ(colo_shutdown(c, COLO_SHUT_WR), 0);
    pthread_join(th, NULL);
    CHECK(b.ok);
    t_echo_join(&e);
    CHECK_EQ(e.echoed, (long long)b.total);
    CHECK_EQ(colo_close(c), 0);
    CHECK_EQ(colo_listener_close(l), 0);
}

static void nonblocking_and_timeouts(void) {
    char addr[COLO_ADDRSTRLEN], buf[4096];
    colo_options o;
    colo_options_init(&o);
    o.ring_capacity = 4096;
    colo_listener *l = t_listen(&o, addr);
    colo_conn *c = NULL, *s = NULL;
    t_pair(l, addr, &o, &c, &s);

    /* non-blocking read: EAGAIN, then the fd turns readable when data arrives */
    CHECK_EQ(colo_set_nonblocking(s, 1), 0);
    CHECK_EQ(colo_read(s, buf, sizeof buf), -EAGAIN);
    CHECK_EQ(readable(colo_fileno(s), 0), 0);
    CHECK_EQ(colo_write(c, "ping", 4), 4);
    CHECK_EQ(readable(colo_fileno(s), 5000), 1);
    CHECK_EQ(colo_read(s, buf, sizeof buf), 4);
    CHECK_EQ(colo_set_nonblocking(s, 0), 0);

    /* read timeout */
    CHECK_EQ(colo_set_read_timeout(s, 50000), 0);
    double t0 = now_s();
    CHECK_EQ(colo_read(s, buf, sizeof buf), -EAGAIN);
    CHECK(now_s() - t0 >= 0.04);
    CHECK_EQ(colo_set_read_timeout(s, 0), 0);

    /* write timeout: fill the 4 KiB ring with nobody reading */
    CHECK_EQ(colo_set_write_timeout(c, 50000), 0);
    memset(buf, 'x', sizeof buf);
    ssize_t n, total = 0;
    while ((n = colo_write(c, buf, sizeof buf)) > 0) total += n;
    CHECK_EQ(n, -EAGAIN);
    CHECK_EQ(total, 4096);
    CHECK_EQ(colo_set_nonblocking(c, 1), 0);
    CHECK_EQ(colo_write(c, buf, 1), -EAGAIN);
    /* the reader drains; the writer's fd becomes readable (progress) and writing works again */
    t_read_exact(s, buf, 4096);
    CHECK_EQ(readable(colo_fileno(c), 5000), 1);
    CHECK(colo_write(c, buf, 10) == 10);
    CHECK_EQ(colo_close(c), 0);
    CHECK_EQ(colo_close(s), 0);

    CHECK_EQ(colo_listener_close(l), 0);
}

static void *accept_nb_main(void *arg) {
    struct t_acc *a = arg;
    a->rc = colo_accept(a->l, COLO_NONBLOCK, &a->s, NULL, 0);
    return NULL;
}

static void accept_nonblock_flag(void) {
    char addr[COLO_ADDRSTRLEN], buf[16];
    colo_listener *l = t_listen(NULL, addr);
    struct t_acc a = {l, NULL, -1};
    pthread_t th;
    pthread_create(&th, NULL, accept_nb_main, &a);
    colo_conn *c = NULL;
    CHECK_EQ(colo_connect(addr, NULL, &c), 0);
    pthread_join(th, NULL);
    CHECK_EQ(a.rc, 0);
    CHECK_EQ(colo_read(a.s, buf, sizeof buf), -EAGAIN);
    CHECK_EQ(colo_close(a.s), 0);
    CHECK_EQ(colo_close(c), 0);
    CHECK_EQ(colo_listener_close(l), 0);
}

/* colo_connect to a plain TCP server gives a TCP connection behind the same calls. */
static void fallback_to_plain_server(void) {
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    CHECK_EQ(bind(ls, (struct sockaddr *)&sa, sizeof sa), 0);
    CHECK_EQ(listen(ls, 4), 0);
    getsockname(ls, (struct sockaddr *)&sa, &sl);
    char addr[COLO_ADDRSTRLEN], buf[16];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(sa.sin_port));
    colo_conn *c = NULL;
    CHECK_EQ(colo_connect(addr, NULL, &c), 0);
    CHECK_EQ(colo_transport(c), COLO_TRANSPORT_TCP);
    int fd = accept(ls, NULL, NULL);
    CHECK(fd >= 0);
    CHECK_EQ(colo_write_all(c, "abc", 3), 0);
    CHECK_EQ(read(fd, buf, sizeof buf), 3);
    CHECK_EQ(write(fd, "xyz", 3), 3);
    t_read_exact(c, buf, 3);
    CHECK(memcmp(buf, "xyz", 3) == 0);
    CHECK(colo_fileno(c) >= 0);
    CHECK_EQ(colo_peer_addr(c, buf, 8), -ENOSPC);
    CHECK(colo_peer_addr(c, buf, sizeof buf) > 0);
    close(fd);
    CHECK_EQ(colo_read(c, buf, sizeof buf), 0);
    CHECK_EQ(colo_close(c), 0);
    close(ls);

    /* nobody listening */
    CHECK_EQ(colo_connect(addr, NULL, &c), -ECONNREFUSED);
}

/* A plain TCP client reaches a colo listener; accept gives a TCP connection. */
static void plain_client_to_colo_listener(void) {
    char addr[COLO_ADDRSTRLEN], buf[16];
    colo_listener *l = t_listen(NULL, addr);
    int port = atoi(strrchr(addr, ':') + 1);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK_EQ(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    CHECK_EQ(readable(colo_listener_fileno(l), 5000), 1);
    colo_conn *s = NULL;
    CHECK_EQ(colo_accept(l, 0, &s, buf, sizeof buf), 0);
    CHECK_EQ(colo_transport(s), COLO_TRANSPORT_TCP);
    CHECK(strncmp(buf, "127.0.0.1:", 10) == 0);
    CHECK_EQ(write(fd, "hi", 2), 2);
    t_read_exact(s, buf, 2);
    CHECK_EQ(colo_shutdown(s, COLO_SHUT_RDWR), 0);
    CHECK_EQ(read(fd, buf, sizeof buf), 0);
    close(fd);
    CHECK_EQ(colo_close(s), 0);
    CHECK_EQ(colo_listener_close(l), 0);
}

int main(void) {
    watchdog(60);
    RUN(basics);
    RUN(large_transfer);
    RUN(nonblocking_and_timeouts);
    RUN(accept_nonblock_flag);
    RUN(fallback_to_plain_server);
    RUN(plain_client_to_colo_listener);
    t_done("test_stream");
    return 0;
}
