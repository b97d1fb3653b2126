//! Threads asleep in the kernel's `accept` while a connection is held (`held`). A blocking accept
//! waits on the listener and its held set together (`api::fds::accept_netns`), but a thread that
//! went into the kernel's accept before the set had anything, or that lost the race for a queued
//! connection to another thread after its wait reported the listener, sleeps there: the kernel
//! wakes it only for a connection of its own queue. If every accepting thread of the process
//! sleeps so (or is away with a connection of its own), nobody would move the held connections
//! on, and one resolved would wait for the next real connection.
//!
//! So while a thread of this process sleeps in the kernel's accept and the set holds anything,
//! a watcher thread of the set's (started at the first such sleep, one per set) moves the held
//! connections on; when one is ready and no accepting thread waits on the set, it wakes a
//! sleeper with a connection of its own to the listener, closed once made: the sleeper's accept
//! takes it, knows it by its address (`Sleepers::is_wake`), closes it, and returns the held
//! connection instead. The kernel may give that connection to a thread of another process
//! accepting on the same socket (a forked worker; the kernel wakes its longest sleeper first):
//! there, it is a client that sent nothing and closed. The watcher tries again, later each time
//! (up to a second), until a thread of this process is awake or the connection is taken.

use super::held::Held;
use colo_sys::{AsFd, OwnedFd};
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::net::{AddressFamily, SocketFlags, SocketType};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// The first wait for a woken sleeper to take the ready connection before another wake-up
/// connection is made; doubled each time, up to [`LAST_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(20);
const LAST_RETRY: Duration = Duration::from_secs(1);
/// How long a wake-up connection's record is kept for its accept (one another process took is
/// never accepted here).
const WAKE_LIFE: Duration = Duration::from_secs(5);

/// A set's threads in the kernel's accept and waiting on it, and its watcher.
pub struct Sleepers {
    /// Where a wake-up connection goes: the listener's address (loopback for a wildcard).
    target: SocketAddr,
    /// Threads of this process in the kernel's accept on the listener.
    asleep: AtomicU32,
    /// Threads of this process waiting on the listener and the set together.
    watching: AtomicU32,
    /// Wakes the watcher (an eventfd).
    kick: OwnedFd,
    started: AtomicBool,
    /// The set was let go: the watcher ends.
    closed: AtomicBool,
    /// Wake-up connections not accepted back yet: the local port, and when it was made (ms since
    /// `epoch`) above it; 0 is a free slot.
    wakes: [AtomicU64; 4],
    epoch: Instant,
}

impl Sleepers {
    /// For the listener on `addr`.
    pub fn new(addr: SocketAddr) -> std::io::Result<Sleepers> {
        let ip = match addr.ip() {
            IpAddr::V4(a) if a.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(a) if a.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        let kick = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK)?;
        Ok(Sleepers {
            target: SocketAddr::new(ip, addr.port()),
            asleep: AtomicU32::new(0),
            watching: AtomicU32::new(0),
            kick: colo_sys::preload::move_above(kick, colo::internal::fd_floor())?,
            started: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            wakes: [const { AtomicU64::new(0) }; 4],
            epoch: Instant::now(),
        })
    }

    fn ring(&self) {
        let _ = rustix::io::write(&self.kick, &1u64.to_ne_bytes());
    }

