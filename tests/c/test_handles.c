/* The handle table: stale handles never reach a newer object in the same slot, loans and
 * messages keep a closed connection usable until released, a thread blocked in
 * colo_recv_message survives a close from another thread, and handles move between threads
 * (messages received on one thread, released on another; connections used by several threads,
 * then closed, also while such a thread is alive and idle). Run under AddressSanitizer: a use after free or a leak fails the test. */
#include "t.h"

#include <pthread.h>

static void send_msg(colo_conn *c, const char *text) {
    colo_buf *b;
    void *d;
    size_t n = strlen(text);
    CHECK_EQ(colo_loan(c, n, &b, &d), 0);
    memcpy(d, text, n);
    CHECK_EQ(colo_send(b, n), 0);
}

static void stale_handles_after_reuse(void) {
    char addr[COLO_ADDRSTRLEN];
    colo_listener *l = t_listen(NULL, addr);
    colo_conn *c = NULL, *s = NULL;
    t_pair(l, addr, NULL, &c, &s);
    /* A released message's handle, then newer messages that take the freed entries: the old
     * value is never given out again and keeps failing. */
    colo_msg *old = NULL;
    send_msg(c, "first");
    CHECK_EQ(colo_recv_message(s, &old, NULL, NULL), 1);
    CHECK_EQ(colo_msg_release(old), 0);
    for (int i = 0; i < 200; i++) {
        colo_msg *m = NULL;
        const void *p;
        size_t n;
        send_msg(c, "again");
        CHECK_EQ(colo_recv_message(s, &m, &p, &n), 1);
        CHECK(m != old);
        CHECK(((uintptr_t)m & 15) == 0);
        CHECK_EQ(colo_msg_len(old), -EBADF);
        CHECK(colo_msg_data(old) == NULL);
        CHECK_EQ(colo_msg_release(old), -EBADF); /* must not release the new message */
        CHECK_EQ(colo_msg_len(m), 5);
        CHECK(memcmp(p, "again", 5) == 0);
        CHECK_EQ(colo_msg_release(m), 0);
    }
    /* The same for loans, and a closed connection's handle after new connections. */
    colo_buf *b;
    void *d;
    CHECK_EQ(colo_loan(c, 8, &b, &d), 0);
    CHECK_EQ(colo_loan_cancel(b), 0);
    colo_buf *b2;
    CHECK_EQ(colo_loan(c, 8, &b2, &d), 0);
    CHECK(b2 != b);
    CHECK_EQ(colo_send(b, 1), -EBADF);
    CHECK_EQ(colo_loan_cancel(b), -EBADF);
    CHECK_EQ(colo_loan_capacity(b2) >= 8, 1);
    CHECK_EQ(colo_loan_cancel(b2), 0);
    CHECK_EQ(colo_close(c), 0);
    colo_conn *c2 = NULL, *s2 = NULL;
    t_pair(l, addr, NULL, &c2, &s2);
    CHECK(c2 != c && s2 != c);
    CHECK_EQ(colo_transport(c), -EBADF);
    CHECK_EQ(colo_close(c), -EBADF);
    CHECK_EQ(colo_transport(c2), COLO_TRANSPORT_SHM);
    CHECK_EQ(colo_close(c2), 0);
    CHECK_EQ(colo_close(s2), 0);
    CHECK_EQ(colo_close(s), 0);
    CHECK_EQ(colo_listener_close(l), 0);
}

