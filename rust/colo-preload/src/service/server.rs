//! The server side: at `listen(2)` the shim binds the rendezvous `colo/1/<addr>` next to the
//! kernel listening socket (which stays pure kernel), and a background thread (the *offer
//! service*) collects CARRIER offers keyed by 4-tuple. `accept(2)` looks up the accepted
//! connection's 4-tuple and claims the offer. A process forked from the one that listens (a
//! multi-worker server accepting after fork) asks the service for the offer over the socket pair
//! of its *lineage* (`crate::record::lineage`: inherited, never named), and gets the descriptors with
//! SCM_RIGHTS. When the serving process is gone (a daemonized master), one of the processes
//! forked from it takes the service over (the lineage's owner word decides which).
//!
//! Pending offers are bounded (`MAX_PENDING`; beyond, REJECT(NO_RESOURCES)) and each expires
//! `PENDING_TTL` after it arrived, on the service thread's own timer.

use crate::base::addr::{is_tcp_stream, sockaddr_of};
use crate::base::env::disabled;
use crate::base::log::{log_debug, log_info};
use crate::base::mem::try_lock;
use crate::conn::entry::Listen;
use crate::conn::options;
use crate::conn::state::Conn;
use crate::conn::table::{self, Entry};
use crate::record::adapt;
use crate::record::lineage::{Asked, Lineage, Request, Shared};
use crate::record::marker;
use crate::service::{handover, offer_key};
use colo::internal::carrier::{self, Hello, HelloRead, Key};
use colo::wire::{self, Mode, Reason};
use colo_sys::{seqpacket, AsFd, AsRawFd, OwnedFd};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// At most this many offers (and rendezvous connections whose HELLO has not arrived) are held
/// by one service; beyond, a new one is answered REJECT(NO_RESOURCES) and its client dials
/// plain TCP. Each holds four descriptors.
pub const MAX_PENDING: usize = 1024;

/// At most this many of them from one client uid (`SO_PEERCRED` of the rendezvous connection):
/// one user cannot take the room of the others.
pub const MAX_PENDING_PER_UID: usize = 256;

/// How long an offer (or a rendezvous connection without its HELLO) is kept: longer than a
/// client waits for its answer (`COLO_CARRIER_TIMEOUT_MS`, 500 ms by default; the Rust API's
/// client 500 ms), after which nobody can claim it any more.
pub const PENDING_TTL: Duration = Duration::from_secs(5);

/// At most this many offers are held for one 4-tuple, each from another uid (see `State::rivals`).
const MAX_PER_KEY: usize = 8;

/// How often held offers are checked for clients that hung up (a `recv` each).
const HANGUP_SWEEP: Duration = Duration::from_secs(1);

/// How long the service leaves its rendezvous alone after running out of descriptors.
const STARVED_PAUSE: Duration = Duration::from_millis(100);

/// How long a process forked from the serving one waits for the service's answer.
const ASK_WAIT: Duration = Duration::from_millis(500);

/// Addresses this process holds colo listeners for (a fork child inherits the list with the
/// sockets): a connection to one of them may have to be accepted by the very thread that dials.
static LISTENING: Mutex<Vec<std::net::SocketAddr>> = Mutex::new(Vec::new());

/// Whether this process may be the one to accept a connection to `target` (it listens there).
pub fn may_accept(target: std::net::SocketAddr) -> bool {
    let Some(l) = try_lock(&LISTENING) else { return false };
    l.iter().any(|a| a.port() == target.port() && (a.ip() == target.ip() || a.ip().is_unspecified()))
}

struct State {
    listens: Vec<Arc<Listen>>,
    /// Rendezvous connections whose HELLO has not arrived, oldest first, with when they were
    /// accepted and their client's uid.
    waiting: Vec<(OwnedFd, Instant, u32)>,
    offers: HashMap<Key, (Box<Hello>, Instant, u32)>,
    /// Later offers for a 4-tuple `offers` holds one for, each from a uid no other held offer for
    /// it comes from, oldest first. Only one sender can own the connection's client end, and which
    /// one is known only once the connection exists: an offer that came first (another user may
    /// know or see a client's port before it offers) must not keep the real client's out. The
    /// claim tries them in order; its owner check refuses the others.
    rivals: Vec<(Key, Box<Hello>, Instant, u32)>,
    shared: &'static Shared,
    /// When held offers were last checked for hang-ups.
    swept: Instant,
    /// The bound was reached (logged once until there is room again).
    full: bool,
    /// The uids whose bound was reached (logged once each until there is room again).
    full_uids: Vec<u32>,
    /// Until when the rendezvous are not polled: accepting failed for want of descriptors.
    starved: Option<Instant>,
}

