/* A client that forks right after connect, before the connection's first use (perl's and
 * rsh-style clients: the child writes, the parent reads), to a server in another process that
 * accepts at once. Under the shim the fork comes while the connection waits for the server's
 * answer; it is decided then. The server's answer is a matter of microseconds, so the decision
 * waits for it as the connection's first read or write would: each of ROUNDS connections is
 * accelerated (a colo segment is mapped in the client once forked) and carries every byte both
 * ways. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <sys/wait.h>

#include "scenario.h"

#define ROUNDS 20
#define BYTES (64 * 1024)

int main(void) {
    alarm(25);
    struct sockaddr_in a;
    pid_t server = fork_echo_server(loopback_listener(&a, 16));
    int accelerated = 0;
    for (int r = 0; r < ROUNDS; r++) {
        int k = socket(AF_INET, SOCK_STREAM, 0);
        if (k < 0 || connect(k, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
        pid_t writer = fork();
        if (writer < 0) die("fork");
        if (writer == 0) {
            static unsigned char out[BYTES];
            for (long i = 0; i < BYTES; i++) out[i] = pattern(i + r);
            write_all(k, out, BYTES);
            shutdown(k, SHUT_WR);
            _exit(0);
        }
        if (segments() > 0) accelerated++;
        static unsigned char in[BYTES];
        int ok = read_full(k, in, BYTES) == 0;
        for (long i = 0; ok && i < BYTES; i++) ok = in[i] == pattern(i + r);
        CHECK(ok, "the parent reads back every byte its child wrote");
        char extra;
        CHECK(read(k, &extra, 1) == 0, "... then the end of the stream");
        int st;
        CHECK(waitpid(writer, &st, 0) == writer && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the writer exits 0");
        close(k);
        segments_settled();
    }
    if (shimmed()) {
        if (accelerated != ROUNDS) fprintf(stderr, "accelerated %d of %d\n", accelerated, ROUNDS);
        CHECK(accelerated == ROUNDS, "every connection forked before its first use is accelerated");
    }
    kill(server, SIGKILL);
    waitpid(server, NULL, 0);
    if (failures) return 1;
    printf("fork_after_connect: ok\n");
    return 0;
}
