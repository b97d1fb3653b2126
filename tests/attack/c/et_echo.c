/* et_echo PORT MODE: an echo server on 127.0.0.1:PORT whose connections are registered
 * edge-triggered (EPOLLIN | EPOLLRDHUP | EPOLLET) and read until EAGAIN, closed at end of
 * stream or an error, as event loops do. MODE flat: waits on that epoll set; nested: waits on
 * an outer set the first one is registered in, then takes the inner set's events without
 * waiting. Prints LISTENING once it listens. Used by t_rt_et_hangup.sh. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    int nested = strcmp(argv[2], "nested") == 0, one = 1;
    int l = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1])), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(l, (void *)&a, sizeof a) || listen(l, 512)) { perror("listen"); return 1; }
    int inner = epoll_create1(0), outer = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = -1};
    if (nested && epoll_ctl(outer, EPOLL_CTL_ADD, inner, &ev)) { perror("nest"); return 1; }
    ev.data.fd = l;
    epoll_ctl(inner, EPOLL_CTL_ADD, l, &ev);
    printf("LISTENING\n");
    fflush(stdout);
    static char buf[1 << 16];
    for (;;) {
        struct epoll_event evs[64];
        if (nested && epoll_wait(outer, evs, 1, -1) < 0 && errno != EINTR) { perror("outer"); return 1; }
        int n = epoll_wait(inner, evs, 64, nested ? 0 : -1);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd, c;
            if (fd == l) {
                while ((c = accept4(l, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    struct epoll_event ce = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.fd = c};
                    epoll_ctl(inner, EPOLL_CTL_ADD, c, &ce);
                }
                continue;
            }
            for (;;) {
                ssize_t r = read(fd, buf, sizeof buf);
                if (r > 0) {
                    if (write(fd, buf, r) < 0 && errno != EAGAIN) r = -1; else continue;
                }
                if (r < 0 && errno == EAGAIN) break;
                close(fd);
                break;
            }
        }
    }
}
