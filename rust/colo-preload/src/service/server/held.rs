//! Connections from listed peers of other network namespaces (spec/WIRE.md section 11), held
//! aside by the application's `accept` instead of waiting there for their PROPOSAL and HELLO
//! (`colo::internal::netns_accept`, the API listener's set). Each listener has one set per
//! process that accepts on it, of at most `netns_accept::MAX_WAITING` (256) connections (a
//! newcomer pushes the oldest out, to the application as it stands), each on its own deadline
//! (`COLO_NETNS_WAIT_MS` for its first bytes, `COLO_CARRIER_TIMEOUT_MS` for its HELLO).
//!
//! The set's epoll fd (`Held::fd`) watches what can move a held connection on (its socket, the
//! rendezvous while a HELLO is awaited, the deadlines' timer) and a bell that stays readable
//! while a resolved connection waits to be returned. It is what the application's wait on the
//! listening socket also waits on: registered next to the listener in the application's epoll
//! sets (`api::lregs`), added to its poll and select sets (`api::ppoll`), and polled with the
//! listener by a blocking accept. Whoever sees it readable steps the set (`Held::service`, no
//! wait) and reports the listener readable if a connection is then ready; `accept` returns
//! those first.

use crate::base::log::log_info;
use crate::conn::entry::Listen;
use colo::internal::netns::{self, Rendezvous};
use colo::internal::netns_accept::{NetnsAccepts, Resolved};
use colo_sys::doorbell::Poller;
use super::sleepers::{self, Sleepers, Watched};
use colo_sys::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The poller token of what moves a held connection on (sockets, rendezvous, timer).
const MOVES: u64 = 0;
/// The poller token of the bell (a resolved connection waits to be returned).
const BELL: u64 = 1;

pub struct Held {
    pid: u32,
    rendezvous: &'static Rendezvous,
    poller: Poller,
    /// An eventfd, readable while `Inner::accepts` has a resolved connection (level-triggered in
    /// `poller`, so that a level-triggered wait on the listener reports it until it is taken).
    bell: OwnedFd,
    inner: Mutex<Inner>,
    /// Threads of this process asleep in the kernel's accept on the listener, and the watcher
    /// that wakes one for a held connection ready (`sleepers`).
    pub(super) sleep: Sleepers,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Held(pid {}, fd {})", self.pid, self.fd())
    }
}

struct Inner {
    accepts: NetnsAccepts,
    /// Whether `bell` is readable.
    rung: bool,
}

impl Held {
    fn new(rendezvous: &'static Rendezvous, l: &Listen) -> std::io::Result<Held> {
        let poller = Poller::new_above(colo::internal::fd_floor())?;
        let accepts = NetnsAccepts::new(&poller, MOVES)?;
        let bell = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK)?;
        poller.add(&bell, BELL)?;
        let inner = Mutex::new(Inner { accepts, rung: false });
        Ok(Held { pid: colo_sys::host::pid(), rendezvous, poller, bell, inner, sleep: Sleepers::new(l.addr, &l.lineage.shared.wakes, &l.lineage.shared.asleep)? })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The set's epoll fd: readable when a held connection may have moved on, or one is ready.
    pub fn fd(&self) -> RawFd {
        self.poller.fd().as_raw_fd()
    }

    /// Takes `tcp` (non-blocking), just accepted from the listed peer `peer`, to wait here. With
    /// `MAX_WAITING` waiting already, the oldest goes on as it stands (`evict_oldest`: to the
    /// application, plain TCP unless proved) to make room; gives `tcp` back only if the set
    /// cannot watch it. Its first bytes, if there already, are reported by the poller at once:
    /// the next `service` looks at them.
    pub fn admit(&self, tcp: TcpStream, peer: SocketAddr) -> Result<(), TcpStream> {
        let mut i = self.lock();
        let tcp = match i.accepts.admit(tcp, peer, &self.poller) {
            Ok(()) => return Ok(()),
            Err(tcp) => tcp,
        };
        if !i.accepts.evict_oldest(self.rendezvous, &self.poller) {
            return Err(tcp);
        }
        self.ring(&mut i);
        i.accepts.admit(tcp, peer, &self.poller)
    }

    /// Whether this process made the set (a fork child's copy of its parent's is not its own).
    pub fn own(&self) -> bool {
        self.pid == colo_sys::host::pid()
    }

