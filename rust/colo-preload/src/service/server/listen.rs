//! `listen(2)` and the close of a listener: the rendezvous `colo/1/<addr>` bound next to the
//! kernel listening socket (which stays pure kernel) and served by this process's offer
//! service, and the addresses this process listens on.

use super::offers::ClosedHere;
use super::thread::{lock, out_of_the_way, own, own_service, polled_without, ring};
use crate::base::addr::{is_tcp_stream, sockaddr_of};
use crate::base::env::disabled;
use crate::base::log::log_info;
use crate::base::mem::try_lock;
use crate::conn::entry::{Guest, Listen};
use crate::conn::table::{self, Entry};
use colo::wire;
use colo_sys::seqpacket;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use std::sync::{Arc, Mutex};

/// Addresses this process holds colo listeners for (a fork child inherits the list with the
/// sockets): a connection to one of them may have to be accepted by the very thread that dials.
static LISTENING: Mutex<Vec<std::net::SocketAddr>> = Mutex::new(Vec::new());

/// The local addresses of accepted connections this process passed to another process over a
/// Unix socket (`api::passed`): its listeners there serve plain TCP.
static PASSED_ON: Mutex<Vec<std::net::SocketAddr>> = Mutex::new(Vec::new());

/// A connection accepted at `local` was passed to another process.
pub fn note_passed_on(local: std::net::SocketAddr) {
    let mut l = PASSED_ON.lock().unwrap_or_else(|e| e.into_inner());
    if !l.contains(&local) {
        l.push(local);
        log_info(format_args!("listen {local}: its connections are passed to other processes: plain TCP from now on"));
    }
}

/// Whether a connection accepted at `local` stays plain TCP: one accepted there was passed on.
pub fn passes_on(local: std::net::SocketAddr) -> bool {
    try_lock(&PASSED_ON).is_some_and(|l| l.contains(&local))
}

/// Whether this process may be the one to accept a connection to `target` (it listens there).
pub fn may_accept(target: std::net::SocketAddr) -> bool {
    let Some(l) = try_lock(&LISTENING) else { return false };
    l.iter().any(|a| a.port() == target.port() && (a.ip() == target.ip() || a.ip().is_unspecified()))
}

/// After a successful real `listen(2)` on `fd`: bind the rendezvous and serve offers.
pub fn on_listen(fd: i32) {
    if disabled() || table::kind(fd) == table::LISTEN {
        return;
    }
    // SAFETY: `fd` is the application's socket, open for the duration of this call.
    let b = unsafe { colo_sys::BorrowedFd::borrow_raw(fd) };
    if !is_tcp_stream(b) {
        return;
    }
    let Some(addr) = rustix::net::getsockname(b).ok().and_then(|a| sockaddr_of(&a)) else { return };
    // A client trusts a rendezvous only if its owner is the kernel's owner of the listening
    // socket, the user that made it (`colo::trust`): a socket made before the program changed
    // user (squid, a server that drops root between socket and listen) could never be served.
    let made_by = rustix::fs::fstat(b).map(|st| st.st_uid).ok();
    let euid = rustix::process::geteuid().as_raw();
    if let Some(uid) = made_by.filter(|&u| u != euid) {
        log_info(format_args!(
            "listen {addr}: its socket was made by uid {uid}, before this process became uid {euid}: clients trust only a rendezvous of the socket's user; plain TCP"
        ));
        return;
    }
    let name = wire::rendezvous_name(addr);
    let bind = || seqpacket::listen(name.as_bytes()).and_then(out_of_the_way);
    let rendezvous = match bind() {
        Ok(r) => r,
        Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => {
            if share_sibling(fd, addr) {
                log_info(format_args!("listen {addr}: another listener of this process on it (SO_REUSEPORT): serving colo offers on its {name}"));
                return;
            }
            if take_back_closed(fd, addr) {
                log_info(format_args!("listen {addr}: serving colo offers on {name}, kept from a listener this process closed on it"));
                return;
            }
            // The name may be one this process kept for a listener it closed, which its service
            // thread let go between the bind and the look for it (the socket was no longer
            // listed): free again after that look, it binds on the second try.
            match bind() {
                Ok(r) => r,
                Err(_) => {
                    // Clients offer there, and the kernel may give their connections to this
                    // socket: it asks the holder for their offers (`guest`).
                    log_info(format_args!(
                        "listen {addr}: rendezvous {name} is held by another process (a SO_REUSEPORT listener on the same address, one that kept an earlier listener's, or a squatter); offers of the connections this listener accepts are asked of it"
                    ));
                    become_guest(fd, addr, name);
                    return;
                }
            }
        }
        Err(e) => {
            log_info(format_args!("listen {addr}: rendezvous {name}: {e}; this listener serves plain TCP"));
            return;
        }
    };
    serve_rendezvous(fd, addr, name, rendezvous);
}

