/* The cost of the C layer on the zero-copy message path, in one process: colo_loan +
 * colo_loan_cancel, and loan + fill + send + receive + release, over one shared-memory pair.
 * Compare with the same loops through the Rust API:
 * `cargo run --release -p colo-ffi --example overhead` (see rust/colo-ffi/README.md, Numbers). */
#include <colo.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(void) {
    colo_listener *l;
    char addr[COLO_ADDRSTRLEN];
    if (colo_listen("127.0.0.1:0", NULL, &l) < 0) return 1;
    colo_listener_addr(l, addr, sizeof addr);
    colo_conn *c, *s;
    if (colo_connect(addr, NULL, &c) < 0) return 2;
    if (colo_accept(l, 0, &s, NULL, 0) < 0) return 3;
    const int n = 1000000;
    double t0 = now();
    for (int i = 0; i < n; i++) {
        colo_buf *b;
        void *d;
        if (colo_loan(c, 64, &b, &d) < 0 || colo_loan_cancel(b) < 0) return 4;
    }
    double t1 = now();
    printf("loan+cancel %.1f ns\n", (t1 - t0) / n * 1e9);
    t0 = now();
    for (int i = 0; i < n; i++) {
        colo_buf *b;
        void *d;
        colo_msg *m;
        if (colo_loan(c, 64, &b, &d) < 0) return 5;
        memset(d, 1, 64);
        if (colo_send(b, 64) < 0 || colo_recv_message(s, &m, NULL, NULL) != 1 || colo_msg_release(m) < 0) return 6;
    }
    t1 = now();
    printf("loan+send+recv+release %.1f ns\n", (t1 - t0) / n * 1e9);
    char buf[64] = {0};
    t0 = now();
    for (int i = 0; i < n; i++)
        if (colo_write_all(c, buf, 64) < 0 || colo_read(s, buf, 64) != 64) return 7;
    t1 = now();
    printf("write_all+read %.1f ns\n", (t1 - t0) / n * 1e9);
    colo_close(c);
    colo_close(s);
    colo_listener_close(l);
    return 0;
}
