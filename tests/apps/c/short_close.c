/* A connection per request, closed by its client first (redis-benchmark -k 0, pgbench -C): under
 * the shim the client's close leaves no TIME_WAIT on its port (the carrier TCP connection never
 * carried a byte, and a port in TIME_WAIT cannot be bound again for a minute: a client dialing
 * thousands a second ran out of the ports carriers bind), while the server still sees what
 * kernel TCP shows after a FIN: getpeername answers the client's address, SO_ERROR is 0, a read
 * is end of stream. Also passes without the shim (the TIME_WAIT check is the shim's alone).
 * alarm() is the watchdog of both processes. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "scenario.h"

/* Whether /proc/net/tcp lists a TIME_WAIT socket (state 06) whose local port is `port`. */
static int time_wait_on(int port) {
    FILE *f = fopen("/proc/net/tcp", "r");
    char line[512];
    int found = 0;
    if (!f) die("/proc/net/tcp");
    while (fgets(line, sizeof line, f)) {
        unsigned lport, state;
        if (sscanf(line, " %*d: %*8X:%4X %*8X:%*4X %2X", &lport, &state) == 2 && (int)lport == port && state == 0x06)
            found = 1;
    }
    fclose(f);
    return found;
}

/* The server: for each of `rounds` connections, answer "ping" with "pong", read to end of stream,
 * wait until the client's close has returned (its port arrives on `go`), look, close, and say
 * so on `done`. */
static int server(int l, int go, int done, int rounds) {
    int fails = 0;
    for (int i = 0; i < rounds; i++) {
        int s = accept(l, NULL, NULL);
        if (s < 0) die("accept");
        char buf[4], c;
        if (read_full(s, buf, 4) < 0 || memcmp(buf, "ping", 4) != 0 || write(s, "pong", 4) != 4) {
            fprintf(stderr, "FAIL server: ping/pong\n");
            fails++;
        }
        if (read(s, &c, 1) != 0) {
            fprintf(stderr, "FAIL server: end of stream after the client's close\n");
            fails++;
        }
        int port;
        if (read_full(go, &port, sizeof port) < 0) die("go");
        struct sockaddr_in peer;
        socklen_t len = sizeof peer;
        if (getpeername(s, (struct sockaddr *)&peer, &len) != 0 || len != sizeof peer || ntohs(peer.sin_port) != port ||
            peer.sin_addr.s_addr != htonl(INADDR_LOOPBACK)) {
            fprintf(stderr, "FAIL server: getpeername after the client's close (%s)\n", strerror(errno));
            fails++;
        }
        int err = -1;
        len = sizeof err;
        if (getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
            fprintf(stderr, "FAIL server: SO_ERROR after the client's close: %d\n", err);
            fails++;
        }
        if (read(s, &c, 1) != 0) {
            fprintf(stderr, "FAIL server: a second read after the client's close is not end of stream\n");
            fails++;
        }
        close(s);
        if (write(done, "d", 1) != 1) die("done");
    }
    return fails;
}

int main(void) {
    alarm(20);
    /* A connection per request is what the shim's short-lived rule sends over plain TCP. */
    setenv("COLO_SHORT_LIVED", "accelerate", 1);
    signal(SIGPIPE, SIG_IGN);
    const int rounds = 20;
    int ports[2], go[2];
    if (pipe(ports) < 0 || pipe(go) < 0) die("pipe");
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        alarm(20);
        close(ports[0]);
        close(go[1]);
        struct sockaddr_in a;
        int l = loopback_listener(&a, 16);
        if (write(ports[1], &a, sizeof a) != sizeof a) die("write port");
        exit(server(l, go[0], ports[1], rounds) != 0);
    }
    close(ports[1]);
    close(go[0]);
    struct sockaddr_in a;
    if (read_full(ports[0], &a, sizeof a) < 0) die("server port");
    for (int i = 0; i < rounds; i++) {
        int c = socket(AF_INET, SOCK_STREAM, 0);
        if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
        char buf[4];
        CHECK(write(c, "ping", 4) == 4 && read_full(c, buf, 4) == 0 && memcmp(buf, "pong", 4) == 0, "ping/pong");
        if (i == 0 && shimmed()) CHECK(segments() == 1, "accelerated");
        struct sockaddr_in me;
        socklen_t len = sizeof me;
        CHECK(getsockname(c, (struct sockaddr *)&me, &len) == 0, "getsockname");
        int port = ntohs(me.sin_port);
        close(c);
        if (write(go[1], &port, sizeof port) != sizeof port) die("go");
        /* Both ends closed: kernel TCP leaves the client's port in TIME_WAIT now. */
        char d;
        if (read_full(ports[0], &d, 1) < 0) die("server done");
        if (shimmed()) CHECK(!time_wait_on(port), "no TIME_WAIT on the client's port after its close");
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0, "the server's checks");
    if (failures) return 1;
    puts("short_close: ok");
    return 0;
}
