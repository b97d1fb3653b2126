//! The epoll registrations of accelerated connections: which application epoll sets watch
//! which connection (each through the connection's control socket and self bell, `Conn::kernel_fds`,
//! both with the same tagged `data`), what each last reported, each set's wake-up eventfd, and the
//! registrations of fresh sockets that move to the connection when `connect` accelerates them.
//! `api::epoll` reports from them.

use crate::base::guard::Guard;
use crate::base::log::log_info;
use crate::base::mem::try_lock;
use crate::conn::state::{Conn, ERR, GONE_EDGE, HUP, IN, OUT, RDNORM, WRNORM};
use crate::conn::table;
use crate::real;
use colo::internal::shm::Drainer;
use libc::{c_int, epoll_event};
use rustc_hash::FxHashMap as HashMap;
use std::os::fd::IntoRawFd;
use std::sync::atomic::{fence, Ordering};
use std::sync::{Arc, Mutex};

pub const TAG: u64 = 0xC01D_0000_0000_0000;
pub const TAG_MASK: u64 = 0xFFFF_0000_0000_0000;
/// The `data` of a set's wake-up eventfd in it (see `set_wake`); no registration has this index.
pub const WAKE: u64 = TAG | 0xFFFF_FFFF;

/// The `data` of a registration's descriptors in the kernel's set: its slot (the low 32 bits)
/// and a stamp of the slot's use (15 bits; bit 47 is `lregs::LISTENER`). An event the kernel
/// reported before a registration went, and read after its slot was given to another (a thread
/// that deleted and added while another's `epoll_wait` returned), is not taken for the other's.
fn key(slot: usize, stamp: u64) -> u64 {
    TAG | (stamp & 0x7FFF) << 32 | slot as u64
}

/// The slot a registration's key names (see `key`).
pub fn slot_of(key: u64) -> usize {
    (key & 0xFFFF_FFFF) as usize
}

pub struct Reg {
    pub epfd: c_int,
    pub fd: c_int,
    pub events: u32,
    pub data: u64,
    pub conn: Arc<Conn>,
    /// `Conn::edges` when last reported (edge-triggered registrations report only a change).
    pub seen: Option<Edges>,
    /// `Conn::edges` and `Conn::own_counters` when last found not ready: while they stay the
    /// same, it stays not ready.
    pub quiet: Option<(Edges, (u64, u64))>,
    /// EPOLLONESHOT fired: silent until EPOLL_CTL_MOD re-arms it.
    pub fired: bool,
    /// The application deleted it (`EPOLL_CTL_DEL`). Our kernel registration stays until the fd
    /// closes or the peer hangs up, so that the next `EPOLL_CTL_ADD` costs no system call (event
    /// loops such as redis-benchmark's delete and add a connection around every request).
    pub deleted: bool,
    /// The events our kernel registrations (`kernel_ctl`) have.
    pub kernel: u32,
    /// The kernel reported the connection and its doorbell was left rung (so that a poller
    /// above the application's set still sees it readable): drained before the next sleep here.
    pub rung: bool,
    /// The `from_rings` call that last reported it (its kernel event is then a duplicate).
    pub round: u64,
    /// Duplicate kernel events seen with nothing to read (see `translate`).
    pub dups: u32,
    /// The descriptors registered in the kernel's set for it.
    pub stand: Stand,
    /// Its kernel registrations' `data` (see `key`), set by `Regs::insert`.
    pub key: u64,
    /// The process that made it (a fork child inherits its parent's: see `forget_fd`).
    pub pid: u32,
}

/// The descriptors that stand for a registration's connection in the kernel's set: the
/// connection's own control socket and self bell (`Conn::kernel_fds`), or copies of them where
/// the set has the connection already under another of the application's numbers (a `dup` of its
/// socket registered too). The kernel keys a registration by file and descriptor number, so the
/// application may register two numbers of one socket, and we may not register one number twice.
pub struct Stand {
    pub fds: [c_int; 2],
    /// The copies are ours: closed with the registration (after the caller removed them from the
    /// kernel's set: a closed number stays registered while its file is open under another).
    owned: bool,
}

