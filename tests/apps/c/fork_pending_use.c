/* Connections dialed, then shared through fork before their first use (under the shim: still
 * waiting for the server's answer, "pending", when the fork comes):
 *   1. the parent closes its copy at once, the child then writes and reads: over TCP a copy's
 *      close does nothing to the connection, so every byte arrives both ways;
 *   2. three children write records at once, their first use of the connection, the parent's
 *      copy closed: each write's bytes stay whole (a record of one writer is never cut by
 *      another's) and every record arrives.
 * alarm() is the watchdog. */
#define _GNU_SOURCE
#include <sys/wait.h>

#include "scenario.h"

#define BYTES (256 * 1024)
#define WRITERS 3
#define RECORDS 3000

static int child_ok(pid_t pid) {
    int st;
    return waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static void parent_closes_child_uses(void) {
    int k, c;
    connected_pair(&k, &c, 0);
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        close(c);
        usleep(200000); /* the parent's close comes first */
        static unsigned char out[BYTES], in[BYTES];
        for (long i = 0; i < BYTES; i++) out[i] = pattern(i);
        write_all(k, out, BYTES);
        if (read_full(k, in, BYTES) != 0) _exit(2);
        for (long i = 0; i < BYTES; i++)
            if (in[i] != pattern(i + 7)) _exit(3);
        _exit(0);
    }
    close(k);
    static unsigned char got[BYTES], back[BYTES];
    CHECK(read_full(c, got, BYTES) == 0, "1: the server reads what the child wrote after the parent closed its copy");
    long bad = -1;
    for (long i = 0; i < BYTES && bad < 0; i++)
        if (got[i] != pattern(i)) bad = i;
    CHECK(bad < 0, "1: ... every byte, in order");
    for (long i = 0; i < BYTES; i++) back[i] = pattern(i + 7);
    write_all(c, back, BYTES);
    CHECK(child_ok(pid), "1: the child reads every byte the server wrote (exit 0)");
    close(c);
}

static void children_write_at_once(void) {
    int k, c;
    connected_pair(&k, &c, 0);
    pid_t pids[WRITERS];
    for (int w = 0; w < WRITERS; w++) {
        pids[w] = fork();
        if (pids[w] < 0) die("fork");
        if (pids[w] == 0) {
            close(c);
            unsigned char rec[520];
            unsigned seed = 77 + w;
            for (int i = 0; i < RECORDS; i++) {
                seed = seed * 1103515245 + 12345;
                unsigned len = 1 + (seed >> 16) % 512;
                rec[0] = 'a' + w;
                rec[1] = len & 0xff;
                rec[2] = len >> 8;
                memset(rec + 3, 'a' + w, len);
                if (write(k, rec, len + 3) != (ssize_t)(len + 3)) _exit(2);
            }
            _exit(0);
        }
    }
    close(k);
    int counts[WRITERS] = {0}, torn = 0, total = 0;
    unsigned char h[3], body[512];
    while (total < WRITERS * RECORDS && read_full(c, h, 3) == 0) {
        unsigned len = h[1] | h[2] << 8, w = h[0] - 'a';
        if (w >= WRITERS || len < 1 || len > 512 || read_full(c, body, len) != 0) {
            torn++;
            break;
        }
        for (unsigned i = 0; i < len; i++)
            if (body[i] != h[0]) {
                torn++;
                break;
            }
        counts[w]++;
        total++;
    }
    CHECK(torn == 0, "2: no record cut by another writer's");
    CHECK(counts[0] == RECORDS && counts[1] == RECORDS && counts[2] == RECORDS, "2: every record of every writer arrives");
    if (torn || total != WRITERS * RECORDS) fprintf(stderr, "records %d %d %d, torn %d\n", counts[0], counts[1], counts[2], torn);
    for (int w = 0; w < WRITERS; w++) CHECK(child_ok(pids[w]), "2: each writer exits 0");
    close(c);
}

int main(void) {
    alarm(25);
    parent_closes_child_uses();
    children_write_at_once();
    if (failures) return 1;
    printf("fork_pending_use: ok\n");
    return 0;
}
