/* closefrom(3) closes accelerated connections (glibc does it with its own close_range system
 * call, which no preloaded library sees); the files the program opens next take their numbers
 * and must get the program's reads and writes, not the old connections'. alarm() is the
 * watchdog. */
#define _GNU_SOURCE
#include <fcntl.h>

#include "scenario.h"

int main(void) {
    alarm(20);
    int k, c;
    connected_pair(&k, &c, 0);
    write_all(k, "x", 1);
    char b[16];
    CHECK(read_full(c, b, 1) == 0 && b[0] == 'x', "the connection carries a byte");
    int low = k < c ? k : c;
    closefrom(low);
    /* Files open at the lowest free numbers: one of them takes the connection's. */
    char path[] = "/tmp/colo-closefrom-XXXXXX";
    int f = mkstemp(path);
    while (f >= 0 && f < low) {
        unlink(path);
        strcpy(path, "/tmp/colo-closefrom-XXXXXX");
        f = mkstemp(path);
    }
    CHECK(f == low, "a file takes the lowest number the connections had");
    const char *line = "a line of the program's own\n";
    CHECK(write(f, line, strlen(line)) == (ssize_t)strlen(line), "a write to it is the file's");
    CHECK(lseek(f, 0, SEEK_SET) == 0, "the file seeks");
    ssize_t n = read(f, b, sizeof b);
    CHECK(n == (ssize_t)sizeof b && memcmp(b, line, sizeof b) == 0, "a read of it gets the file's bytes");
    close(f);
    int g = open(path, O_RDONLY);
    n = read(g, b, sizeof b);
    CHECK(n == (ssize_t)sizeof b && memcmp(b, line, sizeof b) == 0, "the bytes are in the file");
    close(g);
    unlink(path);
    if (failures) return 1;
    printf("closefrom_reuse: ok\n");
    return 0;
}