static void loans_and_messages_outlive_close(void) {
    char addr[COLO_ADDRSTRLEN];
    colo_listener *l = t_listen(NULL, addr);
    colo_conn *c = NULL, *s = NULL;
    t_pair(l, addr, NULL, &c, &s);
    send_msg(c, "kept");
    colo_msg *m;
    const void *p;
    size_t n;
    CHECK_EQ(colo_recv_message(s, &m, &p, &n), 1);
    colo_buf *b1, *b2;
    void *d1, *d2;
    CHECK_EQ(colo_loan(s, 16, &b1, &d1), 0);
    CHECK_EQ(colo_loan(s, 16, &b2, &d2), 0);
    CHECK_EQ(colo_close(s), 0); /* the message and both loans still hold the connection */
    CHECK_EQ(colo_transport(s), -EBADF);
    CHECK(memcmp(p, "kept", 4) == 0);
    memset(d1, 1, 16); /* still mapped */
    memset(d2, 2, 16);
    CHECK(colo_loan_data(b1) == d1);
    CHECK_EQ(colo_msg_len(m), 4);
    CHECK_EQ(colo_loan_cancel(b1), 0);
    int r = colo_send(b2, 16); /* the connection is shut down: an error, the loan is consumed */
    CHECK(r == 0 || r == -EPIPE || r == -ECONNRESET);
    CHECK_EQ(colo_loan_cancel(b2), -EBADF);
    CHECK_EQ(colo_msg_release(m), 0); /* the last holder: the connection goes now */
    CHECK_EQ(colo_close(c), 0);
    CHECK_EQ(colo_listener_close(l), 0);
}

struct blocked {
    colo_conn *s;
    int rc;
};

static void *recv_blocked(void *arg) {
    struct blocked *b = arg;
    colo_msg *m = NULL;
    b->rc = colo_recv_message(b->s, &m, NULL, NULL);
    if (b->rc == 1) colo_msg_release(m);
    return NULL;
}

static void close_while_another_thread_waits(void) {
    char addr[COLO_ADDRSTRLEN];
    colo_listener *l = t_listen(NULL, addr);
    colo_conn *c = NULL, *s = NULL;
    t_pair(l, addr, NULL, &c, &s);
    struct blocked b = {s, 99};
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, recv_blocked, &b), 0);
    usleep(50000); /* let it block */
    /* The handle dies at once; the blocked call keeps the connection and finishes first (over
     * shared memory it waits for the peer, as colo_close documents): the peer's next message
     * ends it, and the connection is freed when that call has released its message. */
    CHECK_EQ(colo_close(s), 0);
    CHECK_EQ(colo_transport(s), -EBADF);
    CHECK_EQ(colo_close(s), -EBADF);
    usleep(20000);
    colo_buf *buf;
    void *d;
    int r = colo_loan(c, 4, &buf, &d);
    if (r == 0) {
        memcpy(d, "wake", 4);
        r = colo_send(buf, 4);
    }
    if (r != 0) CHECK_EQ(colo_close(c), 0); /* the close already reached the peer: EOF wakes it */
    pthread_join(th, NULL);
    CHECK(b.rc == 1 || b.rc == 0 || b.rc < 0);
    if (r == 0) CHECK_EQ(colo_close(c), 0);
    CHECK_EQ(colo_listener_close(l), 0);
}

struct relay {
    colo_msg *m[64];
    int n;
    pthread_mutex_t mu;
    int done;
};

static void *release_elsewhere(void *arg) {
    struct relay *r = arg;
    for (;;) {
        pthread_mutex_lock(&r->mu);
        int n = r->n, done = r->done;
        colo_msg *m[64];
        memcpy(m, r->m, sizeof m);
        r->n = 0;
        pthread_mutex_unlock(&r->mu);
        for (int i = 0; i < n; i++) CHECK_EQ(colo_msg_release(m[i]), 0);
        if (done && n == 0) return NULL;
        if (n == 0) usleep(100);
    }
}

struct user {
    colo_conn *c;
    int sent;
};

static void *use_conn(void *arg) {
    struct user *u = arg;
    for (int i = 0; i < 500; i++) {
        colo_buf *b;
        void *d;
        if (colo_loan(u->c, 4, &b, &d) != 0) break;
        memcpy(d, "user", 4);
        if (colo_send(b, 4) != 0) break;
        u->sent++;
    }
    return NULL;
}