/// `fd`, listening on `addr`, got its rendezvous `name` bound as `rendezvous`: this process's
/// offer service serves it.
fn serve_rendezvous(fd: i32, addr: std::net::SocketAddr, name: String, rendezvous: colo_sys::OwnedFd) {
    let svc = match own_service() {
        Ok(s) => s,
        Err(e) => {
            log_info(format_args!("listen {addr}: offer service: {e}; plain TCP"));
            return;
        }
    };
    static IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let id = IDS.fetch_add(1, Ordering::Relaxed);
    let l = Arc::new(Listen { rendezvous, addr, id, lineage: svc.lineage, forks: colo_sys::host::forks(), pid: colo_sys::host::pid() });
    if let Some(mut l) = try_lock(&LISTENING) {
        l.push(addr);
    }
    lock(svc).listens.push(l.clone());
    ring(svc);
    if let Some(mut slot) = table::lock(fd) {
        slot.set(Entry::Listen(l));
    }
    log_info(format_args!("listen {addr}: serving colo offers on {name}"));
    colo::internal::netns::listening(addr.port());
}

/// Sockets listening on one address with `SO_REUSEPORT` (nginx's `listen ... reuseport` makes
/// one per worker, all in the master): the kernel spreads the TCP connections over them, but only
/// the first has the address's rendezvous, where every client sends its offer. A connection the
/// kernel gives to another of them must still find its offer, or its client waits out its
/// carrier timeout before going on over TCP: `fd` (listening on `addr`, its rendezvous name
/// taken) becomes another descriptor of the listener this process already serves on `addr`,
/// whose offers it claims at accept by 4-tuple as that listener's own. False if there is none.
fn share_sibling(fd: i32, addr: std::net::SocketAddr) -> bool {
    let Some(svc) = own() else { return false };
    let sibling = table::fds_of_kind(table::LISTEN).find_map(|other| match table::lock(other as i32)?.entry() {
        Entry::Listen(l) if l.addr == addr && std::ptr::eq(l.lineage, svc.lineage) => Some(l.clone()),
        _ => None,
    });
    let Some(l) = sibling else { return false };
    if let Some(mut slot) = table::lock(fd) {
        slot.set(Entry::Listen(l));
    }
    true
}

/// A listener this process closed on `addr` while children forked since may hold it
/// (`on_close_listen`) still has the address's rendezvous while the service looks whether the
/// kernel lists it: `fd`, now listening on `addr` too (the old socket gone, or both with
/// `SO_REUSEPORT`), takes it back as its own, as `share_sibling` shares an open one. Without
/// this a program that closes its listener and listens again at once (a reload) would serve
/// plain TCP, and its clients wait their carrier timeout on the old listener's rendezvous.
/// False if there is none.
fn take_back_closed(fd: i32, addr: std::net::SocketAddr) -> bool {
    let Some(svc) = own() else { return false };
    let l = {
        let mut st = lock(svc);
        let Some(i) = st.closed_here.iter().position(|c| c.listen.addr == addr && std::ptr::eq(c.listen.lineage, svc.lineage)) else { return false };
        st.closed_here.swap_remove(i).listen
    };
    if let Some(mut listening) = try_lock(&LISTENING) {
        listening.push(addr);
    }
    if let Some(mut slot) = table::lock(fd) {
        slot.set(Entry::Listen(l));
    }
    colo::internal::netns::listening(addr.port());
    true
}

/// `fd`, listening on `addr`, whose rendezvous `name` another process holds: a guest listener
/// (`guest`).
fn become_guest(fd: i32, addr: std::net::SocketAddr, name: String) {
    let g = Guest { addr, name, refused: std::sync::atomic::AtomicBool::new(false), looked: AtomicU64::new(0) };
    if let Some(mut l) = try_lock(&LISTENING) {
        l.push(addr);
    }
    if let Some(mut slot) = table::lock(fd) {
        slot.set(Entry::Guest(Arc::new(g)));
    }
}

/// `fd`, a descriptor this image inherited (in the shim's constructor) or received over a Unix
/// socket, if a listening TCP socket (socket activation, a launcher that execs its server, a
/// server that re-execs itself to upgrade, node cluster's workers): a listener of this image's
/// whose offers are asked of the rendezvous holder (`guest`), and which takes the rendezvous over
/// at an accept if nobody holds it then. Nothing is bound and no thread started here.
pub fn adopt_inherited(fd: i32) {
    if disabled() || table::kind(fd) != table::NONE {
        return;
    }
    // SAFETY: a descriptor this image inherited, open for the duration of this call.
    let b = unsafe { colo_sys::BorrowedFd::borrow_raw(fd) };
    if !is_tcp_stream(b) || !rustix::net::sockopt::socket_acceptconn(b).unwrap_or(false) {
        return;
    }
    let Some(addr) = rustix::net::getsockname(b).ok().and_then(|a| sockaddr_of(&a)) else { return };
    become_guest(fd, addr, wire::rendezvous_name(addr));
}

