//! Accelerated connections a program passes to another process over a Unix socket
//! (`SCM_RIGHTS`): node's cluster module does so by default (its primary accepts every
//! connection and hands it to a worker), as do pm2 and servers that hand accepted sockets to
//! workers they started. The receiver gets the TCP socket, a carrier that carries no byte, and
//! may not be preloaded at all; the connection's bytes are in the rings. So before such a
//! `sendmsg` the connection is relayed (`service::relay`): its descriptors here become loopback
//! TCP sockets on the same numbers, joined to the rings by a relay process, and those are what
//! is passed. The listener it came from serves its next connections plain TCP: relaying each
//! would be slower than TCP.
//!
//! A listening socket received that way (node's cluster module with its `none` scheduling, a
//! supervisor that hands its listener to workers) is a listener of the receiver's like one it
//! made: the receiver asks the rendezvous holder (the sender, if preloaded) for its connections'
//! offers (`service::server::guest`), or serves the rendezvous itself.

use crate::base::log::log_info;
use crate::conn::state::Conn;
use crate::conn::table::{self, CONN, PENDING};
use crate::service::{client, relay, server};
use libc::{c_int, msghdr};
use std::sync::Arc;

/// After `recvmsg` filled `msg`: each listening TCP socket it received becomes a colo listener
/// of this process's, as one inherited across `exec` does (`server::adopt_inherited`): nothing
/// is bound until the program accepts on it, so a socket passed by anyone to a process that
/// never uses it binds no rendezvous in its name.
///
/// # Safety
/// `msg` is the application's `msghdr`, as `recvmsg(2)` filled it.
pub unsafe fn after_recv(msg: *const msghdr) {
    // SAFETY: the caller's contract.
    for fd in unsafe { passed_fds(msg) } {
        if table::kind(fd) != table::NONE {
            continue;
        }
        if let Some(g) = crate::base::guard::Guard::try_enter() {
            server::adopt_inherited(fd);
            drop(g);
        }
    }
}

/// The descriptors `msg`'s `SCM_RIGHTS` messages carry.
///
/// # Safety
/// `msg` is null or a valid `msghdr` whose control buffer is `msg_controllen` readable bytes.
unsafe fn passed_fds(msg: *const msghdr) -> Vec<c_int> {
    let mut out = Vec::new();
    if msg.is_null() {
        return out;
    }
    // SAFETY: the caller's contract: a valid msghdr.
    let m = unsafe { &*msg };
    if m.msg_control.is_null() || m.msg_controllen < std::mem::size_of::<libc::cmsghdr>() {
        return out;
    }
    // SAFETY: `m`'s control buffer is `msg_controllen` readable bytes (the caller's contract);
    // the CMSG macros stay within it.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(m) };
    while !c.is_null() {
        // SAFETY: a header within the control buffer (CMSG_FIRSTHDR/CMSG_NXTHDR checked it).
        let h = unsafe { &*c };
        if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: CMSG_LEN(0) is the header's size; the data follows it.
            let data_len = (h.cmsg_len as usize).saturating_sub(unsafe { libc::CMSG_LEN(0) } as usize);
            // SAFETY: the descriptors of an SCM_RIGHTS message, `data_len` bytes at CMSG_DATA.
            let fds = unsafe { libc::CMSG_DATA(c) } as *const c_int;
            for i in 0..data_len / std::mem::size_of::<c_int>() {
                // SAFETY: within the message's data (above); unaligned as the buffer may be.
                out.push(unsafe { fds.add(i).read_unaligned() });
            }
        }
        // SAFETY: as for CMSG_FIRSTHDR.
        c = unsafe { libc::CMSG_NXTHDR(m, c) };
    }
    out
}

/// Before `sendmsg` with `msg`: relays each accelerated connection among the descriptors it
/// passes.
///
/// # Safety
/// `msg` is null or the application's `msghdr`, as `sendmsg(2)` takes it.
pub unsafe fn before_send(msg: *const msghdr) {
    let mut conns: Vec<Arc<Conn>> = Vec::new();
    // SAFETY: the caller's contract.
    for fd in unsafe { passed_fds(msg) } {
        if table::kind(fd) == PENDING {
            client::resolve_fd(fd);
        }
        if table::kind(fd) != CONN {
            continue;
        }
        if let Some(conn) = table::conn(fd) {
            if !conns.iter().any(|x| Arc::ptr_eq(x, &conn)) {
                conns.push(conn);
            }
        }
    }
    for conn in conns {
        pass_on(&conn);
    }
}

fn pass_on(conn: &Arc<Conn>) {
    let socks: Vec<i32> =
        table::fds_of_kind(CONN).map(|fd| fd as i32).filter(|&fd| table::conn(fd).is_some_and(|c| Arc::ptr_eq(&c, conn))).collect();
    let (local, peer) = (conn.shm().local_addr(), conn.shm().peer_addr());
    match relay::hand_on(conn, &socks, false) {
        Ok(()) => log_info(format_args!("connection {peer} -> {local} passed to another process: relayed over loopback TCP")),
        Err(why) => log_info(format_args!("connection {peer} -> {local} passed to another process, not relayed: {why}")),
    }
    if conn.shm().role() == colo::internal::segment::Role::Server {
        server::note_passed_on(local);
    }
}
