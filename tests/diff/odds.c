/* Calls the other programs leave out: a connection as sendfile's or splice's input, tee, TCP_INQ,
 * a listener shut down, /proc/self/fdinfo and fstat of a connection, MSG_WAITALL and send cut by
 * a signal, recvfrom's address lengths, connect(AF_UNSPEC), O_ASYNC, SO_TIMESTAMP, SO_ZEROCOPY. */
#include "diff.h"
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <pthread.h>
#include <linux/errqueue.h>
#include <sys/time.h>

static void on_signal(int sig) { (void)sig; }

static void socket_as_input(void) {
    /* The connection is what sendfile, splice and copy_file_range read. */
    int s, c, p[2];
    char b[32] = {0};
    pair(&s, &c);
    if (pipe(p) < 0) die("pipe");
    send(c, "hello world", 11, 0);
    settle(50);
    fcntl(s, F_SETFL, O_NONBLOCK);
    T("sendfile socket -> pipe", sendfile(p[1], s, NULL, 5));
    T("read the pipe", read(p[0], b, sizeof b));
    say("  bytes '%.5s'", b);
    char path[] = "/tmp/colo-diff-odd.XXXXXX";
    int f = mkstemp(path);
    unlink(path);
    T("sendfile socket -> file", sendfile(f, s, NULL, 3));
    loff_t o = 0;
    T("copy_file_range socket -> file", copy_file_range(s, NULL, f, &o, 3, 0));
    T("copy_file_range file -> socket", copy_file_range(f, &o, s, NULL, 3, 0));
    T("splice socket -> pipe, MORE", splice(s, NULL, p[1], NULL, 3, SPLICE_F_MORE));
    T("tee pipe -> pipe", ({ int q[2]; pipe(q); tee(p[0], q[1], 3, SPLICE_F_NONBLOCK); }));
    T("tee socket -> pipe", tee(s, p[1], 3, SPLICE_F_NONBLOCK));
    T("tee pipe -> socket", tee(p[0], s, 3, SPLICE_F_NONBLOCK));
    memset(b, 0, sizeof b);
    T("read the pipe", read(p[0], b, sizeof b));
    say("  bytes '%s'", b);
    T("recv the rest", recv(s, b, sizeof b, 0));
    say("  bytes '%.3s'", b);
    T("sendfile empty non-blocking socket -> pipe", sendfile(p[1], s, NULL, 5));
    shutdown(c, SHUT_WR);
    settle(50);
    T("sendfile socket at its end -> pipe", sendfile(p[1], s, NULL, 5));
}

static void splice_pipe_full(void) {
    /* socket -> a full pipe: SPLICE_F_NONBLOCK says EAGAIN, and the bytes stay in the socket. */
    int s, c, p[2];
    char b[8] = {0};
    pair(&s, &c);
    if (pipe2(p, O_NONBLOCK) < 0) die("pipe");
    static char big[1 << 20];
    long n = 0;
    ssize_t k;
    while ((k = write(p[1], big, sizeof big)) > 0) n += k;
    send(c, "abc", 3, 0);
    settle(50);
    T("splice into a full pipe, NONBLOCK", splice(s, NULL, p[1], NULL, 3, SPLICE_F_NONBLOCK));
    T("splice into a full non-blocking pipe", splice(s, NULL, p[1], NULL, 3, 0));
    T("recv", recv(s, b, sizeof b, MSG_DONTWAIT));
    say("  bytes '%.3s'", b);
    T("splice socket -> socket", splice(s, NULL, c, NULL, 3, 0));
    T("splice of 0", splice(s, NULL, p[1], NULL, 0, 0));
}

/* recvmsg of 4 bytes with `room` bytes of control buffer: the count, and the TCP_CM_INQ it
 * carried, the control length and the flags the kernel set. */
static void recv_inq(int s, size_t room) {
    char b[4];
    union { char buf[64]; struct cmsghdr align; } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct iovec io = {b, sizeof b};
    struct msghdr m = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = room ? ctl.buf : NULL, .msg_controllen = room};
    errno = 0;
    ssize_t r = recvmsg(s, &m, MSG_DONTWAIT);
    if (r < 0) {
        say("  recvmsg 4 (control %zu) = -1 %s", room, ename(errno));
        return;
    }
    int inq = -1, n = 0;
    if (m.msg_controllen >= sizeof(struct cmsghdr)) {
        for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h)) {
            n++;
            if (h->cmsg_level == IPPROTO_TCP && h->cmsg_type == TCP_CM_INQ && h->cmsg_len >= CMSG_LEN(sizeof inq))
                memcpy(&inq, CMSG_DATA(h), sizeof inq);
        }
    }
    say("  recvmsg 4 (control %zu) = %zd: cmsgs %d, inq %d, controllen %zu, cmsg_len %zu, flags %x", room, r, n, inq,
        (size_t)m.msg_controllen, (size_t)ctl.align.cmsg_len, m.msg_flags);
}

