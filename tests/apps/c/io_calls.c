/* The I/O calls on an accelerated connection (run with the shim preloaded, as tests/apps/run.sh
 * does; also passes without it, with plain kernel semantics), built with _FORTIFY_SOURCE=2:
 * FIONREAD (EFAULT for a pointer it cannot write) and FIONBIO, O_NONBLOCK via fcntl, MSG_PEEK, MSG_WAITALL, MSG_DONTWAIT, readv/writev
 * with many iovecs (64, 1024, and more bytes than one gather buffer), sendmsg/recvmsg, recv/send,
 * recvfrom's address, FIONREAD while another thread is blocked reading, and a few MB in both
 * directions at once with a poll loop. A forked peer serves commands. alarm() is the watchdog. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "scenario.h"

/* Two different byte streams: `a` from us to the peer, `b` from the peer to us. */
static unsigned char pa(long i) { return (unsigned char)((i * 2654435761u) >> 13); }
static unsigned char pb(long i) { return (unsigned char)((i * 40503u + 17) >> 5); }

/* ---- the peer ------------------------------------------------------------------------------
 * Commands: 1 byte, then 32-bit arguments.
 *   'S' n      send n bytes of pb(0..n) in one write
 *   'W' k n    send k writes of n bytes of pb(...) 30 ms apart
 *   'E' n      read n bytes, then write them back
 *   'B' n      send n bytes of pb while receiving n bytes of pa (threads); then one status byte
 *   'Q'        quit */
static int psock;
static long bidir_n;

static void *peer_sender(void *arg) {
    (void)arg;
    static unsigned char buf[65536];
    long at = 0;
    while (at < bidir_n) {
        long k = bidir_n - at < (long)sizeof buf ? bidir_n - at : (long)sizeof buf;
        for (long i = 0; i < k; i++) buf[i] = pb(at + i);
        write_all(psock, buf, k);
        at += k;
    }
    return NULL;
}

static void peer(int port) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(c, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    psock = c;
    static unsigned char buf[1 << 20];
    char cmd;
    while (read(c, &cmd, 1) == 1) {
        uint32_t arg[2] = {0, 0};
        if (cmd == 'Q') break;
        int nargs = cmd == 'W' ? 2 : 1;
        if (read_full(c, arg, 4 * nargs) < 0) die("peer args");
        if (cmd == 'S') {
            for (uint32_t i = 0; i < arg[0]; i++) buf[i] = pb(i);
            write_all(c, buf, arg[0]);
        } else if (cmd == 'W') {
            long at = 0;
            for (uint32_t j = 0; j < arg[0]; j++) {
                usleep(30000);
                for (uint32_t i = 0; i < arg[1]; i++) buf[i] = pb(at + i);
                write_all(c, buf, arg[1]);
                at += arg[1];
            }
        } else if (cmd == 'E') {
            unsigned char *e = malloc(arg[0]);
            if (read_full(c, e, arg[0]) < 0) die("peer echo read");
            write_all(c, e, arg[0]);
            free(e);
        } else if (cmd == 'B') {
            bidir_n = arg[0];
            pthread_t t;
            pthread_create(&t, NULL, peer_sender, NULL);
            long at = 0;
            int bad = 0;
            while (at < bidir_n) {
                ssize_t n = read(c, buf, sizeof buf);
                if (n <= 0) die("peer bidir read");
                for (ssize_t i = 0; i < n; i++)
                    if (buf[i] != pa(at + i)) bad = 1;
                at += n;
            }
            pthread_join(t, NULL);
            write_all(c, bad ? "N" : "Y", 1);
        }
    }
    exit(0);
}

static int s;

static void ask(char cmd, uint32_t a, uint32_t b) {
    char m[9];
    m[0] = cmd;
    memcpy(m + 1, &a, 4);
    memcpy(m + 5, &b, 4);
    write_all(s, m, cmd == 'W' ? 9 : cmd == 'Q' ? 1 : 5);
}

static int check_pb(const unsigned char *p, long n, long from) {
    for (long i = 0; i < n; i++)
        if (p[i] != pb(from + i)) return 0;
    return 1;
}

static void wait_readable(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    poll(&p, 1, 5000);
}

/* FIONREAD until it reports `want` bytes (they may arrive in pieces), at most 5 s. */
static int fionread_reaches(int fd, int want) {
    double end = now() + 5;
    int n = -1;
    while (now() < end) {
        if (ioctl(fd, FIONREAD, &n) != 0) return -1;
        if (n >= want) return n;
        usleep(1000);
    }
    return n;
}