impl Stand {
    fn of(conn: &Conn) -> Stand {
        Stand { fds: conn.kernel_fds(), owned: false }
    }

    /// Copies of `conn`'s descriptors, out of the application's way.
    fn copies(conn: &Conn) -> Option<Stand> {
        let mut fds = Vec::with_capacity(2);
        for fd in conn.kernel_fds() {
            // SAFETY: the connection's descriptor, open while `conn` lives.
            fds.push(rustix::io::fcntl_dupfd_cloexec(unsafe { colo_sys::BorrowedFd::borrow_raw(fd) }, 0).ok()?);
        }
        colo_sys::preload::move_all_above(&mut fds, colo::internal::fd_floor()).ok()?;
        let [a, b]: [colo_sys::OwnedFd; 2] = fds.try_into().ok()?;
        Some(Stand { fds: [a.into_raw_fd(), b.into_raw_fd()], owned: true })
    }
}

impl Drop for Stand {
    fn drop(&mut self) {
        if self.owned {
            for fd in self.fds {
                // SAFETY: our copies, closed once.
                unsafe { libc::close(fd) };
            }
        }
    }
}

/// A level-triggered registration looks for a hang-up on one duplicate event in this many.
pub const DUP_CHECK: u32 = 64;

pub type Edges = (u64, u32, u64, u32);

/// How many looks `Reg::report` takes at most for a `ready` the edges around it agree with.
const READY_TRIES: usize = 3;

impl Reg {
    pub fn new(epfd: c_int, fd: c_int, events: u32, data: u64, conn: Arc<Conn>) -> Reg {
        let kernel = kernel_events(events);
        let stand = Stand::of(&conn);
        Reg { epfd, fd, events, data, conn, seen: None, quiet: None, fired: false, deleted: false, kernel, rung: false, round: 0, dups: 0, stand, key: 0, pid: colo_sys::host::pid() }
    }

    /// The events to report for this registration now, from the rings (no system call unless
    /// `check_gone`), honouring level/edge/one-shot; records the report.
    pub fn report(&mut self, check_gone: bool) -> u32 {
        if self.fired || self.deleted {
            return 0;
        }
        let mut now = self.conn.edges();
        let own = self.conn.own_counters();
        if !check_gone && self.quiet == Some((now, own)) {
            return 0;
        }
        // The report is of the edges `now`, so `ready` must have seen no progress past them: a
        // peer that wrote between the two loads would otherwise be reported now and, as an edge
        // not yet seen, once more at the next wait, where kernel TCP reports one arrival once.
        // Each edge only grows, so edges equal before and after `ready` are the ones it saw.
        // Tried a few times; a peer that moves every time leaves the earlier edges recorded
        // (a second report at worst, never a missed one).
        let mut m = self.conn.ready(check_gone) & self.interest();
        for _ in 1..READY_TRIES {
            let after = self.conn.edges();
            if after == now {
                break;
            }
            now = after;
            m = self.conn.ready(check_gone) & self.interest();
        }
        // `ready` may just have learned that the peer is gone: an edge of its own. (Only that
        // bit: edges loaded after `ready` could include progress it did not see.)
        let now = if self.conn.known_gone() { (now.0, now.1, now.2, now.3 | GONE_EDGE) } else { now };
        if m == 0 {
            self.quiet = Some((now, own));
            return 0;
        }
        self.quiet = None;
        if self.events & libc::EPOLLET as u32 != 0 {
            if self.seen == Some(now) {
                return 0;
            }
            self.seen = Some(now);
        }
        if self.events & libc::EPOLLONESHOT as u32 != 0 {
            self.fired = true;
        }
        m
    }

    /// Whether [`Reg::report`] would report something now, recording nothing (a `poll` of the
    /// set itself: the application's `epoll_wait` that follows takes the report).
    pub fn would_report(&self) -> bool {
        if self.fired || self.deleted {
            return false;
        }
        let now = self.conn.edges();
        if self.quiet == Some((now, self.conn.own_counters())) {
            return false;
        }
        self.conn.ready_quick() & self.interest() != 0 && (self.events & libc::EPOLLET as u32 == 0 || self.seen != Some(now))
    }

