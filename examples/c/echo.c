/* A colo echo server and client in C.
 *
 *   cc echo.c $(pkg-config --cflags --libs colo) -lpthread -o echo
 *   ./echo server 127.0.0.1:7000      # echoes each connection's bytes and zero-copy messages
 *   ./echo client 127.0.0.1:7000 hi   # prints the echo of bytes, then of a message, and the transport
 *   ./echo                            # both, in one process (server on a thread)
 */
#include <colo.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *what, long long rc) {
    fprintf(stderr, "echo: %s: %s\n", what, colo_strerror((int)rc));
    exit(1);
}

/* Echo one connection's zero-copy messages: read in place, answer from a loaned buffer. */
static void *echo_messages(void *arg) {
    colo_conn *c = arg;
    colo_msg *m;
    const void *data;
    size_t len;
    while (colo_recv_message(c, &m, &data, &len) == 1) {
        colo_buf *b;
        void *out;
        if (colo_loan(c, len, &b, &out) < 0) break;
        memcpy(out, data, len);
        colo_msg_release(m); /* the sender gets its slot back */
        if (colo_send(b, len) < 0) break;
    }
    return NULL;
}

/* Echo one connection: its byte stream until end of stream and, over shared memory, its
 * messages beside it on a second thread (messages travel apart from the bytes there). Over a TCP
 * fallback, messages are framed on the byte stream, so echoing the bytes echoes them too. */
static void *echo_conn(void *arg) {
    colo_conn *c = arg;
    pthread_t msgs;
    int both = colo_transport(c) == COLO_TRANSPORT_SHM && pthread_create(&msgs, NULL, echo_messages, c) == 0;
    char buf[4096];
    ssize_t n;
    while ((n = colo_read(c, buf, sizeof buf)) > 0)
        if (colo_write_all(c, buf, (size_t)n) < 0) break;
    if (both) pthread_join(msgs, NULL); /* its receive ends at the same end of stream */
    colo_close(c);
    return NULL;
}

static void *serve(void *arg) {
    colo_listener *l = arg;
    for (;;) {
        colo_conn *c;
        if (colo_accept(l, 0, &c, NULL, 0) < 0) break;
        pthread_t th;
        pthread_create(&th, NULL, echo_conn, c);
        pthread_detach(th);
    }
    return NULL;
}

static void client(const char *addr, const char *text) {
    colo_conn *c;
    char buf[4096];
    int rc = colo_connect(addr, NULL, &c);
    if (rc < 0) die("connect", rc);
    size_t len = strlen(text);
    if ((rc = colo_write_all(c, text, len)) < 0) die("write", rc);
    colo_shutdown(c, COLO_SHUT_WR);
    size_t got = 0;
    ssize_t n;
    while ((n = colo_read(c, buf + got, sizeof buf - 1 - got)) > 0) got += (size_t)n;
    if (n < 0) die("read", n);
    buf[got] = 0;
    printf("stream echo: %s (over %s)\n", buf, colo_transport(c) == COLO_TRANSPORT_SHM ? "shared memory" : "TCP");
    colo_close(c);

    /* The same with one zero-copy message, on a second connection. */
    if ((rc = colo_connect(addr, NULL, &c)) < 0) die("connect", rc);
    colo_buf *b;
    void *out;
    if ((rc = colo_loan(c, len, &b, &out)) < 0) die("loan", rc);
    memcpy(out, text, len); /* written once, in the shared segment */
    if ((rc = colo_send(b, len)) < 0) die("send", rc);
    colo_msg *m;
    const void *data;
    size_t mlen;
    if ((rc = colo_recv_message(c, &m, &data, &mlen)) != 1) die("recv_message", rc);
    printf("message echo: %.*s\n", (int)mlen, (const char *)data);
    colo_msg_release(m);
    colo_close(c);
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "client") == 0) {
        client(argv[2], argc > 3 ? argv[3] : "hello");
        return 0;
    }
    colo_listener *l;
    int rc = colo_listen(argc >= 3 ? argv[2] : "127.0.0.1:0", NULL, &l);
    if (rc < 0) die("listen", rc);
    char addr[COLO_ADDRSTRLEN];
    colo_listener_addr(l, addr, sizeof addr);
    if (argc >= 2 && strcmp(argv[1], "server") == 0) {
        printf("listening on %s\n", addr);
        fflush(stdout);
        serve(l);
        return 0;
    }
    pthread_t th;
    pthread_create(&th, NULL, serve, l);
    pthread_detach(th);
    client(addr, "hello from C");
    return 0; /* the server thread ends with the process */
}
