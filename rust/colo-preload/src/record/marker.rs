//! The server side of the short-lived marker (spec/WIRE.md section 2). A client process learns by
//! itself (`adapt`) that a destination's connections are short-lived, but only after a first
//! burst of them has paid for shared memory it did not need.
//! The listener has seen earlier runs of the same program, and tells a new one before its first
//! offer. Per program *run the same way* (its tag, a hash of its command line): a client that
//! opens a connection per request says nothing about another program's connection pool, nor
//! about the same program run with other arguments (redis-benchmark `-k 0` and `-k 1`).
//!
//! Each process serving a listener records here, in the offer service's shared page, how its
//! accelerated connections there ended, by port and client tag; the service thread raises a
//! marker while one tag's connections are short-lived, and lowers it when one is not, or when
//! none has ended for `MARK_MS`.

use std::sync::atomic::{AtomicU64, Ordering};

/// Of the last `WINDOW` endings (at least `RUN`, each within `GAP_MS` of the one before: a
/// connection per request at a rate where set-ups add up), three in four short raise the
/// marker. A health check every second never does, so a service that is also probed like that
/// still offers shared memory to its long-lived clients.
const RUN: u32 = 8;
const WINDOW: u32 = 16;
const GAP_MS: u64 = 250;
/// The marker stays up this long after the last short ending. Clients that see it dial plain
/// TCP, so the endings that keep it up are the probes of clients already running (`adapt`: one
/// a second each) and connections of clients that do not look. Long enough to reach the next
/// run of a benchmark or script that starts a new client process every few seconds; the price:
/// a new client that would have kept its connections open, starting within this after a burst
/// of short ones, gets plain TCP for the connections it opens in its first plain period.
const MARK_MS: u64 = 5000;

/// Milliseconds on the monotonic clock, the same in every process of the host.
pub fn now_ms() -> u64 {
    colo_sys::host::monotonic_ns(false) / 1_000_000
}

/// How the accelerated connections from one program to one listening port ended, in memory
/// shared by the processes that serve it (zeroed: a free slot). Plain relaxed atomics: the marker
/// is advice, and a lost update only delays or misplaces one.
#[derive(Default)]
pub struct ListenerEnds {
    /// The client's tag (48 bits) above the listening port; 0: the slot is free.
    key: AtomicU64,
    /// [`History`], packed.
    history: AtomicU64,
    /// Until when (`now_ms`) the marker should be up; 0 or past: down.
    until: AtomicU64,
}

/// The last endings: newest in bit 0 of `recent` (1: short), `seen` of them (up to `WINDOW`),
/// the last at `last_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct History {
    recent: u16,
    seen: u32,
    last_ms: u64,
}

impl History {
    fn unpack(h: u64) -> History {
        History { recent: h as u16, seen: (h >> 16) as u32 & 0xff, last_ms: h >> 24 }
    }

    fn pack(self) -> u64 {
        u64::from(self.recent) | u64::from(self.seen) << 16 | self.last_ms << 24
    }

    fn after(self, now: u64, short: bool) -> History {
        let (recent, seen) = if now.saturating_sub(self.last_ms) > GAP_MS { (0, 0) } else { (self.recent, self.seen) };
        History { recent: recent << 1 | u16::from(short), seen: (seen + 1).min(WINDOW), last_ms: now }
    }

    fn mostly_short(self) -> bool {
        let window = if self.seen >= WINDOW { u16::MAX } else { (1u16 << self.seen) - 1 };
        self.seen >= RUN && (self.recent & window).count_ones() * 4 >= self.seen * 3
    }
}

fn key(port: u16, tag: u64) -> u64 {
    tag << 16 | u64::from(port)
}

/// The slot of `(port, tag)` among `slots`: its own, else a free one, else the one whose last
/// ending is oldest (started over).
pub fn slot(slots: &[ListenerEnds], port: u16, tag: u64) -> Option<&ListenerEnds> {
    let k = key(port, tag);
    if let Some(s) = slots.iter().find(|s| s.key.load(Ordering::Relaxed) == k) {
        return Some(s);
    }
    let free = |s: &&ListenerEnds| s.key.load(Ordering::Relaxed) == 0 && s.key.compare_exchange(0, k, Ordering::Relaxed, Ordering::Relaxed).is_ok();
    if let Some(s) = slots.iter().find(free) {
        return Some(s);
    }
    let s = slots.iter().min_by_key(|s| History::unpack(s.history.load(Ordering::Relaxed)).last_ms)?;
    s.history.store(0, Ordering::Relaxed);
    s.until.store(0, Ordering::Relaxed);
    s.key.store(k, Ordering::Relaxed);
    Some(s)
}

impl ListenerEnds {
    pub fn port(&self) -> u16 {
        self.key.load(Ordering::Relaxed) as u16
    }