    /// Whether the peer's progress in the rings may make it report: one that fired, was deleted,
    /// or asks for no events (`rings_report`) is not announced to the peer as asleep, so that
    /// the peer rings no doorbell for it.
    pub fn may_wake(&self) -> bool {
        !self.fired && !self.deleted && rings_report(self.events)
    }

    /// The events the application's interest lets through (errors and hang-ups always).
    fn interest(&self) -> u32 {
        (self.events & RING_EVENTS) | ERR | HUP
    }
}

#[derive(Default)]
pub struct Regs {
    pub slab: Vec<Option<Reg>>,
    pub free: Vec<usize>,
    pub index: HashMap<(c_int, c_int), usize>,
    /// Registrations by epoll fd, for the checks `epoll_wait` makes before sleeping.
    pub by_epfd: HashMap<c_int, Vec<usize>>,
    /// Per epoll fd: where in its list the next look at the rings starts, and how many looks
    /// there have been (see `from_rings`).
    pub turns: HashMap<c_int, (usize, u64)>,
    /// Per epoll fd: the wake-up eventfd in it (`set_wake`), `(pid that made it, fd)`.
    pub wakes: HashMap<c_int, (u32, colo_sys::RawFd)>,
    /// Registrations made so far: the next one's stamp (see `key`).
    made: u64,
    /// Epoll sets registered in other sets, `(outer, inner)` (see `nest`).
    pub nested: Vec<(c_int, c_int)>,
}

