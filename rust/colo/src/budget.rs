//! Bounds on the peers' segments this process maps (docs/SAFETY.md item 14).
//!
//! A segment is the peer's memfd: the peer chooses its size (up to
//! `colo_sys::segment::MAX_SEGMENT`) and may hand the same sparse file over again and again, each
//! time costing us address space, a mapping and page tables. So every segment received from a
//! peer is mapped under a [`Lease`] on three budgets: the bytes of peer segments this process
//! maps in total, the share of them one peer uid may hold, and the number of peer segments mapped
//! (each is one of the `vm.max_map_count` mappings the kernel allows a process: beyond those the
//! program's own mmap and malloc fail, so peers may use only a fraction of them), of which one
//! peer uid may hold a quarter (else one user's smallest segments would take them all, and every
//! other user's connections would go plain TCP). A segment that
//! does not fit is not mapped: the listener answers `REJECT(NO_RESOURCES)` (the client falls back
//! to TCP) and keeps serving. The lease goes back when the mapping is unmapped (it lives in the `Segment`).
//!
//! Limits, read once per process from the environment: `COLO_MAX_MAPPED_MB` (total, default
//! [`DEFAULT_TOTAL_MB`], or half the address-space limit `RLIMIT_AS` if that is less),
//! `COLO_MAX_MAPPED_PER_UID_MB` (per uid, default a quarter of the total), both in MiB, and
//! `COLO_MAX_SEGMENTS` (default a quarter of `/proc/sys/vm/max_map_count`, see [`max_segments`]).

use std::collections::HashMap;
use std::sync::Mutex;

/// Default total of peer segment bytes mapped at once, in MiB (256 GiB of address space, of the
/// 128 TiB a process has: about 16,000 connections of the default geometry, 16 MiB each, and
/// 4,000 of one uid; a thousand of the largest segment).
pub const DEFAULT_TOTAL_MB: u64 = 256 * 1024;

const MIB: u64 = 1 << 20;

/// The kernel's default `vm.max_map_count`, assumed when it cannot be read.
const DEFAULT_MAX_MAP_COUNT: u64 = 65530;

/// Which limit refused a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// `COLO_MAX_MAPPED_MB`: all peers' segments together.
    Total,
    /// `COLO_MAX_MAPPED_PER_UID_MB`: one uid's segments.
    PerUid,
    /// `COLO_MAX_SEGMENTS`: the number of peer segments mapped (one mapping each).
    Segments,
    /// A quarter of `COLO_MAX_SEGMENTS`: one uid's segments.
    SegmentsPerUid,
}

/// The accounting itself, without the process-wide state (unit-tested below).
#[derive(Debug)]
pub struct Budget {
    total: u64,
    per_uid: u64,
    max_segments: u64,
    used: u64,
    segments: u64,
    /// Bytes and segments by uid.
    by_uid: HashMap<u32, (u64, u64)>,
}

impl Budget {
    /// A budget of `total` bytes in all, `per_uid` bytes for any one uid, and `max_segments`
    /// segments (one `take` each).
    pub fn new(total: u64, per_uid: u64, max_segments: u64) -> Budget {
        Budget { total, per_uid: per_uid.min(total), max_segments, used: 0, segments: 0, by_uid: HashMap::new() }
    }

    /// Takes one segment of `bytes` for `uid`, or says which limit it would exceed (nothing taken
    /// then).
    pub fn take(&mut self, uid: u32, bytes: u64) -> Result<(), Limit> {
        if self.segments >= self.max_segments {
            return Err(Limit::Segments);
        }
        let (mine, my_segments) = self.by_uid.get(&uid).copied().unwrap_or((0, 0));
        if my_segments >= self.segments_per_uid() {
            return Err(Limit::SegmentsPerUid);
        }
        if mine.checked_add(bytes).is_none_or(|m| m > self.per_uid) {
            return Err(Limit::PerUid);
        }
        if self.used.checked_add(bytes).is_none_or(|u| u > self.total) {
            return Err(Limit::Total);
        }
        self.used += bytes;
        self.segments += 1;
        let m = self.by_uid.entry(uid).or_insert((0, 0));
        *m = (m.0 + bytes, m.1 + 1);
        Ok(())
    }

    /// The segments one uid may hold: a quarter of them all (at least one).
    fn segments_per_uid(&self) -> u64 {
        (self.max_segments / 4).max(1)
    }

    /// Gives back the segment of `bytes` that `take` gave `uid`.
    pub fn give_back(&mut self, uid: u32, bytes: u64) {
        self.used = self.used.saturating_sub(bytes);
        self.segments = self.segments.saturating_sub(1);
        if let Some(m) = self.by_uid.get_mut(&uid) {
            *m = (m.0.saturating_sub(bytes), m.1.saturating_sub(1));
            if m.1 == 0 {
                self.by_uid.remove(&uid);
            }
        }
    }

    /// Bytes held in all.
    #[cfg(test)]
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Bytes held by `uid`.
    pub fn used_by(&self, uid: u32) -> u64 {
        self.by_uid.get(&uid).map_or(0, |m| m.0)
    }

