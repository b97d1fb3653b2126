/* A relay as microsocks copies (tests/apps/relay_bench.sh): a thread per client connects to the
 * upstream port, then polls both and copies 1 KiB at a time (read(1024), write all), until either
 * side ends. No TCP_NODELAY: over TCP, Nagle's algorithm gathers its small writes.
 *   relay1k LISTEN_PORT UPSTREAM_PORT */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>
static int up;
static void copyloop(int a, int b) {
  struct pollfd fds[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
  char buf[1024];
  for (;;) {
    if (poll(fds, 2, -1) <= 0) return;
    int in = (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) ? a : b;
    int out = in == a ? b : a;
    ssize_t n = read(in, buf, sizeof buf);
    if (n <= 0) return;
    for (ssize_t s = 0; s < n;) {
      ssize_t m = write(out, buf + s, n - s);
      if (m < 0) return;
      s += m;
    }
  }
}
static void *serve(void *arg) {
  int c = (int)(long)arg;
  int u = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in ua = {.sin_family = AF_INET, .sin_port = htons(up), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (connect(u, (void *)&ua, sizeof ua)) { perror("connect"); close(c); return 0; }
  copyloop(c, u);
  close(u);
  close(c);
  return 0;
}
int main(int argc, char **argv) {
  int lp = atoi(argv[1]);
  up = atoi(argv[2]);
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(lp), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (bind(l, (void *)&sa, sizeof sa) || listen(l, 64)) { perror("listen"); return 1; }
  for (;;) {
    int c = accept(l, 0, 0);
    if (c < 0) continue;
    pthread_t t;
    pthread_create(&t, 0, serve, (void *)(long)c);
    pthread_detach(t);
  }
}
