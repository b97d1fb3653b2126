//! The client side of a connect to a listener in another network namespace (spec/WIRE.md
//! section 11): the PROPOSAL goes out as soon as the TCP connection is up, and the answer is
//! read by whoever needs it first, never by a `connect` the application made non-blocking.
//!
//! - A blocking `connect` waits for the answer (at most `COLO_CARRIER_TIMEOUT_MS`).
//! - A non-blocking one returns `EINPROGRESS` (or what the kernel said) once the PROPOSAL is
//!   sent; the table holds a [`Dialing`] until the application's first operation on the socket
//!   (`epoll_ctl`, a read or a write: `client::resolve`) reads the answer, with what is left of
//!   the same wait, as the same-namespace path reads its server's answer. A `poll` waits for the
//!   answer with the application's other fds instead ([`undecided`]).
//! - An answer that has not come by then (the server's program has not accepted the connection)
//!   does not fail the connection, as a late accept does not over TCP: it goes on over plain
//!   TCP, and the answer, which the server sends first whenever it gets to the connection, is
//!   owed ([`Owed`]): taken off the stream before the application reads. The server, finding
//!   the client's bytes behind the PROPOSAL (or instead of the HELLO), declines at once.

use crate::base::addr::sockaddr_of;
use crate::base::log::{log_debug, log_info};
use crate::conn::entry::{Dialing, Owed, Pending};
use crate::conn::table::{self, Entry, Slot};
use crate::real;
use crate::record::adapt;
use crate::service::prepared::{geometry, timeout, Prepared};
use colo::internal::netns::{self, Dialed, Late};
use colo_sys::BorrowedFd;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a non-blocking `connect` waits for the TCP connection to be up before it sends the
/// PROPOSAL. A server reads a PROPOSAL only within its first-bytes wait (`COLO_NETNS_WAIT_MS`,
/// 50 ms from its accept), so it cannot wait for the application's first operation, which may
/// come any time later. Over the veths of one host the connection is up within microseconds;
/// one that is not within this (a dropped SYN) goes on as plain TCP, nothing sent.
const CONNECT_WAIT: Duration = Duration::from_millis(50);

/// Connects `b` to `peer`, a listener in another network namespace whose rendezvous is in `dir`,
/// and proposes shared memory on the connection.
pub fn connect(b: BorrowedFd<'_>, peer: SocketAddr, dir: &Path) -> Prepared {
    use rustix::fs::OFlags;
    let Ok(flags) = rustix::fs::fcntl_getfl(b) else { return Prepared::Plain };
    let blocking = !flags.contains(OFlags::NONBLOCK);
    if blocking && rustix::fs::fcntl_setfl(b, flags | OFlags::NONBLOCK).is_err() {
        return Prepared::Plain;
    }
    let outcome = dial(b, peer, dir, blocking);
    if blocking {
        let _ = rustix::fs::fcntl_setfl(b, flags);
    }
    outcome
}

fn done(errno: i32) -> Prepared {
    Prepared::Connected { later: Entry::None, errno }
}

/// `connect` with `b` made non-blocking: waits for the TCP connection (a blocking caller to the
/// end, else at most `CONNECT_WAIT`), sends the PROPOSAL, and for a blocking caller reads the
/// answer too.
fn dial(b: BorrowedFd<'_>, peer: SocketAddr, dir: &Path, blocking: bool) -> Prepared {
    // What a non-blocking caller is told, as the kernel told it.
    let mut told = 0;
    match rustix::net::connect(b, &peer) {
        Ok(()) => {}
        Err(rustix::io::Errno::INPROGRESS) => {
            told = libc::EINPROGRESS;
            let limit = if blocking { None } else { Some(CONNECT_WAIT) };
            if !matches!(colo_sys::tcp::wait_writable(b, limit), Ok(true)) {
                return done(libc::EINPROGRESS);
            }
            if !blocking {
                // Refused or unreachable: the error stays on the socket for the application's
                // `SO_ERROR` (reading it here would clear it).
                if failed(b) {
                    return done(libc::EINPROGRESS);
                }
            } else {
                match rustix::net::sockopt::socket_error(b) {
                    Ok(Ok(())) => told = 0,
                    Ok(Err(e)) => return done(e.raw_os_error()),
                    Err(e) => return done(e.raw_os_error()),
                }
            }
        }
        Err(e) => return done(e.raw_os_error()),
    }
    let proposed = match netns::send_proposal(b, dir) {
        Ok(p) => p,
        Err(d) => return unproposed(b, peer, d, told),
    };
    let d = Box::new(Dialing { proposed, deadline: Instant::now() + timeout(), peer, pid: colo_sys::host::pid() });
    if !blocking {
        return Prepared::Connected { later: Entry::Dialing(d), errno: told };
    }
    match answered(b, *d) {
        Ok(p) => Prepared::Connected { later: Entry::Pending(p), errno: 0 },
        Err(later) => Prepared::Connected { later, errno: 0 },
    }
}

