//! What kernel TCP does that the LD_PRELOAD shim mirrors: an abortive close (RST instead of FIN,
//! for `SO_LINGER {1, 0}` or bytes left unread), a read shutdown the peer never hears of, and
//! blocking calls that a signal handler interrupts.

use super::{RxHalf, Shm, READ_SHUT, READ_TOLD, RESET, WRITE_SHUT};
use std::io;

/// Whether a blocking wait that a signal handler interrupted ends with `EINTR` (true) or goes
/// back to sleep (false). The Rust API always goes back to sleep; the LD_PRELOAD shim installs a
/// policy that follows the handlers' `SA_RESTART`, as the kernel does for a blocking read(2).
static INTERRUPT_POLICY: std::sync::OnceLock<fn() -> bool> = std::sync::OnceLock::new();

/// `timed`: the wait has a deadline (`SO_RCVTIMEO`/`SO_SNDTIMEO`). Under a policy, such a wait
/// always ends with `EINTR`: signal(7), socket calls with a timeout are never restarted, whatever
/// `SA_RESTART` says.
pub(super) fn interrupted_ends_wait(timed: bool) -> bool {
    INTERRUPT_POLICY.get().is_some_and(|policy| timed || policy())
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

    /// A read after our read shutdown: end of stream once the peer was told (it writes no
    /// more); before that (a shutdown of reading alone), as kernel TCP, the bytes that have
    /// arrived, then end of stream, never waiting.
    pub(super) fn read_after_shutdown(&self, rx: &mut RxHalf, buf: &mut [u8], peek: bool) -> io::Result<usize> {
        if self.has(READ_TOLD) {
            return Ok(0);
        }
        self.adopt_rx(rx);
        let before = rx.ring.consumed();
        let got = if peek { rx.ring.peek(buf) } else { rx.ring.read(buf) };
        let n = got.map_err(|c| self.corrupt(c))?;
        if n > 0 && !peek {
            self.wake_for_space(rx, before);
        }
        Ok(n)
    }
}
