//! An abortive close: what kernel TCP does when a socket closes with `SO_LINGER {1, 0}` or with
//! bytes it never read (it sends RST instead of FIN).

use super::{Shm, RESET};
use colo_ring::layout::FLAG_RESET;

impl Shm {
    /// Resets the connection (spec/WIRE.md section 8, "A reset"): `RESET` on our direction and a
    /// ring, so that the peer's reads, writes and readiness report `ECONNRESET` rather than an
    /// end of stream. The drop that follows closes without FIN (a reset connection is not clean)
    /// and never parks the segment for reuse.
    pub fn abort(&self) {
        if !self.has(RESET) {
            self.set(RESET);
            self.signal(self.out_words().flags, FLAG_RESET);
            self.wake_self();
        }
    }
}
