//! `accept(2)` on a colo listener: the offer for the accepted connection's 4-tuple claimed (from
//! this process's service, or asked of the lineage's) before the application sees the
//! connection; a connection from a listed peer of another network namespace held aside
//! (`held`), and handed out once its handshake is decided.

use super::forked::{fetch, may_have_offer};
use super::held::Held;
use super::markers::client_tag;
use super::offers::{drain, drain_one, drain_waiting, held, publish, take, MAX_PER_KEY};
use super::thread::{accept_collected, lock, own, ring, service};
use crate::base::addr::{sockaddr_of, write_sockaddr};
use crate::base::log::{log_debug, log_info};
use crate::conn::entry::Listen;
use crate::conn::options;
use crate::conn::state::Conn;
use crate::conn::table::{self, Entry};
use crate::record::marker;
use crate::service::handover;
use colo::internal::carrier::{self, Hello};
use colo::internal::netns_accept::Resolved;
use colo_sys::AsFd;
use colo::wire::Reason;
use std::sync::Arc;

/// A connection this process accepted on `local` through shared memory, from a program tagged
/// `tag`, ended (`short`: it did not pay for its set-up, see `adapt::Lived`).
fn connection_ended(local: std::net::SocketAddr, tag: u64, short: bool) {
    let Some(svc) = service() else { return };
    let Some(ends) = marker::slot(&svc.lineage.shared.ends, local.port(), tag) else { return };
    if ends.ended(marker::now_ms(), short) && svc.pid == colo_sys::host::pid() {
        // Raise or lower it now (a fork child's copy of the doorbell is closed: the service
        // thread gets to it at its next wake-up, within a second).
        ring(svc);
    }
}

/// After a successful real accept of `fd` on the colo listener `listen`: claim the offer for the
/// new connection.
pub fn on_accept(listen: &Listen, fd: i32, nonblocking: bool) {
    let svc = own().filter(|s| std::ptr::eq(s.lineage, listen.lineage));
    if let Some(svc) = svc {
        // A client offers before its SYN, so the offer of a connection already accepted has
        // arrived at its listener's rendezvous: with none pending the connection is plain, known
        // without asking the kernel for its addresses or looking at the other listeners (a
        // connection per request must cost no more than plain TCP).
        let mut st = lock(svc);
        drain_one(&mut st, listen);
        if !st.waiting.is_empty() {
            drain_waiting(&mut st);
        }
        if held(&st) > 0 {
            accept_collected();
        }
        if held(&st) == 0 {
            log_debug(format_args!("accept on fd {fd}: no colo offer pending; plain TCP"));
            return;
        }
    } else if !may_have_offer(listen) {
        log_debug(format_args!("accept on fd {fd}: no colo offer pending; plain TCP"));
        return;
    }
    // SAFETY: the fd the kernel just gave us, open for the duration of this call.
    let b = unsafe { colo_sys::BorrowedFd::borrow_raw(fd) };
    let (Some(local), Some(peer)) = (
        rustix::net::getsockname(b).ok().and_then(|a| sockaddr_of(&a)),
        rustix::net::getpeername(b).ok().flatten().and_then(|a| sockaddr_of(&a)),
    ) else {
        return;
    };
    let k = carrier::key(peer, local);
    // Several users' offers may name this 4-tuple (`State::rivals`): each is tried in turn, and
    // the claim's owner check refuses those whose sender does not own the client end.
    for _ in 0..MAX_PER_KEY {
        let hello = match svc {
            Some(svc) => {
                let mut st = lock(svc);
                // Collected by the look above unless its HELLO was still on the way.
                if !st.offers.contains_key(&k) {
                    drain(&mut st);
                }
                let h = take(&mut st, &k);
                publish(&st);
                h
            }
            None => fetch(listen.lineage, &k),
        };
        if !claim(fd, nonblocking, peer, local, hello) {
            break;
        }
    }
}

/// What became of a connection just accepted from a process that serves other namespaces.
pub enum Accepted {
    /// Held aside (`held`): the accept looks for another connection.
    Held,
    /// The application's, as it is (claimed if an offer named it, else plain TCP).
    Now,
}