    /// A log line's description of `limit`.
    fn describe(&self, limit: Limit, uid: u32) -> String {
        match limit {
            Limit::Total => format!("COLO_MAX_MAPPED_MB={} reached ({} MiB of peer segments mapped)", self.total / MIB, self.used / MIB),
            Limit::PerUid => format!(
                "COLO_MAX_MAPPED_PER_UID_MB={} reached for uid {uid} ({} MiB mapped)",
                self.per_uid / MIB,
                self.used_by(uid) / MIB
            ),
            Limit::Segments => format!("COLO_MAX_SEGMENTS={} reached ({} peer segments mapped)", self.max_segments, self.segments),
            Limit::SegmentsPerUid => format!(
                "COLO_MAX_SEGMENTS={} reached for uid {uid} (its quarter, {} peer segments)",
                self.max_segments,
                self.segments_per_uid()
            ),
        }
    }
}

/// A positive whole number from the environment variable `name`.
fn env_positive(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse::<u64>().ok().filter(|&mb| mb > 0)
}

/// The number of peer segments mapped at once: `env` (`COLO_MAX_SEGMENTS`) if given, else a
/// quarter of the mappings the kernel allows a process (`max_map_count`, its default if
/// unknown), leaving the rest to the program itself.
pub fn max_segments(env: Option<u64>, max_map_count: Option<u64>) -> u64 {
    env.unwrap_or_else(|| (max_map_count.unwrap_or(DEFAULT_MAX_MAP_COUNT) / 4).max(1))
}

fn max_map_count() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/vm/max_map_count").ok()?.trim().parse().ok()
}

/// The limits from the environment (see the module doc).
fn from_env() -> Budget {
    let by_rlimit = colo_sys::segment::address_space_limit().map_or(u64::MAX, |bytes| bytes / 2 / MIB);
    let total = env_positive("COLO_MAX_MAPPED_MB").unwrap_or(DEFAULT_TOTAL_MB.min(by_rlimit).max(1));
    let per_uid = env_positive("COLO_MAX_MAPPED_PER_UID_MB").unwrap_or(total / 4);
    let segments = max_segments(env_positive("COLO_MAX_SEGMENTS"), max_map_count());
    Budget::new(total.saturating_mul(MIB), per_uid.saturating_mul(MIB), segments)
}

// Locked at every fork (a child forked while another thread held it would wait for it at its
// first lease taken or given back, forever): kept with what the fork handlers write (see
// `colo_sys::host`).
#[link_section = "colo_fork"]
static BUDGET: Mutex<Option<Budget>> = Mutex::new(None);

static LOCKS: crate::fork::Locks = crate::fork::Locks { take: fork_guard, in_child: None };

fn fork_guard(held: &mut crate::fork::Held) {
    held.hold(BUDGET.lock().unwrap_or_else(|e| e.into_inner()));
}

fn with<T>(f: impl FnOnce(&mut Budget) -> T) -> T {
    crate::fork::protect(crate::fork::Rank::Budget, &LOCKS);
    let mut b = BUDGET.lock().unwrap_or_else(|e| e.into_inner());
    f(b.get_or_insert_with(from_env))
}

/// Bytes of a peer's segment counted against this process's budgets until dropped.
#[derive(Debug)]
pub struct Lease {
    uid: u32,
    bytes: u64,
}