    /// Moves the held connections on as far as they can go without a wait, if anything was
    /// reported for them; returns whether a resolved one is ready.
    pub fn service(&self) -> bool {
        let (ready, stepped) = {
            let mut i = self.lock();
            let mut moved = false;
            if i.accepts.waiting() > 0 {
                loop {
                    let got = self.poller.wait(Some(Duration::ZERO)).unwrap_or_default();
                    moved |= got.contains(&MOVES);
                    if got.len() < Poller::MAX_EVENTS {
                        break;
                    }
                }
                if moved {
                    self.step(&mut i);
                }
            }
            (i.accepts.has_ready(), moved)
        };
        if stepped {
            self.siblings_step();
        }
        ready
    }

    /// The step just taken may have read, at the rendezvous, the HELLO of a connection another
    /// listener of this process on the same port holds (an IPv4 and an IPv6 listener share the
    /// port's rendezvous): that set is not woken by the rendezvous any more (read empty), so
    /// it is stepped now. Each set's lock is taken alone.
    fn siblings_step(&self) {
        let others: Vec<Arc<Held>> =
            sets().iter().filter(|(_, h)| h.own() && !std::ptr::eq(&**h, self) && std::ptr::eq(h.rendezvous, self.rendezvous)).map(|(_, h)| h.clone()).collect();
        for h in others {
            let mut i = h.lock();
            if i.accepts.waiting() > 0 {
                h.step(&mut i);
            }
        }
    }

    fn step(&self, i: &mut Inner) {
        i.accepts.step(self.rendezvous, &self.poller);
        self.ring(i);
    }

    /// Keeps the bell readable exactly while a resolved connection is ready.
    fn ring(&self, i: &mut Inner) {
        let ready = i.accepts.has_ready();
        if ready && !i.rung {
            let _ = rustix::io::write(&self.bell, &1u64.to_ne_bytes());
            i.rung = true;
        } else if !ready && i.rung {
            colo_sys::doorbell::drain(self.bell.as_fd());
            i.rung = false;
        }
    }

    /// The next resolved connection, if any.
    pub fn pop(&self) -> Option<(Resolved, SocketAddr)> {
        let mut i = self.lock();
        let r = i.accepts.pop();
        self.ring(&mut i);
        r
    }

    /// How many connections wait (resolved ones not counted).
    pub fn waiting(&self) -> usize {
        self.lock().accepts.waiting()
    }

    /// How many connections wait, and whether a resolved one is ready.
    pub fn counts(&self) -> (usize, bool) {
        let i = self.lock();
        (i.accepts.waiting(), i.accepts.has_ready())
    }

    /// Whether a connection waits here or is ready.
    pub fn holds_any(&self) -> bool {
        let (waiting, ready) = self.counts();
        waiting > 0 || ready
    }

    /// Whether the connection `fd` just accepted is one the set's watcher made to wake a
    /// sleeping accept (`sleepers`): the caller closes it and accepts again.
    pub fn is_wake(&self, fd: i32) -> bool {
        self.sleep.is_wake(fd)
    }

    /// A thread waits on the listener and the set together (`false`: no longer).
    pub fn watching(&self, on: bool) {
        self.sleep.watching(on);
    }

    /// See [`sleepers::asleep`].
    pub fn asleep(self: &Arc<Held>, on: bool, sock: u16) {
        sleepers::asleep(self, on, sock);
    }

    /// See [`sleepers::others_asleep`].
    pub fn others_asleep(&self, sock: u16) -> bool {
        sleepers::others_asleep(&self.sleep, sock)
    }

    /// See [`sleepers::watch_if_needed`].
    pub fn watch_if_needed(self: &Arc<Held>) {
        sleepers::watch_if_needed(self);
    }
}

impl Watched for Held {
    fn sleepers(&self) -> &Sleepers {
        &self.sleep
    }
    fn holds_any(&self) -> bool {
        Held::holds_any(self)
    }
    fn counts(&self) -> (usize, bool) {
        Held::counts(self)
    }
    fn fd(&self) -> RawFd {
        Held::fd(self)
    }
    fn service(&self) -> bool {
        Held::service(self)
    }
    fn own(&self) -> bool {
        Held::own(self)
    }
}

