//! The server side: at `listen(2)` the shim binds the rendezvous `colo/1/<addr>` next to the
//! kernel listening socket (which stays pure kernel), and a background thread collects CARRIER
//! offers keyed by 4-tuple. `accept(2)` looks up the accepted connection's 4-tuple and claims
//! the offer. A process forked from the one that listens (a multi-worker server accepting after
//! fork) asks that process's offer service for the offer over `colo/1/shim/<pid>`, and gets the
//! descriptors with SCM_RIGHTS.

use crate::conn::Conn;
use crate::table::{self, Entry};
use crate::{log_info, sockaddr_of};
use colo::carrier::{self, Hello, HelloRead, Key};
use colo::wire::{self, Mode, Reason};
use colo_sys::{seqpacket, AsFd, AsRawFd, OwnedFd};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A kernel listening socket that also has a rendezvous.
#[derive(Debug)]
pub struct Listen {
    pub rendezvous: OwnedFd,
    /// The address it listens on.
    pub addr: std::net::SocketAddr,
    /// Names it among this process's listeners, for as long as the process lives (its markers
    /// are recorded by it).
    id: u64,
}

/// Addresses this process holds colo listeners for (a fork child inherits the list with the
/// sockets): a connection to one of them may have to be accepted by the very thread that dials.
static LISTENING: Mutex<Vec<std::net::SocketAddr>> = Mutex::new(Vec::new());

/// Whether this process may be the one to accept a connection to `target` (it listens there).
pub fn may_accept(target: std::net::SocketAddr) -> bool {
    let Some(l) = crate::try_lock(&LISTENING) else { return false };
    l.iter().any(|a| a.port() == target.port() && (a.ip() == target.ip() || a.ip().is_unspecified()))
}

struct State {
    listens: Vec<Arc<Listen>>,
    waiting: Vec<(OwnedFd, Instant)>,
    offers: HashMap<Key, (Box<Hello>, Instant)>,
    shared: &'static Shared,
}

/// What the offer service tells the processes forked from it (multi-worker servers, whose
/// workers accept), in a page they share: with no offer held or on its way, a worker knows an
/// accepted connection is plain without asking the service (a connection per request must cost
/// no more than plain TCP).
struct Shared {
    /// Offers held (received, or connections whose HELLO has not arrived yet).
    offers: AtomicU32,
    /// Nonzero while the service is between accepting rendezvous connections and counting their
    /// offers in `offers`; `GONE` once a process found the service gone (its counts are frozen:
    /// every process asks, and so finds the one that took the listeners over).
    busy: AtomicU32,
    /// How accelerated connections to each listening port from each client program ended,
    /// recorded by whichever process served them (`connection_ended`), read by the service
    /// thread (`tend_markers`).
    ends: [crate::marker::ListenerEnds; MARKED_PORTS],
}

/// (listening port, client program) pairs whose endings an offer service tracks.
const MARKED_PORTS: usize = 64;

const GONE: u32 = 1 << 31;

fn shared_page() -> io::Result<&'static Shared> {
    use rustix::mm::{mmap_anonymous, MapFlags, ProtFlags};
    const _: () = assert!(std::mem::size_of::<Shared>() <= 4096);
    // SAFETY: a new anonymous shared mapping of one page, never unmapped (fork children inherit
    // it as shared). The kernel zeroes it: zero atomics are a valid `Shared` (free slots).
    let p = unsafe { mmap_anonymous(std::ptr::null_mut(), 4096, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED)? };
    // SAFETY: as above; page-aligned, so aligned for `Shared`.
    Ok(unsafe { &*p.cast::<Shared>() })
}

/// Publishes how many offers the state holds (called under the state lock after any change).
fn publish(st: &State) {
    // SYNC POINT with the SeqCst loads in `may_have_offer`.
    st.shared.offers.store((st.offers.len() + st.waiting.len()) as u32, Ordering::SeqCst);
}