/// How many epoll sets are registered in other sets (`Regs::nested`): while none is, an
/// `epoll_wait` takes no lock for them.
static NESTINGS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The application's `epoll_ctl(outer, op, inner)` of an epoll set `inner` in another, `outer`,
/// succeeded: an `epoll_wait` on `outer` readies `inner`'s connections for it
/// (`epoll::ready_nested`), as the kernel reports `inner` readable only once a doorbell in it rang.
pub fn nest(outer: c_int, op: c_int, inner: c_int) {
    with_regs(|r| {
        let at = r.nested.iter().position(|&n| n == (outer, inner));
        match (op, at) {
            (libc::EPOLL_CTL_ADD, None) => {
                r.nested.push((outer, inner));
                NESTINGS.fetch_add(1, Ordering::Relaxed);
                // Its close is seen (`forget::release`), as an epoll set's with connections.
                table::set_epoll(outer, true);
            }
            (libc::EPOLL_CTL_DEL, Some(i)) => {
                r.nested.swap_remove(i);
                NESTINGS.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
    });
}

/// Whether an epoll set is registered in another (one relaxed load).
pub fn nesting() -> bool {
    NESTINGS.load(Ordering::Relaxed) != 0
}

/// The epoll sets registered in `outer` (none while no set is registered in another).
pub fn nested_in(outer: c_int) -> Vec<c_int> {
    if !nesting() {
        return Vec::new();
    }
    with_regs(|r| r.nested.iter().filter(|n| n.0 == outer).map(|n| n.1).collect())
}

/// `fd`, an epoll set, is being closed: it is nested no more, nor is anything in it.
pub fn forget_nested(fd: c_int) {
    if !nesting() {
        return;
    }
    with_regs(|r| {
        let before = r.nested.len();
        r.nested.retain(|&(outer, inner)| outer != fd && inner != fd);
        NESTINGS.fetch_sub(before - r.nested.len(), Ordering::Relaxed);
    });
}

// Locked at every fork: kept with what the fork handlers write (see `colo_sys::host`).
#[link_section = "colo_fork"]
static REGS: Mutex<Option<Regs>> = Mutex::new(None);

/// Taken around a fork, after the listeners' registrations (see `crate::fork_guards`), so that
/// the child's copy is whole and unlocked.
pub fn fork_guards(held: &mut colo::internal::fork::Held) {
    held.hold(REGS.lock().unwrap_or_else(|e| e.into_inner()));
}

pub fn with_regs<T>(f: impl FnOnce(&mut Regs) -> T) -> T {
    let mut g = REGS.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(Regs::default))
}

impl Regs {
    /// Adds a registration: its slot, and the key that names it in the kernel's set (`key`).
    pub fn insert(&mut self, mut reg: Reg) -> (usize, u64) {
        let at = (reg.epfd, reg.fd);
        let idx = self.free.pop().unwrap_or_else(|| {
            self.slab.push(None);
            self.slab.len() - 1
        });
        reg.key = key(idx, self.made);
        self.made += 1;
        let k = reg.key;
        self.slab[idx] = Some(reg);
        self.index.insert(at, idx);
        self.by_epfd.entry(at.0).or_default().push(idx);
        table::count_regs(at.0, true);
        (idx, k)
    }

    pub fn remove(&mut self, idx: usize) -> Option<Reg> {
        let r = self.slab.get_mut(idx)?.take()?;
        table::count_regs(r.epfd, false);
        self.index.remove(&(r.epfd, r.fd));
        if let Some(v) = self.by_epfd.get_mut(&r.epfd) {
            v.retain(|&i| i != idx);
            if v.is_empty() {
                self.by_epfd.remove(&r.epfd);
                self.turns.remove(&r.epfd);
            }
        }
        self.free.push(idx);
        Some(r)
    }
}

/// `fd` is being closed: its registrations go, and their kernel registrations with them, but
/// for one another process made: a fork shares the kernel's set, and the kernel keeps a
/// registration while any process holds the file registered (the parent's connection), so a
/// child that closes what it inherited leaves its parent's set as it was.
pub fn forget_fd(fd: c_int) {
    let gone: Vec<Reg> = with_regs(|r| {
        let idx: Vec<usize> = r.index.iter().filter(|((_, f), _)| *f == fd).map(|(_, &i)| i).collect();
        idx.into_iter().filter_map(|i| r.remove(i)).collect()
    });
    let me = colo_sys::host::pid();
    for reg in gone.iter().filter(|reg| reg.pid == me) {
        kernel_del(reg.epfd, reg.stand.fds);
    }
}

/// The connection whose registration stands in a set on `fd`, one of our copies of its
/// descriptors (`Stand::copies`).
pub fn conn_standing_on(fd: c_int) -> Option<Arc<Conn>> {
    with_regs(|r| r.slab.iter().flatten().find(|reg| reg.stand.owned && reg.stand.fds.contains(&fd)).map(|reg| reg.conn.clone()))
}

/// `fd` stops being an accelerated connection but stays open (`service::relay` puts a plain
/// socket in its place): its registrations go, as `forget_fd`, and each one the application
/// still has is returned as `(epoll fd, events, data)`, for the plain socket to be registered
/// in its place (events empty for an `EPOLLONESHOT` one that fired: disarmed until its `MOD`).
pub fn release_fd(fd: c_int) -> Vec<(c_int, u32, u64)> {
    let gone: Vec<Reg> = with_regs(|r| {
        let idx: Vec<usize> = r.index.iter().filter(|((_, f), _)| *f == fd).map(|(_, &i)| i).collect();
        idx.into_iter().filter_map(|i| r.remove(i)).collect()
    });
    let mut keep = Vec::new();
    for reg in gone {
        kernel_del(reg.epfd, reg.stand.fds);
        if !reg.deleted {
            let events = if reg.fired { reg.events & (libc::EPOLLONESHOT | libc::EPOLLET) as u32 } else { reg.events };
            keep.push((reg.epfd, events, reg.data));
        }
    }
    keep
}

/// The epoll fd `epfd` is being closed.
pub fn forget_epoll(epfd: c_int) {
    let (gone, wake): (Vec<Reg>, _) = with_regs(|r| {
        let idx: Vec<usize> = r.by_epfd.get(&epfd).cloned().unwrap_or_default();
        (idx.into_iter().filter_map(|i| r.remove(i)).collect(), r.wakes.remove(&epfd))
    });
    drop(gone);
    // A forked child's copy of the set is its parent's set: the parent's eventfd stays in it.
    if let Some(w) = wake.filter(|w| w.0 == colo_sys::host::pid()) {
        // SAFETY: removing our eventfd from the set (still open: a copy of it would keep it).
        unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, w.1, std::ptr::null_mut()) };
        colo::internal::wake::give_back(w);
    }
}

