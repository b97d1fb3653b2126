//! `accept(2)` on a colo listener: the offer for the accepted connection's 4-tuple claimed (from
//! this process's service, or asked of the lineage's), or a connection from another network
//! namespace answered and claimed, before the application sees the connection.

use super::forked::{fetch, may_have_offer};
use super::markers::client_tag;
use super::offers::{drain, drain_one, drain_waiting, held, publish, take, MAX_PER_KEY};
use super::thread::{lock, own, ring, service};
use crate::base::addr::sockaddr_of;
use crate::base::log::{log_debug, log_info};
use crate::conn::entry::Listen;
use crate::conn::options;
use crate::conn::state::Conn;
use crate::conn::table::{self, Entry};
use crate::record::marker;
use crate::service::handover;
use colo::internal::carrier::{self, Hello};
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
    if netns_accept(listen, fd, nonblocking) {
        return;
    }
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

/// A connection from another network namespace to a listener with a rendezvous in
/// `COLO_NETNS_DIR` (spec/WIRE.md section 11): the proposal is answered and the proved offer
/// claimed before the application sees the connection. Returns whether the connection was
/// handled so (accelerated or left plain); false: not from another namespace, look for offers.
fn netns_accept(listen: &Listen, fd: i32, nonblocking: bool) -> bool {
    use colo::internal::netns;
    if !netns::server_configured() {
        return false;
    }
    // SAFETY: the fd the kernel just gave us, open for the duration of this call.
    let b = unsafe { colo_sys::BorrowedFd::borrow_raw(fd) };
    let Some(peer) = rustix::net::getpeername(b).ok().flatten().and_then(|a| sockaddr_of(&a)) else { return false };
    if !netns::from_elsewhere(peer) {
        return false;
    }
    let Some(r) = netns::serving(listen.addr.port()) else {
        netns::decline(b, peer);
        return true;
    };
    let Some(local) = rustix::net::getsockname(b).ok().and_then(|a| sockaddr_of(&a)) else { return true };
    let Some(est) = r.serve(b, local, peer) else { return true };
    match Conn::accepted(None, connection_ended, est, nonblocking) {
        Ok(c) if (fd as usize) < table::MAX_FD => {
            let c = Arc::new(c);
            if let Some(mut slot) = table::lock(fd) {
                slot.set(Entry::Conn(c.clone()));
            }
            options::adopt_options(fd, &c);
            handover::on_new(fd, &c);
            log_info(format_args!("accept {peer} -> {local}: accelerated (shared memory, other namespace)"));
        }
        Ok(_) => log_info(format_args!("accept {peer} -> {local}: fd {fd} too high; connection lost")),
        Err(e) => log_info(format_args!("accept {peer} -> {local}: {e}; connection reset")),
    }
    true
}

/// Claims `hello` for the connection just accepted as `fd`; returns whether the offer was
/// refused (then another offer for the same 4-tuple may be tried) and the connection is plain.
fn claim(fd: i32, nonblocking: bool, peer: std::net::SocketAddr, local: std::net::SocketAddr, hello: Option<Box<Hello>>) -> bool {
    let Some(hello) = hello else {
        log_debug(format_args!("accept {peer} -> {local}: no colo offer; plain TCP"));
        return false;
    };
    if fd as usize >= table::MAX_FD {
        carrier::reject(&hello.control, Reason::NoResources);
        log_info(format_args!("accept {peer} -> {local}: fd {fd} too high; plain TCP"));
        return false;
    }
    match hello.claim() {
        // The tag after the claim: its look at the client's command line must not delay the
        // WELCOME the client waits for.
        Ok(est) => match Conn::accepted(client_tag(&est.fds.control), connection_ended, est, nonblocking) {
            Ok(c) => {
                let c = Arc::new(c);
                if let Some(mut slot) = table::lock(fd) {
                    slot.set(Entry::Conn(c.clone()));
                }
                options::adopt_options(fd, &c);
                handover::on_new(fd, &c);
                log_info(format_args!("accept {peer} -> {local}: accelerated (shared memory)"));
                false
            }
            Err(e) => {
                log_info(format_args!("accept {peer} -> {local}: {e}; connection reset"));
                false
            }
        },
        Err(why) => {
            log_info(format_args!("accept {peer} -> {local}: {why}; plain TCP"));
            true
        }
    }
}
