//! Letting go of what the table holds for a descriptor: at its close or replacement, at a
//! `close_range`, and when the kernel hands its number out again (it was closed past the shim;
//! see `behind`).

use crate::base::guard::Guard;
use crate::base::vm::borrowed_memory;
use crate::base::log::log_info;
use crate::conn::table::{self, Entry, NONE};
use crate::conn::{options, regs};
use crate::service::{client, server};
use libc::c_int;

/// Forgets what the table knows about `fd` (it is being closed or replaced, and still open).
pub fn forget(fd: c_int) {
    release(fd, true);
}

/// [`forget`]; `open`: `fd` is still the descriptor the table knew (not a number the kernel
/// handed out again), so a connection's last close may act on it.
fn release(fd: c_int, open: bool) {
    if table::is_epoll(fd) {
        regs::forget_epoll(fd);
        crate::api::lregs::forget(fd);
        table::set_epoll(fd, false);
    }
    if table::kind(fd) == NONE {
        return;
    }
    let old = match table::lock(fd) {
        Some(mut s) => s.take(),
        None => return,
    };
    regs::forget_fd(fd);
    match old {
        Entry::Conn(c) => {
            options::closing(fd, &c);
            // The table's was the last reference: `c` is dropped here, before the close of `fd`.
            if open && std::sync::Arc::strong_count(&c) == 1 {
                c.last_close(fd);
            }
        }
        Entry::Listen(l) => {
            crate::api::lregs::forget(fd);
            server::on_close_listen(&l, fd);
        }
        Entry::Guest(g) => server::on_close_guest(&g, fd),
        Entry::Pending(p) => client::close_pending(p),
        _ => {}
    }
}

/// Whether the shim knows anything about `fd` (a fast test: two relaxed loads).
#[inline]
pub fn known(fd: c_int) -> bool {
    table::kind(fd) != table::NONE || table::is_epoll(fd)
}

/// `close_range(first, last)` (without `CLOSE_RANGE_CLOEXEC`) is about to close every descriptor
/// in the range: the shim lets go of those it knows first, as `close` does one by one.
pub fn closing_range(first: u32, last: u32) {
    let last = last.min(table::MAX_FD as u32 - 1);
    if first > last || !(first..=last).any(|fd| known(fd as c_int)) || borrowed_memory() {
        return;
    }
    let _g = Guard::enter();
    for fd in first..=last {
        if known(fd as c_int) {
            forget(fd as c_int);
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
    log_info(format_args!("fd {fd} was closed past the shim; what it held is released"));
    let _g = Guard::enter();
    release(fd, false);
}
