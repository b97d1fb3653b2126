/* An FTP server's passive mode (pure-ftpd, vsftpd) with a client that waits for its data
 * connection to complete before it sends the command (lftp): for each transfer the server's
 * session process listens on a new port, tells the client, and accepts only after the client's
 * next command on the control connection; the client connects without blocking, waits until
 * the socket is writable, then sends that command. Over TCP the kernel completes the connection
 * in the listener's queue at once. Under the shim the answer to the offer would come with the
 * accept, which waits for the command: the client finds that program not accepting (its queue
 * flat over three looks) and goes on over TCP, about 30 ms a transfer. Each transfer is to a
 * new port, so remembering the destination does not spare the next one: remembering the
 * program does. Every transfer's bytes arrive intact; at most a few transfers wait 20 ms or
 * more for their connection (each of 20 did before); the control connection is accelerated
 * (run with the shim preloaded, as tests/apps/run.sh does; also passes without it). */
#define _GNU_SOURCE
#include "scenario.h"
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>

#define TRANSFERS 20
#define SIZE 65536

static void session(int control) {
    static unsigned char buf[SIZE];
    for (int t = 0; t < TRANSFERS; t++) {
        struct sockaddr_in d;
        int l = loopback_listener(&d, 4);
        unsigned short port = d.sin_port;
        write_all(control, &port, sizeof port);
        char cmd[4];
        if (read_full(control, cmd, sizeof cmd) < 0) _exit(2);
        int s = accept(l, NULL, NULL);
        if (s < 0) _exit(3);
        close(l);
        for (long i = 0; i < SIZE; i++) buf[i] = pattern(i + t);
        write_all(s, buf, SIZE);
        close(s);
    }
    _exit(0);
}

int main(void) {
    alarm(25);
    signal(SIGPIPE, SIG_IGN);
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    pid_t srv = fork();
    if (srv < 0) die("fork");
    if (srv == 0) {
        int c = accept(l, NULL, NULL);
        if (c < 0) _exit(4);
        close(l);
        session(c);
    }
    close(l);
    int control = socket(AF_INET, SOCK_STREAM, 0);
    if (control < 0 || connect(control, (struct sockaddr *)&a, sizeof a) < 0) die("connect control");
    static unsigned char got[SIZE + 1];
    int waited = 0, intact = 0;
    for (int t = 0; t < TRANSFERS; t++) {
        unsigned short port;
        if (read_full(control, &port, sizeof port) < 0) die("read port");
        struct sockaddr_in d = a;
        d.sin_port = port;
        int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (s < 0) die("socket");
        double t0 = now();
        if (connect(s, (struct sockaddr *)&d, sizeof d) < 0 && errno != EINPROGRESS) die("connect data");
        struct pollfd p = {.fd = s, .events = POLLOUT};
        if (poll(&p, 1, 20000) != 1) die("poll");
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
        CHECK(err == 0, "the data connection completes");
        if (now() - t0 >= 0.020) waited++;
        write_all(control, "RETR", 4);
        fcntl(s, F_SETFL, 0);
        size_t n = 0;
        for (;;) {
            ssize_t k = read(s, got + n, sizeof got - n);
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) break;
            n += k;
        }
        close(s);
        int ok = n == SIZE;
        for (long i = 0; ok && i < SIZE; i++) ok = got[i] == pattern(i + t);
        intact += ok;
    }
    int status;
    waitpid(srv, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the session served every transfer");
    CHECK(intact == TRANSFERS, "every transfer's bytes arrive intact");
    fprintf(stderr, "%d of %d data connections waited 20 ms or more to complete\n", waited, TRANSFERS);
    CHECK(waited <= 4, "at most a few data connections wait for their server's accept");
    return failures ? 1 : 0;
}