/// The wake-up eventfd of the epoll set `epfd` (`colo::internal::wake`), added to the set (edge-triggered,
/// with `data` `WAKE`) at the set's first sleep on connections: registered with them while a
/// thread sleeps in `epoll_wait` (`Waking`), it wakes the set when another thread's drain of a
/// doorbell takes a ring (`Shm::drain_doorbell`), as a `poll` sleeper's own eventfd does. One
/// per set, not per thread: whichever thread waits on the set reports its connections. A forked
/// child adds one of its own (the set it inherited is its parent's, and so is the eventfd in it).
/// `None` if none can be had (the sleep then does without).
pub fn set_wake(epfd: c_int) -> Option<colo_sys::RawFd> {
    with_regs(|r| {
        if let Some(&(pid, fd)) = r.wakes.get(&epfd) {
            if pid == colo_sys::host::pid() {
                return Some(fd);
            }
        }
        let w = colo::internal::wake::take()?;
        let mut ev = epoll_event { events: (libc::EPOLLIN | libc::EPOLLET) as u32, u64: WAKE };
        // SAFETY: adding our own eventfd to the application's set.
        if unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, w.1, &mut ev) } != 0 {
            colo::internal::wake::give_back(w);
            return None;
        }
        r.wakes.insert(epfd, w);
        Some(w.1)
    })
}

/// The application takes the number `fd` (its `dup2` onto it): if it is the wake-up eventfd of
/// epoll sets of this process's (`set_wake`), they have none from now on (their next sleep takes
/// another). Returns whether it was.
pub fn forget_wake(fd: colo_sys::RawFd) -> bool {
    let me = colo_sys::host::pid();
    with_regs(|r| {
        let before = r.wakes.len();
        r.wakes.retain(|_, w| *w != (me, fd));
        r.wakes.len() != before
    })
}

pub const PASS_FLAGS: u32 = (libc::EPOLLET | libc::EPOLLONESHOT | libc::EPOLLWAKEUP | libc::EPOLLEXCLUSIVE) as u32;

/// The events a connection's rings can make a registration report, besides the error and
/// hang-up that every registration reports.
const RING_EVENTS: u32 = IN | OUT | RDNORM | WRNORM | libc::EPOLLRDHUP as u32;

/// Whether a registration for the application's `events` may be made ready by the rings' progress
/// (the peer's doorbell): one with no interest but the flags (an event loop that turns a socket
/// off with a one-shot `EPOLL_CTL_MOD` to no events) reports only an error or a hang-up, as the
/// kernel does.
pub fn rings_report(events: u32) -> bool {
    events & RING_EVENTS != 0
}

/// The events of our kernel registrations of a connection for the application's `events`: input
/// (the doorbell, the self bell, the control socket's end) while the rings can make it report;
/// else none, and the kernel reports only our descriptors' errors and hang-ups (the peer's
/// processes gone), so that the peer's traffic, which the application does not ask about, wakes
/// no sleeper.
pub fn kernel_events(events: u32) -> u32 {
    (if rings_report(events) { libc::EPOLLIN as u32 } else { 0 }) | (events & PASS_FLAGS)
}

