/* A stdio stream made with fdopen(3) on a TCP socket before it connects (run with the shim
 * preloaded, as tests/apps/run.sh does; also passes without it, with plain kernel semantics):
 * the connect puts the connection on shared memory after the stream exists, and the stream's
 * reads and writes must still be the connection's. fprintf of 100 KB and fflush reach the
 * server in order, fgets reads its answer, fileno names the socket, fclose closes it (the
 * server reads end of stream) and a second such connection leaves no descriptor behind. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <fcntl.h>

#include "scenario.h"

#define BIG 100000

/* One connection whose stream is made before connect, used and closed. */
static void one_round(int l, struct sockaddr_in *a) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0) die("socket");
    FILE *f = fdopen(c, "r+");
    if (!f) die("fdopen");
    CHECK(fileno(f) == c, "fileno of the stream made before connect");
    if (connect(c, (struct sockaddr *)a, sizeof *a) < 0) die("connect");
    int s = accept(l, NULL, NULL);
    if (s < 0) die("accept");
    if (shimmed()) CHECK(segments() == 2, "the connection accelerated (both ends)");

    static char big[BIG + 1], got[BIG + 16];
    for (int i = 0; i < BIG; i++) big[i] = 'a' + i % 26;
    CHECK(fprintf(f, "<%s>\n", big) == BIG + 3, "fprintf of 100 KB");
    CHECK(fflush(f) == 0, "fflush");
    CHECK(read_full(s, got, BIG + 3) == 0, "the server read 100 KB + 3");
    CHECK(got[0] == '<' && memcmp(got + 1, big, BIG) == 0 && memcmp(got + 1 + BIG, ">\n", 2) == 0,
          "the server read every byte the stream wrote, in order");

    const char answer[] = "answer line\n";
    CHECK(write(s, answer, sizeof answer - 1) == (ssize_t)sizeof answer - 1, "the server answers");
    char line[64];
    CHECK(fgets(line, sizeof line, f) != NULL && strcmp(line, answer) == 0, "fgets reads the answer");

    CHECK(fclose(f) == 0, "fclose");
    CHECK(fcntl(c, F_GETFD) < 0 && errno == EBADF, "fclose closed the socket");
    char b;
    CHECK(read(s, &b, 1) == 0, "the server reads end of stream");
    close(s);
    if (shimmed()) CHECK(segments_settled() == 0, "no segment left");
}

int main(void) {
    alarm(30);
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    /* Twice: what the first connection opens for the whole process (the shim's own) is counted
     * in the baseline; the second must leave nothing more. */
    one_round(l, &a);
    int base = descriptors_open();
    one_round(l, &a);
    CHECK(descriptors_open() == base, "no descriptor left by a connection");
    close(l);

    if (failures == 0)
        printf("ok: a stream made before connect carries 100 KB each way in order, twice%s\n", shimmed() ? " (accelerated)" : "");
    return failures != 0;
}
