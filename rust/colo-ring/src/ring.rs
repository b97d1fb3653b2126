//! The byte ring of one direction (spec/WIRE.md section 5): the producer half and the consumer half.
//!
//! Each half keeps its own counter privately and a cached copy of the other side's, re-reading the
//! shared counter only when the cache says full (producer) or empty (consumer), as rtrb does. Both
//! counters count bytes ever moved and wrap at 2^64; byte `i` lives at `data[i % capacity]`.

use crate::layout::RING_FLAGS;
use crate::sync::{AtomicU32, AtomicU64, Ordering};
use crate::Corrupt;

/// The memory a ring's bytes live in.
///
/// # Safety
/// Implementors guarantee that `store` and `load` access exactly `at..at + len` of a region of
/// `capacity()` bytes that stays valid for the life of the value.
pub unsafe trait Bytes {
    /// Size of the region.
    fn capacity(&self) -> usize;
    /// Copies `src` to `at..at + src.len()`.
    ///
    /// # Safety
    /// `at + src.len() <= capacity()`.
    unsafe fn store(&self, at: usize, src: &[u8]);
    /// Copies `at..at + dst.len()` to `dst`.
    ///
    /// # Safety
    /// `at + dst.len() <= capacity()`.
    unsafe fn load(&self, at: usize, dst: &mut [u8]);
}

/// A region of shared memory given by address and length.
#[derive(Debug, Clone, Copy)]
pub struct RawBytes {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: RawBytes is an address; the owner of the mapping guarantees it outlives every user, and
// concurrent access to the bytes is ordered by the ring protocol (or is the peer's misbehaviour,
// which can only change the bytes we copy, never where we copy).
unsafe impl Send for RawBytes {}

impl RawBytes {
    /// # Safety
    /// `ptr..ptr + len` is mapped, readable and writable for the life of the returned value.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Self {
        RawBytes { ptr, len }
    }
}

// SAFETY: `store`/`load` stay inside `ptr..ptr + len` by their callers' contract.
unsafe impl Bytes for RawBytes {
    fn capacity(&self) -> usize {
        self.len
    }
    unsafe fn store(&self, at: usize, src: &[u8]) {
        debug_assert!(at + src.len() <= self.len);
        // SAFETY: in bounds by the caller's contract; `src` is private memory, so no overlap.
        unsafe { crate::copy::copy(src.as_ptr(), self.ptr.add(at), src.len()) }
    }
    unsafe fn load(&self, at: usize, dst: &mut [u8]) {
        debug_assert!(at + dst.len() <= self.len);
        // SAFETY: in bounds by the caller's contract; `dst` is private memory, so no overlap.
        unsafe { crate::copy::copy(self.ptr.add(at), dst.as_mut_ptr(), dst.len()) }
    }
}

/// The four shared words of a ring (offsets in `layout::block`).
#[derive(Debug, Clone, Copy)]
pub struct RingWords {
    /// `ring_head`.
    pub head: *const AtomicU64,
    /// `ring_flags`.
    pub flags: *const AtomicU32,
    /// `ring_tail`.
    pub tail: *const AtomicU64,
    /// `read_flags`.
    pub read_flags: *const AtomicU32,
}

// SAFETY: the words are atomics; the pointers are valid for the ring's life (see `RingWords::get`).
unsafe impl Send for RingWords {}
// SAFETY: as for `Send`: shared access only loads the pointers and uses the atomics behind them.
unsafe impl Sync for RingWords {}

impl RingWords {
    /// The producer's `ring_flags`, validated (for a reader that is not this ring's consumer,
    /// such as the message half of the same direction).
    pub fn producer_flags(&self) -> Result<u32, Corrupt> {
        // SYNC POINT with the Release fetch_or in `Producer::set_flags`.
        check_flags(self.flags().load(Ordering::Acquire), RING_FLAGS)
    }

    fn head(&self) -> &AtomicU64 {
        // SAFETY: the constructor of the Producer/Consumer holding these words guaranteed they point
        // to live, aligned atomics for its whole life.
        unsafe { &*self.head }
    }
    fn flags(&self) -> &AtomicU32 {
        // SAFETY: as in `head`.
        unsafe { &*self.flags }
    }
    fn tail(&self) -> &AtomicU64 {
        // SAFETY: as in `head`.
        unsafe { &*self.tail }
    }
}

