//! The io_uring refusal. `io_uring_setup` is refused with ENOSYS, so that a program that would
//! register its sockets through io_uring (libuv 1.45 and later: uvloop, recent Node) falls back
//! to epoll, which the shim sees; through io_uring an accelerated socket's readiness is the TCP
//! socket's and its reader waits forever.

use crate::base::env::disabled;
use crate::base::guard::set_errno;
use crate::base::log::log_debug;

/// Whether `syscall(n, ...)` is refused; if so errno is ENOSYS and the call returns -1.
pub fn refused(n: libc::c_long) -> bool {
    if n == libc::SYS_io_uring_setup && !disabled() {
        log_debug(format_args!("io_uring_setup refused (ENOSYS): the program falls back to epoll"));
        set_errno(libc::ENOSYS);
        return true;
    }
    false
}
