/* Run as nobody by tests/attack/py/pool_pages.py (mode `toggle`): flips the 8-byte word at
 * OFFSET of every memfd FD it was given between VALUE-1 and VALUE, as fast as it can, until it
 * is killed: a peer whose word says one thing at one read and the other at the next.
 * Usage: toggle_word OFFSET VALUE FD... */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: toggle_word OFFSET VALUE FD...\n");
    return 2;
  }
  size_t off = strtoull(argv[1], 0, 0);
  uint64_t v = strtoull(argv[2], 0, 0);
  int n = argc - 3;
  volatile uint64_t **w = calloc(n, sizeof *w);
  for (int i = 0; i < n; i++) {
    struct stat st;
    int fd = atoi(argv[3 + i]);
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < off + 8) {
      perror("fstat");
      return 1;
    }
    char *m = mmap(0, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
      perror("mmap");
      return 1;
    }
    w[i] = (volatile uint64_t *)(m + off);
  }
  printf("TOGGLING %d\n", n);
  fflush(stdout);
  for (;;) {
    for (int i = 0; i < n; i++) *w[i] = v - 1;
    for (int i = 0; i < n; i++) *w[i] = v;
  }
}
