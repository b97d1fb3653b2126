#!/usr/bin/env bash
# A program linked to liburing (a shared library) that reads a connection through io_uring
# when it can set a ring up, and through recv when it cannot, as programs written for kernels
# without io_uring do. liburing makes the io_uring_setup system call itself, not through libc's
# `syscall`, so the shim refuses liburing's set-up functions: under `colo run` the program
# falls back and gets its bytes (a ring's read of an accelerated socket would wait on its TCP
# socket, which carries none). Without the shim it reads through io_uring. Needs the Debian
# package liburing-dev; every run has a timeout.
source "$(dirname "$0")/common.sh"
[ -n "${COLO_APPS_BUILT:-}" ] || build
FAIL=0
[ -e /usr/include/liburing.h ] || { bad "liburing-dev is not installed (tests/apps/packages.txt)"; exit 1; }
cat >"$WORK/uring.c" <<'C'
#include <liburing.h>
#include <string.h>
#include "scenario.h"
int main(void) {
    alarm(10);
    int k, c;
    connected_pair(&k, &c, 0);
    write_all(k, "hello", 5);
    char buf[16] = {0};
    struct io_uring ring;
    int r = io_uring_queue_init(8, &ring, 0);
    if (r == 0) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
        io_uring_prep_recv(sqe, c, buf, 5, MSG_WAITALL);
        io_uring_submit(&ring);
        struct io_uring_cqe *cqe;
        if (io_uring_wait_cqe(&ring, &cqe) == 0) r = cqe->res;
        printf("io_uring: %d bytes\n", r);
    } else {
        printf("no io_uring (%s): recv\n", strerror(-r));
        r = read_full(c, buf, 5) == 0 ? 5 : -1;
    }
    CHECK(r == 5 && memcmp(buf, "hello", 5) == 0, "the bytes arrive");
    return failures != 0;
}
C
gcc -O2 -I"$HERE/c" -o "$WORK/uring" "$WORK/uring.c" -luring || { bad "compile uring.c"; exit 1; }
check "without the shim: the bytes arrive" sh -c "timeout 20 '$WORK/uring' >'$WORK/plain.out'"
check "under colo run: the bytes arrive (liburing's set-up refused, recv)" sh -c \
  "timeout 20 env LD_PRELOAD='$SHIM' COLO_LOG=info '$WORK/uring' >'$WORK/colo.out' 2>'$WORK/colo.err' && grep -q 'no io_uring' '$WORK/colo.out'"
check "... over shared memory" sh -c "grep -q 'connect .*: accelerated (shared memory)' '$WORK/colo.err' && grep -q 'accept .*: accelerated (shared memory)' '$WORK/colo.err'"
exit $FAIL