static void tcp_inq(void) {
    /* TCP_INQ: recvmsg carries the bytes left to read in a TCP_CM_INQ message (1 at the end of
     * the stream), truncated to the control buffer given. */
    int s, c, one = 1;
    pair(&s, &c);
    send(c, "0123456789abcdefghij", 20, 0);
    settle(50);
    recv_inq(s, 64);
    T("setsockopt TCP_INQ", setsockopt(s, IPPROTO_TCP, TCP_INQ, &one, sizeof one));
    int v = -1;
    socklen_t len = sizeof v;
    T("getsockopt TCP_INQ", getsockopt(s, IPPROTO_TCP, TCP_INQ, &v, &len));
    say("  TCP_INQ = %d", v);
    recv_inq(s, 64);
    recv_inq(s, 0);
    recv_inq(s, 8);
    recv_inq(s, 18);
    recv_inq(s, 64);
    recv_inq(s, 64);
    shutdown(c, SHUT_WR);
    settle(50);
    recv_inq(s, 64);
    recv_inq(s, 64);
    /* FIN with bytes pending: the count includes the FIN (the kernel's rcv_nxt - copied_seq). */
    say("  FIN with bytes pending:");
    pair(&s, &c);
    T("setsockopt TCP_INQ", setsockopt(s, IPPROTO_TCP, TCP_INQ, &one, sizeof one));
    send(c, "0123456789", 10, 0);
    shutdown(c, SHUT_WR);
    settle(50);
    for (int i = 0; i < 5; i++) recv_inq(s, 64);
}

static void tcp_inq_set_by_a_fork_child(void) {
    /* TCP_INQ is the socket's: set by a fork child, the parent's recvmsg carries TCP_CM_INQ. */
    int s, c, one = 1;
    pair(&s, &c);
    send(c, "0123456789", 10, 0);
    settle(50);
    pid_t p = fork();
    if (p == 0) {
        setsockopt(s, IPPROTO_TCP, TCP_INQ, &one, sizeof one);
        _exit(0);
    }
    waitpid(p, NULL, 0);
    recv_inq(s, 64);
}

static void tcp_inq_from_the_listener(void) {
    /* TCP_INQ set on a listener is its accepted connections' (the kernel copies it at accept);
     * cleared on the connection later, recvmsg carries no TCP_CM_INQ. */
    struct sockaddr_in a;
    int l = listener(&a), one = 1, zero = 0;
    T("setsockopt listener TCP_INQ", setsockopt(l, IPPROTO_TCP, TCP_INQ, &one, sizeof one));
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    int s = accept(l, NULL, NULL);
    if (s < 0) die("accept");
    char x = 'x';
    if (write(c, &x, 1) != 1 || read(s, &x, 1) != 1 || write(s, &x, 1) != 1 || read(c, &x, 1) != 1) die("settle");
    __atomic_add_fetch(diff_conns, 1, __ATOMIC_SEQ_CST);
    send(c, "0123456789", 10, 0);
    settle(50);
    recv_inq(s, 64);
    recv_inq(s, 64);
    T("setsockopt TCP_INQ 0", setsockopt(s, IPPROTO_TCP, TCP_INQ, &zero, sizeof zero));
    recv_inq(s, 64);
    close(l);
}

/* The blocked accept's errno (0: it returned a connection), said after the join. */
static int accept_errno;

static void *accept_blocked(void *l) {
    errno = 0;
    int r = accept(*(int *)l, NULL, NULL);
    accept_errno = r < 0 ? errno : 0;
    return NULL;
}

static void listener_shutdown(void) {
    /* shutdown on a listening socket stops it listening; a blocked accept wakes. */
    struct sockaddr_in a;
    int l = listener(&a);
    int s, c;
    pair(&s, &c);
    pthread_t t;
    pthread_create(&t, NULL, accept_blocked, &l);
    settle(200);
    T("shutdown listener SHUT_RD", shutdown(l, SHUT_RD));
    pthread_join(t, NULL);
    say("  blocked accept = %s", accept_errno ? ename(accept_errno) : "a connection");
    T("accept after", accept(l, NULL, NULL));
    int nc = socket(AF_INET, SOCK_STREAM, 0);
    T("connect to it", connect(nc, (struct sockaddr *)&a, sizeof a));
    int v = -1;
    socklen_t len = sizeof v;
    getsockopt(l, SOL_SOCKET, SO_ACCEPTCONN, &v, &len);
    say("  SO_ACCEPTCONN = %d", v);
    int fresh = socket(AF_INET, SOCK_STREAM, 0);
    T("shutdown never connected", shutdown(fresh, SHUT_WR));
    T("listen again", listen(l, 4));
}

