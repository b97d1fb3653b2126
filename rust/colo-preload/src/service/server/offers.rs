//! The offers one service holds, and how they come in: rendezvous connections accepted and their
//! HELLOs read without blocking, within a bound overall (`MAX_PENDING`; beyond,
//! REJECT(NO_RESOURCES)) and one per client uid; kept by 4-tuple, with the rivals for one
//! 4-tuple in order; taken at a claim; dropped `PENDING_TTL` after they arrived or once their
//! client hung up. Every function here runs under the service's state lock.

use crate::base::log::{log_debug, log_info};
use crate::conn::entry::Listen;
use crate::record::lineage::Shared;
use colo::internal::carrier::{self, Hello, HelloRead, Key};
use colo::wire::{Mode, Reason};
use colo_sys::{seqpacket, AsFd, AsRawFd, OwnedFd};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// At most this many offers (and rendezvous connections whose HELLO has not arrived) are held
/// by one service; beyond, a new one is answered REJECT(NO_RESOURCES) and its client dials
/// plain TCP. Each holds two descriptors (the control socket and the segment memfd).
pub const MAX_PENDING: usize = 1024;

/// At most this many of them from one client uid (`SO_PEERCRED` of the rendezvous connection):
/// one user cannot take the room of the others.
pub const MAX_PENDING_PER_UID: usize = 256;

/// How many of them `uid` may have held: [`MAX_PENDING_PER_UID`], and for a uid other than ours
/// no more than hold a quarter of the descriptor numbers the shim keeps to
/// (`colo_sys::preload::band`: 64 under a fixed limit of 1024), two each: else another user's
/// offers and silent connections would leave our own user's connections none, and plain TCP.
fn most_from(uid: u32) -> usize {
    if uid == colo_sys::host::uid() {
        return MAX_PENDING_PER_UID;
    }
    MAX_PENDING_PER_UID.min((colo_sys::preload::band() / 4 / 2).max(1))
}

/// How long an offer (or a rendezvous connection without its HELLO) is kept: longer than a
/// client waits for its answer (`COLO_CARRIER_TIMEOUT_MS`, 500 ms by default; the Rust API's
/// client 500 ms), after which nobody can claim it any more.
pub const PENDING_TTL: Duration = Duration::from_secs(5);

/// At most this many offers are held for one 4-tuple, each from another uid (see `State::rivals`).
pub(super) const MAX_PER_KEY: usize = 8;

/// How often held offers are checked for clients that hung up (a `recv` each).
const HANGUP_SWEEP: Duration = Duration::from_secs(1);

/// How long the service leaves its rendezvous alone after running out of descriptors.
const STARVED_PAUSE: Duration = Duration::from_millis(100);

pub(super) struct State {
    pub(super) listens: Vec<Arc<Listen>>,
    /// Rendezvous connections whose HELLO has not arrived, oldest first, with when they were
    /// accepted and their client's uid.
    pub(super) waiting: Vec<(OwnedFd, Instant, u32)>,
    pub(super) offers: HashMap<Key, (Box<Hello>, Instant, u32)>,
    /// Later offers for a 4-tuple `offers` holds one for, each from a uid no other held offer for
    /// it comes from, oldest first. Only one sender can own the connection's client end, and which
    /// one is known only once the connection exists: an offer that came first (another user may
    /// know or see a client's port before it offers) must not keep the real client's out. The
    /// claim tries them in order; its owner check refuses the others.
    pub(super) rivals: Vec<(Key, Box<Hello>, Instant, u32)>,
    pub(super) shared: &'static Shared,
    /// When held offers were last checked for hang-ups.
    pub(super) swept: Instant,
    /// The bound was reached (logged once until there is room again).
    pub(super) full: bool,
    /// The uids whose bound was reached (logged once each until there is room again).
    pub(super) full_uids: Vec<u32>,
    /// Until when the rendezvous are not polled: accepting failed for want of descriptors.
    pub(super) starved: Option<Instant>,
    /// Listeners of `listens` this process closed while children forked since may hold them.
    pub(super) closed_here: Vec<ClosedHere>,
    /// How many times the service thread has collected the descriptors it polls (`listens`'
    /// rendezvous among them): a listener taken out of `listens` is no longer polled by the
    /// thread once this has moved on (`thread::polled_without`).
    pub(super) collected: u64,
    /// ASKs read (their connection text, their sender's uid), answered once the HELLOs that
    /// came before them are collected (`answer_asks`).
    pub(super) asks: Vec<(OwnedFd, Vec<u8>, u32)>,
}