/// Publishes how many offers the state holds (called under the state lock after any change).
fn publish(st: &State) {
    // SYNC POINT with the SeqCst loads in `may_have_offer`.
    st.shared.offers.store(held(st) as u32, Ordering::SeqCst);
}

/// In a process forked from the service's: whether the connection just accepted on `l` may have
/// an offer (then ask the service). The client's HELLO is sent before its SYN, so it is either
/// still queued at the rendezvous (readable), or being taken by the service (`busy`), or held
/// (`offers`): checked in that order, as the service moves it the other way.
fn may_have_offer(l: &Listen) -> bool {
    let shared = l.lineage.shared;
    let mut p = [rustix::event::PollFd::new(&l.rendezvous, rustix::event::PollFlags::IN)];
    let queued = rustix::event::poll(&mut p, Some(&rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 })).map_or(true, |n| n > 0);
    // SYNC POINT with `drain_one` (busy) and `publish` (offers): the loads below come after the
    // look at the queue (a system call is no fence on every architecture).
    std::sync::atomic::fence(Ordering::SeqCst);
    queued || shared.busy.load(Ordering::SeqCst) != 0 || shared.offers.load(Ordering::SeqCst) != 0
}

struct Service {
    pid: u32,
    lineage: &'static Lineage,
    state: Mutex<State>,
    wake: OwnedFd,
}

/// The offer service of this process (or, in a fork child, of the process it was forked from).
static SERVICE: AtomicPtr<Service> = AtomicPtr::new(std::ptr::null_mut());

fn service() -> Option<&'static Service> {
    // SYNC POINT with the Release store in `start`.
    let p = SERVICE.load(Ordering::Acquire);
    // SAFETY: services are leaked (never freed), so a non-null pointer stays valid.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// This process's own service, if it runs one.
fn own() -> Option<&'static Service> {
    service().filter(|s| s.pid == colo_sys::host::pid())
}

fn own_service() -> io::Result<&'static Service> {
    if let Some(s) = own() {
        return Ok(s);
    }
    let lineage = Lineage::new()?;
    start(lineage, lineage.owner(), Vec::new()).ok_or_else(|| io::Error::other("the service thread did not start"))
}

/// A wake-up eventfd for the service thread, private to its process (fork children close their
/// copy), so ringing it never blocks.
fn wake_fd() -> io::Result<OwnedFd> {
    let fd = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK)?;
    out_of_the_way(fd)
}

fn ring(svc: &Service) {
    let _ = rustix::io::write(&svc.wake, &1u64.to_ne_bytes());
}