static const char *fdinfo_flags(int fd) {
    static char out[64];
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/self/fdinfo/%d", fd);
    FILE *f = fopen(path, "r");
    strcpy(out, "?");
    while (f && fgets(line, sizeof line, f)) {
        unsigned long fl;
        if (sscanf(line, "flags: %lo", &fl) == 1) snprintf(out, sizeof out, "nonblock %s cloexec %s", fl & O_NONBLOCK ? "yes" : "no", fl & O_CLOEXEC ? "yes" : "no");
    }
    if (f) fclose(f);
    return out;
}

static void fd_looks(void) {
    /* What fstat and /proc/self/fdinfo say of a connection, as its flags change. */
    int s, c;
    pair(&s, &c);
    struct stat a, b;
    fstat(s, &a);
    say("  socket: %s", S_ISSOCK(a.st_mode) ? "yes" : "no");
    say("  fdinfo: %s", fdinfo_flags(s));
    fcntl(s, F_SETFL, O_NONBLOCK);
    say("  fdinfo after O_NONBLOCK: %s", fdinfo_flags(s));
    ioctl(s, FIONBIO, &(int){0});
    say("  fdinfo after FIONBIO 0: %s", fdinfo_flags(s));
    fcntl(s, F_SETFD, FD_CLOEXEC);
    say("  fdinfo after FD_CLOEXEC: %s", fdinfo_flags(s));
    send(c, "ab", 2, 0);
    char x[2];
    recv(s, x, 2, 0);
    fstat(s, &b);
    say("  same inode after use: %s", a.st_ino == b.st_ino && a.st_dev == b.st_dev ? "yes" : "no");
    int d = dup(s);
    fstat(d, &b);
    say("  dup same inode: %s", a.st_ino == b.st_ino ? "yes" : "no");
    struct stat pc, ps;
    fstat(c, &pc);
    fstat(s, &ps);
    say("  ends differ: %s", pc.st_ino != ps.st_ino ? "yes" : "no");
    char path[64], link[64] = {0};
    snprintf(path, sizeof path, "/proc/self/fd/%d", s);
    ssize_t n = readlink(path, link, sizeof link - 1);
    char want[64];
    snprintf(want, sizeof want, "socket:[%lu]", (unsigned long)a.st_ino);
    say("  /proc/self/fd names its inode: %s", n > 0 && strcmp(link, want) == 0 ? "yes" : "no");
}

static void waitall_signal(void) {
    /* MSG_WAITALL interrupted by a signal after a partial read: the bytes read, not EINTR. */
    int s, c;
    char b[8] = {0};
    pair(&s, &c);
    struct sigaction sa = {.sa_handler = on_signal, .sa_flags = 0};
    sigaction(SIGUSR1, &sa, NULL);
    pid_t me = getpid(), p = fork();
    if (p == 0) {
        send(c, "abc", 3, 0);
        settle(300);
        kill(me, SIGUSR1);
        _exit(0);
    }
    T("recv 8 WAITALL (no SA_RESTART)", recv(s, b, sizeof b, MSG_WAITALL));
    say("  bytes '%s'", b);
    waitpid(p, NULL, 0);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    p = fork();
    if (p == 0) {
        send(c, "def", 3, 0);
        settle(300);
        kill(me, SIGUSR1);
        settle(300);
        send(c, "ghijk", 5, 0);
        _exit(0);
    }
    memset(b, 0, sizeof b);
    T("recv 8 WAITALL (SA_RESTART)", recv(s, b, sizeof b, MSG_WAITALL));
    say("  bytes '%.8s'", b);
    waitpid(p, NULL, 0);
}

