/* Bad input never crashes: NULL, made-up, closed and wrong-kind handles give -EBADF; NULL
 * out-pointers, bad lengths, addresses and options give -EINVAL; double close / double release /
 * double send are detected. */
#include "t.h"

#define BOGUS ((void *)(uintptr_t)0x123450)

static void every_conn_call_rejects(colo_conn *c) {
    char buf[COLO_ADDRSTRLEN];
    colo_buf *loan = NULL;
    void *data = NULL;
    colo_msg *m = NULL;
    CHECK_EQ(colo_read(c, buf, sizeof buf), -EBADF);
    CHECK_EQ(colo_peek(c, buf, sizeof buf), -EBADF);
    CHECK_EQ(colo_write(c, "x", 1), -EBADF);
    CHECK_EQ(colo_write_all(c, "x", 1), -EBADF);
    CHECK_EQ(colo_shutdown(c, COLO_SHUT_WR), -EBADF);
    CHECK_EQ(colo_fileno(c), -EBADF);
    CHECK_EQ(colo_set_nonblocking(c, 1), -EBADF);
    CHECK_EQ(colo_set_read_timeout(c, 1000), -EBADF);
    CHECK_EQ(colo_set_write_timeout(c, 1000), -EBADF);
    CHECK_EQ(colo_transport(c), -EBADF);
    CHECK_EQ(colo_peer_addr(c, buf, sizeof buf), -EBADF);
    CHECK_EQ(colo_local_addr(c, buf, sizeof buf), -EBADF);
    CHECK_EQ(colo_max_message_size(c), -EBADF);
    CHECK_EQ(colo_loan(c, 10, &loan, &data), -EBADF);
    CHECK_EQ(colo_recv_message(c, &m, NULL, NULL), -EBADF);
    CHECK_EQ(colo_close(c), -EBADF);
}

static void every_listener_call_rejects(colo_listener *l) {
    char buf[COLO_ADDRSTRLEN];
    colo_conn *c = NULL;
    CHECK_EQ(colo_listener_addr(l, buf, sizeof buf), -EBADF);
    CHECK_EQ(colo_listener_fileno(l), -EBADF);
    CHECK_EQ(colo_listener_set_nonblocking(l, 1), -EBADF);
    CHECK_EQ(colo_listener_is_colo(l), -EBADF);
    CHECK_EQ(colo_accept(l, 0, &c, NULL, 0), -EBADF);
    CHECK_EQ(colo_listener_close(l), -EBADF);
}

static void every_msg_call_rejects(colo_msg *m) {
    CHECK(colo_msg_data(m) == NULL);
    CHECK_EQ(colo_msg_len(m), -EBADF);
    CHECK_EQ(colo_msg_release(m), -EBADF);
}

static void every_loan_call_rejects(colo_buf *l) {
    CHECK(colo_loan_data(l) == NULL);
    CHECK_EQ(colo_loan_capacity(l), -EBADF);
    CHECK_EQ(colo_send(l, 0), -EBADF);
    CHECK_EQ(colo_loan_cancel(l), -EBADF);
}

static void null_and_bogus_handles(void) {
    every_conn_call_rejects(NULL);
    every_conn_call_rejects(BOGUS);
    every_listener_call_rejects(NULL);
    every_listener_call_rejects(BOGUS);
    every_msg_call_rejects(NULL);
    every_msg_call_rejects(BOGUS);
    every_loan_call_rejects(NULL);
    every_loan_call_rejects(BOGUS);
}

static void closed_and_wrong_kind_handles(void) {
    char addr[COLO_ADDRSTRLEN];
    colo_listener *l = t_listen(NULL, addr);
    /* a listener is not a connection, a message or a loan */
    every_conn_call_rejects((colo_conn *)l);
    every_msg_call_rejects((colo_msg *)l);
    every_loan_call_rejects((colo_buf *)l);
    CHECK_EQ(colo_listener_is_colo(l), 1); /* still alive after all that */

    colo_conn *c = NULL, *s = NULL;
    t_pair(l, addr, NULL, &c, &s);
    every_listener_call_rejects((colo_listener *)c);
    CHECK_EQ(colo_transport(c), COLO_TRANSPORT_SHM);

    /* a message and a loan, then used after release / send */
    colo_buf *loan = NULL;
    void *data = NULL;
    CHECK_EQ(colo_loan(c, 3, &loan, &data), 0);
    memcpy(data, "abc", 3);
    every_conn_call_rejects((colo_conn *)loan);
    CHECK_EQ(colo_send(loan, 3), 0);
    every_loan_call_rejects(loan); /* sent: gone */
    colo_msg *m = NULL;
    CHECK_EQ(colo_recv_message(s, &m, NULL, NULL), 1);
    every_listener_call_rejects((colo_listener *)m);
    CHECK_EQ(colo_msg_len(m), 3);
    CHECK_EQ(colo_msg_release(m), 0);
    every_msg_call_rejects(m); /* released twice: detected */

    CHECK_EQ(colo_close(c), 0);
    every_conn_call_rejects(c); /* closed twice: detected */
    CHECK_EQ(colo_close(s), 0);
    every_conn_call_rejects(s);
    CHECK_EQ(colo_listener_close(l), 0);
    every_listener_call_rejects(l);
}

