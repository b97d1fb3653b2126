/* Zero-copy messages: loan, fill in place, send, receive a view in the shared segment, release;
 * sizes, pool exhaustion, cancel, no pool, end of stream, and the same calls over TCP. */
#include "t.h"

#include <arpa/inet.h>
#include <sys/socket.h>

/* Whether `p` lies in a memfd mapping of this process (the shared segment). */
static int in_memfd_mapping(const void *p) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int found = 0;
    uintptr_t a = (uintptr_t)p;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && a >= lo && a < hi) found = strstr(line, "memfd:") != NULL;
    }
    fclose(f);
    return found;
}

static void round_trip(void) {
    char addr[COLO_ADDRSTRLEN];
    colo_options o;
    colo_options_init(&o);
    o.slot_size = 1 << 20;
    o.slot_count = 4;
    colo_listener *l = t_listen(&o, addr);
    colo_conn *c = NULL, *s = NULL;
    t_pair(l, addr, &o, &c, &s);
    CHECK_EQ(colo_max_message_size(c), 1 << 20);

    for (int k = 0; k < 20; k++) {
        size_t len = k == 0 ? 0 : (size_t)(1 << 20) >> (k % 12);
        colo_buf *b = NULL;
        void *data = NULL;
        CHECK_EQ(colo_loan(c, len, &b, &data), 0);
        CHECK(colo_loan_capacity(b) >= (ssize_t)len);
        CHECK(colo_loan_data(b) == data);
        CHECK(in_memfd_mapping(data));
        for (size_t j = 0; j < len; j++) ((uint8_t *)data)[j] = (uint8_t)((k + j) % 251);
        CHECK_EQ(colo_send(b, len), 0);

        colo_msg *m = NULL;
        const void *p = NULL;
        size_t n = 1;
        CHECK_EQ(colo_recv_message(s, &m, &p, &n), 1);
        CHECK_EQ(n, len);
        CHECK(colo_msg_data(m) == p);
        CHECK_EQ(colo_msg_len(m), (ssize_t)len);
        if (len) CHECK(in_memfd_mapping(p)); /* read in place: no copy */
        for (size_t j = 0; j < len; j++)
            if (((const uint8_t *)p)[j] != (uint8_t)((k + j) % 251)) CHECK(!"message bytes differ");
        CHECK_EQ(colo_msg_release(m), 0);
    }

    /* EMSGSIZE, cancel, and pool exhaustion (4 slots, none released) */
    colo_buf *b[5];
    void *d;
    CHECK_EQ(colo_loan(c, (1 << 20) + 1, &b[0], &d), -EMSGSIZE);
    CHECK_EQ(colo_loan(c, 10, &b[0], &d), 0);
    CHECK_EQ(colo_loan_cancel(b[0]), 0);
    for (int i = 0; i < 4; i++) {
        CHECK_EQ(colo_loan(c, 8, &b[i], &d), 0);
        memcpy(d, "12345678", 8);
        CHECK_EQ(colo_send(b[i], 8), 0);
    }
    CHECK_EQ(colo_set_write_timeout(c, 20000), 0);
    CHECK_EQ(colo_loan(c, 8, &b[4], &d), -EAGAIN);
    CHECK_EQ(colo_set_nonblocking(c, 1), 0);
    CHECK_EQ(colo_loan(c, 8, &b[4], &d), -EAGAIN);
    colo_msg *m[4];
    for (int i = 0; i < 4; i++) CHECK_EQ(colo_recv_message(s, &m[i], NULL, NULL), 1);
    CHECK_EQ(colo_set_nonblocking(s, 1), 0);
    CHECK_EQ(colo_recv_message(s, &m[0], NULL, NULL), -EAGAIN); /* m[0] untouched on error */
    CHECK_EQ(colo_msg_release(m[2]), 0);               /* any order */
    CHECK_EQ(colo_msg_release(m[2]), -EBADF);          /* released twice */
    CHECK_EQ(colo_loan(c, 8, &b[4], &d), 0);           /* a slot came back */
    CHECK_EQ(colo_loan_cancel(b[4]), 0);
    for (int i = 0; i < 4; i++)
        if (i != 2) CHECK_EQ(colo_msg_release(m[i]), 0);

    /* a message outlives its connection's handle */
    CHECK_EQ(colo_set_nonblocking(c, 0), 0);
    CHECK_EQ(colo_set_nonblocking(s, 0), 0);
    CHECK_EQ(colo_loan(c, 4, &b[0], &d), 0);
    memcpy(d, "last", 4);
    CHECK_EQ(colo_send(b[0], 4), 0);
    const void *p;
    size_t n;
    CHECK_EQ(colo_recv_message(s, &m[0], &p, &n), 1);
    CHECK_EQ(colo_close(c), 0);
    CHECK_EQ(colo_close(s), 0);
    CHECK(memcmp(p, "last", 4) == 0);
    CHECK_EQ(colo_msg_release(m[0]), 0);
    CHECK_EQ(colo_listener_close(l), 0);
}