static void send_cut_by_signal(void) {
    /* A blocking send that fills the peer's buffers, then a signal: the bytes it moved, not a
     * restart, SA_RESTART or not (and a writev as well). */
    int s, c;
    pair(&s, &c);
    static char big[32 << 20];
    pid_t me = getpid();
    for (int restart = 0; restart < 2; restart++) {
        struct sigaction sa = {.sa_handler = on_signal, .sa_flags = restart ? SA_RESTART : 0};
        sigaction(SIGUSR1, &sa, NULL);
        for (int vec = 0; vec < 2; vec++) {
            pid_t p = fork();
            if (p == 0) {
                settle(300);
                kill(me, SIGUSR1);
                _exit(0);
            }
            struct iovec io[2] = {{big, sizeof big / 2}, {big + sizeof big / 2, sizeof big / 2}};
            errno = 0;
            ssize_t n = vec ? writev(c, io, 2) : send(c, big, sizeof big, 0);
            say("  %s%s: %s", vec ? "writev" : "send", restart ? " (SA_RESTART)" : "",
                n > 0 && n < (ssize_t)sizeof big ? "partial" : n < 0 ? ename(errno) : "all");
            waitpid(p, NULL, 0);
            /* Drain what was sent, so that the next send starts on empty buffers. */
            fcntl(s, F_SETFL, O_NONBLOCK);
            long got = 0;
            while (got < n) {
                ssize_t k = recv(s, big, sizeof big, 0);
                if (k > 0) got += k; else settle(1);
            }
            fcntl(s, F_SETFL, 0);
        }
    }
}

static void recvfrom_lengths(void) {
    /* recvfrom's address out-parameters on a stream: the length set to 0; a length it cannot
     * read (NULL) or a negative one fails the call after the read (the byte is gone). */
    int s, c;
    char b[2] = {0};
    pair(&s, &c);
    send(c, "abcde", 5, 0);
    settle(50);
    struct sockaddr_in a;
    socklen_t len = 3;
    memset(&a, 0x55, sizeof a);
    T("recvfrom, length 3", recvfrom(s, b, 1, 0, (struct sockaddr *)&a, &len));
    say("  '%s', length %u, family untouched: %s", b, len, a.sin_family == 0x5555 ? "yes" : "no");
    T("recvfrom, NULL length", recvfrom(s, b, 1, 0, (struct sockaddr *)&a, NULL));
    len = (socklen_t)-1;
    T("recvfrom, length -1", recvfrom(s, b, 1, 0, (struct sockaddr *)&a, &len));
    len = 16;
    T("recvfrom, NULL address", recvfrom(s, b, 1, 0, NULL, &len));
    say("  '%s', length %u", b, len);
    T("recvfrom, NULL length, the last byte", recvfrom(s, b, 1, MSG_DONTWAIT, (struct sockaddr *)&a, NULL));
    T("recvfrom, NULL length, nothing there", recvfrom(s, b, 1, MSG_DONTWAIT, (struct sockaddr *)&a, NULL));
    T("recv, nothing there", recv(s, b, 1, MSG_DONTWAIT));
}

static volatile sig_atomic_t got_io;
static void on_io(int sig) { (void)sig; got_io++; }

static void connect_unspec(void) {
    /* connect(AF_UNSPEC) on a connected socket disconnects it. */
    int s, c;
    char b[8];
    pair(&s, &c);
    send(s, "ab", 2, 0);
    settle(50);
    struct sockaddr sa = {.sa_family = AF_UNSPEC};
    T("connect AF_UNSPEC", connect(c, &sa, sizeof sa));
    T("recv after", recv(c, b, sizeof b, MSG_DONTWAIT));
    T("send after", send(c, "x", 1, MSG_NOSIGNAL));
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    T("getpeername after", getpeername(c, (struct sockaddr *)&a, &len));
    mask("poll after", pmask(c));
    settle(50);
    mask("peer poll", pmask(s));
    T("peer recv", recv(s, b, sizeof b, MSG_DONTWAIT));
    T("peer send", send(s, "x", 1, MSG_NOSIGNAL));
}

static void sigio(void) {
    /* O_ASYNC with F_SETOWN: SIGIO when bytes arrive. */
    int s, c;
    pair(&s, &c);
    signal(SIGIO, on_io);
    T("F_SETOWN", fcntl(s, F_SETOWN, getpid()));
    T("F_SETFL O_ASYNC", fcntl(s, F_SETFL, O_ASYNC | O_NONBLOCK));
    say("  O_ASYNC kept: %s", fcntl(s, F_GETFL) & O_ASYNC ? "yes" : "no");
    got_io = 0;
    send(c, "ab", 2, 0);
    settle(100);
    say("  SIGIO on data: %s", got_io ? "yes" : "no");
}