/// Applies `op` (`EPOLL_CTL_ADD` or `EPOLL_CTL_MOD`) to our kernel registrations of a connection
/// in the application's set `epfd`, `stand` (`Stand::fds`): its control socket and its self
/// bell, both for input (a hung-up control socket reads as its end: input too; no
/// `EPOLLRDHUP`, which the kernel refuses beside `EPOLLEXCLUSIVE`), with `events` and the tagged
/// `data`. An `ADD` is all or nothing. Returns the kernel's errno.
pub fn kernel_ctl(epfd: c_int, op: c_int, stand: [c_int; 2], events: u32, data: u64) -> Result<(), c_int> {
    let [control, self_bell] = stand;
    for fd in [control, self_bell] {
        let mut kev = epoll_event { events, u64: data };
        // SAFETY: registering (or modifying our registration of) our own descriptor in the
        // application's set.
        if unsafe { real::epoll_ctl(epfd, op, fd, &mut kev) } != 0 {
            let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL);
            if op == libc::EPOLL_CTL_ADD && fd == self_bell {
                // SAFETY: taking back the control socket's registration made just above.
                unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, control, std::ptr::null_mut()) };
            }
            return Err(e);
        }
    }
    Ok(())
}

/// Removes our kernel registrations `stand` (`Stand::fds`) from the application's set `epfd` (if
/// there).
pub fn kernel_del(epfd: c_int, stand: [c_int; 2]) {
    for fd in stand {
        // SAFETY: removing our own descriptor's registration from the application's set.
        unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
    }
}

/// The application's kernel registrations of fresh sockets (`table::is_fresh`: TCP, not yet
/// connected): a socket registered before its `connect` (nginx's upstreams) may become a colo
/// connection, and its registrations must then move to the connection's descriptors
/// ([`adopt_plain`]). Per fd: `(epfd, events, data)`. Any other fd's registrations are not
/// recorded, so the `epoll_ctl`s of a plain connection take no lock of the shim's
/// (docs/ARCHITECTURE.md, "Only fresh sockets are the shim's business").
/// Entries of an fd that was closed meanwhile are harmless: adoption first removes the kernel
/// registration, which fails for them. (`None` rather than an empty `Vec`: all zeros, so the
/// array costs no space in the library file.)
pub type PlainRegs = Mutex<Option<Vec<(c_int, u32, u64)>>>;
pub static PLAIN: [PlainRegs; table::MAX_FD] = [const { Mutex::new(None) }; table::MAX_FD];

#[inline(never)]
pub fn note_plain(epfd: c_int, op: c_int, fd: c_int, ev: *const epoll_event) {
    if fd < 0 || fd as usize >= table::MAX_FD || Guard::busy() {
        return;
    }
    let Some(mut regs) = try_lock(&PLAIN[fd as usize]) else { return };
    let regs = regs.get_or_insert_with(Vec::new);
    regs.retain(|r| r.0 != epfd);
    if op != libc::EPOLL_CTL_DEL && !ev.is_null() {
        // SAFETY: the application's event, which the kernel just accepted.
        let e = unsafe { *ev };
        regs.push((epfd, e.events, e.u64));
    }
}

/// Whether `fd` has kernel registrations made while it was a plain socket. Records left by an
/// earlier socket with this number (closed, so the kernel dropped its registrations) are dropped
/// here: re-asserting a live registration succeeds, a gone one fails. Without that, a stale record
/// would make `connect` wait for the server's answer for nothing.
pub fn has_plain(fd: c_int) -> bool {
    if fd < 0 || fd as usize >= table::MAX_FD {
        return false;
    }
    let Some(mut regs) = try_lock(&PLAIN[fd as usize]) else { return false };
    let Some(v) = regs.as_mut() else { return false };
    v.retain(|&(epfd, events, data)| {
        // A one-shot registration is kept as it is (re-asserting it would re-arm it).
        if events & libc::EPOLLONESHOT as u32 != 0 {
            return true;
        }
        let mut ev = epoll_event { events, u64: data };
        // SAFETY: modifying the application's registration to what it already is.
        unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_MOD, fd, &mut ev) == 0 }
    });
    !v.is_empty()
}