/// The tag of the listening socket `fd` in the lineage's table of threads asleep in the
/// kernel's accept (`sleepers`): the low 16 bits of its inode, the same in every process that
/// holds it, and told apart from another socket of the lineage's but for one pair in 65536 (a
/// thread asleep on one would then make a holder on the other look every 10 ms instead of
/// accepting, until its held connections are decided).
pub fn socket_tag(fd: RawFd) -> u16 {
    // SAFETY: the application's listening socket, open for the duration of this call.
    let b = unsafe { colo_sys::BorrowedFd::borrow_raw(fd) };
    rustix::fs::fstat(b).map_or(0, |st| st.st_ino as u16)
}

/// The held sets of this process, by listener (`Listen::id`). A fork child's copy of its
/// parent's sets is not its own (`Held::pid`): replaced at its first look, so that the sockets
/// its parent holds are closed here and end when the parent closes them.
// Locked at every fork: kept with what the fork handlers write (see `colo_sys::host`).
#[link_section = "colo_fork"]
static SETS: Mutex<Vec<(u64, Arc<Held>)>> = Mutex::new(Vec::new());

fn sets() -> std::sync::MutexGuard<'static, Vec<(u64, Arc<Held>)>> {
    SETS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The held set of `l` in this process: made now if `make` (and this process serves other
/// namespaces on its port: `COLO_NETNS_DIR`, a rendezvous bound).
pub fn of(l: &Listen, make: bool) -> Option<Arc<Held>> {
    let pid = colo_sys::host::pid();
    let mut all = sets();
    if let Some((_, h)) = all.iter().find(|(id, h)| *id == l.id && h.pid == pid) {
        return Some(h.clone());
    }
    if !make || !netns::server_configured() {
        return None;
    }
    let r = netns::serving(l.addr.port())?;
    match Held::new(r, l) {
        Ok(h) => {
            let h = Arc::new(h);
            all.retain(|(_, h)| h.pid == pid);
            all.push((l.id, h.clone()));
            Some(h)
        }
        Err(e) => {
            log_info(format_args!("listen {}: a set for connections from other namespaces: {e}; they are decided on one look", l.addr));
            None
        }
    }
}

/// The listener `l` is closed in this process: its held connections go (closed: their clients
/// see the end of a connection never accepted, as a listener's close gives them).
pub fn forget(l: &Listen) {
    let pid = colo_sys::host::pid();
    let gone: Vec<_> = {
        let mut all = sets();
        let (gone, keep) = std::mem::take(&mut *all).into_iter().partition(|(id, h)| *id == l.id && h.pid == pid);
        *all = keep;
        gone
    };
    for (_, h) in &gone {
        h.sleep.close();
        h.lock().accepts.close(h.rendezvous);
    }
    drop(gone);
}

/// A held set's lock as the forking thread holds it, with the set it belongs to.
struct KeptInner {
    /// Declared first, so dropped before `_set`, which keeps the mutex it borrows alive.
    _guard: std::sync::MutexGuard<'static, Inner>,
    _set: Arc<Held>,
}

/// Taken around a fork (registered with `colo::internal::fork` at `Rank::Shim` by the shim's
/// constructor): the sets' list, then every set's own lock, so that the child's copies are
/// whole and unlocked, whatever other threads of the parent were doing. No thread takes the
/// list's lock while it holds a set's (`siblings_step` collects the sets first), nor either of
/// them while it holds the registrations' (`lregs`), which come after.
pub fn fork_guards(held: &mut colo::internal::fork::Held) {
    let all = sets();
    for (_, h) in all.iter() {
        // SAFETY: the mutex lives in the `Held` that `_set` (an `Arc` of it) keeps alive for as
        // long as the guard, which is dropped first; 'static only names that for the holder.
        let m: &'static Mutex<Inner> = unsafe { &*std::ptr::from_ref(&h.inner) };
        held.hold(KeptInner { _guard: m.lock().unwrap_or_else(|e| e.into_inner()), _set: h.clone() });
    }
    // The list's guard last, so released first: nothing can reach a set once it is.
    held.hold(all);
}

/// In a fork child, once the locks are released (`fork_guards`): the parent's sets go (their
/// sockets are copies here, closed so that a connection the parent hands out ends when the
/// parent's application closes it). Their connections are let go explicitly: a set may outlive
/// the list here, as the parent's watcher thread (`sleepers`), which does not exist here, held a
/// reference to it at the fork.
#[link_section = "colo_fork_text"]
pub fn forked() {
    let gone: Vec<_> = {
        let mut s = sets();
        if s.is_empty() {
            return;
        }
        std::mem::take(&mut *s)
    };
    for (_, h) in &gone {
        h.lock().accepts.let_go();
    }
    drop(gone);
}
