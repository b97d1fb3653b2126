//! Who empties a side's doorbell, and the wake-up eventfds (`crate::wake`) of the threads asleep
//! on it: a drain that takes a ring another thread waited for rings theirs.

use super::{Shm, PEER_GONE};
use colo_ring::sync::Ordering;
use colo_sys::doorbell;
use std::time::Duration;

/// Who empties a side's doorbell (`Shm::drain_doorbell`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drainer {
    /// A thread not asleep on it (a non-blocking call; a thread back from its sleep).
    Awake,
    /// A sleeper with this wake-up eventfd of its own (`Shm::add_waker`).
    Waker(colo_sys::RawFd),
}

/// A place of `Shm::wakers`: `pid << 42 | fd << 12 | count` (0: free), where `count` is how
/// many sleepers registered that eventfd (the threads waiting on one epoll set share the set's).
/// Linux pids are below 2^22 and descriptors below 2^30.
const WAKER_COUNT: u64 = (1 << 12) - 1;

/// A wake-up eventfd of this process as `Shm::wakers` holds it, without the count.
fn waker(fd: colo_sys::RawFd) -> u64 {
    u64::from(colo_sys::host::pid()) << 42 | u64::from(fd as u32) << 12
}

/// How many wake-up eventfds at once can be registered with one side (`Shm::add_waker`).
pub(super) const WAKERS: usize = 8;

/// How long a sleeper that could not register a wake-up eventfd (all `WAKERS` places taken, or
/// no eventfd to be had) sleeps at most before it looks again: a ring another thread's drain
/// takes then costs it that much latency instead of a hang.
pub const UNPASSED_SLEEP: Duration = Duration::from_millis(10);

impl Shm {
    /// Registers the wake-up eventfd (`crate::wake`) of a thread about to sleep on this side's
    /// doorbell (with the eventfd in the same `poll`): from now on every drain of the doorbell
    /// by another thread rings it. Register before announcing; `remove_waker` once awake. An
    /// eventfd registered already (an epoll set's, by another thread waiting on the set) is
    /// counted once more. Returns false (not registered) if all `WAKERS` places are taken: the
    /// caller then sleeps for at most `UNPASSED_SLEEP` at a time.
    pub fn add_waker(&self, fd: colo_sys::RawFd) -> bool {
        let me = waker(fd);
        // SYNC POINT (all the compare-and-swaps here and in `remove_waker`) with the loads in
        // `drain_doorbell`: SeqCst, though what matters is the order the kernel gives the two
        // drains of the eventfd: either the caller's own drain, after this, takes the ring, or
        // it comes after the other thread's, whose load then follows this store.
        for w in &self.wakers {
            let mut v = w.load(Ordering::SeqCst);
            while v & !WAKER_COUNT == me && v & WAKER_COUNT < WAKER_COUNT {
                match w.compare_exchange(v, v + 1, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(_) => return true,
                    Err(now) => v = now,
                }
            }
        }
        // (Two threads registering one eventfd at once may each take a place: rung twice.)
        self.wakers.iter().any(|w| w.compare_exchange(0, me | 1, Ordering::SeqCst, Ordering::Relaxed).is_ok())
    }

    /// Undoes `add_waker`.
    pub fn remove_waker(&self, fd: colo_sys::RawFd) {
        let me = waker(fd);
        // SYNC POINT with the loads in `drain_doorbell`, as in `add_waker`.
        for w in &self.wakers {
            let mut v = w.load(Ordering::SeqCst);
            while v != 0 && v & !WAKER_COUNT == me {
                let less = if v & WAKER_COUNT == 1 { 0 } else { v - 1 };
                match w.compare_exchange(v, less, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(_) => return,
                    Err(now) => v = now,
                }
            }
        }
    }