/// `fd` just became a colo connection: its kernel registrations (made while it was a plain
/// socket) move to the connection's descriptors, with the same events and data.
pub fn adopt_plain(fd: c_int, conn: &Arc<Conn>) {
    if fd < 0 || fd as usize >= table::MAX_FD {
        return;
    }
    let regs = try_lock(&PLAIN[fd as usize]).and_then(|mut r| r.take()).unwrap_or_default();
    for (epfd, events, data) in regs {
        // SAFETY: removing the application's registration of its own fd; it fails (and we skip
        // it) if that registration is gone (the fd number was closed and reused meanwhile).
        if unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) } != 0 {
            continue;
        }
        if let Err(e) = register(epfd, fd, events, data, conn) {
            log_info(format_args!("fd {fd}: moving its epoll registration to shared memory: errno {e}"));
            // Put the application's registration back: the TCP socket at least reports a close.
            let mut ev = epoll_event { events, u64: data };
            // SAFETY: restoring the registration removed above.
            unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) };
        }
    }
}

/// Registers `conn` (the connection on `fd`) in the application's epoll set `epfd` as the
/// application asked for `fd`: its descriptors, tagged, in the kernel's set. A new registration
/// reports the current state as an edge (after an adoption possibly a second OUT edge for the
/// connect: harmless, where a missed one would hang).
///
/// The registration is listed and given to the kernel under the registrations' lock, so that no
/// thread sees it before the kernel has it: another thread's `epoll_wait` on the set may report
/// it from the rings at once (its request is there already), and a one-shot one's re-arm, an
/// `EPOLL_CTL_MOD` of the thread it woke, would otherwise reach the kernel before the `ADD` and
/// fail with `ENOENT`, which a thread pool takes for a lost connection.
pub fn register(epfd: c_int, fd: c_int, events: u32, data: u64, conn: &Arc<Conn>) -> Result<(), c_int> {
    with_regs(|r| {
        let (idx, key) = r.insert(Reg::new(epfd, fd, events, data, conn.clone()));
        // Counted (in `insert`) and marked before the kernel can report it.
        table::set_epoll(epfd, true);
        let mut added = kernel_ctl(epfd, libc::EPOLL_CTL_ADD, conn.kernel_fds(), kernel_events(events), key);
        if added == Err(libc::EEXIST) {
            // The set has this connection under another number of the application's: copies
            // stand for this one.
            added = match Stand::copies(conn) {
                Some(copies) => {
                    let added = kernel_ctl(epfd, libc::EPOLL_CTL_ADD, copies.fds, kernel_events(events), key);
                    if let Some(reg) = r.slab[idx].as_mut() {
                        reg.stand = copies;
                    }
                    added
                }
                None => Err(libc::ENOMEM),
            };
        }
        // Dropped after the lock is let go, as every registration taken out.
        let failed = added.is_err().then(|| r.remove(idx));
        (added, failed)
    })
    .0?;
    // A thread asleep on this set must look at it (the kernel would wake it); one about to sleep
    // marks itself sleeping before its last look at the registrations (or, in a set without
    // connections, at their count).
    fence(Ordering::SeqCst); // Partner: the fence in `api::epoll::epoll_wait_with`.
    if table::has_sleepers(epfd) {
        conn.poke();
    }
    Ok(())
}

/// How a sleeper drains: through its wake-up eventfd if it has one, else as a thread not
/// asleep (without one it is registered nowhere).
pub fn waker(wake: Option<colo_sys::RawFd>) -> Drainer {
    wake.map_or(Drainer::Awake, Drainer::Waker)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_used_again_has_another_key() {
        for slot in [0usize, 1, 4096, 0xFFFF_FFFE] {
            let keys: Vec<u64> = (0..0x8000u64).map(|made| key(slot, made)).collect();
            let mut distinct = keys.clone();
            distinct.sort_unstable();
            distinct.dedup();
            // Every one of 32,768 uses of a slot in a row has a key of its own.
            assert_eq!(distinct.len(), keys.len());
            for &k in &keys {
                assert_eq!(slot_of(k), slot);
                assert_eq!(k & TAG_MASK, TAG, "tagged as a registration");
                assert_eq!(k & crate::api::lregs::LISTENER, 0, "not a listener's");
                assert_ne!(k, WAKE);
            }
        }
    }
}