static void null_pointers_and_lengths(void) {
    char addr[COLO_ADDRSTRLEN];
    colo_listener *l = t_listen(NULL, addr);
    colo_conn *c = NULL, *s = NULL;
    colo_listener *l2 = NULL;

    CHECK_EQ(colo_listen(NULL, NULL, &l2), -EINVAL);
    CHECK_EQ(colo_listen("127.0.0.1:0", NULL, NULL), -EINVAL);
    CHECK_EQ(colo_listen("not an address", NULL, &l2), -EINVAL);
    CHECK_EQ(colo_listen("\xff\xfe", NULL, &l2), -EINVAL); /* not UTF-8 */
    CHECK_EQ(colo_listen(addr, NULL, &l2), -EADDRINUSE);
    CHECK_EQ(colo_connect(NULL, NULL, &c), -EINVAL);
    CHECK_EQ(colo_connect(addr, NULL, NULL), -EINVAL);
    CHECK_EQ(colo_connect("nonsense", NULL, &c), -EINVAL);
    /* A host name that does not resolve is no address either (not -EIO, an I/O error). */
    CHECK_EQ(colo_connect("colo-no-such-host.invalid:80", NULL, &c), -EINVAL);
    CHECK_EQ(colo_listen("colo-no-such-host.invalid:0", NULL, &l2), -EINVAL);
    CHECK_EQ(colo_accept(l, 0, NULL, NULL, 0), -EINVAL);
    CHECK_EQ(colo_accept(l, 0x100, &s, NULL, 0), -EINVAL);
    CHECK_EQ(colo_options_init(NULL), -EINVAL);

    t_pair(l, addr, NULL, &c, &s);
    CHECK_EQ(colo_read(c, NULL, 10), -EINVAL);
    CHECK_EQ(colo_read(c, NULL, 0), 0);
    CHECK_EQ(colo_peek(c, NULL, 10), -EINVAL);
    CHECK_EQ(colo_write(c, NULL, 10), -EINVAL);
    CHECK_EQ(colo_write(c, NULL, 0), 0);
    CHECK_EQ(colo_write_all(c, NULL, 10), -EINVAL);
    char b[4];
    CHECK_EQ(colo_read(c, b, (size_t)-1), -EINVAL); /* length above SSIZE_MAX */
    CHECK_EQ(colo_write(c, b, (size_t)-1), -EINVAL);
    CHECK_EQ(colo_shutdown(c, 7), -EINVAL);
    CHECK_EQ(colo_peer_addr(c, NULL, 64), -EINVAL);
    CHECK_EQ(colo_local_addr(c, b, sizeof b), -ENOSPC); /* too small: nothing written */
    CHECK_EQ(colo_listener_addr(l, b, sizeof b), -ENOSPC);
    CHECK_EQ(colo_listener_addr(l, NULL, 64), -EINVAL);

    colo_buf *loan = NULL;
    void *data = NULL;
    CHECK_EQ(colo_loan(c, 10, NULL, &data), -EINVAL);
    CHECK_EQ(colo_loan(c, 10, &loan, NULL), -EINVAL);
    CHECK_EQ(colo_loan(c, (size_t)colo_max_message_size(c) + 1, &loan, &data), -EMSGSIZE);
    CHECK_EQ(colo_loan(c, 10, &loan, &data), 0);
    ssize_t cap = colo_loan_capacity(loan);
    CHECK(cap >= 10);
    CHECK_EQ(colo_send(loan, (size_t)cap + 1), -EINVAL); /* wrong length: the loan stays */
    CHECK(colo_loan_data(loan) == data);
    CHECK_EQ(colo_loan_cancel(loan), 0);
    CHECK_EQ(colo_loan_cancel(loan), -EBADF);
    CHECK_EQ(colo_recv_message(c, NULL, NULL, NULL), -EINVAL);

    CHECK_EQ(colo_close(c), 0);
    CHECK_EQ(colo_close(s), 0);
    CHECK_EQ(colo_listener_close(l), 0);
}

static void bad_options(void) {
    colo_options o;
    colo_listener *l = NULL;
    colo_conn *c = NULL;
    CHECK_EQ(colo_options_init(&o), 0);
    CHECK_EQ(o.size, sizeof o);
    CHECK(o.ring_capacity >= 4096);
    CHECK_EQ(o.spin_us, COLO_SPIN_DEFAULT);

    colo_options bad = o;
    bad.size = 4; /* not initialised by colo_options_init */
    CHECK_EQ(colo_listen("127.0.0.1:0", &bad, &l), -EINVAL);
    bad = o;
    bad.ring_capacity = 5000; /* not a power of two */
    CHECK_EQ(colo_listen("127.0.0.1:0", &bad, &l), -EINVAL);
    CHECK_EQ(colo_connect("127.0.0.1:1", &bad, &c), -EINVAL);
    bad = o;
    bad.slot_count = 0; /* slot size without slots */
    CHECK_EQ(colo_listen("127.0.0.1:0", &bad, &l), -EINVAL);
    bad = o;
    bad.spin_us = -7;
    CHECK_EQ(colo_listen("127.0.0.1:0", &bad, &l), -EINVAL);
    o.spin_us = 0;
    CHECK_EQ(colo_listen("127.0.0.1:0", &o, &l), 0);
    CHECK_EQ(colo_listener_close(l), 0);
}

static void strerror_and_version(void) {
    CHECK(strstr(colo_strerror(-EBADF), "EBADF") != NULL);
    CHECK(strstr(colo_strerror(EAGAIN), "EAGAIN") != NULL);
    CHECK(strlen(colo_strerror(-EACCES)) > 0); /* from the system table */
    CHECK(colo_strerror(-99999) != NULL);
    CHECK(colo_strerror(-2147483647 - 1) != NULL);
    CHECK(strcmp(colo_version(), "0.1.0") == 0);
}

int main(void) {
    watchdog(30);
    RUN(null_and_bogus_handles);
    RUN(closed_and_wrong_kind_handles);
    RUN(null_pointers_and_lengths);
    RUN(bad_options);
    RUN(strerror_and_version);
    t_done("test_errors");
    return 0;
}
