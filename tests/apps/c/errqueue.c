/* Reads of a connection's error queue (`MSG_ERRQUEUE`: the notifications of `MSG_ZEROCOPY`
 * sends and `SO_TIMESTAMPING`, which a program drains when it likes) and of urgent data
 * (`MSG_OOB`, none sent) never take the stream's bytes: recvmsg, recv and recvfrom with either
 * flag fail (EAGAIN for an empty error queue, at once even on a blocking socket; EINVAL for no
 * urgent data) and the bytes written before are read afterwards, in order. Run with the shim
 * preloaded (tests/apps/run.sh); also passes without it. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <poll.h>

#include "scenario.h"

/* recvmsg(c, flags) into a 16-byte buffer with room for control messages. */
static ssize_t recvmsg_with(int c, int flags) {
    char b[16], ctl[128];
    struct iovec v = {b, sizeof b};
    struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
    return recvmsg(c, &m, flags);
}

int main(void) {
    alarm(10);
    int k, c;
    connected_pair(&k, &c, 0);
    write_all(k, "data", 4);
    struct pollfd p = {.fd = c, .events = POLLIN};
    CHECK(poll(&p, 1, 5000) == 1 && (p.revents & POLLIN), "the bytes are readable");
    char b[16];
    errno = 0;
    CHECK(recvmsg_with(c, MSG_ERRQUEUE | MSG_DONTWAIT) == -1 && errno == EAGAIN, "recvmsg(MSG_ERRQUEUE | MSG_DONTWAIT): EAGAIN");
    errno = 0;
    CHECK(recvmsg_with(c, MSG_ERRQUEUE) == -1 && errno == EAGAIN, "recvmsg(MSG_ERRQUEUE), blocking socket: EAGAIN at once");
    errno = 0;
    CHECK(recv(c, b, sizeof b, MSG_ERRQUEUE) == -1 && errno == EAGAIN, "recv(MSG_ERRQUEUE): EAGAIN");
    errno = 0;
    CHECK(recvfrom(c, b, sizeof b, MSG_ERRQUEUE, NULL, NULL) == -1 && errno == EAGAIN, "recvfrom(MSG_ERRQUEUE): EAGAIN");
    errno = 0;
    CHECK(recvmsg_with(c, MSG_OOB) == -1 && errno == EINVAL, "recvmsg(MSG_OOB), no urgent data: EINVAL");
    errno = 0;
    CHECK(recv(c, b, sizeof b, MSG_OOB) == -1 && errno == EINVAL, "recv(MSG_OOB), no urgent data: EINVAL");
    CHECK(read_full(c, b, 4) == 0 && memcmp(b, "data", 4) == 0, "the stream's bytes are all still there, in order");
    write_all(c, "back", 4);
    CHECK(read_full(k, b, 4) == 0 && memcmp(b, "back", 4) == 0, "the connection carries on");
    close(k);
    close(c);
    return failures != 0;
}