/// Bytes between `tail` and `head` of a ring of `capacity` bytes: the readable bytes for the
/// consumer, the used space for the producer. Both counters wrap at 2^64; more than `capacity` is
/// corruption.
///
/// ```
/// use colo_ring::ring::occupancy;
/// assert_eq!(occupancy(10, u64::MAX - 5, 4096), Ok(16));
/// assert!(occupancy(5, 10, 4096).is_err());
/// ```
pub fn occupancy(head: u64, tail: u64, capacity: u64) -> Result<u64, Corrupt> {
    let used = head.wrapping_sub(tail);
    if used > capacity {
        Err(Corrupt("ring counters out of range"))
    } else {
        Ok(used)
    }
}

fn check_flags(value: u32, known: u32) -> Result<u32, Corrupt> {
    if value & !known != 0 {
        Err(Corrupt("unknown flag bits"))
    } else {
        Ok(value)
    }
}

/// The writing half of a byte ring.
#[derive(Debug)]
pub struct Producer<B> {
    words: RingWords,
    data: B,
    capacity: u64,
    head: u64,
    cached_tail: u64,
}

impl<B: Bytes> Producer<B> {
    /// # Safety
    /// `words` point to live, aligned atomics of a fresh ring (all zero) whose data is `data`, and
    /// stay valid for the life of the producer. `data.capacity()` is a power of two.
    pub unsafe fn new(words: RingWords, data: B) -> Self {
        let capacity = data.capacity() as u64;
        debug_assert!(capacity.is_power_of_two());
        Producer { words, data, capacity, head: 0, cached_tail: 0 }
    }

    /// Takes over the producing end of a ring already in use (a program that inherited the
    /// connection across `exec`): continues from the current `ring_head`, which only the producer
    /// writes. The cached tail says "full", so the first write reads the real one.
    ///
    /// # Safety
    /// As for [`Producer::new`], except that the ring need not be fresh; no other producer of it
    /// exists any more.
    pub unsafe fn resume(words: RingWords, data: B) -> Self {
        let capacity = data.capacity() as u64;
        let head = words.head().load(Ordering::Relaxed);
        Producer { words, data, capacity, head, cached_tail: head.wrapping_sub(capacity) }
    }

    fn refresh(&mut self) -> Result<u64, Corrupt> {
        // SYNC POINT with the Release store of `ring_tail` in `Consumer::read`: the consumer's
        // copies out of the bytes it released happen before we overwrite them.
        let tail = self.words.tail().load(Ordering::Acquire);
        // `head - cached_tail <= capacity` always holds, so a genuine tail is at most `capacity`
        // past the cached one; a tail that went backwards wraps far beyond.
        if tail.wrapping_sub(self.cached_tail) > self.capacity {
            return Err(Corrupt("ring_tail moved backwards"));
        }
        let used = occupancy(self.head, tail, self.capacity)?;
        self.cached_tail = tail;
        Ok(self.capacity - used)
    }

    /// Bytes that can be written now.
    pub fn space(&mut self) -> Result<usize, Corrupt> {
        let cached = self.capacity - self.head.wrapping_sub(self.cached_tail);
        Ok(if cached > 0 { cached } else { self.refresh()? } as usize)
    }

    /// Copies as much of `src` as fits and publishes it; returns the count (0 when full).
    pub fn write(&mut self, src: &[u8]) -> Result<usize, Corrupt> {
        let mut free = self.capacity - self.head.wrapping_sub(self.cached_tail);
        if free < src.len() as u64 {
            free = self.refresh()?;
        }
        let n = (free as usize).min(src.len());
        if n == 0 {
            return Ok(0);
        }
        let at = (self.head & (self.capacity - 1)) as usize; // a power of two: `%` without a division
        let first = n.min(self.capacity as usize - at);
        // SAFETY: `at + first <= capacity` and `n - first <= capacity - first`; the consumer does
        // not read these bytes until the Release store below publishes them.
        unsafe {
            self.data.store(at, &src[..first]);
            if first < n {
                self.data.store(0, &src[first..n]);
            }
        }
        self.head = self.head.wrapping_add(n as u64);
        // SYNC POINT with the Acquire load of `ring_head` in `Consumer::refresh`: the bytes stored
        // above are visible to the consumer before it sees the new head.
        self.words.head().store(self.head, Ordering::Release);
        Ok(n)
    }

    /// Sets bits of `ring_flags` (`FIN`, `RESET`, `NOT_READING`).
    pub fn set_flags(&self, flags: u32) {
        // SYNC POINT with the Acquire load in `Consumer::flags`: every byte published before FIN is
        // visible to a consumer that sees FIN.
        self.words.flags().fetch_or(flags, Ordering::Release);
    }