impl Lease {
    /// Takes `bytes` for a segment from a peer of uid `uid`; the error, for the log, names the
    /// limit that refused it.
    pub fn take(uid: u32, bytes: u64) -> Result<Lease, String> {
        with(|b| b.take(uid, bytes).map_err(|limit| format!("segment of {} KiB: {}", bytes >> 10, b.describe(limit, uid))))?;
        Ok(Lease { uid, bytes })
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        with(|b| b.give_back(self.uid, self.bytes));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_uid_share_then_total() {
        let mut b = Budget::new(10 * MIB, 4 * MIB, 100);
        assert_eq!(b.take(1, 3 * MIB), Ok(()));
        assert_eq!(b.take(1, 2 * MIB), Err(Limit::PerUid), "uid 1 would hold 5 MiB of its 4");
        assert_eq!(b.take(1, MIB), Ok(()), "exactly the share fits");
        assert_eq!(b.take(2, 4 * MIB), Ok(()));
        assert_eq!(b.take(3, 3 * MIB), Err(Limit::Total), "10 MiB in all");
        assert_eq!(b.take(3, 2 * MIB), Ok(()));
        assert_eq!((b.used(), b.used_by(1), b.used_by(2), b.used_by(3)), (10 * MIB, 4 * MIB, 4 * MIB, 2 * MIB));
    }

    #[test]
    fn refused_takes_nothing_and_give_back_frees() {
        let mut b = Budget::new(8 * MIB, 8 * MIB, 100);
        assert_eq!(b.take(7, 9 * MIB), Err(Limit::PerUid));
        assert_eq!((b.used(), b.used_by(7)), (0, 0));
        b.take(7, 8 * MIB).unwrap();
        assert_eq!(b.take(8, 1), Err(Limit::Total));
        b.give_back(7, 8 * MIB);
        assert_eq!((b.used(), b.used_by(7)), (0, 0));
        assert_eq!(b.take(8, 8 * MIB), Ok(()));
    }

    #[test]
    fn no_overflow_on_huge_requests() {
        let mut b = Budget::new(u64::MAX, u64::MAX, 100);
        b.take(1, u64::MAX - 1).unwrap();
        assert_eq!(b.take(1, 2), Err(Limit::PerUid));
        assert_eq!(b.take(2, 2), Err(Limit::Total));
    }

    #[test]
    fn per_uid_share_is_at_most_the_total() {
        let mut b = Budget::new(2 * MIB, 100 * MIB, 100);
        assert_eq!(b.take(1, 3 * MIB), Err(Limit::PerUid));
        assert_eq!(b.take(1, 2 * MIB), Ok(()));
    }

    #[test]
    fn one_uid_holds_a_quarter_of_the_segments() {
        let mut b = Budget::new(u64::MAX, u64::MAX, 8);
        assert_eq!((b.take(1, 4096), b.take(1, 4096)), (Ok(()), Ok(())));
        assert_eq!(b.take(1, 4096), Err(Limit::SegmentsPerUid), "a third of uid 1's, of 8");
        assert!(b.describe(Limit::SegmentsPerUid, 1).contains("reached for uid 1 (its quarter, 2 peer segments)"));
        assert_eq!(b.take(2, 4096), Ok(()), "another uid's");
        b.give_back(1, 4096);
        assert_eq!(b.take(1, 4096), Ok(()), "one given back makes room for one");
    }

    #[test]
    fn segments_are_counted_whatever_their_size() {
        let mut b = Budget::new(u64::MAX, u64::MAX, 3);
        for uid in 1..=3 {
            assert_eq!(b.take(uid, 4096), Ok(()));
        }
        assert_eq!(b.take(4, 4096), Err(Limit::Segments), "a fourth segment, of any uid");
        assert!(b.describe(Limit::Segments, 4).contains("COLO_MAX_SEGMENTS=3 reached (3 peer segments mapped)"));
        b.give_back(2, 4096);
        assert_eq!(b.take(4, 4096), Ok(()), "one given back makes room for one");
        assert_eq!(b.take(1, 1), Err(Limit::Segments));
    }

    #[test]
    fn max_segments_is_a_quarter_of_max_map_count_unless_set() {
        assert_eq!(max_segments(None, Some(65530)), 16382);
        assert_eq!(max_segments(None, Some(1_048_576)), 262_144);
        assert_eq!(max_segments(None, None), 16382, "the kernel's default when unreadable");
        assert_eq!(max_segments(None, Some(2)), 1, "never zero");
        assert_eq!(max_segments(Some(50), Some(65530)), 50, "COLO_MAX_SEGMENTS wins");
    }

    #[test]
    fn leases_release_on_drop() {
        // The process-wide budget: these leases are the only ones this test makes for uid
        // u32::MAX - 5 (no real peer has it).
        let uid = u32::MAX - 5;
        let before = with(|b| b.used_by(uid));
        let l = Lease::take(uid, 3 * MIB).unwrap();
        assert_eq!(with(|b| b.used_by(uid)), before + 3 * MIB);
        let err = Lease::take(uid, u64::MAX / 2).unwrap_err();
        assert!(err.contains("COLO_MAX_MAPPED"), "{err}");
        drop(l);
        assert_eq!(with(|b| b.used_by(uid)), before);
    }

    #[test]
    fn a_fork_child_takes_a_lease_while_another_thread_takes_them() {
        // A thread of the parent takes and gives back leases without a pause (as the listener's
        // threads map peer segments and the orphan thread lets them go) while the main thread
        // forks: each child takes a lease of its own under a watchdog. A child forked while the
        // thread held the budget's lock would wait for it forever.
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let uid = u32::MAX - 6;
        // The fork handlers are registered at the budget's first use, by this thread: a fork at
        // the instant another thread registers them may come before them (documented in `fork`).
        drop(Lease::take(uid, 4096));
        let stop = Arc::new(AtomicBool::new(false));
        let churn = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    drop(Lease::take(uid, 4096));
                }
            })
        };
        let mut hung = 0;
        for _ in 0..300 {
            if hung > 0 {
                break;
            }
            // SAFETY: the child takes a lease (this crate's budget, whose lock the fork handlers
            // make safe to take) and leaves with _exit.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // SAFETY: alarm and _exit take no memory.
                unsafe { libc::alarm(2) };
                let ok = Lease::take(uid - 1, 4096).is_ok();
                // SAFETY: ends the child without running the parent's destructors.
                unsafe { libc::_exit(if ok { 0 } else { 1 }) };
            }
            assert!(pid > 0, "fork");
            let mut status = 0;
            // SAFETY: waits for the child just forked.
            assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
            if libc::WIFSIGNALED(status) {
                hung += 1;
            } else {
                assert_eq!(libc::WEXITSTATUS(status), 0, "the child's lease");
            }
        }
        stop.store(true, Ordering::Relaxed);
        churn.join().unwrap();
        assert_eq!(hung, 0, "a child waited for the budget's lock (SIGALRM)");
    }
}
