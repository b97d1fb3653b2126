//! Descriptors closed or replaced past libc's wrappers, and numbers the kernel hands out again.
//!
//! libuv (Node.js, uvloop) closes every descriptor with `syscall(SYS_close, fd)`, never through
//! `close`. The shim must see those closes as it sees `close`: otherwise the connection's entry
//! stays in the table after the kernel has closed the socket, its segment, control socket and
//! doorbells stay open and its peer never sees the end, and the next descriptor the kernel gives
//! that number (a plain TCP connection accepted later) is served from the dead connection's
//! rings (an end of file at once, which the program answers by closing, resetting its client).
//!
//! So `syscall(SYS_close | SYS_dup | SYS_dup2 | SYS_dup3)` take the shim's own paths,
//! `close_range` lets go of the connections in its range before it closes them, and a
//! number the kernel has just returned from `accept` or `socket` drops whatever the table still
//! held for it (something closed it in a way no wrapper saw: a raw system call made elsewhere,
//! `fclose` on a `fdopen`ed socket): the kernel's word that the number is new is final.
//!
//! Not between `vfork` and `exec`: such a child shares this process's memory (and so the table)
//! but not its descriptors, and a close it makes must not end the parent's connections. It is
//! recognised by its process id, which differs from the one the shim cached in the parent.

use crate::api::shim;
use crate::conn::table;
use libc::{c_int, c_long};

/// True in a child that shares this process's memory without being this process (a `vfork` or
/// `clone(CLONE_VM)` child): the cached pid is the parent's.
fn borrowed_memory() -> bool {
    rustix::process::getpid().as_raw_nonzero().get() as u32 != colo_sys::host::pid()
}

/// Whether the shim knows anything about `fd` (a fast test: two relaxed loads).
#[inline]
fn known(fd: c_int) -> bool {
    table::kind(fd) != table::NONE || table::is_epoll(fd)
}

/// `syscall(n, a, b, c, ...)` for the calls this module takes over; `None` for the others.
///
/// # Safety
/// The application's arguments, as the system call takes them.
pub unsafe fn syscall(n: c_long, a: c_long, b: c_long, c: c_long) -> Option<c_long> {
    let (fd, new) = (a as c_int, b as c_int);
    let mine = match n {
        libc::SYS_close | libc::SYS_dup => known(fd),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_dup2 => known(fd) || known(new),
        libc::SYS_dup3 => known(fd) || known(new),
        _ => return None,
    };
    if !mine || borrowed_memory() {
        return None;
    }
    // SAFETY: the application's arguments (the shim's wrappers keep libc's conventions: -1 and
    // errno on failure, as `syscall` does).
    let r = unsafe {
        match n {
            libc::SYS_close => shim::close(fd),
            libc::SYS_dup => shim::dup(fd),
            #[cfg(target_arch = "x86_64")]
            libc::SYS_dup2 => shim::dup3(fd, new, 0, true),
            _ => shim::dup3(fd, new, c as c_int, false),
        }
    };
    Some(r as c_long)
}

/// `close_range(first, last)` (without `CLOSE_RANGE_CLOEXEC`) is about to close every descriptor
/// in the range: the shim lets go of those it knows first, as `close` does one by one.
pub fn closing_range(first: u32, last: u32) {
    let last = last.min(table::MAX_FD as u32 - 1);
    if first > last || !(first..=last).any(|fd| known(fd as c_int)) || borrowed_memory() {
        return;
    }
    let _g = crate::base::guard::Guard::enter();
    for fd in first..=last {
        if known(fd as c_int) {
            shim::forget(fd as c_int);
        }
    }
}

/// The kernel has just returned `fd` as a new descriptor (`accept`, `socket`; `tcp`: a TCP socket
/// `connect` may accelerate): whatever the table held for that number belongs to a descriptor
/// closed where the shim did not see it; it is released now, before the new socket is looked at.
#[inline]
pub fn new_number(fd: c_int, tcp: bool) {
    if fd >= 0 && known(fd) {
        stale(fd);
    }
    table::set_fresh(fd, tcp);
}

#[inline(never)]
fn stale(fd: c_int) {
    if borrowed_memory() {
        return;
    }
    crate::base::log::log_info(format_args!("fd {fd} was closed past the shim; what it held is released"));
    let _g = crate::base::guard::Guard::enter();
    shim::forget(fd);
}
