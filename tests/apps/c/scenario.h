/* What every scenario program in tests/apps/c shares: the CHECK macro and its failure count,
 * die(), whether the colo shim is preloaded, and how many colo segments this process holds. */
#ifndef COLO_SCENARIO_H
#define COLO_SCENARIO_H
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures __attribute__((unused));
#define CHECK(cond, what)                                                   \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "FAIL %s (line %d)\n", what, __LINE__);         \
            failures++;                                                     \
        }                                                                   \
    } while (0)

static void die(const char *what) {
    perror(what);
    exit(1);
}

/* Whether the colo shim is preloaded (the programs also run without it). */
static inline int shimmed(void) {
    const char *p = getenv("LD_PRELOAD");
    return p && strstr(p, "colo");
}

/* How many descriptors of this process are colo segments. */
static inline int segments(void) {
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    char path[300], link[256];
    int found = 0;
    while (d && (e = readdir(d))) {
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, link, sizeof link - 1);
        if (n > 0) {
            link[n] = 0;
            if (strstr(link, "colo-seg")) found++;
        }
    }
    if (d) closedir(d);
    return found;
}
#endif