    /// Bytes ever written.
    pub fn written(&self) -> u64 {
        self.head
    }
}

/// The reading half of a byte ring.
#[derive(Debug)]
pub struct Consumer<B> {
    words: RingWords,
    data: B,
    capacity: u64,
    tail: u64,
    cached_head: u64,
}

impl<B: Bytes> Consumer<B> {
    /// # Safety
    /// As for [`Producer::new`].
    pub unsafe fn new(words: RingWords, data: B) -> Self {
        let capacity = data.capacity() as u64;
        debug_assert!(capacity.is_power_of_two());
        Consumer { words, data, capacity, tail: 0, cached_head: 0 }
    }

    /// Takes over the consuming end of a ring already in use: continues from the current
    /// `ring_tail`, which only the consumer writes. The cached head says "empty".
    ///
    /// # Safety
    /// As for [`Producer::resume`].
    pub unsafe fn resume(words: RingWords, data: B) -> Self {
        let capacity = data.capacity() as u64;
        let tail = words.tail().load(Ordering::Relaxed);
        Consumer { words, data, capacity, tail, cached_head: tail }
    }

    fn refresh(&mut self) -> Result<u64, Corrupt> {
        // SYNC POINT with the Release store of `ring_head` in `Producer::write`.
        let head = self.words.head().load(Ordering::Acquire);
        // As in `Producer::refresh`: a genuine head is at most `capacity` past the cached one.
        if head.wrapping_sub(self.cached_head) > self.capacity {
            return Err(Corrupt("ring_head moved backwards"));
        }
        let avail = occupancy(head, self.tail, self.capacity)?;
        self.cached_head = head;
        Ok(avail)
    }

    /// Bytes that can be read now.
    pub fn available(&mut self) -> Result<usize, Corrupt> {
        let cached = self.cached_head.wrapping_sub(self.tail);
        Ok(if cached > 0 { cached } else { self.refresh()? } as usize)
    }

    fn copy_out(&mut self, dst: &mut [u8]) -> Result<usize, Corrupt> {
        let mut avail = self.cached_head.wrapping_sub(self.tail);
        if avail < dst.len() as u64 {
            avail = self.refresh()?;
        }
        let n = (avail as usize).min(dst.len());
        let at = (self.tail & (self.capacity - 1)) as usize;
        let first = n.min(self.capacity as usize - at);
        // SAFETY: `at + first <= capacity` and `n - first <= capacity - first`; the producer
        // published these bytes (Acquire in `refresh`) and will not overwrite them before we
        // release them by storing `ring_tail`.
        unsafe {
            self.data.load(at, &mut dst[..first]);
            if first < n {
                self.data.load(0, &mut dst[first..n]);
            }
        }
        Ok(n)
    }

    /// Copies up to `dst.len()` bytes out and releases them; returns the count (0 when empty).
    pub fn read(&mut self, dst: &mut [u8]) -> Result<usize, Corrupt> {
        let n = self.copy_out(dst)?;
        if n > 0 {
            self.tail = self.tail.wrapping_add(n as u64);
            // SYNC POINT with the Acquire load of `ring_tail` in `Producer::refresh`.
            self.words.tail().store(self.tail, Ordering::Release);
        }
        Ok(n)
    }

    /// Copies up to `dst.len()` bytes out without releasing them (`MSG_PEEK`).
    pub fn peek(&mut self, dst: &mut [u8]) -> Result<usize, Corrupt> {
        self.copy_out(dst)
    }

    /// The producer's `ring_flags`.
    pub fn flags(&self) -> Result<u32, Corrupt> {
        // SYNC POINT with the Release fetch_or in `Producer::set_flags`.
        check_flags(self.words.flags().load(Ordering::Acquire), RING_FLAGS)
    }

    /// Whether the ring was full when `ring_tail` was `tail_before` (so the producer may be
    /// waiting for space). Loads `ring_head` afresh.
    pub fn was_full_before(&self, tail_before: u64) -> bool {
        // SYNC POINT with the Release store of `ring_head` in `Producer::write` (see
        // `notify::peer_needs_space_wake` for why this load sees a blocked producer's head).
        self.words.head().load(Ordering::Acquire).wrapping_sub(tail_before) >= self.capacity
    }

    /// Bytes ever read.
    pub fn consumed(&self) -> u64 {
        self.tail
    }
}
