/* A fork child that closes a connection it inherited leaves its parent's epoll registration of
 * it alone, as the kernel does (the set is one for both, and the parent still holds the file).
 * Under the shim the child's close took the connection's descriptors out of the shared set, and
 * the parent's epoll_wait never reported the connection again. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <sys/epoll.h>
#include <sys/wait.h>

#include "scenario.h"

int main(void) {
    alarm(30);
    int k, c;
    connected_pair(&k, &c, SOCK_NONBLOCK);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    for (int i = 0; i < 2; i++) {
        unsigned et = i ? EPOLLET : 0;
        struct epoll_event ev = {.events = EPOLLIN | et, .data.fd = c}, out[4];
        if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev) < 0) die("epoll");
        pid_t pid = fork();
        if (pid < 0) die("fork");
        if (pid == 0) {
            close(c);
            usleep(100000);
            write_all(k, "after", 5);
            _exit(0);
        }
        char b[16];
        int n = epoll_wait(ep, out, 4, 5000);
        CHECK(n == 1 && out[0].data.fd == c, et ? "ET: the parent's set reports the connection after the child closed its copy"
                                                : "LT: the parent's set reports the connection after the child closed its copy");
        CHECK(read(c, b, sizeof b) == 5, "the bytes are read");
        waitpid(pid, NULL, 0);
        epoll_ctl(ep, EPOLL_CTL_DEL, c, NULL);
    }
    if (failures == 0) printf("epoll_child_close: ok\n");
    return failures != 0;
}