static void timestamps(void) {
    /* SO_TIMESTAMP: recvmsg carries the time the bytes arrived. */
    int s, c, one = 1;
    pair(&s, &c);
    T("SO_TIMESTAMP", setsockopt(s, SOL_SOCKET, SO_TIMESTAMP, &one, sizeof one));
    /* The kernel turns its receive stamps on a moment later (a deferred static key). */
    settle(200);
    send(c, "ab", 2, 0);
    settle(50);
    char b[4], ctl[64];
    struct iovec io = {b, sizeof b};
    struct msghdr m = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
    T("recvmsg", recvmsg(s, &m, 0));
    struct cmsghdr *h = m.msg_controllen ? CMSG_FIRSTHDR(&m) : NULL;
    struct timeval now;
    gettimeofday(&now, NULL);
    if (h) {
        struct timeval tv;
        memcpy(&tv, CMSG_DATA(h), sizeof tv);
        say("  cmsg %d/%d, recent: %s", h->cmsg_level, h->cmsg_type, now.tv_sec - tv.tv_sec < 10 ? "yes" : "no");
    } else say("  no cmsg");
}

static volatile sig_atomic_t pipes;
static void on_pipe(int sig) { (void)sig; pipes++; }
static void pipe_signals(void) {
    /* SIGPIPE and EPIPE from splice, sendfile, writev and sendmsg after SHUT_WR and after the
     * peer closed. */
    int s, c, p[2];
    pair(&s, &c);
    signal(SIGPIPE, on_pipe);
    if (pipe(p) < 0) die("pipe");
    char path[] = "/tmp/colo-diff-ps.XXXXXX";
    int f = mkstemp(path);
    unlink(path);
    if (write(f, "0123456789", 10) != 10) die("write");
    shutdown(c, SHUT_WR);
    if (write(p[1], "abc", 3) != 3) die("write");
    T("splice pipe -> socket after SHUT_WR", splice(p[0], NULL, c, NULL, 3, 0));
    say("  SIGPIPE %d", pipes);
    off_t off = 0;
    T("sendfile after SHUT_WR", sendfile(c, f, &off, 4));
    say("  SIGPIPE %d", pipes);
    T("writev after SHUT_WR", writev(c, &(struct iovec){"x", 1}, 1));
    say("  SIGPIPE %d", pipes);
    T("sendmsg NOSIGNAL after SHUT_WR", sendmsg(c, &(struct msghdr){.msg_iov = &(struct iovec){"x", 1}, .msg_iovlen = 1}, MSG_NOSIGNAL));
    say("  SIGPIPE %d", pipes);
    int s2, c2;
    pair(&s2, &c2);
    close(s2);
    settle(50);
    off = 0;
    T("sendfile after the peer closed", sendfile(c2, f, &off, 4));
    settle(50);
    T("sendfile again", sendfile(c2, f, &off, 4));
    say("  SIGPIPE %d, offset %ld", pipes, (long)off);
    if (write(p[1], "abc", 3) != 3) die("write");
    T("splice to it", splice(p[0], NULL, c2, NULL, 3, 0));
    say("  SIGPIPE %d", pipes);
}
static void zerocopy(void) {
    /* SO_ZEROCOPY and MSG_ZEROCOPY: the send's notification on the error queue. */
    int s, c, one = 1;
    char b[16];
    pair(&s, &c);
    T("setsockopt SO_ZEROCOPY", setsockopt(c, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof one));
    T("send MSG_ZEROCOPY", send(c, "hello", 5, MSG_ZEROCOPY));
    T("send MSG_ZEROCOPY", send(c, "world", 5, MSG_ZEROCOPY));
    settle(100);
    mask("poll sender", pmask(c));
    T("recv", recv(s, b, sizeof b, 0));
    char ctl[128];
    struct msghdr m = {.msg_control = ctl, .msg_controllen = sizeof ctl};
    errno = 0;
    ssize_t r = recvmsg(c, &m, MSG_ERRQUEUE | MSG_DONTWAIT);
    say("  recvmsg ERRQUEUE = %zd %s", r, r < 0 ? ename(errno) : "");
    struct cmsghdr *h = r < 0 ? NULL : CMSG_FIRSTHDR(&m);
    if (h) {
        struct sock_extended_err *e = (void *)CMSG_DATA(h);
        say("  cmsg level %d type %d: errno %u origin %u info %u data %u", h->cmsg_level, h->cmsg_type, e->ee_errno, e->ee_origin, e->ee_info, e->ee_data);
    }
    mask("poll sender after", pmask(c));
}

int main(void) {
    diff_begin();
    RUN(socket_as_input);
    RUN(splice_pipe_full);
    RUN(tcp_inq);
    RUN(tcp_inq_set_by_a_fork_child);
    RUN(tcp_inq_from_the_listener);
    RUN(listener_shutdown);
    RUN(fd_looks);
    RUN(waitall_signal);
    RUN(send_cut_by_signal);
    RUN(recvfrom_lengths);
    RUN(connect_unspec);
    RUN(sigio);
    RUN(timestamps);
    RUN(pipe_signals);
    RUN(zerocopy);
    diff_end();
    return 0;
}