/// Whether the connection of `b` failed (poll reports an error or a hang-up), without taking
/// the error off the socket.
fn failed(b: BorrowedFd<'_>) -> bool {
    use colo_sys::AsRawFd;
    let mut p = libc::pollfd { fd: b.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
    // SAFETY: one pollfd of ours, no waiting.
    let n = unsafe { real::poll(&mut p, 1, 0) };
    n == 1 && p.revents & (libc::POLLERR | libc::POLLHUP) != 0
}

/// A proposal that did not get as far as an offer: plain TCP, or (the stream unusable) a
/// connection shut down both ways so that nothing of colo's reaches the server's program.
fn unproposed(b: BorrowedFd<'_>, peer: SocketAddr, d: Dialed, errno: i32) -> Prepared {
    match d {
        Dialed::Plain(why) => log_info(format_args!("connect {peer}: other namespace: {why}; plain TCP")),
        Dialed::Broken(e) => {
            log_info(format_args!("connect {peer}: other namespace: {e}; connection failed"));
            let _ = rustix::net::shutdown(b, rustix::net::Shutdown::Both);
        }
        Dialed::Offered(_) => unreachable!("no offer went out"),
    }
    done(errno)
}

/// Reads the answer to `d` with what is left of its wait, then connects to the rendezvous and
/// offers: `Ok` the offer to decide (`client::resolve`), `Err` what the table holds instead
/// (nothing: plain TCP; or [`Owed`]: plain TCP, the answer still to come).
fn answered(b: BorrowedFd<'_>, d: Dialing) -> Result<Box<Pending>, Entry> {
    let Dialing { proposed, deadline, peer, pid } = d;
    let Some(local) = rustix::net::getsockname(b).ok().and_then(|a| sockaddr_of(&a)) else {
        return Err(Entry::Owed(Box::new(Owed { peer, partial_since: None })));
    };
    let waited = Instant::now();
    match proposed.finish(b, local, peer, geometry(), deadline.saturating_duration_since(waited)) {
        Dialed::Offered(offer) => Ok(Box::new(Pending { offer: *offer, deadline: Instant::now() + timeout(), peer, self_served: None, server: 0, pid })),
        Dialed::Broken(e) if e.kind() == io::ErrorKind::TimedOut => {
            // Its next connections would wait the same way (a server busy or stopped): plain TCP
            // there for a while, as for a same-namespace server whose queue does not move.
            adapt::not_accepting(peer);
            log_info(format_args!(
                "connect {peer}: other namespace: no answer within {} ms (its server's program has not accepted the connection); plain TCP, the answer taken off the stream when it comes, and plain TCP there for {:?}",
                timeout().as_millis(),
                adapt::BUSY_FOR
            ));
            Err(Entry::Owed(Box::new(Owed { peer, partial_since: None })))
        }
        d => {
            let _ = unproposed(b, peer, d, 0);
            Err(Entry::None)
        }
    }
}

/// Decides the [`Dialing`] entry of `fd` in `slot` (bounded wait for the answer): afterwards the
/// slot holds a `Pending` offer for `client::resolve` to decide, an [`Owed`] answer, or nothing.
pub fn resolve_dialing(fd: i32, slot: &mut Slot) {
    let Entry::Dialing(_) = slot.entry() else { return };
    let Entry::Dialing(d) = slot.take_keeping_kind() else { unreachable!() };
    // SAFETY: the application's socket, open during this call.
    let b = unsafe { BorrowedFd::borrow_raw(fd) };
    let now = match answered(b, *d) {
        Ok(p) => Entry::Pending(p),
        Err(e) => e,
    };
    slot.set(now);
}

/// For `poll`: the deadline of the [`Dialing`] entry of `fd` while its answer has not come (one
/// look without waiting, nothing taken off the stream), so that the poll waits for the answer
/// among the application's fds and reports nothing for this one meanwhile. `None` when `fd` is
/// no such entry, or `client::resolve` can decide it without waiting for the answer (it came,
/// the stream shows none will, or the wait for it is over).
pub fn undecided(fd: i32) -> Option<Instant> {
    if table::kind(fd) != table::PENDING {
        return None;
    }
    let mut slot = table::lock(fd)?;
    let Entry::Dialing(d) = slot.entry() else { return None };
    if Instant::now() >= d.deadline {
        return None;
    }
    // SAFETY: the application's socket, open during this call.
    let b = unsafe { BorrowedFd::borrow_raw(fd) };
    // Nothing yet. (Part of an answer is left to `resolve`'s bounded read: the kernel would
    // report the socket readable again at once.)
    match colo_sys::pathsock::recv_tcp(b, &mut [0u8; 1], true) {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Some(d.deadline),
        _ => None,
    }
}

/// One look at the head of the stream of the [`Owed`] entry of `fd` in `slot`: once the answer
/// is taken off (or the stream shows there is none), the slot holds nothing (plain TCP).
/// Returns whether the answer is still owed.
pub fn settle(fd: i32, slot: &mut Slot) -> bool {
    let Entry::Owed(o) = slot.entry() else { return false };
    let peer = o.peer;
    // SAFETY: the application's socket, open during this call.
    let b = unsafe { BorrowedFd::borrow_raw(fd) };
    // Another copy of the socket (a dup, a fork child) took the answer already: nothing is read
    // before it, so a stream read from at all has had its answer taken. The kernel's socket is
    // what the copies share: bytes received less bytes unread (a FIN counts one at most).
    let read_from = crate::service::downward::tcp_info(&b).zip(rustix::io::ioctl_fionread(b).ok());
    if read_from.is_some_and(|((received, _), unread)| received.saturating_sub(unread) >= netns::ANSWER_LEN as u64) {
        slot.set(Entry::None);
        return false;
    }
    match netns::take_answer(b) {
        Late::NotYet => {
            if rustix::io::ioctl_fionread(b).is_ok_and(|n| n > 0) {
                let Entry::Owed(o) = slot.entry() else { return false };
                let since = *o.partial_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= timeout() {
                    log_debug(format_args!("connect {peer}: other namespace: the stream begins with part of an answer that never grew; plain TCP"));
                    slot.set(Entry::None);
                    return false;
                }
            }
            true
        }
        late => {
            log_debug(format_args!("connect {peer}: other namespace: the late answer {}; plain TCP", if late == Late::Taken { "taken off the stream" } else { "never came" }));
            slot.set(Entry::None);
            false
        }
    }
}

/// Whether `fd`'s answer is owed ([`Owed`]): its reads go through [`owed_before_read`].
pub fn owed(fd: i32) -> bool {
    table::kind(fd) == table::PENDING && table::lock(fd).is_some_and(|mut s| matches!(s.entry(), Entry::Owed(_)))
}

/// Before a read of `fd` with `flags`: if its answer is owed, takes it off the stream first,
/// waiting for it as the read would wait for bytes (a blocking socket without `MSG_DONTWAIT`,
/// up to its `SO_RCVTIMEO`). Nothing can come before it: the server sends the answer before its
/// program sees the connection. `Some(errno)`: the read fails so (`EAGAIN` while the answer has
/// not come). The slot is not held while waiting, so other threads' writes go on.
pub fn owed_before_read(fd: i32, flags: i32) -> Option<i32> {
    loop {
        // SAFETY: the application's socket, open during this call.
        let b = unsafe { BorrowedFd::borrow_raw(fd) };
        let partial = {
            let mut slot = table::lock(fd)?;
            if !matches!(slot.entry(), Entry::Owed(_)) || !settle(fd, &mut slot) {
                return None;
            }
            matches!(slot.entry(), Entry::Owed(o) if o.partial_since.is_some())
        };
        let nonblocking = rustix::fs::fcntl_getfl(b).map(|f| f.contains(rustix::fs::OFlags::NONBLOCK)).unwrap_or(true);
        if nonblocking || flags & libc::MSG_DONTWAIT != 0 {
            return Some(libc::EAGAIN);
        }
        if partial {
            // Readable already (the part): a wait for more bytes would return at once.
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        let limit = rustix::net::sockopt::socket_timeout(b, rustix::net::sockopt::Timeout::Recv).ok().flatten();
        let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        let ms = limit.map_or(-1, |d| d.as_millis().clamp(1, i32::MAX as u128) as i32);
        // SAFETY: one pollfd of ours.
        match unsafe { real::poll(&mut p, 1, ms) } {
            0 => return Some(libc::EAGAIN),
            // Interrupted (EINTR, as the read would be) or failed: the read says so.
            n if n < 0 => return Some(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINTR)),
            _ => {}
        }
    }
}
