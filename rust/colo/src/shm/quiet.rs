//! The writing half as the shrinker sees it (`crate::shrink`, spec/WIRE.md section 5, "Growing
//! and shrinking"): a ring that grew, empty and unwritten since the last look, goes back to its
//! first size and gives its pages back.

use super::TxHalf;
use crate::segment::{Role, Segment};
use crate::shrink::{Look, Shrink};
use colo_ring::layout::MIN_RING_SIZE;
use colo_ring::sync::{AtomicU64, Ordering};
use std::sync::TryLockError;

/// Where the shrinker works beside the producer: the ring's data (to give pages back) and this
/// end's `written` copy (to send the other holders of this end back to the shared size).
pub(super) struct TxPages {
    data: *mut u8,
    /// Where the pages the ring may give back end (see `Segment::ring_release_end`).
    end: *mut u8,
    written: *const AtomicU64,
}

// SAFETY: addresses inside the segment's mapping. They are used only under the writing half's
// lock, and `Shm::drop` marks the half closed under that lock before the mapping can go.
unsafe impl Send for TxPages {}

impl TxPages {
    pub(super) fn new(seg: &Segment, role: Role) -> TxPages {
        let c2s = role == Role::Client;
        TxPages { data: seg.ring_data_ptr(c2s), end: seg.ring_release_end(c2s), written: seg.written(role) }
    }
}

impl Shrink for crate::fork::ForkableMutex<TxHalf> {
    fn look(&self) -> Look {
        let mut tx = match self.try_lock() {
            Ok(tx) => tx,
            // Being written: not quiet.
            Err(TryLockError::WouldBlock) => return Look::Again,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
        };
        if tx.closed {
            return Look::Done;
        }
        if tx.born != crate::fork::forks() {
            // Shared with another process that may write at the size it knows: never shrunk
            // (`watched` stays set, so it is not registered again).
            return Look::Done;
        }
        let writes = tx.writes;
        if std::mem::replace(&mut tx.looked_at, writes) != writes {
            return Look::Again;
        }
        let head = tx.ring.written();
        match tx.ring.shrink_if_empty() {
            Ok(Some(pages)) => {
                // The other holders of this end (a fork, an exec'd child) must write at the new
                // size: a copy no head equals sends them back to the shared words first.
                // SAFETY: an aligned atomic in the mapping, alive while the half is not closed.
                unsafe { &*tx.pages.written }.store(!head, Ordering::Relaxed);
                // The page that holds the old size's last bytes goes too (it holds nothing else
                // in use, up to `end`); `release_pages` keeps only whole pages.
                let from = tx.pages.data.wrapping_add(pages.start);
                let to = (tx.pages.data.wrapping_add(pages.end) as usize).next_multiple_of(4096).min(tx.pages.end as usize);
                // SAFETY: `from..to` lies inside the ring's data and the padding after it, inside
                // the mapping, and the ring no longer uses it (its size is below `pages.start`).
                let _ = unsafe { colo_sys::segment::release_pages(from, to.saturating_sub(from as usize)) };
                tx.watched = false;
                Look::Done
            }
            Ok(None) if tx.ring.size() > MIN_RING_SIZE as usize => Look::Again,
            // Small already, or corrupt (the next write reports it).
            _ => {
                tx.watched = false;
                Look::Done
            }
        }
    }
}