static void *blocked_reader(void *arg) {
    char b[16];
    ssize_t n = read(s, b, sizeof b);
    *(ssize_t *)arg = n;
    return NULL;
}

int main(void) {
    alarm(60);
    signal(SIGPIPE, SIG_IGN);
    struct sockaddr_in a;
    int l = loopback_listener(&a, 1);
    pid_t pid = fork();
    if (pid == 0) {
        close(l);
        peer(ntohs(a.sin_port));
    }
    s = accept(l, NULL, NULL);
    if (s < 0) die("accept");
    if (shimmed()) CHECK(segments() == 1, "connection accelerated");
    static unsigned char buf[1 << 20];
    char small[64];
    int n;
    ssize_t r;

    /* FIONREAD. */
    CHECK(ioctl(s, FIONREAD, &n) == 0 && n == 0, "FIONREAD 0 when empty");
    ask('S', 1000, 0);
    CHECK(fionread_reaches(s, 1000) == 1000, "FIONREAD counts what arrived");
    CHECK(read_full(s, buf, 1000) == 0 && check_pb(buf, 1000, 0), "the bytes FIONREAD counted");
    CHECK(ioctl(s, FIONREAD, &n) == 0 && n == 0, "FIONREAD 0 after reading");
    /* A pointer the program cannot write: the kernel answers EFAULT, the program lives on. */
    void *ro = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(ro != MAP_FAILED, "a read-only page");
    errno = 0;
    CHECK(ioctl(s, FIONREAD, (int *)ro) < 0 && errno == EFAULT, "FIONREAD into a read-only page: EFAULT");
    errno = 0;
    CHECK(ioctl(s, FIONREAD, (int *)8) < 0 && errno == EFAULT, "FIONREAD into an unmapped address: EFAULT");
    munmap(ro, 4096);

    /* FIONBIO. */
    int on = 1, off = 0;
    CHECK(ioctl(s, FIONBIO, &on) == 0, "FIONBIO on");
    CHECK((fcntl(s, F_GETFL) & O_NONBLOCK) != 0, "FIONBIO shows in F_GETFL");
    r = read(s, small, sizeof small);
    CHECK(r < 0 && errno == EAGAIN, "non-blocking (FIONBIO) read: EAGAIN");
    r = recv(s, small, sizeof small, 0);
    CHECK(r < 0 && errno == EAGAIN, "non-blocking (FIONBIO) recv: EAGAIN");
    CHECK(ioctl(s, FIONBIO, &off) == 0 && (fcntl(s, F_GETFL) & O_NONBLOCK) == 0, "FIONBIO off");

    /* O_NONBLOCK via fcntl. */
    int fl = fcntl(s, F_GETFL);
    CHECK(fcntl(s, F_SETFL, fl | O_NONBLOCK) == 0, "F_SETFL O_NONBLOCK");
    r = read(s, small, sizeof small);
    CHECK(r < 0 && errno == EAGAIN, "non-blocking (fcntl) read: EAGAIN");
    struct iovec iv = {small, sizeof small};
    r = readv(s, &iv, 1);
    CHECK(r < 0 && errno == EAGAIN, "non-blocking readv: EAGAIN");
    ask('S', 10, 0);
    wait_readable(s);
    r = read(s, small, sizeof small);
    CHECK(r > 0 && r <= 10 && check_pb((unsigned char *)small, r, 0), "non-blocking read of what arrived");
    if (r > 0 && r < 10) {
        wait_readable(s);
        r = read(s, small, 10 - r);
    }
    CHECK(fcntl(s, F_SETFL, fl) == 0 && (fcntl(s, F_GETFL) & O_NONBLOCK) == 0, "blocking again");

    /* MSG_DONTWAIT on a blocking socket; the socket stays blocking. */
    r = recv(s, small, sizeof small, MSG_DONTWAIT);
    CHECK(r < 0 && errno == EAGAIN, "MSG_DONTWAIT recv: EAGAIN");
    r = recv(s, small, sizeof small, MSG_DONTWAIT | MSG_PEEK);
    CHECK(r < 0 && errno == EAGAIN, "MSG_DONTWAIT|MSG_PEEK recv: EAGAIN");
    ask('W', 1, 20);
    r = recv(s, small, 20, 0); /* blocks ~30 ms */
    CHECK(r > 0 && check_pb((unsigned char *)small, r, 0), "blocking recv after MSG_DONTWAIT");
    if (r > 0 && r < 20) read_full(s, small, 20 - r);
    ask('E', 5, 0);
    r = send(s, "hello", 5, MSG_DONTWAIT);
    CHECK(r == 5, "MSG_DONTWAIT send");
    CHECK(read_full(s, small, 5) == 0 && memcmp(small, "hello", 5) == 0, "echo of the MSG_DONTWAIT send");

    /* MSG_PEEK: the data stays. */
    ask('S', 100, 0);
    CHECK(fionread_reaches(s, 100) == 100, "100 bytes arrived");
    r = recv(s, buf, 100, MSG_PEEK);
    CHECK(r == 100 && check_pb(buf, 100, 0), "MSG_PEEK sees the data");
    r = recv(s, buf, 50, MSG_PEEK);
    CHECK(r == 50 && check_pb(buf, 50, 0), "a second MSG_PEEK sees it again");
    CHECK(ioctl(s, FIONREAD, &n) == 0 && n == 100, "FIONREAD unchanged by MSG_PEEK");
    memset(buf, 0, 100);
    CHECK(read_full(s, buf, 100) == 0 && check_pb(buf, 100, 0), "read after MSG_PEEK gets the same bytes");

    /* MSG_WAITALL across several writes of the peer. */
    ask('W', 3, 1000);
    r = recv(s, buf, 3000, MSG_WAITALL);
    CHECK(r == 3000 && check_pb(buf, 3000, 0), "MSG_WAITALL: one call returns all 3 writes");
    ask('W', 2, 700);
    struct msghdr m = {0};
    struct iovec wv[2] = {{buf, 1000}, {buf + 1000, 400}};
    m.msg_iov = wv;
    m.msg_iovlen = 2;
    r = recvmsg(s, &m, MSG_WAITALL);
    CHECK(r == 1400 && check_pb(buf, 1400, 0), "recvmsg MSG_WAITALL over two iovecs");

    /* writev/readv with 64 iovecs of different sizes, echoed. */
    struct iovec v[1024];
    unsigned char *out = malloc(4 << 20), *in = malloc(4 << 20);
    long total = 0;
    for (int i = 0; i < 64; i++) {
        v[i].iov_base = out + total;
        v[i].iov_len = i * 37 + 1;
        total += v[i].iov_len;
    }
    for (long i = 0; i < total; i++) out[i] = pa(i);
    ask('E', total, 0);
    CHECK(writev(s, v, 64) == total, "writev of 64 iovecs");
    long got = 0;
    while (got < total) {
        struct iovec rv[64];
        long at = got;
        int cnt = 0;
        for (int i = 0; i < 64 && at < total; i++) {
            long sz = (i % 7) * 13 + 1;
            if (sz > total - at) sz = total - at;
            rv[i].iov_base = in + at;
            rv[i].iov_len = sz;
            at += sz;
            cnt++;
        }
        r = readv(s, rv, cnt);
        if (r <= 0) break;
        got += r;
    }
    CHECK(got == total && memcmp(in, out, total) == 0, "readv with 64 iovecs gets the echo intact");

    /* 1024 iovecs (IOV_MAX), and a blocking writev of more than 1 MiB: all of it is written. */
    total = 0;
    for (int i = 0; i < 1024; i++) {
        v[i].iov_base = out + total;
        v[i].iov_len = 1500 + (i % 3) * 700;
        total += v[i].iov_len;
    }
    for (long i = 0; i < total; i++) out[i] = pa(i * 3);
    ask('E', total, 0);
    r = writev(s, v, 1024);
    CHECK(r == total, "blocking writev of 1024 iovecs (>1 MiB) writes everything");
    if (r > 0 && r < total) write_all(s, out + r, total - r);
    CHECK(read_full(s, in, total) == 0 && memcmp(in, out, total) == 0, "echo of the big writev");

    /* sendmsg/recvmsg; recvfrom and recvmsg report no address on a connected TCP socket. */
    struct iovec sv[3] = {{"abc", 3}, {"", 0}, {"defgh", 5}};
    memset(&m, 0, sizeof m);
    m.msg_iov = sv;
    m.msg_iovlen = 3;
    ask('E', 8, 0);
    CHECK(sendmsg(s, &m, 0) == 8, "sendmsg with 3 iovecs");
    char r1[3], r2[16];
    struct iovec rv2[2] = {{r1, 3}, {r2, sizeof r2}};
    struct sockaddr_in from;
    memset(&m, 0, sizeof m);
    m.msg_iov = rv2;
    m.msg_iovlen = 2;
    m.msg_name = &from;
    m.msg_namelen = sizeof from;
    wait_readable(s);
    CHECK(fionread_reaches(s, 8) == 8, "echo arrived");
    r = recvmsg(s, &m, 0);
    CHECK(r == 8 && memcmp(r1, "abc", 3) == 0 && memcmp(r2, "defgh", 5) == 0, "recvmsg scatters");
    CHECK(m.msg_namelen == 0, "recvmsg: no address for a connected stream socket");
    CHECK(m.msg_flags == 0, "recvmsg: no flags");
    ask('E', 4, 0);
    CHECK(send(s, "wxyz", 4, 0) == 4, "send");
    socklen_t fl2 = sizeof from;
    CHECK(fionread_reaches(s, 4) == 4, "echo arrived (recvfrom)");
    r = recvfrom(s, small, sizeof small, 0, (struct sockaddr *)&from, &fl2);
    CHECK(r == 4 && memcmp(small, "wxyz", 4) == 0, "recvfrom");
    CHECK(fl2 == 0, "recvfrom: no address for a connected stream socket");

    /* FIONREAD does not wait for a thread blocked in read. */
    ssize_t tr = -2;
    pthread_t t;
    pthread_create(&t, NULL, blocked_reader, &tr);
    usleep(50000);
    /* A FIONREAD that waited for the reader would never return: the data it would wait for is
     * asked for only after it (the alarm() watchdog ends the test). */
    CHECK(ioctl(s, FIONREAD, &n) == 0 && n == 0, "FIONREAD while another thread reads");
    ask('S', 3, 0);
    pthread_join(t, NULL);
    CHECK(tr > 0 && tr <= 3, "the blocked reader got the data");
    if (tr > 0 && tr < 3) read_full(s, small, 3 - tr);

    /* A few MB both ways at once, non-blocking with poll. */
    long big = 6 << 20;
    ask('B', big, 0);
    fcntl(s, F_SETFL, fl | O_NONBLOCK);
    long sent = 0, recvd = 0;
    int bad = 0;
    double start = now();
    while (sent < big || recvd < big) {
        struct pollfd p = {.fd = s, .events = (sent < big ? POLLOUT : 0) | (recvd < big ? POLLIN : 0)};
        if (poll(&p, 1, 10000) != 1) {
            CHECK(0, "bidirectional: poll timed out");
            break;
        }
        if (p.revents & POLLOUT) {
            long k = big - sent < 65536 ? big - sent : 65536;
            for (long i = 0; i < k; i++) out[i] = pa(sent + i);
            r = send(s, out, k, 0);
            if (r > 0) sent += r;
            else if (!(r < 0 && errno == EAGAIN)) {
                CHECK(0, "bidirectional: send");
                break;
            }
        }
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
            long want = big - recvd < (long)sizeof buf ? big - recvd : (long)sizeof buf;
            r = recv(s, buf, want, 0);
            if (r > 0) {
                if (!check_pb(buf, r, recvd)) bad = 1;
                recvd += r;
            } else if (!(r < 0 && errno == EAGAIN)) {
                CHECK(0, "bidirectional: recv");
                break;
            }
        }
    }
    double secs = now() - start;
    CHECK(!bad && recvd == big, "bidirectional: our side received everything intact");
    fcntl(s, F_SETFL, fl);
    char status = 0;
    CHECK(read_full(s, &status, 1) == 0 && status == 'Y', "bidirectional: the peer received everything intact");

    ask('Q', 0, 0);
    char b;
    CHECK(read(s, &b, 1) == 0, "EOF after the peer quits");
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "peer exit");
    if (failures == 0)
        printf("ok: FIONREAD, FIONBIO, O_NONBLOCK, MSG_DONTWAIT/PEEK/WAITALL, readv/writev (64, 1024 iovecs), "
               "sendmsg/recvmsg, 2 x %ld MB both ways in %.2f s%s\n",
               big >> 20, secs, shimmed() ? " (accelerated)" : "");
    return failures != 0;
}
