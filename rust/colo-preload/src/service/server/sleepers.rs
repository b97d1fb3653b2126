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
//! a process of the same lineage knows it too (the records are in the lineage's shared page),
//! drops it and sleeps again; any other sees a client that sent nothing and closed. The watcher
//! tries again every 10 ms (each try wakes the next sleeper), and after half a second every
//! second, until a thread of this process is awake or the connection is taken.
//!
//! A held connection can be handed out by its own process only. So a thread of a process that
//! holds connections, waiting on the listener and the set together, leaves the listener's
//! queue to the lineage's other processes while one of them sleeps in the kernel's accept on
//! that port (`Held::others_asleep`; counted in the lineage's shared page): had it taken a
//! queued connection, its held ones would wait until its application came back to accept.

use super::held::Held;
use colo_sys::{AsFd, OwnedFd};
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::net::{AddressFamily, SocketFlags, SocketType};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The wait for a woken sleeper to take the ready connection before another wake-up
/// connection is made, for the first [`QUICK_TRIES`] (a process of the lineage that the kernel
/// gave one to drops it and sleeps again, behind the others: the next goes to the next
/// sleeper); then [`LAST_RETRY`] (a process outside the lineage accepts on the socket too).
const QUICK_RETRY: Duration = Duration::from_millis(10);
const QUICK_TRIES: u32 = 50;
const LAST_RETRY: Duration = Duration::from_secs(1);
/// How long a wake-up connection's record is kept for its accept (one that a process outside
/// the lineage took is never accepted back).
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
    /// Wake-up connections not accepted back yet, the lineage's (shared by the processes that
    /// accept on the listener: one another process takes, it knows and drops): the local port,
    /// and when it was made (monotonic ms) above it; 0 is a free slot.
    wakes: &'static [AtomicU64; 8],
    /// The lineage's threads asleep in the kernel's accept, by port (`Shared::asleep`).
    everyone: &'static [AtomicU64; 8],
}

/// Counts a thread of the lineage going to sleep in the kernel's accept on `port` (`up`), or
/// back; nothing if the table is full (then no process counts others asleep there).
fn count_asleep(slots: &[AtomicU64; 8], port: u16, up: bool) {
    let key = u64::from(port) << 32;
    for slot in slots {
        let mut v = slot.load(Ordering::Relaxed);
        loop {
            if v == 0 && up {
                match slot.compare_exchange(0, key | 1, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => return,
                    Err(now) => v = now,
                }
                continue;
            }
            if v >> 32 != u64::from(port) {
                break;
            }
            let n = v & 0xFFFF_FFFF;
            let next = if up { key | (n + 1) } else { key | n.saturating_sub(1) };
            match slot.compare_exchange(v, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(now) => v = now,
            }
        }
    }
}

/// How many threads of the lineage are asleep in the kernel's accept on `port`.
fn asleep_on(slots: &[AtomicU64; 8], port: u16) -> u64 {
    slots.iter().map(|s| s.load(Ordering::Relaxed)).find(|v| v >> 32 == u64::from(port)).map_or(0, |v| v & 0xFFFF_FFFF)
}

/// The monotonic clock in milliseconds (the same in every process).
fn now_ms() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1000 + t.tv_nsec as u64 / 1_000_000
}

impl Sleepers {
    /// For the listener on `addr`, whose lineage records wake-up connections in `wakes` and
    /// its threads asleep in the kernel's accept in `everyone`.
    pub fn new(addr: SocketAddr, wakes: &'static [AtomicU64; 8], everyone: &'static [AtomicU64; 8]) -> std::io::Result<Sleepers> {
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
            wakes,
            everyone,
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
        let now = now_ms();
        let expired = |v: u64| v == 0 || now.saturating_sub(v >> 16) > WAKE_LIFE.as_millis() as u64;
        let family = if self.target.is_ipv4() { AddressFamily::INET } else { AddressFamily::INET6 };
        let Ok(s) = rustix::net::socket_with(family, SocketType::STREAM, SocketFlags::NONBLOCK | SocketFlags::CLOEXEC, None) else { return };
        if rustix::net::bind(&s, &SocketAddr::new(self.target.ip(), 0)).is_err() {
            return;
        }
        let Some(local) = rustix::net::getsockname(&s).ok().and_then(|a| crate::base::addr::sockaddr_of(&a)) else { return };
        let value = now.max(1) << 16 | u64::from(local.port());
        // Claimed by an exchange: the lineage's other processes record theirs in the same
        // table, and a record one overwrote would leave its wake-up connection unknown to the
        // accept that takes it (handed to the application as a client that sent nothing).
        let Some(slot) = claim_slot(self.wakes, value, expired) else { return };
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

/// Stores `value` in a slot of `wakes` whose content `free` accepts, by an exchange from what
/// was read (no other process's record is overwritten); `None` if none could be had.
fn claim_slot(wakes: &[AtomicU64; 8], value: u64, free: impl Fn(u64) -> bool) -> Option<&AtomicU64> {
    wakes.iter().find(|w| {
        let v = w.load(Ordering::Relaxed);
        free(v) && w.compare_exchange(v, value, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    })
}

impl Held {
    /// A thread of this process goes to sleep in the kernel's accept on the listener (`false`:
    /// it is back): while the set holds anything, the watcher looks after it.
    pub fn asleep(self: &Arc<Held>, on: bool) {
        let s = &self.sleep;
        count_asleep(s.everyone, s.target.port(), on);
        // Relaxed: see `watching`.
        if !on {
            s.asleep.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        s.asleep.fetch_add(1, Ordering::Relaxed);
        self.watch_if_needed();
    }

    /// Whether a thread of another process of the lineage is asleep in the kernel's accept on
    /// the listener: a connection queued there is its, and a thread of this process that holds
    /// connections had better wait for those than take it (the held ones can go to no other
    /// process, and this one would be away with the other).
    pub fn others_asleep(&self) -> bool {
        let s = &self.sleep;
        asleep_on(s.everyone, s.target.port()) > u64::from(s.asleep.load(Ordering::Relaxed))
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
    let mut tries = 0;
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
            timeout = Some(if tries < QUICK_TRIES { QUICK_RETRY } else { LAST_RETRY });
            tries += 1;
        } else {
            tries = 0;
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

#[cfg(test)]
mod tests {
    use super::claim_slot;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Eight threads, as eight processes of a lineage, each record a wake-up connection at the
    /// same moment: every record lands in a slot of its own, none overwritten.
    #[test]
    fn records_made_at_once_each_get_a_slot() {
        static WAKES: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];
        let start = std::sync::Barrier::new(8);
        std::thread::scope(|s| {
            for t in 1..=8u64 {
                let start = &start;
                s.spawn(move || {
                    start.wait();
                    assert!(claim_slot(&WAKES, t << 16 | t, |v| v == 0).is_some(), "a free slot was there for record {t}");
                });
            }
        });
        let mut got: Vec<u64> = WAKES.iter().map(|w| w.load(Ordering::Relaxed) & 0xFFFF).collect();
        got.sort_unstable();
        assert_eq!(got, (1..=8).collect::<Vec<_>>());
        assert!(claim_slot(&WAKES, 9 << 16 | 9, |v| v == 0).is_none(), "a full table takes no more");
    }
}
