/* The cross-language test peer (tests/xlang/PEER.md), C edition, on libcolo. */
#include <colo.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static colo_options opts(void) {
    colo_options o;
    colo_options_init(&o);
    o.slot_size = 4 << 20;
    o.slot_count = 8;
    return o;
}

static int fail(const char *what, long long rc) {
    fprintf(stderr, "colo-peer: %s: %s\n", what, rc < 0 ? colo_strerror((int)rc) : "failed");
    return 1;
}

/* ---- server ---- */

struct job {
    colo_conn *c;
    int msg;
};

static void *serve_conn(void *arg) {
    struct job *j = arg;
    colo_conn *c = j->c;
    if (j->msg) {
        for (;;) {
            colo_msg *m;
            const void *p;
            size_t n;
            int r = colo_recv_message(c, &m, &p, &n);
            if (r <= 0) {
                if (r < 0) fail("server recv_message", r);
                break;
            }
            colo_buf *b;
            void *d;
            r = colo_loan(c, n, &b, &d);
            if (r < 0) {
                colo_msg_release(m);
                fail("server loan", r);
                break;
            }
            memcpy(d, p, n);
            colo_msg_release(m);
            if ((r = colo_send(b, n)) < 0) {
                fail("server send", r);
                break;
            }
        }
    } else {
        static __thread char buf[256 * 1024];
        for (;;) {
            ssize_t n = colo_read(c, buf, sizeof buf);
            if (n < 0) {
                fail("server read", n);
                break;
            }
            if (n == 0) {
                colo_shutdown(c, COLO_SHUT_WR);
                break;
            }
            int r = colo_write_all(c, buf, (size_t)n);
            if (r < 0) {
                fail("server write", r);
                break;
            }
        }
    }
    colo_close(c);
    free(j);
    return NULL;
}

static int server(const char *addr, const char *mode) {
    colo_options o = opts();
    colo_listener *l;
    int r = colo_listen(addr, &o, &l);
    if (r < 0) return fail("listen", r);
    char a[COLO_ADDRSTRLEN];
    colo_listener_addr(l, a, sizeof a);
    printf("READY %s\n", a);
    fflush(stdout);
    for (;;) {
        colo_conn *c;
        if ((r = colo_accept(l, 0, &c, NULL, 0)) < 0) return fail("accept", r);
        struct job *j = malloc(sizeof *j);
        j->c = c;
        j->msg = strcmp(mode, "msg") == 0;
        pthread_t th;
        pthread_create(&th, NULL, serve_conn, j);
        pthread_detach(th);
    }
}

/* ---- clients ---- */

static const char *transport(colo_conn *c) { return colo_transport(c) == COLO_TRANSPORT_SHM ? "colo" : "tcp"; }

struct checker {
    colo_conn *c;
    uint64_t total;
    int rc;
};

static void *check_echo(void *arg) {
    struct checker *k = arg;
    static char buf[256 * 1024];
    uint64_t got = 0;
    for (;;) {
        ssize_t n = colo_read(k->c, buf, sizeof buf);
        if (n < 0) {
            k->rc = fail("client read", n);
            return NULL;
        }
        if (n == 0) break;
        for (ssize_t i = 0; i < n; i++)
            if ((uint8_t)buf[i] != (uint8_t)((got + (uint64_t)i) % 251)) {
                fprintf(stderr, "colo-peer: mismatch at byte %llu\n", (unsigned long long)(got + (uint64_t)i));
                k->rc = 1;
                return NULL;
            }
        got += (uint64_t)n;
    }
    if (got != k->total) {
        fprintf(stderr, "colo-peer: echo ended after %llu of %llu bytes\n", (unsigned long long)got, (unsigned long long)k->total);
        k->rc = 1;
    }
    return NULL;
}