/// Starts a service thread in this process for `lineage`, serving `listens`, if it becomes the
/// lineage's owner (the owner word still reads `seen`); returns the service it then is.
fn start(lineage: &'static Lineage, seen: u32, listens: Vec<Arc<Listen>>) -> Option<&'static Service> {
    let wake = match wake_fd() {
        Ok(w) => w,
        Err(e) => {
            log_info(format_args!("offer service: {e}"));
            return None;
        }
    };
    let state = State { listens, waiting: Vec::new(), offers: HashMap::new(), rivals: Vec::new(), shared: lineage.shared, swept: Instant::now(), full: false, full_uids: Vec::new(), starved: None };
    let svc = Box::new(Service { pid: colo_sys::host::pid(), lineage, state: Mutex::new(state), wake });
    let (tx, rx) = std::sync::mpsc::sync_channel::<Option<usize>>(1);
    let spawned = colo_sys::host::with_signals_blocked(|| {
        std::thread::Builder::new().name("colo-offers".into()).spawn(move || {
            if !svc.lineage.take_over(seen) {
                // Another process (or thread) serves: this one's `wake` is closed with it.
                let _ = tx.send(None);
                return;
            }
            let svc: &'static Service = Box::leak(svc);
            {
                // Counts a service that ended left behind are not this one's.
                let st = lock(svc);
                // SYNC POINT with the SeqCst loads in `may_have_offer`, as in `drain_one`.
                svc.lineage.shared.busy.store(0, Ordering::SeqCst);
                publish(&st);
            }
            // SYNC POINT with the Acquire load in `service`: a thread that sees the pointer sees
            // the Service built above.
            SERVICE.store(svc as *const Service as *mut Service, Ordering::Release);
            let _ = tx.send(Some(svc as *const Service as usize));
            serve(svc)
        })
    });
    if let Err(e) = spawned {
        log_info(format_args!("offer service: {e}"));
        return None;
    }
    // The verdict comes at once (the thread's first act); a thread that died first dropped `tx`.
    // SAFETY: the pointer is to a leaked `Service` (never freed).
    rx.recv().ok().flatten().map(|p| unsafe { &*(p as *const Service) })
}

/// A descriptor the service keeps for long, moved out of the numbers the application uses: a
/// program that `dup2`s onto a low number it believes free (a shell redirection, `dup2(s, 5)`)
/// would otherwise close the rendezvous under the service, which then took the application's
/// next connection at that number for its own.
fn out_of_the_way(fd: OwnedFd) -> io::Result<OwnedFd> {
    colo_sys::preload::move_above(fd, colo::internal::fd_floor())
}

fn lock(s: &Service) -> std::sync::MutexGuard<'_, State> {
    s.state.lock().unwrap_or_else(|e| e.into_inner())
}

fn held(st: &State) -> usize {
    st.offers.len() + st.rivals.len() + st.waiting.len()
}