/// In a process forked from the service's: whether the connection just accepted on `l` may have
/// an offer (then ask the service). The client's HELLO is sent before its SYN, so it is either
/// still queued at the rendezvous (readable), or being taken by the service (`busy`), or held
/// (`offers`): checked in that order, as the service moves it the other way.
fn may_have_offer(svc: &Service, l: &Listen) -> bool {
    let mut p = [rustix::event::PollFd::new(&l.rendezvous, rustix::event::PollFlags::IN)];
    let queued = rustix::event::poll(&mut p, Some(&rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 })).map_or(true, |n| n > 0);
    // SYNC POINT with `drain_one` (busy) and `publish` (offers): the loads below come after the
    // look at the queue (a system call is no fence on every architecture).
    std::sync::atomic::fence(Ordering::SeqCst);
    queued || svc.shared.busy.load(Ordering::SeqCst) != 0 || svc.shared.offers.load(Ordering::SeqCst) != 0
}

struct Service {
    pid: u32,
    shared: &'static Shared,
    state: Mutex<State>,
    wake: OwnedFd,
    requests: OwnedFd,
    /// `colo/1/shim/adopted/<pid>`: this service took over the listeners of process `pid`, which
    /// is gone; its other orphans ask here.
    alias: std::sync::OnceLock<OwnedFd>,
}

/// The offer service of this process (or, in a fork child, of the process it was forked from).
static SERVICE: AtomicPtr<Service> = AtomicPtr::new(std::ptr::null_mut());

fn service() -> Option<&'static Service> {
    let p = SERVICE.load(Ordering::Acquire);
    // SAFETY: services are leaked (never freed), so a non-null pointer stays valid.
    (!p.is_null()).then(|| unsafe { &*p })
}

fn request_name(pid: u32) -> String {
    format!("colo/1/shim/{pid}")
}

fn own_service() -> io::Result<&'static Service> {
    let me = colo_sys::host::pid();
    if let Some(s) = service() {
        if s.pid == me {
            return Ok(s);
        }
    }
    let requests = out_of_the_way(seqpacket::listen(request_name(me).as_bytes())?)?;
    let wake = out_of_the_way(colo_sys::doorbell::create()?)?;
    let shared = shared_page()?;
    let svc: &'static Service = Box::leak(Box::new(Service {
        pid: me,
        shared,
        state: Mutex::new(State { listens: Vec::new(), waiting: Vec::new(), offers: HashMap::new(), shared }),
        wake,
        requests,
        alias: std::sync::OnceLock::new(),
    }));
    SERVICE.store(svc as *const Service as *mut Service, Ordering::Release);
    colo_sys::host::with_signals_blocked(|| std::thread::Builder::new().name("colo-offers".into()).spawn(move || serve(svc)))?;
    Ok(svc)
}

/// A descriptor the service keeps for long, moved out of the numbers the application uses: a
/// program that `dup2`s onto a low number it believes free (a shell redirection, `dup2(s, 5)`)
/// would otherwise close the rendezvous under the service, which then took the application's
/// next connection at that number for its own.
fn out_of_the_way(fd: OwnedFd) -> io::Result<OwnedFd> {
    colo_sys::preload::move_above(fd, carrier::fd_floor())
}

fn lock(s: &Service) -> std::sync::MutexGuard<'_, State> {
    s.state.lock().unwrap_or_else(|e| e.into_inner())
}

