//! What kernel TCP does that the LD_PRELOAD shim mirrors: an abortive close (RST instead of FIN,
//! for `SO_LINGER {1, 0}` or bytes left unread), a read shutdown the peer never hears of, and
//! blocking calls that a signal handler interrupts.

use super::{RxHalf, Shm, READ_SHUT, RESET, WRITE_SHUT};
use colo_ring::layout::{FLAG_DROPPED, FLAG_FIN};
use colo_ring::snapshot::RingState;
use colo_ring::sync::{AtomicU32, Ordering};
use std::io;

/// Whether a blocking wait that a signal handler interrupted ends with `EINTR` (true) or goes
/// back to sleep (false). The Rust API always goes back to sleep; the LD_PRELOAD shim installs a
/// policy that follows the handlers' `SA_RESTART`, as the kernel does for a blocking read(2).
static INTERRUPT_POLICY: std::sync::OnceLock<fn() -> bool> = std::sync::OnceLock::new();

/// `timed`: the wait has a deadline (`SO_RCVTIMEO`/`SO_SNDTIMEO`). Under a policy, such a wait
/// always ends with `EINTR`: signal(7), socket calls with a timeout are never restarted, whatever
/// `SA_RESTART` says. (Also asked by the shim's waits for a turn between processes.)
pub fn interrupted_ends_wait(timed: bool) -> bool {
    INTERRUPT_POLICY.get().is_some_and(|policy| timed || SIGNALS_END_WAITS.get() || policy())
}