/// After a real accept of `fd` (flags `flags`) on `listen` by a process that serves other
/// namespaces (`COLO_NETNS_DIR`): a connection from a listed peer is held in `held` to be
/// resolved off the accept path; without a set (or if the set cannot watch it) it is decided on
/// one look (a PROPOSAL already there answered DECLINE). Any other goes the way of every accept.
pub fn netns_accepted(listen: &Listen, held: Option<&Held>, fd: i32, flags: i32) -> Accepted {
    use colo::internal::netns;
    let nonblocking = flags & libc::SOCK_NONBLOCK != 0;
    // SAFETY: the fd the kernel just gave us, open for the duration of this call.
    let b = unsafe { colo_sys::BorrowedFd::borrow_raw(fd) };
    let Some(peer) = rustix::net::getpeername(b).ok().flatten().and_then(|a| sockaddr_of(&a)) else { return Accepted::Now };
    if !netns::from_elsewhere(peer) {
        // A CARRIER client's port is odd (spec/WIRE.md section 3).
        if !peer.port().is_multiple_of(2) {
            on_accept(listen, fd, nonblocking);
        }
        return Accepted::Now;
    }
    let Some(h) = held else {
        netns::decline_now(b, peer, "no rendezvous of this process (COLO_NETNS_DIR not writable?)");
        return Accepted::Now;
    };
    // Non-blocking and close-on-exec while held; as the accept that hands it out asks then.
    // SAFETY: the fd the kernel just gave us, owned by nothing else; the held set owns it from
    // here (released back to the application below if the set cannot take it).
    let tcp = unsafe { <std::net::TcpStream as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    if tcp.set_nonblocking(true).is_err() || rustix::io::fcntl_setfd(&tcp, rustix::io::FdFlags::CLOEXEC).is_err() {
        let _ = std::os::fd::IntoRawFd::into_raw_fd(tcp);
        return Accepted::Now;
    }
    // Held above the shim's floor; the number the kernel gave stays open until the set has it.
    let (held_tcp, given) = match out_of_the_way(&tcp) {
        Some(high) => (high, Some(tcp)),
        None => (tcp, None),
    };
    match h.admit(held_tcp, peer) {
        Ok(()) => {
            drop(given);
            log_debug(format_args!("accept {peer}: from another namespace; held until its handshake is decided"));
            Accepted::Held
        }
        Err(held_tcp) => {
            // The application gets the number the kernel gave, as `fd`.
            let tcp = given.unwrap_or(held_tcp);
            netns::decline_now(tcp.as_fd(), peer, "its socket cannot be watched");
            let _ = tcp.set_nonblocking(nonblocking);
            let fd_flags = if flags & libc::SOCK_CLOEXEC != 0 { rustix::io::FdFlags::CLOEXEC } else { rustix::io::FdFlags::empty() };
            let _ = rustix::io::fcntl_setfd(&tcp, fd_flags);
            let _ = std::os::fd::IntoRawFd::into_raw_fd(tcp);
            Accepted::Now
        }
    }
}

/// A copy of a held connection's socket above the shim's floor (as the shim's other
/// descriptors: the number the kernel gave is free again for the application's next descriptor
/// once the original is closed, and one it `dup2`s onto a number it believes free cannot close
/// it); `None` if there is none to be had.
fn out_of_the_way(tcp: &std::net::TcpStream) -> Option<std::net::TcpStream> {
    let copy = rustix::io::fcntl_dupfd_cloexec(tcp, 0).ok()?;
    colo_sys::preload::move_above(copy, colo::internal::fd_floor()).ok().map(std::net::TcpStream::from)
}

/// Hands the resolved connection `res` from `peer` to the application as a new descriptor, as
/// `accept4(.., addr, len, flags)` would have: non-blocking and close-on-exec as `flags` ask,
/// the peer's address at `addr`; on shared memory if its offer was claimed.
///
/// # Safety
/// `addr` and `len` are the application's arguments to accept4: null, or `*len` writable bytes
/// at `addr` and a writable `*len`.
pub unsafe fn hand_out(res: Resolved, peer: std::net::SocketAddr, addr: *mut libc::sockaddr, len: *mut libc::socklen_t, flags: i32) -> i32 {
    let nonblocking = flags & libc::SOCK_NONBLOCK != 0;
    let (tcp, est) = match res {
        Resolved::Shm(est, tcp) => (tcp, Some(est)),
        Resolved::Tcp(tcp) => (tcp, None),
    };
    // The lowest number free, as the kernel's accept gives (a program that `select`s needs it
    // below FD_SETSIZE); kept where it is if none is free (the application's limit is reached).
    let tcp = match rustix::io::fcntl_dupfd_cloexec(&tcp, 0) {
        Ok(low) if std::os::fd::AsRawFd::as_raw_fd(&low) < std::os::fd::AsRawFd::as_raw_fd(&tcp) => std::net::TcpStream::from(low),
        _ => tcp,
    };
    let _ = tcp.set_nonblocking(nonblocking);
    let fd_flags = if flags & libc::SOCK_CLOEXEC != 0 { rustix::io::FdFlags::CLOEXEC } else { rustix::io::FdFlags::empty() };
    let _ = rustix::io::fcntl_setfd(&tcp, fd_flags);
    let fd = std::os::fd::IntoRawFd::into_raw_fd(tcp);
    // SAFETY: the caller's contract on `addr` and `len`.
    unsafe { write_sockaddr(peer, addr, len) };
    let Some(est) = est else {
        log_info(format_args!("accept {peer}: from another namespace: plain TCP"));
        return fd;
    };
    let inheritable = flags & libc::SOCK_CLOEXEC == 0;
    match Conn::accepted(None, connection_ended, est, nonblocking, inheritable) {
        Ok(c) if (fd as usize) < table::MAX_FD => {
            let c = Arc::new(c);
            if let Some(mut slot) = table::lock(fd) {
                slot.set(Entry::Conn(c.clone()));
            }
            options::adopt_options(fd, &c);
            handover::on_new(fd, &c, inheritable);
            log_info(format_args!("accept {peer}: accelerated (shared memory, other namespace)"));
        }
        Ok(_) => log_info(format_args!("accept {peer}: fd {fd} too high; connection lost")),
        Err(e) => log_info(format_args!("accept {peer}: {e}; connection reset")),
    }
    fd
}

/// Claims `hello` for the connection just accepted as `fd`; returns whether the offer was
/// refused (then another offer for the same 4-tuple may be tried) and the connection is plain.
pub(super) fn claim(fd: i32, nonblocking: bool, peer: std::net::SocketAddr, local: std::net::SocketAddr, hello: Option<Box<Hello>>) -> bool {
    let Some(hello) = hello else {
        log_debug(format_args!("accept {peer} -> {local}: no colo offer; plain TCP"));
        return false;
    };
    if super::listen::passes_on(local) {
        // Its program passes its connections to other processes (`api::passed`).
        carrier::reject(&hello.control, Reason::NotClaimed);
        log_debug(format_args!("accept {peer} -> {local}: this listener's connections are passed on; plain TCP"));
        return false;
    }
    if fd as usize >= table::MAX_FD {
        carrier::reject(&hello.control, Reason::NoResources);
        log_info(format_args!("accept {peer} -> {local}: fd {fd} too high; plain TCP"));
        return false;
    }
    match hello.claim() {
        // The tag after the claim: its look at the client's command line must not delay the
        // WELCOME the client waits for.
        Ok(est) => {
            let inheritable = !handover::is_cloexec(fd);
            match Conn::accepted(client_tag(est.peer_pid), connection_ended, est, nonblocking, inheritable) {
                Ok(c) => {
                    let c = Arc::new(c);
                    if let Some(mut slot) = table::lock(fd) {
                        slot.set(Entry::Conn(c.clone()));
                    }
                    options::adopt_options(fd, &c);
                    handover::on_new(fd, &c, inheritable);
                    log_info(format_args!("accept {peer} -> {local}: accelerated (shared memory)"));
                    false
                }
                Err(e) => {
                    log_info(format_args!("accept {peer} -> {local}: {e}; connection reset"));
                    false
                }
            }
        }
        Err(why) => {
            log_info(format_args!("accept {peer} -> {local}: {why}; plain TCP"));
            true
        }
    }
}
