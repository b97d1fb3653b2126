//! A process that confines itself with a seccomp filter (`prctl(PR_SET_SECCOMP)` or
//! `seccomp(2)`; OpenSSH's pre-authentication child, self-sandboxing daemons). The filter
//! allows the calls the program makes over TCP, not the shim's (a doorbell's `sendto` and
//! `recvmsg`, a sleeper's thread, a rendezvous's accept), and kills or refuses the program at
//! its first one. So before the filter goes in, the shim leaves the process: every accelerated
//! connection is relayed (`relay::hand_on`: a loopback TCP socket on the same number, a relay
//! process carrying the bytes, as for a connection passed to another process), connections still
//! waiting for their server's answer are decided first, listeners are let go of (plain
//! `accept`), and no socket made afterwards is accelerated (`base::env::turn_off`). From then on the
//! program makes only the calls it makes over TCP.

use crate::api::forget::forget;
use crate::base::guard::Guard;
use crate::base::log::log_info;
use crate::base::vm::borrowed_memory;
use crate::conn::state::Conn;
use crate::conn::table::{self, CONN, GUEST, LISTEN, PENDING};
use crate::service::{client, relay};
use std::sync::Arc;

/// Whether `prctl(option, arg2, ...)` installs a seccomp filter (or strict mode).
pub fn prctl_confines(option: libc::c_int, arg2: libc::c_ulong) -> bool {
    option == libc::PR_SET_SECCOMP && (arg2 == libc::SECCOMP_MODE_FILTER as libc::c_ulong || arg2 == libc::SECCOMP_MODE_STRICT as libc::c_ulong)
}

/// Whether `seccomp(op, ...)` installs a filter (or strict mode).
pub fn seccomp_confines(op: libc::c_long) -> bool {
    op == libc::SECCOMP_SET_MODE_FILTER as libc::c_long || op == libc::SECCOMP_SET_MODE_STRICT as libc::c_long
}

/// Called just before the process installs its filter: see the module's comment. Not in a
/// child that shares its parent's memory (its table is the parent's; a `vfork` child that
/// confines itself then executes a program, which the filter confines from its start).
pub fn leave_process() {
    if borrowed_memory() {
        return;
    }
    let _g = Guard::enter();
    crate::base::env::turn_off();
    for fd in table::fds_of_kind(PENDING).collect::<Vec<_>>() {
        client::resolve_fd(fd as i32);
    }
    let mut conns: Vec<Arc<Conn>> = Vec::new();
    for fd in table::fds_of_kind(CONN) {
        if let Some(c) = table::conn(fd as i32) {
            if !conns.iter().any(|x| Arc::ptr_eq(x, &c)) {
                conns.push(c);
            }
        }
    }
    for conn in conns {
        relay_here(&conn, "the program confines itself with seccomp");
    }
    for fd in table::fds_of_kind(LISTEN).chain(table::fds_of_kind(GUEST)).collect::<Vec<_>>() {
        forget(fd as i32);
    }
}

/// Relays `conn` over loopback TCP on every number it has in this process (`relay::hand_on`),
/// for `why`, which the log line gives; whether it was.
pub fn relay_here(conn: &Arc<Conn>, why: &str) -> bool {
    let socks: Vec<i32> = table::fds_of_kind(CONN).map(|fd| fd as i32).filter(|&fd| table::conn(fd).is_some_and(|c| Arc::ptr_eq(&c, conn))).collect();
    let peer = conn.shm().peer_addr();
    match relay::hand_on(conn, &socks, true) {
        Ok(()) => {
            log_info(format_args!("connection to {peer} on fd {socks:?}: relayed over loopback TCP ({why})"));
            true
        }
        Err(e) => {
            log_info(format_args!("connection to {peer} on fd {socks:?}: {why}; not relayed: {e}"));
            false
        }
    }
}

/// Signal-driven I/O (`O_ASYNC` by `F_SETFL` or `FIOASYNC`) asked for on connection `fd`: the
/// kernel signals the socket's owner when bytes arrive, and bytes on the rings reach no kernel
/// socket, so the connection is relayed over loopback TCP from now on (a socket that signals),
/// its owner and signal (`F_SETOWN_EX`, `F_SETSIG`) set on it as they were on the old one. The
/// caller then makes the program's call on the new socket. Not in a child that shares its
/// parent's memory (as `leave_process`).
pub fn signal_driven(fd: libc::c_int) {
    if borrowed_memory() {
        return;
    }
    if table::kind(fd) == PENDING {
        client::resolve_fd(fd);
    }
    let Some(conn) = table::conn(fd) else { return };
    // fcntl(2)'s F_SETSIG, F_GETSIG, F_SETOWN_EX and F_GETOWN_EX (the same on every Linux
    // architecture), and `struct f_owner_ex` (a type and a pid), which the libc crate lacks.
    const F_SETSIG: libc::c_int = 10;
    const F_GETSIG: libc::c_int = 11;
    const F_SETOWN_EX: libc::c_int = 15;
    const F_GETOWN_EX: libc::c_int = 16;
    let mut owner: [libc::c_int; 2] = [0, 0];
    // SAFETY: F_GETOWN_EX and F_GETSIG of the application's socket, into an array we own of
    // `struct f_owner_ex`'s size and layout.
    let (had_owner, sig) = unsafe { (crate::real::fcntl(fd, F_GETOWN_EX, owner.as_mut_ptr() as libc::c_ulong) == 0, crate::real::fcntl(fd, F_GETSIG, 0)) };
    if !relay_here(&conn, "the program asks for signal-driven I/O, O_ASYNC") {
        return;
    }
    // SAFETY: F_SETOWN_EX and F_SETSIG of the new socket on the same number, from a struct we
    // own.
    unsafe {
        if had_owner && owner[1] != 0 {
            crate::real::fcntl(fd, F_SETOWN_EX, owner.as_ptr() as libc::c_ulong);
        }
        if sig > 0 {
            crate::real::fcntl(fd, F_SETSIG, sig as libc::c_ulong);
        }
    }
}