    /// A thread waits on the listener and the set together (`false`: no longer).
    pub fn watching(&self, on: bool) {
        // Relaxed: a count the watcher reads as a hint; it looks again after every wait.
        if on {
            self.watching.fetch_add(1, Ordering::Relaxed);
        } else {
            self.watching.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The set was let go (its listener closed here): the watcher ends.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.ring();
    }

    /// Whether the connection `fd` just accepted is a wake-up connection of this set's (its
    /// record is then dropped): the caller closes it and accepts again.
    pub fn is_wake(&self, fd: i32) -> bool {
        if self.wakes.iter().all(|w| w.load(Ordering::Relaxed) == 0) {
            return false;
        }
        // SAFETY: the descriptor the kernel just gave the caller, open for this call.
        let b = unsafe { colo_sys::BorrowedFd::borrow_raw(fd) };
        let Some(peer) = rustix::net::getpeername(b).ok().flatten().and_then(|a| crate::base::addr::sockaddr_of(&a)) else { return false };
        if peer.ip() != self.target.ip() {
            return false;
        }
        self.wakes.iter().any(|w| {
            let v = w.load(Ordering::Relaxed);
            v != 0 && v & 0xFFFF == u64::from(peer.port()) && w.compare_exchange(v, 0, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        })
    }

    /// Connects to the listener and closes the connection once it is made: a thread asleep in
    /// the kernel's accept on it wakes. Recorded first, so that the accept that takes it here
    /// knows it; another process that takes it sees a client that sent nothing and closed.
    fn wake_one(&self) {
        let now = self.epoch.elapsed().as_millis() as u64;
        let expired = |v: u64| v == 0 || now.saturating_sub(v >> 16) > WAKE_LIFE.as_millis() as u64;
        let Some(slot) = self.wakes.iter().find(|w| expired(w.load(Ordering::Relaxed))) else { return };
        let family = if self.target.is_ipv4() { AddressFamily::INET } else { AddressFamily::INET6 };
        let Ok(s) = rustix::net::socket_with(family, SocketType::STREAM, SocketFlags::NONBLOCK | SocketFlags::CLOEXEC, None) else { return };
        if rustix::net::bind(&s, &SocketAddr::new(self.target.ip(), 0)).is_err() {
            return;
        }
        let Some(local) = rustix::net::getsockname(&s).ok().and_then(|a| crate::base::addr::sockaddr_of(&a)) else { return };
        // At least 1 ms after the epoch, so that a record is never 0.
        let value = now.max(1) << 16 | u64::from(local.port());
        slot.store(value, Ordering::Relaxed);
        let made = match rustix::net::connect(&s, &self.target) {
            Ok(()) => true,
            Err(e) if e == rustix::io::Errno::INPROGRESS => {
                let mut p = [PollFd::new(&s, PollFlags::OUT)];
                let wait = Timespec { tv_sec: 0, tv_nsec: 100_000_000 };
                matches!(poll(&mut p, Some(&wait)), Ok(1)) && rustix::net::sockopt::socket_error(&s).is_ok_and(|r| r.is_ok())
            }
            Err(_) => false,
        };
        if !made {
            // Never made (a full queue): no accept will take it.
            let _ = slot.compare_exchange(value, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
    }
}

impl Held {
    /// A thread of this process goes to sleep in the kernel's accept on the listener (`false`:
    /// it is back): while the set holds anything, the watcher looks after it.
    pub fn asleep(self: &Arc<Held>, on: bool) {
        let s = &self.sleep;
        // Relaxed: see `watching`.
        if !on {
            s.asleep.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        s.asleep.fetch_add(1, Ordering::Relaxed);
        self.watch_if_needed();
    }

    /// If a thread sleeps in the kernel's accept while the set holds anything: the watcher
    /// (started now if it is not yet) looks at the set again. Called where that may have
    /// become so (a thread goes to sleep, or leaves the set unwatched).
    pub fn watch_if_needed(self: &Arc<Held>) {
        let s = &self.sleep;
        if s.asleep.load(Ordering::Relaxed) == 0 || !self.holds_any() {
            return;
        }
        if !s.started.swap(true, Ordering::Relaxed) {
            let w = Arc::downgrade(self);
            if std::thread::Builder::new().name("colo-held".into()).spawn(move || watch(w)).is_err() {
                s.started.store(false, Ordering::Relaxed);
                return;
            }
        }
        s.ring();
    }
}

/// The watcher of the set `w`: see the module's comment. Holds the set only across one wait,
/// and ends when it is let go.
fn watch(w: Weak<Held>) {
    let mut retry = FIRST_RETRY;
    loop {
        let Some(h) = w.upgrade() else { return };
        let s = &h.sleep;
        if s.closed.load(Ordering::Relaxed) || !h.own() {
            return;
        }
        let asleep = s.asleep.load(Ordering::Relaxed) > 0;
        let (waiting, ready) = h.counts();
        let mut timeout = None;
        let on_set = asleep && !ready && waiting > 0;
        if asleep && ready {
            if s.watching.load(Ordering::Relaxed) == 0 {
                s.wake_one();
            }
            timeout = Some(retry);
            retry = (retry * 2).min(LAST_RETRY);
        } else {
            retry = FIRST_RETRY;
        }
        let set = h.fd();
        // SAFETY: the set's epoll fd, open while `h` lives (held across this wait).
        let set = unsafe { colo_sys::BorrowedFd::borrow_raw(set) };
        let mut fds = [PollFd::new(&s.kick, PollFlags::IN), PollFd::new(&set, PollFlags::IN)];
        let n = if on_set { 2 } else { 1 };
        let t = timeout.map(|d| Timespec { tv_sec: d.as_secs() as i64, tv_nsec: i64::from(d.subsec_nanos()) });
        let _ = poll(&mut fds[..n], t.as_ref());
        let set_moved = on_set && fds[1].revents().contains(PollFlags::IN);
        colo_sys::doorbell::drain(s.kick.as_fd());
        if set_moved {
            h.service();
        }
    }
}