static void end_of_stream(void) {
    char addr[COLO_ADDRSTRLEN];
    colo_listener *l = t_listen(NULL, addr);
    colo_conn *c = NULL, *s = NULL;
    t_pair(l, addr, NULL, &c, &s);
    colo_buf *b;
    void *d;
    CHECK_EQ(colo_loan(c, 3, &b, &d), 0);
    memcpy(d, "abc", 3);
    CHECK_EQ(colo_send(b, 3), 0);
    CHECK_EQ(colo_shutdown(c, COLO_SHUT_WR), 0);
    colo_msg *m = (colo_msg *)1;
    CHECK_EQ(colo_recv_message(s, &m, NULL, NULL), 1); /* sent before the shutdown: delivered */
    CHECK_EQ(colo_msg_release(m), 0);
    CHECK_EQ(colo_recv_message(s, &m, NULL, NULL), 0);
    CHECK(m == NULL);
    /* A loan taken before this side's write shutdown is refused at send, like a write. */
    CHECK_EQ(colo_loan(s, 3, &b, &d), 0);
    CHECK_EQ(colo_shutdown(s, COLO_SHUT_WR), 0);
    CHECK_EQ(colo_send(b, 3), -EPIPE);
    /* This side's read shutdown ends receiving at once. */
    CHECK_EQ(colo_shutdown(c, COLO_SHUT_RD), 0);
    CHECK_EQ(colo_recv_message(c, &m, NULL, NULL), 0);
    CHECK_EQ(colo_close(c), 0);
    CHECK_EQ(colo_close(s), 0);
    /* A loan taken before the peer closed cannot be sent into the void. */
    t_pair(l, addr, NULL, &c, &s);
    CHECK_EQ(colo_loan(c, 3, &b, &d), 0);
    CHECK_EQ(colo_close(s), 0);
    CHECK_EQ(colo_send(b, 3), -EPIPE);
    CHECK_EQ(colo_close(c), 0);
    CHECK_EQ(colo_listener_close(l), 0);
}

static void no_pool(void) {
    char addr[COLO_ADDRSTRLEN];
    colo_options o;
    colo_options_init(&o);
    o.slot_size = 0;
    o.slot_count = 0;
    colo_listener *l = t_listen(&o, addr);
    colo_conn *c = NULL, *s = NULL;
    t_pair(l, addr, &o, &c, &s);
    CHECK_EQ(colo_transport(c), COLO_TRANSPORT_SHM);
    CHECK_EQ(colo_max_message_size(c), 0);
    colo_buf *b;
    void *d;
    colo_msg *m;
    CHECK_EQ(colo_loan(c, 1, &b, &d), -ENOBUFS);
    CHECK_EQ(colo_recv_message(s, &m, NULL, NULL), -ENOBUFS);
    CHECK_EQ(colo_write_all(c, "still a stream", 14), 0);
    char buf[14];
    t_read_exact(s, buf, 14);
    CHECK_EQ(colo_close(c), 0);
    CHECK_EQ(colo_close(s), 0);
    CHECK_EQ(colo_listener_close(l), 0);
}

/* Over TCP (a plain client), the same calls frame messages on the stream. */
static void messages_over_tcp(void) {
    char addr[COLO_ADDRSTRLEN];
    colo_listener *l = t_listen(NULL, addr);
    int port = atoi(strrchr(addr, ':') + 1);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK_EQ(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    colo_conn *s = NULL;
    CHECK_EQ(colo_accept(l, 0, &s, NULL, 0), 0);
    CHECK_EQ(colo_transport(s), COLO_TRANSPORT_TCP);
    /* a framed message: u32 little-endian length, bytes */
    CHECK_EQ(write(fd, "\x05\0\0\0hello", 9), 9);
    colo_msg *m;
    const void *p;
    size_t n;
    CHECK_EQ(colo_recv_message(s, &m, &p, &n), 1);
    CHECK_EQ(n, 5);
    CHECK(memcmp(p, "hello", 5) == 0);
    CHECK_EQ(colo_msg_release(m), 0);
    colo_buf *b;
    void *d;
    CHECK_EQ(colo_loan(s, 16, &b, &d), 0);
    CHECK_EQ(colo_loan_capacity(b), 16);
    memcpy(d, "world", 5);
    CHECK_EQ(colo_send(b, 5), 0);
    char buf[9];
    CHECK_EQ(read(fd, buf, 9), 9);
    CHECK(memcmp(buf, "\x05\0\0\0world", 9) == 0);
    close(fd);
    CHECK_EQ(colo_recv_message(s, &m, NULL, NULL), 0);
    CHECK_EQ(colo_close(s), 0);
    CHECK_EQ(colo_listener_close(l), 0);
}

int main(void) {
    watchdog(60);
    RUN(round_trip);
    RUN(end_of_stream);
    RUN(no_pool);
    RUN(messages_over_tcp);
    t_done("test_msg");
    return 0;
}