static void handles_move_between_threads(void) {
    char addr[COLO_ADDRSTRLEN];
    colo_options o;
    colo_options_init(&o);
    o.slot_count = 64;
    o.slot_size = 64;
    colo_listener *l = t_listen(&o, addr);
    colo_conn *c = NULL, *s = NULL;
    t_pair(l, addr, &o, &c, &s);
    /* messages received here, released on another thread */
    struct relay r = {.n = 0, .done = 0};
    pthread_mutex_init(&r.mu, NULL);
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, release_elsewhere, &r), 0);
    /* two threads send on the same connection (each looks it up on its own) */
    struct user u1 = {c, 0}, u2 = {c, 0};
    pthread_t t1, t2;
    CHECK_EQ(pthread_create(&t1, NULL, use_conn, &u1), 0);
    CHECK_EQ(pthread_create(&t2, NULL, use_conn, &u2), 0);
    for (int got = 0; got < 1000; got++) {
        colo_msg *m;
        CHECK_EQ(colo_recv_message(s, &m, NULL, NULL), 1);
        for (;;) {
            pthread_mutex_lock(&r.mu);
            int ok = r.n < 64;
            if (ok) r.m[r.n++] = m;
            pthread_mutex_unlock(&r.mu);
            if (ok) break;
            usleep(100);
        }
    }
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    CHECK_EQ(u1.sent + u2.sent, 1000);
    pthread_mutex_lock(&r.mu);
    r.done = 1;
    pthread_mutex_unlock(&r.mu);
    pthread_join(th, NULL);
    /* a connection used by other threads, closed here: freed (LeakSanitizer checks at exit) */
    CHECK_EQ(colo_close(c), 0);
    CHECK_EQ(colo_close(s), 0);
    CHECK_EQ(colo_listener_close(l), 0);
}

struct idle {
    colo_conn *s, *other;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int step;
};

static void idle_step(struct idle *t, int want, int set) {
    pthread_mutex_lock(&t->mu);
    while (t->step != want) pthread_cond_wait(&t->cv, &t->mu);
    t->step = set;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

static void *use_then_idle(void *arg) {
    struct idle *t = arg;
    CHECK_EQ(colo_transport(t->s), COLO_TRANSPORT_SHM); /* looks it up: keeps references cached */
    idle_step(t, 0, 1);
    idle_step(t, 2, 3); /* main closed it meanwhile */
    CHECK_EQ(colo_transport(t->s), -EBADF);
    CHECK_EQ(colo_transport(t->other), COLO_TRANSPORT_SHM); /* gives the cached ones back */
    return NULL;
}

/* A connection closed while another, idle thread has used it: the peer sees the close at once. */
static void close_after_another_thread_used_it(void) {
    char addr[COLO_ADDRSTRLEN];
    colo_listener *l = t_listen(NULL, addr);
    colo_conn *c = NULL, *s = NULL;
    t_pair(l, addr, NULL, &c, &s);
    struct idle t = {.s = s, .other = c, .step = 0};
    pthread_mutex_init(&t.mu, NULL);
    pthread_cond_init(&t.cv, NULL);
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, use_then_idle, &t), 0);
    idle_step(&t, 1, 1);
    CHECK_EQ(colo_write_all(s, "bye", 3), 0);
    CHECK_EQ(colo_close(s), 0);
    char buf[8];
    t_read_exact(c, buf, 3);
    CHECK(memcmp(buf, "bye", 3) == 0);
    CHECK_EQ(colo_set_read_timeout(c, 5000000), 0);
    CHECK_EQ(colo_read(c, buf, sizeof buf), 0); /* end of stream, not a timeout */
    idle_step(&t, 1, 2);
    pthread_join(th, NULL);
    CHECK_EQ(colo_close(c), 0);
    CHECK_EQ(colo_listener_close(l), 0);
}

int main(void) {
    watchdog(60);
    RUN(stale_handles_after_reuse);
    RUN(loans_and_messages_outlive_close);
    RUN(close_while_another_thread_waits);
    RUN(handles_move_between_threads);
    RUN(close_after_another_thread_used_it);
    t_done("test_handles");
    return 0;
}
