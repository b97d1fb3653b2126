//! Offers for a listener whose rendezvous another process holds (spec/WIRE.md section 3, "Offers
//! for another process's listener"). Unrelated processes of one user may listen on one address
//! with `SO_REUSEPORT` (an old server and its replacement, independent copies of a server): the
//! kernel spreads the connections over their sockets, but every client sends its HELLO to the
//! one rendezvous, which the first of them holds. Each other one (a *guest*) asks the holder for
//! the offer of each connection it accepts and claims it as its own (`offers::answer_asks` is
//! the holder's side).

use super::accept::claim;
use crate::base::addr::sockaddr_of;
use crate::base::log::{log_debug, log_info};
use crate::conn::entry::Guest;
use crate::service::offer_key;
use colo::internal::carrier::{self, Hello, Key};
use colo::wire::{self, Mode, Reason};
use colo_sys::{seqpacket, BorrowedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a guest's accept waits for the holder's answer. A holder answers at its service
/// thread's next look, at once unless it has just been handing its offers to its own accepts
/// (then within `thread::ACCEPTS_COLLECT_EVERY_MS`, once; it stops doing so while asked).
const ANSWER_WAIT: Duration = Duration::from_millis(25);

/// What an ASK found out.
enum Asked {
    /// The offer, to claim.
    Offer(Box<Hello>),
    /// None for this connection (plain TCP), or the holder could not be asked now.
    Nothing,
    /// Nobody holds the rendezvous: this listener takes it over.
    Vacant,
    /// Never to be asked again: the reason, for the log.
    Never(String),
}

/// How often a guest's accepts look whether its rendezvous is free (a bind).
const VACANCY_LOOK_MS: u64 = 1000;

/// On an accept on the guest listener `listen_fd`, whatever the connection: at most once per
/// `VACANCY_LOOK_MS`, takes the rendezvous over if nobody holds it (`listen::take_over_vacant`).
/// A client offers only where a rendezvous is bound, so a listener that waited for an offer
/// to find the rendezvous free would wait for good.
pub fn look_for_vacancy(listen_fd: i32, g: &Arc<Guest>) {
    let now = crate::record::marker::now_ms();
    let last = g.looked.load(Ordering::Relaxed);
    if last != 0 && now.saturating_sub(last) < VACANCY_LOOK_MS {
        return;
    }
    g.looked.store(now.max(1), Ordering::Relaxed);
    super::listen::take_over_vacant(listen_fd, g);
}

/// After a successful real accept of `fd` on `g`'s listening socket `listen_fd` (a connection
/// from an odd port, spec section 3): claims its offer if the rendezvous holder hands it over.
/// With nobody holding the rendezvous, the listener takes it over for the connections after
/// this one.
pub fn on_accept(listen_fd: i32, g: &Arc<Guest>, fd: i32, nonblocking: bool) {
    if g.refused.load(Ordering::Relaxed) {
        return;
    }
    // SAFETY: the fd the kernel just gave us, open for the duration of this call.
    let b = unsafe { BorrowedFd::borrow_raw(fd) };
    let (Some(local), Some(peer)) = (
        rustix::net::getsockname(b).ok().and_then(|a| sockaddr_of(&a)),
        rustix::net::getpeername(b).ok().flatten().and_then(|a| sockaddr_of(&a)),
    ) else {
        return;
    };
    match ask(g, &carrier::key(peer, local)) {
        Asked::Offer(h) => {
            claim(fd, nonblocking, peer, local, Some(h));
        }
        Asked::Nothing => log_debug(format_args!("accept {peer} -> {local}: no colo offer at {}; plain TCP", g.name)),
        Asked::Vacant => super::listen::take_over_vacant(listen_fd, g),
        Asked::Never(why) => {
            g.refused.store(true, Ordering::Relaxed);
            log_info(format_args!("listen {}: {why}; this listener serves plain TCP", g.addr));
        }
    }
}

fn ask(g: &Guest, k: &Key) -> Asked {
    let c = match seqpacket::connect_nonblocking(g.name.as_bytes()) {
        Ok(c) => c,
        Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => return Asked::Vacant,
        // Its backlog full: this connection is plain.
        Err(_) => return Asked::Nothing,
    };
    // The holder gets the connection's addresses and hands over descriptors the claim trusts
    // as a HELLO's: only a process of this process's own user may. Another user's holder is
    // asked nothing, this time only: any user may bind a free name for a moment (while our
    // holder restarts), and our holder may take it back after.
    match seqpacket::peer_cred(&c) {
        Ok((_, uid)) if uid == rustix::process::geteuid().as_raw() => {}
        Ok((_, uid)) => {
            log_debug(format_args!("the rendezvous {} is held by uid {uid}, not this process's: not asked", g.name));
            return Asked::Nothing;
        }
        Err(_) => return Asked::Nothing,
    }
    let Some(msg) = wire::encode_ask(&offer_key::encode(k)) else { return Asked::Nothing };
    if seqpacket::send(&c, &msg, &[]).is_err() {
        return Asked::Nothing;
    }
    let deadline = Instant::now() + ANSWER_WAIT;
    let mut buf = [0u8; wire::MESSAGE_LEN];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Asked::Nothing;
        }
        let mut p = [rustix::event::PollFd::new(&c, rustix::event::PollFlags::IN)];
        let t = rustix::event::Timespec { tv_sec: 0, tv_nsec: left.as_nanos() as i64 };
        if !matches!(rustix::event::poll(&mut p, Some(&t)), Ok(n) if n > 0) {
            continue;
        }
        // Descriptors of a process of our own user: disarmed, their queues left alone.
        let mut r = match seqpacket::recv_own(&c, &mut buf, true) {
            Ok(r) => r,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return Asked::Nothing,
        };
        return match (r.len, buf[0], r.fds.len()) {
            (2, 1, 2) => {
                let mode = if buf[1] == Mode::Direct as u8 { Mode::Direct } else { Mode::Carrier };
                let mut it = r.take_fds().into_iter();
                let (Some(control), Some(memfd)) = (it.next(), it.next()) else {
                    return Asked::Nothing;
                };
                match carrier::hello_from_fds(control, memfd, mode) {
                    Ok(h) if h.key() == Some(*k) => Asked::Offer(Box::new(h)),
                    Ok(h) => {
                        carrier::reject(&h.control, Reason::BadMessage);
                        Asked::Nothing
                    }
                    Err(_) => Asked::Nothing,
                }
            }
            // A holder that does not take ASKs (not the shim) refuses it as a bad HELLO; any
            // other answer (NO_RESOURCES while it holds its limit of offers, descriptors cut
            // short for want of numbers here) is for this connection only.
            (wire::MESSAGE_LEN, _, 0)
                if matches!(
                    wire::Message::decode(&buf),
                    Ok(wire::Message::Reject { reason: Reason::BadMessage | Reason::BadVersion, .. })
                ) =>
            {
                Asked::Never(format!("the rendezvous {} does not hand over offers", g.name))
            }
            _ => Asked::Nothing,
        };
    }
}
