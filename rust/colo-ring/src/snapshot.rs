//! A ring's counters and flags read without taking either half (spec/WIRE.md section 5): what a
//! poller asks ("how many bytes can be read, how much room is left, has the peer sent FIN?")
//! while another thread of the same process may be inside [`Consumer::read`] or
//! [`Producer::write`].
//!
//! A [`RingState`] is four loads, no lock and no system call. Each constructor is written for one
//! side of the ring and names which words are the other side's (loaded with Acquire, paired with
//! the Release that published them) and which are this side's own. Both counters may move while
//! they are loaded (the peer's half moves one, this side's own half, on another thread, the
//! other), so the snapshot loads this side's own counter before and after the peer's and uses
//! the pair only when both loads agree: the own counter then held that value when the peer's was
//! loaded, and an honest ring yields `tail <= head <= tail + capacity` (see each constructor for
//! why the orderings give that). [`RingState::used`] validates it, as the halves do.
//!
//! [`Consumer::read`]: crate::ring::Consumer::read
//! [`Producer::write`]: crate::ring::Producer::write

use crate::ring::{occupancy, RingWords};
use crate::sync::Ordering;
use crate::Corrupt;

/// A byte ring's `ring_head`, `ring_tail` and `ring_flags` as one of the constructors loaded them
/// (each value untrusted: the peer may have written anything; [`RingState::used`] validates the counters, and
/// flag bits outside `layout::RING_FLAGS` are the peer's noise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingState {
    /// Bytes ever written (`ring_head`, the producer's).
    pub head: u64,
    /// Bytes ever read (`ring_tail`, the consumer's).
    pub tail: u64,
    /// `ring_flags` (`FIN`, `RESET`, `NOT_READING`, the producer's).
    pub flags: u32,
}

/// How many times a view loads the counters before it gives up waiting for this side's own
/// counter to hold still: an honest half moves it far less often (a read or write takes longer
/// than a try), so only a peer scribbling over the own counter exhausts them, and then gets the
/// last try's values, which `used` may find corrupt.
const TRIES: u32 = 16;

impl RingState {
    /// The ring as its consumer sees it outside its reading half (readable bytes, the peer's FIN
    /// or RESET): a reader that sees `used() == n` can read `n` bytes, one that sees `FIN` sees
    /// every byte published before it counted in `head`.
    ///
    /// Every value loaded is untrusted: its user validates it (`used`, the flag mask).
    pub fn consumer_view(words: &RingWords) -> RingState {
        let mut state = RingState { head: 0, tail: 0, flags: 0 };
        for _ in 0..TRIES {
            // SYNC POINT with the Release store of `ring_tail` in `Consumer::read` (this side's
            // reading half, maybe on another thread): the head that read loaded happens before
            // the head load below, which so sees a head at least as large as this tail.
            let tail = words.tail().load(Ordering::Acquire);
            // SYNC POINT with the Release fetch_or in `Producer::set_flags`: loaded before the
            // head, so a state with FIN has the head published before it (the last byte's).
            let flags = words.flags().load(Ordering::Acquire);
            // SYNC POINT with the Release store of `ring_head` in `Producer::write`: the bytes
            // counted up to this head are in the ring, and the tail the producer checked before
            // publishing them happens before the tail load below (`head <= that tail + capacity`).
            let head = words.head().load(Ordering::Acquire);
            // Relaxed: ordered after the head by that load's Acquire; it only confirms the first.
            let again = words.tail().load(Ordering::Relaxed);
            state = RingState { head, tail, flags };
            if again == tail {
                break;
            }
        }
        state
    }

    /// The ring as its producer sees it outside its writing half (room left, this side's own
    /// flags): the bytes `used()` does not count have been copied out by the consumer and may be
    /// overwritten.
    pub fn producer_view(words: &RingWords) -> RingState {
        let mut state = RingState { head: 0, tail: 0, flags: 0 };
        for _ in 0..TRIES {
            // SYNC POINT with the Release store of `ring_head` in `Producer::write` (this side's
            // writing half, maybe on another thread): the tail that write checked happens before
            // the tail load below, which so sees a tail no smaller (`head <= tail + capacity`).
            let head = words.head().load(Ordering::Acquire);
            // SYNC POINT with the Release store of `ring_tail` in `Consumer::read` (the peer's):
            // its copies out of the bytes it released are done, and the head that read loaded
            // (published by this side's writing half) happens before the head load below.
            let tail = words.tail().load(Ordering::Acquire);
            // Relaxed: this side's own, ordered after the tail by that load's Acquire.
            let again = words.head().load(Ordering::Relaxed);
            let flags = words.flags().load(Ordering::Relaxed);
            state = RingState { head, tail, flags };
            if again == head {
                break;
            }
        }
        state
    }

    /// The words loaded with no ordering, for change detection only (an edge-triggered waiter
    /// that compares two states to learn whether to look again): nothing read on its strength
    /// may be trusted to be in the ring, and `used()` may report a passing inconsistency as
    /// corruption. Use the views above to decide readiness.
    pub fn relaxed(words: &RingWords) -> RingState {
        // Relaxed: a changed value is only a hint to look again with a view above.
        let (head, tail, flags) =
            (words.head().load(Ordering::Relaxed), words.tail().load(Ordering::Relaxed), words.flags().load(Ordering::Relaxed));
        RingState { head, tail, flags }
    }

    /// Bytes between `tail` and `head`: the readable bytes for the consumer, the used room for
    /// the producer. More than `capacity` (the data region's size, the most a ring can grow to)
    /// is corruption (see [`occupancy`]).
    pub fn used(&self, capacity: u64) -> Result<u64, Corrupt> {
        occupancy(self.head, self.tail, capacity)
    }
}
