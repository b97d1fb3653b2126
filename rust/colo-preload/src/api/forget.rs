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
        regs::forget_nested(fd);
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

/// The `close_range(first, last, flags)` system call, made around the shim's own descriptors in
/// the range (those `colo_sys::preload` placed: a connection's control socket and self bell, the
/// holders page, a listener's rendezvous): a forked child that closes all but its connection
/// keeps the connection working, as over TCP. Those of connections in the range are closed with
/// them as the table lets go of them (`closing_range`). Not in a child that shares this
/// process's memory (`vfork`): its exec closes the shim's close-on-exec descriptors anyway.
///
/// # Safety
/// The application's arguments, as the system call takes them.
pub unsafe fn close_range_around_own(first: u32, last: u32, flags: c_int) -> libc::c_long {
    let raw = |a: u32, b: u32| {
        // SAFETY: the application's arguments, narrowed to a part of its range.
        unsafe { crate::real::syscall(libc::SYS_close_range, a as libc::c_long, b as libc::c_long, flags as libc::c_long, 0, 0, 0) }
    };
    if first > last || borrowed_memory() {
        return raw(first, last);
    }
    let mut from = first;
    for fd in colo_sys::placed::in_range(first, last) {
        let fd = fd as u32;
        if fd > from {
            let r = raw(from, fd - 1);
            if r != 0 {
                return r;
            }
        }
        match fd.checked_add(1) {
            Some(next) => from = next,
            None => return 0,
        }
    }
    if from > last {
        return 0;
    }
    raw(from, last)
}

/// The kernel has just returned `fd` as a new descriptor (`accept`, `socket`; `tcp`: a TCP socket
/// `connect` may accelerate): whatever the table held for that number belongs to a descriptor
/// closed where the shim did not see it; it is released now, before the new socket is looked at.
#[inline]
pub fn new_number(fd: c_int, tcp: bool) {
    if fd >= 0 && known(fd) {
        stale(fd);
    }
    crate::api::sockopt::forget_asked(fd);
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

/// The application's `dup2` or `dup3` is about to put a file of its own on `nfd`, where the shim
/// keeps a descriptor of its own (`colo_sys::placed`: below a fixed limit of open files, from
/// 1024 up). The kernel would give the program the number, so it gets it; the connection whose
/// control socket, self bell or segment memfd is there (or a copy of one, registered in an
/// epoll set for another of its numbers) is relayed first (`relay::hand_on`: a
/// loopback TCP socket on each of its numbers, a relay process carrying its bytes, in order),
/// which lets go of those descriptors in this process: the number is free when the `dup2`
/// takes it, and the shim never rings, reads or closes it again. Not in a child that shares
/// this process's memory (`vfork`): the table is its parent's.
pub fn vacate_own(nfd: c_int) {
    if !colo_sys::placed::maybe(nfd) || borrowed_memory() || !colo_sys::placed::refused(nfd) {
        return;
    }
    let _g = Guard::enter();
    // A connection still waiting for its server's answer holds its descriptors too: decided
    // first, as before an `exec`.
    for fd in table::fds_of_kind(table::PENDING).collect::<Vec<_>>() {
        client::resolve_fd(fd as c_int);
    }
    let owner = table::fds_of_kind(table::CONN)
        .find_map(|fd| table::conn(fd as c_int).filter(|c| c.fds().contains(&nfd)))
        .or_else(|| regs::conn_standing_on(nfd));
    let Some(conn) = owner else {
        // The hang-up watcher's wake-up eventfd: moved. A thread's or an epoll set's: given up
        // (no later sleep takes it, and it is never rung again but by a drain racing with a
        // sleep on it now).
        if colo::internal::hangup::give_up(nfd) {
            log_info(format_args!("fd {nfd}: the hang-up watcher's wake-up eventfd, moved for the program's dup2"));
            return;
        }
        let set = regs::forget_wake(nfd);
        if colo::internal::wake::give_up(nfd) || set {
            log_info(format_args!("fd {nfd}: a wake-up eventfd of the shim's, given up to the program's dup2"));
        } else {
            // What it is is not known here: at least its close by the shim is kept off the
            // program's file.
            colo_sys::placed::give_away(nfd);
            log_info(format_args!("fd {nfd}: one of the shim's own descriptors, not a connection's, is replaced by the program's dup2"));
        }
        return;
    };
    let socks: Vec<c_int> = table::fds_of_kind(table::CONN)
        .map(|fd| fd as c_int)
        .filter(|&fd| table::conn(fd).is_some_and(|c| std::sync::Arc::ptr_eq(&c, &conn)))
        .collect();
    let peer = conn.shm().peer_addr();
    match crate::service::relay::hand_on(&conn, &socks, true) {
        Ok(()) => log_info(format_args!("connection to {peer} on fd {socks:?}: relayed over loopback TCP (the program takes fd {nfd}, one of its descriptors, with dup2)")),
        Err(why) => log_info(format_args!("connection to {peer} on fd {socks:?}: the program takes fd {nfd}, one of its descriptors, with dup2; not relayed: {why}")),
    }
    drop(conn);
    if colo_sys::placed::refused(nfd) {
        // Another thread still holds the connection (asleep in a call on it): the shim's close
        // of the number when that call returns must not reach the program's file.
        colo_sys::placed::give_away(nfd);
    }
}