thread_local! {
    /// Set while [`signals_end_waits`] runs its call on this thread.
    static SIGNALS_END_WAITS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether a job-control stop (`SIGSTOP`, then `SIGCONT` with no handler) must end a wait: under
/// a policy, one that any signal ends (`timed`, or under [`signals_end_waits`]), as kernel TCP
/// ends such a socket wait at any pending signal, a stop included (signal(7)). A stop runs no
/// handler and the kernel restarts a futex wait or a `poll` after it unseen, so such a wait
/// sleeps on the futex only for its budget, then in `epoll_wait`, which the stop ends with
/// `EINTR` (`colo_sys::doorbell::wait_stoppable`).
pub(super) fn stops_end_wait(timed: bool) -> bool {
    INTERRUPT_POLICY.get().is_some() && (timed || SIGNALS_END_WAITS.get())
}

/// Whether this thread continues a blocking call that already moved bytes (under
/// [`signals_end_waits`]): its waits block whatever `O_NONBLOCK` says now, as kernel TCP decides
/// once, at a call's start, whether it may wait (a `MSG_WAITALL` read or a long send goes on to
/// its end when another thread sets `O_NONBLOCK` meanwhile).
pub fn continues_blocking_call() -> bool {
    SIGNALS_END_WAITS.get()
}

/// Runs `f` (a read or write that continues a blocking call which already moved bytes) with its
/// waits ended by any signal handler under a policy, `SA_RESTART` or not: kernel TCP returns the
/// bytes a blocking call moved at the first signal after them, and restarts only a call that
/// moved none. Its waits block even once `O_NONBLOCK` is set (`continues_blocking_call`).
pub fn signals_end_waits<T>(f: impl FnOnce() -> T) -> T {
    let _ends = EndWaits::begin();
    f()
}

/// While it lives, this thread's waits are ended by any signal handler under a policy, as under
/// [`signals_end_waits`]; its drop puts back what was before, a panic's unwinding included.
pub(super) struct EndWaits(bool);

impl EndWaits {
    pub(super) fn begin() -> Self {
        EndWaits(SIGNALS_END_WAITS.replace(true))
    }
}

impl Drop for EndWaits {
    fn drop(&mut self) {
        SIGNALS_END_WAITS.set(self.0);
    }
}

/// Sets the policy for blocking waits interrupted by a signal handler, once per process:
/// `policy()` runs on the interrupted thread right after the handler; true makes the read or
/// write fail with `EINTR` (`io::ErrorKind::Interrupted`), after any bytes it already moved.
pub fn set_interrupt_policy(policy: fn() -> bool) {
    let _ = INTERRUPT_POLICY.set(policy);
}
use colo_ring::layout::FLAG_RESET;

impl Shm {
    /// Resets the connection (spec/WIRE.md section 8, "A reset"): `RESET` on our direction and a
    /// ring, so that the peer's reads, writes and readiness report `ECONNRESET` rather than an
    /// end of stream. The drop that follows closes without FIN (a reset connection is not clean)
    /// and never parks the segment for reuse.
    pub fn abort(&self) {
        if !self.has(RESET) {
            self.set(RESET);
            self.signal(FLAG_RESET);
            self.wake_self();
        }
    }

    /// `shutdown(2)` as kernel TCP answers it. A read shutdown alone is this side's own: reads
    /// return end of stream once the ring is empty, and the peer, which kernel TCP never tells,
    /// goes on writing (until the ring is full; the bytes are never read). Once both directions
    /// are shut, the peer is told (NOT_READING, spec section 8): kernel TCP answers data that
    /// arrives then with a reset, so its writes fail.
    pub fn shutdown_as_tcp(&self, read: bool, write: bool) {
        if write || (read && self.has(WRITE_SHUT)) {
            self.shutdown(read || self.has(READ_SHUT), write);
        } else if read && !self.has(READ_SHUT) {
            self.set(READ_SHUT);
            // A thread of ours blocked in read must see the shutdown now.
            self.wake_self();
        }
    }

    /// Shares the read shutdown with the other processes holding this side (fork copies): bit
    /// `bit` of `word` says that one of them shut down reading, as a kernel socket's read
    /// shutdown holds for every process holding it. A read here takes it as a shutdown of our
    /// own (`adopt_shared_read_shut`); the holder that shut down wakes our sleepers through the
    /// bells and the futex word it shares with us (`wake_self`), and each holder that takes the
    /// shutdown in wakes them again, so that a ring another holder's drain took is rung anew.
    ///
    /// # Safety
    /// `word` must stay valid (mapped, and only ever accessed atomically) for as long as this
    /// `Shm` is used.
    pub unsafe fn share_read_shut(&self, word: *const AtomicU32, bit: u32) {
        self.shared_read_shut_bit.store(bit, Ordering::Relaxed);
        // SYNC POINT: Release, with the Acquire load in `adopt_shared_read_shut`: the bit is
        // stored before the word is published.
        self.shared_read_shut.store(word.cast_mut(), Ordering::Release);
    }

    /// Whether another holder of this side shut down reading (`share_read_shut`); taken in as
    /// our own read shutdown the first time it is seen (which wakes our own sleepers in turn).
    pub fn adopt_shared_read_shut(&self) -> bool {
        // SYNC POINT with the Release store in `share_read_shut`.
        let word = self.shared_read_shut.load(Ordering::Acquire);
        if word.is_null() {
            return false;
        }
        // SAFETY: the caller of `share_read_shut` keeps the word valid while we are used.
        let word = unsafe { &*word };
        // Relaxed: the bit is the whole message; the bytes a read after it returns are ordered
        // by the ring's own loads.
        let shut = word.load(Ordering::Relaxed) & self.shared_read_shut_bit.load(Ordering::Relaxed) != 0;
        if shut && !self.has(READ_SHUT) {
            self.shutdown_as_tcp(true, false);
        }
        shut
    }

    /// Takes on a write shutdown another process holding this side made (a FIN in our ring's
    /// flags that this copy did not send): its writes fail from now on, as a kernel socket's
    /// shutdown holds for every process holding it. The peer had the FIN already.
    pub fn adopt_write_shut(&self) {
        if !self.has(WRITE_SHUT) && RingState::producer_view(&self.out_words).flags & FLAG_FIN != 0 {
            self.set(WRITE_SHUT);
        }
    }

    /// A read after our read shutdown: as kernel TCP, the bytes that had arrived, then end of
    /// stream, never waiting. Once the peer was told (both directions shut, NOT_READING) it
    /// writes no more, so the bytes left are those that came before.
    pub(super) fn read_after_shutdown(&self, rx: &mut RxHalf, buf: &mut [u8], peek: bool, skip: usize) -> io::Result<usize> {
        self.adopt_rx(rx);
        let before = rx.ring.consumed();
        let got = if peek { rx.ring.peek_at(skip, buf) } else { rx.ring.read(buf) };
        let n = got.map_err(|c| self.corrupt(c))?;
        if n > 0 && !peek {
            self.wake_for_space(rx, before);
        }
        if n == 0 && rx.ring.flags().map_err(|c| self.corrupt(c))? & FLAG_DROPPED != 0 {
            // The peer's closer let its unread bytes go (spec/WIRE.md section 8, "Orphaned
            // bytes"): they are lost, which a reader must learn as a reset, not an end of stream.
            self.set(RESET);
            return Err(io::ErrorKind::ConnectionReset.into());
        }
        Ok(n)
    }
}