fn take_hello(st: &mut State, control: OwnedFd) {
    match carrier::read_hello(control) {
        HelloRead::Pending(c) => st.waiting.push((c, Instant::now())),
        HelloRead::Hello(h) => {
            if h.mode == Mode::Direct {
                carrier::reject(&h.control, Reason::NeedCarrier);
                crate::log_debug(format_args!("DIRECT HELLO refused with NEED_CARRIER"));
            } else if let Some(k) = h.key() {
                st.offers.insert(k, (h, Instant::now()));
            }
        }
        HelloRead::Refused(why) => crate::log_debug(format_args!("rendezvous: {why}")),
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

/// Collects the HELLOs that have arrived at one listener's rendezvous (none of the waiting ones).
fn drain_one(st: &mut State, l: &Listen) {
    // SYNC POINT with `may_have_offer`: busy from before the first accept until the offers are
    // counted.
    st.shared.busy.fetch_add(1, Ordering::SeqCst);
    while let Ok(c) = seqpacket::accept(&l.rendezvous) {
        take_hello(st, c);
    }
    publish(st);
    st.shared.busy.fetch_sub(1, Ordering::SeqCst);
}

/// Reads the HELLOs whose connections were accepted before their message arrived.
fn drain_waiting(st: &mut State) {
    let waiting = std::mem::take(&mut st.waiting);
    for (c, at) in waiting {
        if at.elapsed() > Duration::from_secs(5) {
            continue;
        }
        match carrier::read_hello(c) {
            HelloRead::Pending(c) => st.waiting.push((c, at)),
            other => {
                if let HelloRead::Hello(h) = other {
                    if h.mode == Mode::Direct {
                        carrier::reject(&h.control, Reason::NeedCarrier);
                    } else if let Some(k) = h.key() {
                        st.offers.insert(k, (h, Instant::now()));
                    }
                }
            }
        }
    }
    publish(st);
}

/// Drops offers whose client hung up (abandoned) or that are too old.
fn sweep(st: &mut State) {
    st.offers.retain(|_, (h, at)| {
        if at.elapsed() > Duration::from_secs(30) {
            return false;
        }
        let mut b = [0u8; 1];
        !matches!(
            rustix::net::recv(&h.control, &mut b[..], rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT),
            Ok(_) | Err(rustix::io::Errno::CONNRESET)
        )
    });
    publish(st);
}

fn encode_key(k: &Key) -> Vec<u8> {
    format!("{}|{}", k.0, k.1).into_bytes()
}

fn decode_key(b: &[u8]) -> Option<Key> {
    let s = std::str::from_utf8(b).ok()?;
    let (a, c) = s.split_once('|')?;
    Some((a.parse().ok()?, c.parse().ok()?))
}

fn answer_request(svc: &Service, c: OwnedFd) {
    // The socket is non-blocking (accepted from a non-blocking listener): wait for the request.
    let mut p = [rustix::event::PollFd::new(&c, rustix::event::PollFlags::IN)];
    let t = rustix::event::Timespec { tv_sec: 0, tv_nsec: 200_000_000 };
    let _ = rustix::event::poll(&mut p, Some(&t));
    let mut buf = [0u8; 256];
    let Ok(r) = seqpacket::recv(&c, &mut buf, false) else { return };
    let Some(k) = decode_key(&buf[..r.len]) else { return };
    let hello = {
        let mut st = lock(svc);
        drain(&mut st);
        let h = st.offers.remove(&k);
        publish(&st);
        h
    };
    match hello {
        Some((h, _)) => {
            let fds = [h.control.as_fd(), h.memfd.as_fd(), h.client_bell.as_fd(), h.server_bell.as_fd()];
            let _ = seqpacket::send(&c, &[1, h.mode as u8], &fds);
        }
        None => {
            let _ = seqpacket::send(&c, &[0, 0], &[]);
        }
    }
}

fn serve(svc: &'static Service) {
    use rustix::event::{poll, PollFd, PollFlags};
    loop {
        let fds: Vec<i32> = {
            let st = lock(svc);
            let mut v: Vec<i32> = st.listens.iter().map(|l| l.rendezvous.as_raw_fd()).collect();
            v.extend(st.waiting.iter().map(|(c, _)| c.as_raw_fd()));
            v
        };
        let mut pfds = Vec::with_capacity(fds.len() + 2);
        pfds.push(PollFd::new(&svc.wake, PollFlags::IN));
        pfds.push(PollFd::new(&svc.requests, PollFlags::IN));
        if let Some(a) = svc.alias.get() {
            pfds.push(PollFd::new(a, PollFlags::IN));
        }
        // SAFETY: these fds stay open while we poll: listens are only removed under the lock by
        // `unlisten`, which wakes us first, and a closed fd in poll only reports POLLNVAL.
        let borrowed: Vec<_> = fds.iter().map(|&f| unsafe { colo_sys::BorrowedFd::borrow_raw(f) }).collect();
        for b in &borrowed {
            pfds.push(PollFd::new(b, PollFlags::IN));
        }
        let wait_ms = tend_markers(svc).min(1000) as i64;
        let t = rustix::event::Timespec { tv_sec: wait_ms / 1000, tv_nsec: wait_ms % 1000 * 1_000_000 };
        let _ = poll(&mut pfds, Some(&t));
        let woke = pfds[0].revents().contains(PollFlags::IN);
        let req = pfds[1].revents().contains(PollFlags::IN)
            || (svc.alias.get().is_some() && pfds.get(2).is_some_and(|p| p.revents().contains(PollFlags::IN)));
        drop(pfds);
        if woke {
            colo_sys::doorbell::drain(&svc.wake);
        }
        {
            let mut st = lock(svc);
            drain(&mut st);
            sweep(&mut st);
        }
        if req {
            for l in [Some(&svc.requests), svc.alias.get()].into_iter().flatten() {
                while let Ok(c) = seqpacket::accept(l) {
                    answer_request(svc, c);
                }
            }
        }
    }
}

/// After a successful real `listen(2)` on `fd`: bind the rendezvous and serve offers.
pub fn on_listen(fd: i32) {
    if crate::disabled() || table::kind(fd) == table::LISTEN {
        return;
    }
    // SAFETY: `fd` is the application's socket, open for the duration of this call.
    let b = unsafe { colo_sys::BorrowedFd::borrow_raw(fd) };
    if !crate::is_tcp_stream(b) {
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
    let l = Arc::new(Listen { rendezvous, addr, id: IDS.fetch_add(1, Ordering::Relaxed) });
    if let Some(mut l) = crate::try_lock(&LISTENING) {
        l.push(addr);
    }
    lock(svc).listens.push(l.clone());
    colo_sys::doorbell::ring(&svc.wake);
    if let Some(mut slot) = table::lock(fd) {
        slot.set(Entry::Listen(l));
    }
    log_info(format_args!("listen {addr}: serving colo offers on {name}"));
}

/// When a listening fd is closed in the process that listens: stop serving its rendezvous.
pub fn on_close_listen(l: &Arc<Listen>) {
    if let Some(mut listening) = crate::try_lock(&LISTENING) {
        if let Some(i) = listening.iter().position(|&a| a == l.addr) {
            listening.swap_remove(i);
        }
    }
    let Some(svc) = service() else { return };
    if svc.pid != colo_sys::host::pid() {
        return;
    }
    lock(svc).listens.retain(|x| !Arc::ptr_eq(x, l));
    // Its markers are lowered by the service thread (`tend_markers`), which alone raises them.
    colo_sys::doorbell::ring(&svc.wake);
}

// ---- the short-lived marker (spec/WIRE.md section 2; the rule is in `crate::marker`) -----------

/// Held while a marker socket is made or closed, and across `fork` (the atfork handlers): a
/// child must know every marker descriptor it inherits, to close it. One it kept open would
/// hold the name up after the service lowered it, for as long as the child lives.
static MARKER_LOCK: crate::marker::ForkLock = crate::marker::ForkLock::new();

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
    if !crate::adapt::enabled() {
        return None;
    }
    let pid = seqpacket::peer_cred(control).ok()?.0;
    if let Some(&(_, t)) = crate::try_lock(&TAGS)?.iter().find(|(p, _)| *p == pid) {
        return Some(t);
    }
    let tag = wire::program_tag(&colo_sys::host::cmdline(Some(pid)).ok()?);
    let mut tags = crate::try_lock(&TAGS)?;
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
    let Some(ends) = crate::marker::slot(&svc.shared.ends, local.port(), tag) else { return };
    if ends.ended(crate::marker::now_ms(), short) && svc.pid == colo_sys::host::pid() {
        // Raise or lower it now (a fork child's copy of the doorbell is closed: the service
        // thread gets to it at its next wake-up, within a second).
        colo_sys::doorbell::ring(&svc.wake);
    }
}

/// Raises or lowers each listener's markers as its port's endings say, and lowers those of
/// listeners gone; returns how long the service may sleep before the next change is due (ms).
fn tend_markers(svc: &Service) -> u64 {
    let now = crate::marker::now_ms();
    let any_marked = svc.shared.ends.iter().any(|e| e.marked_until(now).is_some());
    if !any_marked && RAISED.iter().all(|r| r.fd.load(Ordering::Relaxed) < 0) {
        return u64::MAX;
    }
    let listens = lock(svc).listens.clone();
    let mut next = u64::MAX;
    let mut wanted = Vec::new();
    for l in &listens {
        for e in svc.shared.ends.iter().filter(|e| e.port() == l.addr.port()) {
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
    let fd = match colo_sys::marker::unraised(carrier::fd_floor()) {
        Ok(fd) => fd,
        Err(e) => return crate::log_debug(format_args!("listen {}: marker {name}: {e}", l.addr)),
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
        Err(e) => crate::log_debug(format_args!("listen {}: marker {name}: {e}", l.addr)),
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
        crate::log_debug(format_args!("short-lived marker {:012x} lowered", r.tag.load(Ordering::Relaxed)));
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

/// Starts this process's own offer service for the listeners it holds (the rendezvous
/// descriptors were inherited with them).
fn adopt_listeners() -> Option<&'static Service> {
    let svc = own_service().ok()?;
    let mut adopted = 0;
    for fd in table::fds_of_kind(table::LISTEN) {
        let Some(mut slot) = table::lock(fd as i32) else { continue };
        if let Entry::Listen(l) = slot.entry() {
            let mut st = lock(svc);
            if !st.listens.iter().any(|x| Arc::ptr_eq(x, l)) {
                st.listens.push(l.clone());
                adopted += 1;
            }
        }
    }
    colo_sys::doorbell::ring(&svc.wake);
    log_info(format_args!("the process that listened is gone: serving colo offers for {adopted} inherited listener(s)"));
    Some(svc)
}

fn adopted_name(gone: u32) -> String {
    format!("colo/1/shim/adopted/{gone}")
}

/// Where a process whose offer service (that of process `gone`) has gone away gets offers now.
enum Orphan {
    /// It took over: its own service.
    Own(&'static Service),
    /// Another process forked from `gone` took over: a request connection to it.
    Ask(OwnedFd),
}

/// A server that daemonizes after `listen` (the parent exits, the child serves; nginx does by
/// default) would otherwise leave every offer unanswered, and every client would wait for its
/// carrier timeout before falling back to TCP. The first of the orphans to get here (binding
/// the alias name decides) serves the listeners it holds and answers the others at the alias.
fn orphaned(gone: u32) -> Option<Orphan> {
    let name = adopted_name(gone);
    if let Ok(c) = seqpacket::connect(name.as_bytes()) {
        return Some(Orphan::Ask(c));
    }
    let Ok(alias) = seqpacket::listen(name.as_bytes()).and_then(out_of_the_way) else {
        // Another orphan bound it just now.
        return seqpacket::connect(name.as_bytes()).ok().map(Orphan::Ask);
    };
    let svc = adopt_listeners()?;
    let _ = svc.alias.set(alias);
    colo_sys::doorbell::ring(&svc.wake);
    Some(Orphan::Own(svc))
}

/// In a fork child: let go of the parent's offer-request socket (inherited, though only the
/// parent's service thread accepts on it). Held here, it would keep the parent's name bound
/// after the parent is gone, and a request sent there would wait for an answer that never comes.
pub fn atfork_child() {
    /// The pid whose service descriptors this process image has let go of already (a
    /// grandchild inherits the value, and must not close the numbers again: they may have been
    /// reused by the program meanwhile).
    static LET_GO: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    if let Some(svc) = service() {
        if svc.pid != colo_sys::host::pid() && LET_GO.swap(svc.pid, Ordering::Relaxed) != svc.pid {
            let alias = svc.alias.get().map(|a| a.as_raw_fd());
            for fd in [Some(svc.requests.as_raw_fd()), Some(svc.wake.as_raw_fd()), alias].into_iter().flatten() {
                // SAFETY: closing our inherited copy of a descriptor only the parent's service
                // thread uses; nothing in this process refers to it (`svc.pid` is not ours), and
                // `LET_GO` says it was not closed before in this line of processes.
                unsafe { libc::syscall(libc::SYS_close, fd) };
            }
        }
    }
}

/// Called in the parent before `fork`: a child forked from a process whose offer service is gone
/// must find a live one (ours) to ask. Costs nothing unless this process holds listeners it did
/// not open itself.
pub fn before_fork() {
    let Some(svc) = service() else { return };
    if svc.pid != colo_sys::host::pid()
        && table::fds_of_kind(table::LISTEN).next().is_some()
        && seqpacket::connect(request_name(svc.pid).as_bytes()).is_err()
    {
        orphaned(svc.pid);
    }
}

/// Asks the offer service of process `pid` for the offer of `k`. `Err`: that service is gone.
fn fetch_remote(pid: u32, k: &Key) -> Result<Option<Box<Hello>>, ()> {
    let c = seqpacket::connect(request_name(pid).as_bytes()).map_err(drop)?;
    Ok(fetch_on(c, k))
}

fn fetch_on(c: OwnedFd, k: &Key) -> Option<Box<Hello>> {
    seqpacket::send(&c, &encode_key(k), &[]).ok()?;
    seqpacket::set_recv_timeout(&c, Some(Duration::from_millis(500))).ok()?;
    let mut buf = [0u8; 8];
    let r = seqpacket::recv(&c, &mut buf, false).ok()?;
    if r.len != 2 || buf[0] != 1 || r.fds.len() != 4 {
        return None;
    }
    let mode = if buf[1] == Mode::Direct as u8 { Mode::Direct } else { Mode::Carrier };
    let mut it = r.fds.into_iter();
    let (control, memfd, cb, sb) = (it.next()?, it.next()?, it.next()?, it.next()?);
    carrier::hello_from_fds(control, memfd, cb, sb, mode).ok().map(Box::new)
}

/// After a successful real accept of `fd` on the colo listener `listen`: claim the offer for the
/// new connection.
pub fn on_accept(listen: &Listen, fd: i32, nonblocking: bool) {
    let Some(mut svc) = service() else { return };
    if svc.pid == colo_sys::host::pid() {
        // A client offers before its SYN, so the offer of a connection already accepted has
        // arrived at its listener's rendezvous: with none pending the connection is plain, known
        // without asking the kernel for its addresses or looking at the other listeners (a
        // connection per request must cost no more than plain TCP).
        let mut st = lock(svc);
        drain_one(&mut st, listen);
        if !st.waiting.is_empty() {
            drain_waiting(&mut st);
        }
        if st.offers.is_empty() && st.waiting.is_empty() {
            crate::log_debug(format_args!("accept on fd {fd}: no colo offer pending; plain TCP"));
            return;
        }
    } else if !may_have_offer(svc, listen) {
        crate::log_debug(format_args!("accept on fd {fd}: no colo offer pending; plain TCP"));
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
    if svc.pid != colo_sys::host::pid() {
        match fetch_remote(svc.pid, &k) {
            Ok(h) => return claim(fd, nonblocking, peer, local, h),
            Err(()) => {
                // Its counts are frozen now: every process must ask (and so find the adopter).
                svc.shared.busy.fetch_or(GONE, Ordering::SeqCst);
                match orphaned(svc.pid) {
                    Some(Orphan::Own(s)) => svc = s,
                    Some(Orphan::Ask(c)) => return claim(fd, nonblocking, peer, local, fetch_on(c, &k)),
                    None => return,
                }
            }
        }
    }
    let hello = {
        let mut st = lock(svc);
        // Collected by the look above unless its HELLO was still on the way.
        if !st.offers.contains_key(&k) {
            drain(&mut st);
        }
        let h = st.offers.remove(&k).map(|(h, _)| h);
        publish(&st);
        h
    };
    claim(fd, nonblocking, peer, local, hello);
}

fn claim(fd: i32, nonblocking: bool, peer: std::net::SocketAddr, local: std::net::SocketAddr, hello: Option<Box<Hello>>) {
    let Some(hello) = hello else {
        crate::log_debug(format_args!("accept {peer} -> {local}: no colo offer; plain TCP"));
        return;
    };
    if fd as usize >= table::MAX_FD {
        carrier::reject(&hello.control, Reason::NoResources);
        log_info(format_args!("accept {peer} -> {local}: fd {fd} too high; plain TCP"));
        return;
    }
    match hello.claim() {
        // The tag after the claim: its look at the client's command line must not delay the
        // WELCOME the client waits for.
        Ok(est) => match Conn::accepted(client_tag(&est.fds.control), est, nonblocking) {
            Ok(c) => {
                let c = Arc::new(c);
                if let Some(mut slot) = table::lock(fd) {
                    slot.set(Entry::Conn(c.clone()));
                }
                crate::handover::on_new(fd, &c);
                log_info(format_args!("accept {peer} -> {local}: accelerated (shared memory)"));
            }
            Err(e) => log_info(format_args!("accept {peer} -> {local}: {e}; connection reset")),
        },
        Err(why) => log_info(format_args!("accept {peer} -> {local}: {why}; plain TCP")),
    }
}