    pub fn tag(&self) -> u64 {
        self.key.load(Ordering::Relaxed) >> 16
    }

    /// An accelerated connection to this port ended at `now`; returns whether the marker
    /// should go up or down now.
    pub fn ended(&self, now: u64, short: bool) -> bool {
        let prev = self.history.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| Some(History::unpack(h).after(now, short).pack()));
        let h = History::unpack(prev.unwrap_or_else(|h| h)).after(now, short);
        let up = self.until.load(Ordering::Relaxed) > now;
        if !short {
            self.until.store(0, Ordering::Relaxed);
            return up;
        }
        if up || h.mostly_short() {
            self.until.store(now + MARK_MS, Ordering::Relaxed);
            return !up;
        }
        false
    }

    /// Until when the marker should be up, if it should be at `now`.
    pub fn marked_until(&self, now: u64) -> Option<u64> {
        let t = self.until.load(Ordering::Relaxed);
        (t > now).then_some(t)
    }
}

/// A lock that can be taken in a `pthread_atfork` prepare handler and let go in the parent and
/// child handlers (a guard cannot cross those calls).
pub struct ForkLock(std::cell::UnsafeCell<libc::pthread_mutex_t>);

// SAFETY: a pthread mutex is made to be shared between threads; it is only used through its
// own functions.
unsafe impl Sync for ForkLock {}

impl ForkLock {
    pub const fn new() -> ForkLock {
        ForkLock(std::cell::UnsafeCell::new(libc::PTHREAD_MUTEX_INITIALIZER))
    }

    pub fn acquire(&self) {
        // SAFETY: a statically initialized mutex that is never moved or destroyed.
        unsafe { libc::pthread_mutex_lock(self.0.get()) };
    }

    /// By the thread that acquired it (in a fork child: the copy of the thread that forked).
    pub fn release(&self) {
        // SAFETY: as in `acquire`; the caller holds it.
        unsafe { libc::pthread_mutex_unlock(self.0.get()) };
    }

    pub fn hold(&self) -> ForkLockGuard<'_> {
        self.acquire();
        ForkLockGuard(self)
    }
}

pub struct ForkLockGuard<'a>(&'a ForkLock);

impl Drop for ForkLockGuard<'_> {
    fn drop(&mut self) {
        self.0.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_short_endings_raises_the_marker_and_a_long_one_lowers_it() {
        let e = ListenerEnds::default();
        for i in 0..RUN - 1 {
            assert!(!e.ended(1000 + u64::from(i), true));
        }
        assert_eq!(e.marked_until(1010), None, "not yet a run");
        assert!(e.ended(1010, true), "the run is complete");
        assert_eq!(e.marked_until(1011), Some(1010 + MARK_MS));
        assert!(!e.ended(3000, true), "a lone short ending (a probe) keeps it up...");
        assert_eq!(e.marked_until(3000 + MARK_MS - 1), Some(3000 + MARK_MS));
        assert_eq!(e.marked_until(3000 + MARK_MS), None, "...for MARK_MS");
        e.ended(9000, true);
        assert_eq!(e.marked_until(9001), None, "it lapsed: one short ending does not raise it again");
        for t in 9001..9020 {
            e.ended(t, true);
        }
        assert!(e.marked_until(9020).is_some());
        assert!(e.ended(9021, false), "a long-lived connection lowers it at once");
        assert_eq!(e.marked_until(9022), None);
    }

    #[test]
    fn each_program_and_port_has_its_slot_and_the_oldest_makes_room() {
        let slots: [ListenerEnds; 2] = Default::default();
        let a = slot(&slots, 80, 7).unwrap() as *const ListenerEnds;
        assert_eq!(slot(&slots, 80, 7).unwrap() as *const ListenerEnds, a);
        let b = slot(&slots, 80, 8).unwrap();
        assert_ne!(b as *const ListenerEnds, a);
        assert_eq!((b.port(), b.tag()), (80, 8));
        slot(&slots, 80, 7).unwrap().ended(100, true);
        b.ended(50, true);
        let c = slot(&slots, 81, 7).unwrap();
        assert_eq!(c as *const ListenerEnds, b as *const ListenerEnds, "the oldest ending made room");
        assert_eq!((c.port(), c.tag()), (81, 7));
    }

    #[test]
    fn short_endings_far_apart_never_raise_it() {
        let e = ListenerEnds::default();
        for i in 0..100u64 {
            assert!(!e.ended(i * 1000, true), "one a second (a health check)");
        }
        let e = ListenerEnds::default();
        for i in 0..100u64 {
            e.ended(i, i % 2 == 0);
        }
        assert_eq!(e.marked_until(100), None, "half of them long: shared memory pays");
    }
}