/// How many of those held come from `uid` (counted only when the total could reach the bound).
fn held_from(st: &State, uid: u32) -> usize {
    if held(st) < MAX_PENDING_PER_UID {
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
fn take(st: &mut State, k: &Key) -> Option<Box<Hello>> {
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
fn drain(st: &mut State) {
    let listens = st.listens.clone();
    for l in &listens {
        drain_one(st, l);
    }
    drain_waiting(st);
}

/// Answers a rendezvous connection REJECT(NO_RESOURCES) and lets it go. A HELLO already queued
/// is read first, and once more after the answer: a connection closed with unread data would
/// reach its client as a reset before the reason (one whose HELLO lands between the last look and
/// the close still does; that client dials plain TCP all the same).
fn refuse(c: &OwnedFd) {
    let mut b = [0u8; 64];
    let _ = seqpacket::recv(c, &mut b, true);
    carrier::reject(c, Reason::NoResources);
    let _ = seqpacket::recv(c, &mut b, true);
}

/// Collects the HELLOs that have arrived at one listener's rendezvous (none of the waiting ones).
/// Beyond `MAX_PENDING` held, a new rendezvous connection is answered REJECT(NO_RESOURCES).
fn drain_one(st: &mut State, l: &Listen) {
    // SYNC POINT with `may_have_offer`: busy from before the first accept until the offers are
    // counted.
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
        if held_from(st, uid) >= MAX_PENDING_PER_UID {
            refuse(&c);
            if !st.full_uids.contains(&uid) {
                st.full_uids.push(uid);
                log_info(format_args!(
                    "listen {}: {MAX_PENDING_PER_UID} offers pending from uid {uid} (the limit per uid): its new ones are refused with NO_RESOURCES until some are claimed or expire",
                    l.addr
                ));
            }
            continue;
        }
        take_hello(st, c, uid);
    }
    publish(st);
    // SYNC POINT with `may_have_offer`: not busy only once the offers are counted (`publish`).
    st.shared.busy.fetch_sub(1, Ordering::SeqCst);
}

/// Reads the HELLOs whose connections were accepted before their message arrived.
fn drain_waiting(st: &mut State) {
    // Only those with something queued (one poll): another user may hold hundreds that never
    // speak, and this runs for each connection a process of the lineage accepts.
    let ready = {
        let fds: Vec<_> = st.waiting.iter().map(|w| w.0.as_fd()).collect();
        seqpacket::with_data(&fds)
    };
    let waiting = std::mem::take(&mut st.waiting);
    for ((c, at, uid), ready) in waiting.into_iter().zip(ready) {
        if at.elapsed() >= PENDING_TTL {
            continue;
        }
        if !ready {
            st.waiting.push((c, at, uid));
            continue;
        }
        match carrier::read_hello(c) {
            HelloRead::Pending(c) => st.waiting.push((c, at, uid)),
            HelloRead::Hello(h) => keep(st, h, at, uid),
            HelloRead::Refused(why) => refused(&why, uid),
        }
    }
    publish(st);
}

/// Drops what is older than `PENDING_TTL` (and, once per `HANGUP_SWEEP`, offers whose client
/// hung up); returns when the next one expires.
fn expire(st: &mut State) -> Option<Instant> {
    let now = Instant::now();
    let before = held(st);
    st.waiting.retain(|w| now.duration_since(w.1) < PENDING_TTL);
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
    if !st.full_uids.is_empty() && held(st) < MAX_PENDING_PER_UID {
        st.full_uids.clear();
    }
    publish(st);
    let oldest = st.waiting.iter().map(|w| w.1).chain(st.offers.values().map(|o| o.1)).chain(st.rivals.iter().map(|r| r.2)).min();
    oldest.map(|at| at + PENDING_TTL)
}

/// Answers one request of a process of the lineage: the offer's descriptors, or "none".
fn answer_request(svc: &Service, req: Request) {
    let Some(k) = offer_key::decode(&req.bytes) else {
        return req.answer(&[0, 0], &[]);
    };
    let hello = {
        let mut st = lock(svc);
        drain(&mut st);
        let h = take(&mut st, &k);
        publish(&st);
        h
    };
    match hello {
        Some(h) => {
            let fds = [h.control.as_fd(), h.memfd.as_fd(), h.client_bell.as_fd(), h.server_bell.as_fd()];
            req.answer(&[1, h.mode as u8], &fds);
        }
        None => req.answer(&[0, 0], &[]),
    }
}

fn serve(svc: &'static Service) {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut next_expiry: Option<Instant> = None;
    // Whether the lineage's socket pair is still open here (a program that closes descriptors
    // it does not know closes it too: its processes then get no answers, and this thread must
    // not spin on the invalid descriptor).
    let mut requests = true;
    loop {
        let fds: Vec<i32> = {
            let mut st = lock(svc);
            let starved = st.starved.is_some_and(|t| t > Instant::now());
            if !starved {
                st.starved = None;
            }
            let listens = st.listens.iter().filter(|_| !starved);
            let mut v: Vec<i32> = listens.map(|l| l.rendezvous.as_raw_fd()).collect();
            v.extend(st.waiting.iter().map(|w| w.0.as_raw_fd()));
            v
        };
        let mut pfds = Vec::with_capacity(fds.len() + 2);
        pfds.push(PollFd::new(&svc.wake, PollFlags::IN));
        let serve_fd = svc.lineage.serve_fd();
        if requests {
            pfds.push(PollFd::new(&serve_fd, PollFlags::IN));
        }
        // SAFETY: these fds stay open while we poll: listens are only removed under the lock by
        // `unlisten`, which wakes us first, and a closed fd in poll only reports POLLNVAL.
        let borrowed: Vec<_> = fds.iter().map(|&f| unsafe { colo_sys::BorrowedFd::borrow_raw(f) }).collect();
        for b in &borrowed {
            pfds.push(PollFd::new(b, PollFlags::IN));
        }
        // The pending offers' timer: the thread wakes when the oldest expires, whatever else
        // happens (or not) meanwhile.
        let until_expiry = next_expiry.map_or(u64::MAX, |t| t.saturating_duration_since(Instant::now()).as_millis() as u64 + 1);
        let starved_ms = lock(svc).starved.map_or(u64::MAX, |t| t.saturating_duration_since(Instant::now()).as_millis() as u64 + 1);
        let wait_ms = tend_markers(svc).min(1000).min(until_expiry).min(starved_ms) as i64;
        let t = rustix::event::Timespec { tv_sec: wait_ms / 1000, tv_nsec: wait_ms % 1000 * 1_000_000 };
        let _ = poll(&mut pfds, Some(&t));
        let woke = pfds[0].revents().contains(PollFlags::IN);
        let req = requests && pfds[1].revents().contains(PollFlags::IN);
        if requests && pfds[1].revents().contains(PollFlags::NVAL) {
            requests = false;
            log_info(format_args!("offer service: the program closed its socket pair; processes forked from this one get no offers"));
        }
        drop(pfds);
        if woke {
            let mut b = [0u8; 8];
            let _ = rustix::io::read(&svc.wake, &mut b);
        }
        {
            let mut st = lock(svc);
            drain(&mut st);
            next_expiry = expire(&mut st);
        }
        if req {
            while let Some(r) = svc.lineage.next_request() {
                answer_request(svc, r);
            }
        }
    }
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
    let name = wire::rendezvous_name(addr);
    let rendezvous = match seqpacket::listen(name.as_bytes()).and_then(out_of_the_way) {
        Ok(r) => r,
        Err(e) => {
            log_info(format_args!("listen {addr}: rendezvous {name}: {e}; this listener serves plain TCP"));
            return;
        }
    };
    let svc = match own_service() {
        Ok(s) => s,
        Err(e) => {
            log_info(format_args!("listen {addr}: offer service: {e}; plain TCP"));
            return;
        }
    };
    static IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let l = Arc::new(Listen { rendezvous, addr, id: IDS.fetch_add(1, Ordering::Relaxed), lineage: svc.lineage });
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

/// When a listening fd is closed in the process that listens: stop serving its rendezvous.
pub fn on_close_listen(l: &Arc<Listen>) {
    if let Some(mut listening) = try_lock(&LISTENING) {
        if let Some(i) = listening.iter().position(|&a| a == l.addr) {
            listening.swap_remove(i);
        }
    }
    let Some(svc) = own() else { return };
    lock(svc).listens.retain(|x| !Arc::ptr_eq(x, l));
    // Its markers are lowered by the service thread (`tend_markers`), which alone raises them.
    ring(svc);
}

// ---- the short-lived marker (spec/WIRE.md section 2; the rule is in `crate::record::marker`) -----------

/// Held while a marker socket is made or closed, and across `fork` (the atfork handlers): a
/// child must know every marker descriptor it inherits, to close it. One it kept open would
/// hold the name up after the service lowered it, for as long as the child lives.
static MARKER_LOCK: marker::ForkLock = marker::ForkLock::new();

/// Forks this process has made (counted by the parent's atfork handler, under `MARKER_LOCK`): a
/// marker socket made before a fork that the lock did not cover may have a copy in the child.
static FORKS: AtomicU64 = AtomicU64::new(0);

/// A raised marker: the listener it speaks for (`Listen::id`), the program tag, the socket.
struct Raised {
    listen: AtomicU64,
    tag: AtomicU64,
    fd: AtomicI32,
}

/// The markers this process holds (fd -1: a free entry); a fork child closes them all. Only the
/// service thread raises and lowers them.
static RAISED: [Raised; 64] = [const { Raised { listen: AtomicU64::new(0), tag: AtomicU64::new(0), fd: AtomicI32::new(-1) } }; 64];

/// The tag of the program that dialed the control connection `control` (spec/WIRE.md section
/// 2), its command line read once per client process.
fn client_tag(control: &OwnedFd) -> Option<u64> {
    static TAGS: Mutex<Vec<(u32, u64)>> = Mutex::new(Vec::new());
    if !adapt::enabled() {
        return None;
    }
    let pid = seqpacket::peer_cred(control).ok()?.0;
    if let Some(&(_, t)) = try_lock(&TAGS)?.iter().find(|(p, _)| *p == pid) {
        return Some(t);
    }
    let tag = wire::program_tag(&colo_sys::host::cmdline(Some(pid)).ok()?);
    let mut tags = try_lock(&TAGS)?;
    if tags.len() >= 64 {
        tags.remove(0);
    }
    tags.push((pid, tag));
    Some(tag)
}

/// A connection this process accepted on `local` through shared memory, from a program tagged
/// `tag`, ended (`short`: it did not pay for its set-up, see `adapt::Lived`).
pub fn connection_ended(local: std::net::SocketAddr, tag: u64, short: bool) {
    let Some(svc) = service() else { return };
    let Some(ends) = marker::slot(&svc.lineage.shared.ends, local.port(), tag) else { return };
    if ends.ended(marker::now_ms(), short) && svc.pid == colo_sys::host::pid() {
        // Raise or lower it now (a fork child's copy of the doorbell is closed: the service
        // thread gets to it at its next wake-up, within a second).
        ring(svc);
    }
}

/// Raises or lowers each listener's markers as its port's endings say, and lowers those of
/// listeners gone; returns how long the service may sleep before the next change is due (ms).
fn tend_markers(svc: &Service) -> u64 {
    let now = marker::now_ms();
    let any_marked = svc.lineage.shared.ends.iter().any(|e| e.marked_until(now).is_some());
    if !any_marked && RAISED.iter().all(|r| r.fd.load(Ordering::Relaxed) < 0) {
        return u64::MAX;
    }
    let listens = lock(svc).listens.clone();
    let mut next = u64::MAX;
    let mut wanted = Vec::new();
    for l in &listens {
        for e in svc.lineage.shared.ends.iter().filter(|e| e.port() == l.addr.port()) {
            if let Some(t) = e.marked_until(now) {
                next = next.min(t - now);
                wanted.push((l.id, e.tag()));
            }
        }
    }
    for r in &RAISED {
        let (fd, key) = (r.fd.load(Ordering::Relaxed), (r.listen.load(Ordering::Relaxed), r.tag.load(Ordering::Relaxed)));
        if fd >= 0 && !wanted.contains(&key) {
            lower_marker(r);
        }
    }
    for l in &listens {
        for &(_, tag) in wanted.iter().filter(|(id, _)| *id == l.id) {
            raise_marker(l, tag);
        }
    }
    next
}

/// Only system calls and atomics under `MARKER_LOCK`: an allocator's own fork handler (redis
/// links jemalloc) may run before ours and hold its locks while `fork` waits for this one. So
/// the socket is made (and moved up, which may allocate) before, and given up if a fork came
/// in between: the child would hold a copy, and with it the name once raised.
fn raise_marker(l: &Listen, tag: u64) {
    let have = |r: &Raised| r.fd.load(Ordering::Relaxed) >= 0 && r.listen.load(Ordering::Relaxed) == l.id && r.tag.load(Ordering::Relaxed) == tag;
    if RAISED.iter().any(have) {
        return;
    }
    let name = wire::short_lived_marker(l.addr, tag);
    let forks = FORKS.load(Ordering::Relaxed);
    let fd = match colo_sys::marker::unraised(colo::internal::fd_floor()) {
        Ok(fd) => fd,
        Err(e) => return log_debug(format_args!("listen {}: marker {name}: {e}", l.addr)),
    };
    let raised = {
        let _g = MARKER_LOCK.hold();
        let Some(entry) = RAISED.iter().find(|r| r.fd.load(Ordering::Relaxed) < 0) else { return };
        if FORKS.load(Ordering::Relaxed) != forks {
            // Dropped unraised (a copy in a child names nothing): the next pass tries again.
            return;
        }
        colo_sys::marker::raise(&fd, name.as_bytes()).map(|()| {
            entry.listen.store(l.id, Ordering::Relaxed);
            entry.tag.store(tag, Ordering::Relaxed);
            entry.fd.store(colo_sys::IntoRawFd::into_raw_fd(fd), Ordering::Relaxed);
        })
    };
    match raised {
        Ok(()) => log_info(format_args!("listen {}: a program's connections are short-lived; it is told to dial plain TCP when it starts again ({name})", l.addr)),
        Err(e) => log_debug(format_args!("listen {}: marker {name}: {e}", l.addr)),
    }
}

fn lower_marker(r: &Raised) {
    let fd = {
        let _g = MARKER_LOCK.hold();
        let fd = r.fd.swap(-1, Ordering::Relaxed);
        if fd >= 0 {
            // SAFETY: a marker socket this process raised; nothing else refers to the number.
            unsafe { libc::syscall(libc::SYS_close, fd) };
        }
        fd
    };
    if fd >= 0 {
        log_debug(format_args!("short-lived marker {:012x} lowered", r.tag.load(Ordering::Relaxed)));
    }
}

/// Parts of the `pthread_atfork` handlers: no marker socket is made or closed while a process
/// forks.
pub fn marker_prepare() {
    MARKER_LOCK.acquire();
}

pub fn marker_parent() {
    FORKS.fetch_add(1, Ordering::Relaxed);
    MARKER_LOCK.release();
}

/// In the child (from its atfork handler): close the inherited marker sockets (their listeners'
/// service is the parent's).
pub fn marker_child() {
    for r in &RAISED {
        let fd = r.fd.swap(-1, Ordering::Relaxed);
        if fd >= 0 {
            // SAFETY: a marker socket the parent raised; the child's copy, which nothing in the
            // child refers to (the lock kept the parent from closing it during the fork).
            unsafe { libc::syscall(libc::SYS_close, fd) };
        }
    }
    MARKER_LOCK.release();
}


// ---- processes forked from the serving one -------------------------------------------------

/// The listeners of `lineage` this process holds (inherited with their rendezvous descriptors).
fn inherited_listeners(lineage: &'static Lineage) -> Vec<Arc<Listen>> {
    let mut out = Vec::new();
    for fd in table::fds_of_kind(table::LISTEN) {
        let Some(mut slot) = table::lock(fd as i32) else { continue };
        if let Entry::Listen(l) = slot.entry() {
            if std::ptr::eq(l.lineage, lineage) && !out.iter().any(|x| Arc::ptr_eq(x, l)) {
                out.push(l.clone());
            }
        }
    }
    out
}

/// The service of `lineage` ended (its owner word reads `seen`): a server that daemonizes after
/// `listen` (the parent exits, the child serves; nginx does by default) would otherwise leave
/// every offer unanswered, and every client would wait for its carrier timeout. This process
/// starts a service for the listeners of that lineage it holds, unless it already serves one;
/// the owner word makes exactly one of the processes that try the one that serves.
fn orphaned(lineage: &'static Lineage, seen: u32) {
    if own().is_some() || Lineage::is_alive(seen) || !lineage.intact() {
        return;
    }
    let listens = inherited_listeners(lineage);
    if listens.is_empty() {
        return;
    }
    let n = listens.len();
    if start(lineage, seen, listens).is_some() {
        log_info(format_args!("the process that listened is gone: serving colo offers for {n} inherited listener(s)"));
    }
}

/// In a fork child: let go of the parent's service wake-up descriptor (only the parent's
/// service thread reads it). The lineage's socket pair is kept: this process may ask on it, and
/// may have to serve it once the parent is gone.
pub fn atfork_child() {
    /// The pid whose service descriptors this process image has let go of already (a
    /// grandchild inherits the value, and must not close the numbers again: they may have been
    /// reused by the program meanwhile).
    static LET_GO: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    if let Some(svc) = service() {
        if svc.pid != colo_sys::host::pid() && LET_GO.swap(svc.pid, Ordering::Relaxed) != svc.pid {
            // SAFETY: closing our inherited copy of a descriptor only the parent's service
            // thread uses; nothing in this process refers to it (`svc.pid` is not ours), and
            // `LET_GO` says it was not closed before in this line of processes.
            unsafe { libc::syscall(libc::SYS_close, svc.wake.as_raw_fd()) };
        }
    }
}

/// Called in the parent before `fork`: a child forked from a process whose offer service is gone
/// should find a live one (ours) without each child starting its own first. Costs one load
/// unless this process holds listeners it did not open itself.
pub fn before_fork() {
    let Some(svc) = service() else { return };
    if svc.pid != colo_sys::host::pid() {
        let seen = svc.lineage.owner();
        if !Lineage::is_alive(seen) {
            orphaned(svc.lineage, seen);
        }
    }
}

/// Asks the service of `lineage` for the offer of `k` (starting one here if it is gone).
fn fetch(lineage: &'static Lineage, k: &Key) -> Option<Box<Hello>> {
    let (answer, fds) = match lineage.ask(&offer_key::encode(k), ASK_WAIT, |seen| orphaned(lineage, seen)) {
        Asked::Answer(a, fds) => (a, fds),
        Asked::Nothing(why) => {
            log_debug(format_args!("offer service: {why}"));
            return None;
        }
    };
    if answer.len() != 2 || answer[0] != 1 || fds.len() != 4 {
        return None;
    }
    let mode = if answer[1] == Mode::Direct as u8 { Mode::Direct } else { Mode::Carrier };
    let mut it = fds.into_iter();
    let (control, memfd, cb, sb) = (it.next()?, it.next()?, it.next()?, it.next()?);
    let h = carrier::hello_from_fds(control, memfd, cb, sb, mode).ok().map(Box::new)?;
    if h.key() != Some(*k) {
        carrier::reject(&h.control, Reason::BadMessage);
        log_info(format_args!("offer service answered for another connection than {} -> {}; plain TCP", k.0, k.1));
        return None;
    }
    Some(h)
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