/// A listener this process closed that may still be open in its children.
pub(super) struct ClosedHere {
    pub(super) listen: Arc<Listen>,
    /// The number it had here, and its socket's inode: the close is done once the number no
    /// longer names that inode.
    pub(super) fd: i32,
    pub(super) inode: u64,
    /// When to look again.
    pub(super) next: Instant,
}

/// Publishes how many offers the state holds (called under the state lock after any change).
pub(super) fn publish(st: &State) {
    // SYNC POINT with the SeqCst loads in `forked::may_have_offer`.
    st.shared.offers.store(held(st) as u32, Ordering::SeqCst);
}

pub(super) fn held(st: &State) -> usize {
    st.offers.len() + st.rivals.len() + st.waiting.len()
}

/// How many of those held come from `uid` (counted only when the total could reach `most`).
fn held_from(st: &State, uid: u32, most: usize) -> usize {
    if held(st) < most {
        return 0;
    }
    st.waiting.iter().filter(|w| w.2 == uid).count()
        + st.offers.values().filter(|o| o.2 == uid).count()
        + st.rivals.iter().filter(|r| r.3 == uid).count()
}

/// The uid of the process at the other end of a rendezvous connection (`u32::MAX` if the
/// kernel does not say: such clients share one bound).
fn peer_uid(c: &OwnedFd) -> u32 {
    let mut cred = libc::ucred { pid: 0, uid: u32::MAX, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED writes at most `len` bytes into `cred`, a `ucred` we own. (Not
    // rustix's `socket_peercred`, whose pid type cannot hold the 0 the kernel reports for a
    // process in a pid namespace this one cannot see.)
    let r = unsafe {
        libc::syscall(
            libc::SYS_getsockopt,
            c.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred,
            &mut len as *mut libc::socklen_t,
        )
    };
    if r < 0 {
        u32::MAX
    } else {
        cred.uid
    }
}

/// Whether the client at the other end of `control` has hung up.
fn hung_up(control: &OwnedFd) -> bool {
    let mut b = [0u8; 1];
    matches!(
        rustix::net::recv(control, &mut b[..], rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT),
        Ok(_) | Err(rustix::io::Errno::CONNRESET)
    )
}

/// Keeps a HELLO read from a rendezvous connection accepted at `at` from `uid`.
fn keep(st: &mut State, h: Box<Hello>, at: Instant, uid: u32) {
    if h.mode == Mode::Direct {
        carrier::reject(&h.control, Reason::NeedCarrier);
        log_debug(format_args!("DIRECT HELLO refused with NEED_CARRIER"));
        return;
    }
    let Some(k) = h.key() else { return };
    match st.offers.get(&k) {
        // Another offer for a 4-tuple whose first is still pending: at most one of them comes
        // from the connection's client, and which one is known only at the claim. One from a
        // uid with an offer held for it already is refused; one from another uid is kept.
        Some((first, _, first_uid)) if !hung_up(&first.control) => {
            let rivals = st.rivals.iter().filter(|r| r.0 == k);
            if *first_uid == uid || rivals.clone().any(|r| r.3 == uid) || rivals.count() + 1 >= MAX_PER_KEY {
                carrier::reject(&h.control, Reason::NotClaimed);
                log_info(format_args!("rendezvous: another offer from uid {uid} for {} -> {} refused (one is pending)", k.0, k.1));
            } else {
                st.rivals.push((k, h, at, uid));
            }
        }
        _ => {
            st.offers.insert(k, (h, at, uid));
        }
    }
}

/// Takes the oldest held offer for `k`; the next one for it, if any, moves up.
pub(super) fn take(st: &mut State, k: &Key) -> Option<Box<Hello>> {
    let first = st.offers.remove(k).map(|o| o.0);
    let next = st.rivals.iter().position(|r| r.0 == *k).map(|i| st.rivals.remove(i));
    match (first, next) {
        (Some(h), Some((_, n, at, uid))) => {
            st.offers.insert(*k, (n, at, uid));
            Some(h)
        }
        (first, next) => first.or(next.map(|n| n.1)),
    }
}

fn take_hello(st: &mut State, control: OwnedFd, uid: u32) {
    match carrier::read_hello(control) {
        // Kept for a while: out of the application's numbers (a HELLO's descriptors are moved
        // with it, in `read_hello`), so that connections that never send one cannot use up the
        // application's own limit of open files.
        HelloRead::Pending(c) => {
            let mut c = [c];
            match colo_sys::preload::move_all_above(&mut c, colo::internal::fd_floor()) {
                Ok(()) => st.waiting.extend(c.map(|c| (c, Instant::now(), uid))),
                Err(e) => {
                    refuse(&c[0]);
                    log_info(format_args!("rendezvous: a client of uid {uid} left on TCP: {e}: {}", colo_sys::preload::shortage()));
                }
            }
        }
        HelloRead::Hello(h) => keep(st, h, Instant::now(), uid),
        HelloRead::Ask(c, key) => st.asks.push((c, key, uid)),
        HelloRead::Refused(why) => refused(&why, uid),
    }
}

/// Logs why a HELLO was refused: at `info` when a resource refused it (its client stays on
/// TCP for want of it), else at `debug`.
fn refused(why: &str, uid: u32) {
    if why.starts_with(carrier::NO_DESCRIPTORS) {
        log_info(format_args!("rendezvous: a client of uid {uid} left on TCP: {why}: {}", colo_sys::preload::shortage()));
    } else {
        log_debug(format_args!("rendezvous: {why}"));
    }
}

/// Collects every HELLO that has arrived, without blocking.
pub(super) fn drain(st: &mut State) {
    let listens = st.listens.clone();
    for l in &listens {
        drain_one(st, l);
    }
    drain_waiting(st);
}

/// Answers a rendezvous connection REJECT(NO_RESOURCES) and lets it go. What is queued (a HELLO,
/// and anything a peer queued behind it, descriptors too) is taken first, once the socket
/// refuses descriptors, and once more after the answer: a connection closed with unread data
/// would reach its client as a reset before the reason (one whose HELLO lands between the last
/// look and the close still does; that client dials plain TCP all the same), and a descriptor
/// left queued would be released by the close in this thread (`colo_sys::gift`).
fn refuse(c: &OwnedFd) {
    colo_sys::gift::refuse_rights(c);
    seqpacket::empty_before_close(c);
    carrier::reject(c, Reason::NoResources);
    seqpacket::empty_before_close(c);
}

/// Collects the HELLOs that have arrived at one listener's rendezvous (none of the waiting ones).
/// Beyond `MAX_PENDING` held, a new rendezvous connection is answered REJECT(NO_RESOURCES).
pub(super) fn drain_one(st: &mut State, l: &Listen) {
    // SYNC POINT with `forked::may_have_offer`: busy from before the first accept until the
    // offers are counted.
    st.shared.busy.fetch_add(1, Ordering::SeqCst);
    loop {
        let c = match seqpacket::accept(&l.rendezvous) {
            Ok(c) => c,
            Err(e) => {
                if e.kind() != io::ErrorKind::WouldBlock && e.kind() != io::ErrorKind::Interrupted {
                    // Out of descriptors: the connections wait in the backlog; the service thread
                    // looks again a little later instead of spinning on the readable rendezvous.
                    if st.starved.is_none() {
                        log_info(format_args!(
                            "listen {}: rendezvous: {e}: offers wait (their clients may go to TCP): {}",
                            l.addr,
                            colo_sys::preload::shortage()
                        ));
                    }
                    st.starved = Some(Instant::now() + STARVED_PAUSE);
                }
                break;
            }
        };
        if held(st) >= MAX_PENDING {
            refuse(&c);
            if !st.full {
                st.full = true;
                log_info(format_args!(
                    "listen {}: {MAX_PENDING} offers pending (the limit): new ones are refused with NO_RESOURCES until some are claimed or expire",
                    l.addr
                ));
            }
            continue;
        }
        let uid = peer_uid(&c);
        let most = most_from(uid);
        if held_from(st, uid, most) >= most {
            refuse(&c);
            if !st.full_uids.contains(&uid) {
                st.full_uids.push(uid);
                log_info(format_args!(
                    "listen {}: {most} offers pending from uid {uid} (the limit per uid): its new ones are refused with NO_RESOURCES until some are claimed or expire",
                    l.addr
                ));
            }
            continue;
        }
        take_hello(st, c, uid);
    }
    if !st.asks.is_empty() {
        // Answered with the HELLOs still on their way collected.
        drain_waiting(st);
    }
    publish(st);
    // SYNC POINT with `forked::may_have_offer`: not busy only once the offers are counted
    // (`publish`).
    st.shared.busy.fetch_sub(1, Ordering::SeqCst);
}

/// Reads the HELLOs whose connections were accepted before their message arrived.
pub(super) fn drain_waiting(st: &mut State) {
    // Only those with something queued (one poll): another user may hold hundreds that never
    // speak, and this runs for each connection a process of the lineage accepts.
    let ready = {
        let fds: Vec<_> = st.waiting.iter().map(|w| w.0.as_fd()).collect();
        seqpacket::with_data(&fds)
    };
    let waiting = std::mem::take(&mut st.waiting);
    for ((c, at, uid), ready) in waiting.into_iter().zip(ready) {
        if at.elapsed() >= PENDING_TTL {
            seqpacket::let_go(c);
            continue;
        }
        if !ready {
            st.waiting.push((c, at, uid));
            continue;
        }
        match carrier::read_hello(c) {
            HelloRead::Pending(c) => st.waiting.push((c, at, uid)),
            HelloRead::Hello(h) => keep(st, h, at, uid),
            HelloRead::Ask(c, key) => st.asks.push((c, key, uid)),
            HelloRead::Refused(why) => refused(&why, uid),
        }
    }
    answer_asks(st);
    publish(st);
}

/// When (`marker::now_ms`) this process last read an ASK.
static ASKED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Whether this process read an ASK of its own user within the last ten seconds: a process that
/// does not serve the rendezvous accepts connections to its address, and waits on the answers.
pub(super) fn asked_lately() -> bool {
    let at = ASKED.load(Ordering::Relaxed);
    at != 0 && crate::record::marker::now_ms().saturating_sub(at) < 10_000
}

/// Answers the ASKs read (spec/WIRE.md section 3, "Offers for another process's listener"): the
/// offer of the connection named, to a process of this process's own user (the kernel admits
/// only the same user to a `SO_REUSEPORT` group) for a connection the kernel lists as accepted
/// (one still queued is for this process's own accepts); else `[0, 0]`. An offer handed over is
/// the asker's to claim.
fn answer_asks(st: &mut State) {
    if st.asks.is_empty() {
        return;
    }
    let me = rustix::process::geteuid().as_raw();
    for (c, key, uid) in std::mem::take(&mut st.asks) {
        if uid == me {
            // Another user's ASKs get nothing and change nothing here.
            ASKED.store(crate::record::marker::now_ms(), Ordering::Relaxed);
        }
        // Held first (no system call for a plain client's connection), then accepted.
        let k = crate::service::offer_key::decode(&key)
            .filter(|k| uid == me && (st.offers.contains_key(k) || st.rivals.iter().any(|r| r.0 == *k)))
            .filter(|k| matches!(colo_sys::diag::server_end(k.1, k.0), Ok(Some(colo_sys::diag::ServerEnd::Accepted))));
        let hello = k.and_then(|k| take(st, &k));
        match hello {
            Some(h) => {
                let _ = seqpacket::send(&c, &[1, h.mode as u8], &[h.control.as_fd(), h.memfd()]);
                log_debug(format_args!("rendezvous: an offer handed to another listener of uid {uid} on its address"));
            }
            None => {
                let _ = seqpacket::send(&c, &[0, 0], &[]);
            }
        }
    }
}

/// Drops what is older than `PENDING_TTL` (and, once per `HANGUP_SWEEP`, offers whose client
/// hung up); returns when the next one expires.
pub(super) fn expire(st: &mut State) -> Option<Instant> {
    let now = Instant::now();
    let before = held(st);
    let (kept, gone): (Vec<_>, Vec<_>) = std::mem::take(&mut st.waiting).into_iter().partition(|w| now.duration_since(w.1) < PENDING_TTL);
    st.waiting = kept;
    gone.into_iter().for_each(|w| seqpacket::let_go(w.0));
    st.offers.retain(|_, o| now.duration_since(o.1) < PENDING_TTL);
    st.rivals.retain(|r| now.duration_since(r.2) < PENDING_TTL);
    if now.duration_since(st.swept) >= HANGUP_SWEEP {
        st.swept = now;
        st.offers.retain(|_, o| !hung_up(&o.0.control));
        st.rivals.retain(|r| !hung_up(&r.1.control));
    }
    let gone = before - held(st);
    if gone > 0 {
        log_debug(format_args!("{gone} pending offer(s) expired or abandoned"));
    }
    if st.full && held(st) < MAX_PENDING {
        st.full = false;
    }
    if !st.full_uids.is_empty() {
        let mut full = std::mem::take(&mut st.full_uids);
        full.retain(|&uid| {
            let most = most_from(uid);
            held_from(st, uid, most) >= most
        });
        st.full_uids = full;
    }
    publish(st);
    let oldest = st.waiting.iter().map(|w| w.1).chain(st.offers.values().map(|o| o.1)).chain(st.rivals.iter().map(|r| r.2)).min();
    oldest.map(|at| at + PENDING_TTL)
}