static int client_stream(colo_conn *c, uint64_t total) {
    struct checker k = {c, total, 0};
    pthread_t th;
    pthread_create(&th, NULL, check_echo, &k);
    static uint8_t chunk[64 * 1024];
    for (uint64_t sent = 0; sent < total;) {
        size_t n = total - sent < sizeof chunk ? (size_t)(total - sent) : sizeof chunk;
        for (size_t i = 0; i < n; i++) chunk[i] = (uint8_t)((sent + i) % 251);
        int r = colo_write_all(c, chunk, n);
        if (r < 0) return fail("client write", r);
        sent += n;
    }
    int r = colo_shutdown(c, COLO_SHUT_WR);
    if (r < 0) return fail("client shutdown", r);
    pthread_join(th, NULL);
    return k.rc;
}

static int client_msg(colo_conn *c, uint64_t count, size_t size) {
    for (uint64_t k = 0; k < count; k++) {
        colo_buf *b;
        void *d;
        int r = colo_loan(c, size, &b, &d);
        if (r < 0) return fail("loan", r);
        for (size_t j = 0; j < size; j++) ((uint8_t *)d)[j] = (uint8_t)((k + j) % 251);
        if ((r = colo_send(b, size)) < 0) return fail("send", r);
        colo_msg *m;
        const void *p;
        size_t n;
        r = colo_recv_message(c, &m, &p, &n);
        if (r < 0) return fail("recv_message", r);
        if (r == 0) return fail("early end of stream", 0);
        int bad = n != size;
        for (size_t j = 0; !bad && j < size; j++) bad = ((const uint8_t *)p)[j] != (uint8_t)((k + j) % 251);
        colo_msg_release(m);
        if (bad) {
            fprintf(stderr, "colo-peer: message %llu differs\n", (unsigned long long)k);
            return 1;
        }
    }
    return 0;
}

static int client_halfclose(colo_conn *c) {
    int r = colo_write_all(c, "hello", 5);
    if (r < 0) return fail("write", r);
    if ((r = colo_shutdown(c, COLO_SHUT_WR)) < 0) return fail("shutdown", r);
    char buf[64];
    size_t got = 0;
    ssize_t n;
    while ((n = colo_read(c, buf + got, sizeof buf - got)) > 0) got += (size_t)n;
    if (n < 0) return fail("read", n);
    if (got != 5 || memcmp(buf, "hello", 5) != 0) {
        fprintf(stderr, "colo-peer: got %zu bytes, not \"hello\"\n", got);
        return 1;
    }
    return 0;
}

static int usage(void) {
    fprintf(stderr, "usage: colo-peer server ADDR stream|msg | client ADDR stream BYTES | client ADDR msg COUNT SIZE | client ADDR halfclose\n");
    return 2;
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    if (argc < 4) return usage();
    if (strcmp(argv[1], "server") == 0) {
        if (strcmp(argv[3], "stream") != 0 && strcmp(argv[3], "msg") != 0) return usage();
        return server(argv[2], argv[3]);
    }
    if (strcmp(argv[1], "client") != 0) return usage();
    const char *kind = argv[3];
    int is_stream = strcmp(kind, "stream") == 0, is_msg = strcmp(kind, "msg") == 0, is_half = strcmp(kind, "halfclose") == 0;
    if ((is_stream && argc != 5) || (is_msg && argc != 6) || (!is_stream && !is_msg && !is_half)) return usage();
    colo_options o = opts();
    colo_conn *c;
    int r = colo_connect(argv[2], &o, &c);
    if (r < 0) return fail("connect", r);
    unsigned long long count;
    if (is_stream) {
        count = strtoull(argv[4], NULL, 10);
        r = client_stream(c, count);
    } else if (is_msg) {
        count = strtoull(argv[4], NULL, 10);
        r = client_msg(c, count, (size_t)strtoull(argv[5], NULL, 10));
    } else {
        count = 5;
        r = client_halfclose(c);
    }
    if (r == 0) printf("OK %llu %s\n", count, transport(c));
    colo_close(c);
    return r;
}