/// `fd`, the guest listener `g`: if nobody holds its rendezvous now (the launcher that held it
/// let go, or there never was one), binds it and serves it as a listener of this process's own.
pub fn take_over_vacant(fd: i32, g: &Arc<Guest>) {
    let Ok(rendezvous) = seqpacket::listen(g.name.as_bytes()).and_then(out_of_the_way) else { return };
    on_close_guest(g, fd);
    serve_rendezvous(fd, g.addr, g.name.clone(), rendezvous);
}

/// When `fd`, a listening socket whose rendezvous another process holds, is about to be closed.
pub fn on_close_guest(g: &Arc<Guest>, fd: i32) {
    let elsewhere_here = table::fds_of_kind(table::GUEST).any(|other| {
        other as i32 != fd && table::lock(other as i32).is_some_and(|mut s| matches!(s.entry(), Entry::Guest(x) if Arc::ptr_eq(x, g)))
    });
    if elsewhere_here {
        return;
    }
    if let Some(mut listening) = try_lock(&LISTENING) {
        if let Some(i) = listening.iter().position(|&a| a == g.addr) {
            listening.swap_remove(i);
        }
    }
}

/// In a process forked from the serving one, which closes its last copy of the listener `l`:
/// it can never serve `l`'s rendezvous (`forked::orphaned` serves only the listeners a process
/// still holds), so its copy of the parent's service state lets go of `l`, and the caller's drop
/// of the last reference closes the inherited rendezvous descriptor. Kept, it would hold the
/// address's name after the serving process is gone (a fork-per-connection server restarted
/// while a child still serves): the new server's listen would find the name taken and ask a
/// holder that never answers, and its clients would wait, then go on over TCP, for as long as
/// the child lives. A state lock the parent's service thread held at the fork stays locked in
/// the child: the descriptor is then kept, as before.
fn forget_inherited(l: &Arc<Listen>) {
    let Some(svc) = super::thread::service() else { return };
    if let Some(mut st) = try_lock(&svc.state) {
        st.listens.retain(|x| !Arc::ptr_eq(x, l));
        st.closed_here.retain(|c| !Arc::ptr_eq(&c.listen, l));
    }
}

/// When listening fd `fd` is about to be closed in the process that listens: stop serving its
/// rendezvous, unless the listener is still open here under another number (a duplicate, or a
/// `SO_REUSEPORT` sibling, `share_sibling`), or may be open in a child forked since the listen
/// (a master that forks workers to accept, then closes its own copy): the service then keeps
/// serving it for as long as the kernel still lists the socket (`thread::closed_here`), since
/// the workers' accepts ask this process for their offers.
pub fn on_close_listen(l: &Arc<Listen>, fd: i32) {
    let elsewhere_here = table::fds_of_kind(table::LISTEN).any(|other| {
        other as i32 != fd && table::lock(other as i32).is_some_and(|mut s| matches!(s.entry(), Entry::Listen(x) if Arc::ptr_eq(x, l)))
    });
    if elsewhere_here {
        return;
    }
    // Its connections from other namespaces held here go (closed, as a listener's close ends
    // the connections in its queue).
    super::held::forget(l);
    if let Some(mut listening) = try_lock(&LISTENING) {
        if let Some(i) = listening.iter().position(|&a| a == l.addr) {
            listening.swap_remove(i);
        }
    }
    let Some(svc) = own() else {
        forget_inherited(l);
        return;
    };
    // SAFETY: `fd` is the application's listening socket, still open (the close comes after).
    let inode = rustix::fs::fstat(unsafe { colo_sys::BorrowedFd::borrow_raw(fd) }).map(|st| st.st_ino);
    let since = match inode {
        Ok(inode) if colo_sys::host::forks() != l.forks => {
            lock(svc).closed_here.push(ClosedHere { listen: l.clone(), fd, inode, next: Instant::now() });
            None
        }
        _ => {
            let mut st = lock(svc);
            st.listens.retain(|x| !Arc::ptr_eq(x, l));
            Some(st.collected)
        }
    };
    // Its markers are lowered by the service thread (`markers::tend_markers`), which alone
    // raises them.
    ring(svc);
    // The rendezvous is closed when the caller lets go of `l`, after this returns: its name is
    // then free for a listen that follows at once, if no poll of the service thread holds it.
    if let Some(since) = since {
        polled_without(svc, since);
    }
}