    /// Keeps this side's kernel fds readable for level-triggered pollers of them (a read that
    /// left bytes in the ring): rings the self bell, unless a ring of this process kept there
    /// has not been drained since (the kernel's pollers see the eventfd readable until a drain
    /// empties it, however many rings it holds).
    ///
    /// The invariant, in one process: `kept_rung` set means that after the last drain of this
    /// process ended, a call here set it and rang the self bell (or is about to), so the bell
    /// holds that ring or a drain has taken it since; every drain clears it after its reads.
    /// A skipped ring therefore loses nothing: either the ring kept is still there, or the
    /// drain that took it is one before a sleep, which announces the sleep and looks at the
    /// rings afterwards (`arm`, `epoll_wait`'s drains of reported doorbells), and that look sees
    /// the bytes left, or the peer's next progress rings the control socket.
    /// Only a drain of another process (fork copies share the eventfd, not this memory) leaves
    /// the flag set over an empty bell; that drain looks at the rings as any other, and this
    /// process's next drain clears the flag. Relaxed throughout: the flag publishes nothing,
    /// and a drain that took the ring of a call that set it saw that ring's `write` in the
    /// kernel's eventfd, under its lock, so the drain's store comes after the set in the flag's
    /// order and clears it.
    ///
    /// Only for keeping the fds readable: a wake-up (a new edge for an edge-triggered waiter,
    /// a poller that must look again) rings the bell every time (`doorbell::ring`).
    pub fn keep_self_rung(&self) {
        if !self.kept_rung.load(Ordering::Relaxed) && !self.kept_rung.swap(true, Ordering::Relaxed) {
            doorbell::ring(&self.fds.self_bell);
        }
    }

    /// Empties this side's bells; returns whether one had rung. (The control socket at end of
    /// stream is the peer's hang-up, anything but a ring or the answer to the HELLO a protocol
    /// error: `on_datagram`.)
    ///
    /// Several threads may sleep on one doorbell (two threads polling one socket, one to read
    /// and one to write; an event loop, and a thread writing from outside it whose non-blocking
    /// call drains): the one that empties it takes a ring another may have waited for, and that
    /// other's `poll` or `epoll_wait`, looking only afterwards, sleeps on with its condition
    /// true. So every sleeper registers a wake-up eventfd of its own (`add_waker`), which only
    /// it empties, and a drain that took a ring rings every registered one but the drainer's
    /// (re-ringing the doorbell would not do: the passer, or another sleeper, could empty the
    /// pass before the one it was meant for looks; docs/ARCHITECTURE.md has the history).
    ///
    /// Once the peer is known gone, the control socket is left alone (only the self bell is
    /// drained): nothing can come after its hang-up, and each shutdown of it wakes its pollers
    /// again, a new event for an edge-triggered registration, which would end every wait at
    /// once.
    ///
    /// A ring of `keep_self_rung` waiting in the self bell is emptied with the peer's (one read
    /// more now, not a sleep that ends at once for nothing), and the self bell counts as not
    /// kept rung from the end of this drain on.
    pub fn drain_doorbell(&self, by: Drainer) -> bool {
        let kept = self.kept_rung.load(Ordering::Relaxed);
        let found = if self.has(PEER_GONE) {
            doorbell::Rings { rung: doorbell::drain(&self.fds.self_bell), ..Default::default() }
        } else if kept {
            doorbell::drain_both(&self.fds.control, &self.fds.self_bell)
        } else {
            doorbell::drain_side(&self.fds.control, &self.fds.self_bell)
        };
        // After the reads, never before: cleared before them, a ring kept between the two would
        // be taken by these reads and leave the flag set over an empty bell. Cleared after, a
        // ring kept meanwhile is at worst rung once more by the next keep (see `keep_self_rung`).
        self.kept_rung.store(false, Ordering::Relaxed);
        if found.hung_up {
            self.on_datagram(doorbell::Datagram::HungUp);
        }
        if let Some(d) = found.other {
            self.on_datagram(d);
        }
        if !found.rung {
            return false;
        }
        let own = match by {
            Drainer::Waker(fd) => Some(fd),
            Drainer::Awake => None,
        };
        let pid = u64::from(colo_sys::host::pid());
        for w in &self.wakers {
            // SYNC POINT with the compare-and-swaps in `add_waker` and `remove_waker`.
            let v = w.load(Ordering::SeqCst);
            let fd = (v >> 12) as u32 as colo_sys::RawFd & ((1 << 30) - 1);
            if v != 0 && v >> 42 == pid && Some(fd) != own {
                // SAFETY: wake-up eventfds are never closed (`crate::wake`), so a racing removal
                // leaves, at worst, a spurious ring on an eventfd of this process.
                doorbell::ring(unsafe { colo_sys::BorrowedFd::borrow_raw(fd) });
            }
        }
        true
    }
}
