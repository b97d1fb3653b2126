//! The byte ring of one direction (spec/WIRE.md section 5): the producer half and the consumer half.
//!
//! Each half keeps its own counter privately and a cached copy of the other side's, re-reading the
//! shared counter only when the cache says full (producer) or empty (consumer), as rtrb does. Both
//! counters count bytes ever moved and wrap at 2^64; byte `i` lives at `data[i % capacity]`.

use crate::layout::{FLAG_DROPPED, FLAG_RESET, MIN_RING_SIZE, RING_FLAGS};
use crate::sync::{fence, AtomicU32, AtomicU64, Ordering};
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

    /// The region's first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
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

/// Where the shared words of a ring live (offsets in `layout::block`). The fields are
/// private: [`RingWords::new`] is the one place that vouches for the pointers, so every method
/// here, and the views of [`crate::snapshot`], can load them without a contract of their own.
#[derive(Debug, Clone, Copy)]
pub struct RingWords {
    /// `ring_head`.
    head: *const AtomicU64,
    /// `ring_flags`.
    flags: *const AtomicU32,
    /// `ring_size`.
    size: *const AtomicU32,
    /// `space_wake`.
    space_wake: *const AtomicU32,
    /// `ring_tail`.
    tail: *const AtomicU64,
    /// `read_flags`.
    read_flags: *const AtomicU32,
}

// SAFETY: the words are atomics, valid for as long as any copy of the value is used (the
// contract of `RingWords::new`), so another thread may load and store them too.
unsafe impl Send for RingWords {}
// SAFETY: as for `Send`: shared access only loads the pointers and uses the atomics behind them.
unsafe impl Sync for RingWords {}

impl RingWords {
    /// Locates a ring's words.
    ///
    /// # Safety
    /// Each pointer points to an aligned atomic that stays live (mapped, not freed) for as long
    /// as the returned value or any copy of it is used. Their values may be anything: every value
    /// loaded through them is validated before it is trusted.
    pub unsafe fn new(
        head: *const AtomicU64,
        flags: *const AtomicU32,
        size: *const AtomicU32,
        space_wake: *const AtomicU32,
        tail: *const AtomicU64,
        read_flags: *const AtomicU32,
    ) -> RingWords {
        RingWords { head, flags, size, space_wake, tail, read_flags }
    }

    /// The producer's `ring_flags`, validated (for a reader that is not this ring's consumer,
    /// such as the message half of the same direction).
    pub fn producer_flags(&self) -> Result<u32, Corrupt> {
        // SYNC POINT with the Release fetch_or in `Producer::set_flags` and `raise_flags`.
        check_ring_flags(self.flags().load(Ordering::Acquire))
    }

    /// Sets bits of `ring_flags` (`FIN`, `RESET`, `NOT_READING`) without the producer half, for
    /// a side whose producer may be held by a blocked writer: as [`Producer::set_flags`].
    pub fn raise_flags(&self, bits: u32) {
        // SYNC POINT with the Acquire loads of `ring_flags` (`Consumer::flags`, `producer_flags`,
        // `RingState::consumer_view`): what this side published before the flag is visible with it.
        self.flags().fetch_or(bits, Ordering::Release);
    }

    /// The consumer's `read_flags` (`READ_CLOSED`), unvalidated.
    pub fn read_flags(&self) -> u32 {
        // SYNC POINT with the Release fetch_or in `close_reading`.
        self.read_flags_word().load(Ordering::Acquire)
    }

    /// Sets bits of the consumer's `read_flags` (`READ_CLOSED`: this side shut down reading).
    pub fn close_reading(&self, bits: u32) {
        // SYNC POINT with the Acquire load in `read_flags` (a later holder of this side, such as
        // the program image after `exec`).
        self.read_flags_word().fetch_or(bits, Ordering::Release);
    }

    /// Makes the ring start at [`MIN_RING_SIZE`] bytes: the segment's creator does so for a fresh or
    /// recycled segment before it sends HELLO (whose system call publishes the store to the peer).
    pub fn start_small(&self) {
        self.size().store(MIN_RING_SIZE, Ordering::Relaxed);
        self.space_wake().store(0, Ordering::Relaxed);
    }

    /// For the consumer, about to pause (announce a sleep of its own, or return "would block"):
    /// whether its producer may be waiting for space that exists but that no read of ours will
    /// wake it for, as the unread bytes are still above its `space_wake` mark and we stop
    /// reading (spec/WIRE.md section 6, "Waiting for space"). With mark 0 the first byte read
    /// woke it already. Unvalidated loads: the answer only decides one wake-up.
    pub fn space_wake_owed(&self) -> bool {
        let mark = u64::from(self.space_wake().load(Ordering::Relaxed));
        let size = u64::from(self.size().load(Ordering::Relaxed));
        // SYNC POINT with the Release store of `ring_head` in `Producer::write`.
        let used = self.head().load(Ordering::Acquire).wrapping_sub(self.tail().load(Ordering::Relaxed));
        mark != 0 && used > mark && used < size
    }

    pub(crate) fn head(&self) -> &AtomicU64 {
        // SAFETY: live, aligned atomics while any copy of `self` is used (`RingWords::new`).
        unsafe { &*self.head }
    }
    pub(crate) fn flags(&self) -> &AtomicU32 {
        // SAFETY: as in `head`.
        unsafe { &*self.flags }
    }
    fn size(&self) -> &AtomicU32 {
        // SAFETY: as in `head`.
        unsafe { &*self.size }
    }
    pub(crate) fn tail(&self) -> &AtomicU64 {
        // SAFETY: as in `head`.
        unsafe { &*self.tail }
    }
    fn read_flags_word(&self) -> &AtomicU32 {
        // SAFETY: as in `head`.
        unsafe { &*self.read_flags }
    }
    fn space_wake(&self) -> &AtomicU32 {
        // SAFETY: as in `head`.
        unsafe { &*self.space_wake }
    }
}

/// The smallest `ring_size` (loom models use rings of a few bytes).
const SMALLEST: u64 = if cfg!(loom) { 1 } else { MIN_RING_SIZE as u64 };

/// A `ring_size` as the peer left it: a power of two from [`MIN_RING_SIZE`] to the data region's
/// `capacity`, or corruption.
fn valid_size(size: u32, capacity: u64) -> Result<u64, Corrupt> {
    let s = u64::from(size);
    if s.is_power_of_two() && (s >= SMALLEST || s == capacity) && s <= capacity {
        Ok(s)
    } else {
        Err(Corrupt("ring_size out of range"))
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

/// A `ring_flags` word: a bit not named in spec/WIRE.md section 8, or DROPPED without RESET (a
/// reader would wait on a ring whose bytes are gone), is corruption.
fn check_ring_flags(value: u32) -> Result<u32, Corrupt> {
    if value & (FLAG_DROPPED | FLAG_RESET) == FLAG_DROPPED {
        return Err(Corrupt("DROPPED without RESET"));
    }
    check_flags(value, RING_FLAGS)
}

fn check_flags(value: u32, known: u32) -> Result<u32, Corrupt> {
    if value & !known != 0 {
        Err(Corrupt("unknown flag bits"))
    } else {
        Ok(value)
    }
}

/// How many times in a row a read may find the ring grown under it before the peer counts as
/// corrupting the segment (an honest producer grows a ring at most about 20 times in its life,
/// and shrinks it only while it is empty, never during a read).
const MAX_REREADS: u32 = 64;

/// The writing half of a byte ring.
#[derive(Debug)]
pub struct Producer<B> {
    words: RingWords,
    data: B,
    /// Size of the data region: the largest the ring may grow to.
    capacity: u64,
    /// The ring's current size (`ring_size`); 0 if the shared word was invalid when read.
    size: u64,
    /// The size a write may grow the ring to (a power of two, at most `capacity`).
    limit: u64,
    /// The most bytes the ring ever holds unread (a power of two, at least `limit`): a ring
    /// found larger (its size word is shared, and the peer can write it) is filled only this
    /// far and goes down once empty ([`Producer::fit`]).
    bound: u64,
    /// The bytes asked of `set_limit`, before rounding (the capacity without one): the mark
    /// stays below what a program's `SO_SNDBUF` lets it queue.
    asked: u64,
    head: u64,
    cached_tail: u64,
    /// The `space_wake` we last stored (0: none yet, the wire's "any free byte").
    space_wake: u64,
}

impl<B: Bytes> Producer<B> {
    /// # Safety
    /// `words` are those of a fresh ring (counters zero, `ring_size` set by
    /// [`RingWords::start_small`] or to any valid size) whose data is `data`, and no other
    /// producer of the ring writes while this one lives. `data.capacity()` is a power of two.
    pub unsafe fn new(words: RingWords, data: B) -> Self {
        let capacity = data.capacity() as u64;
        debug_assert!(capacity.is_power_of_two());
        let size = valid_size(words.size().load(Ordering::Relaxed), capacity).unwrap_or(0);
        Producer { words, data, capacity, size, limit: capacity, bound: capacity, asked: capacity, head: 0, cached_tail: 0, space_wake: 0 }
    }

    /// Takes over the producing end of a ring already in use (a program that inherited the
    /// connection across `exec`, or another holder of it wrote since): continues from the
    /// current `ring_head` and `ring_size`, which only producers write. The cached tail says
    /// "full", so the first write reads the real one.
    ///
    /// # Safety
    /// As for [`Producer::new`], except that the ring need not be fresh; no other producer of it
    /// writes at the same time.
    pub unsafe fn resume(words: RingWords, data: B) -> Self {
        let capacity = data.capacity() as u64;
        let head = words.head().load(Ordering::Relaxed);
        let size = valid_size(words.size().load(Ordering::Relaxed), capacity).unwrap_or(0);
        let space_wake = u64::from(words.space_wake().load(Ordering::Relaxed)).min(size.saturating_sub(1));
        let cached_tail = head.wrapping_sub(size);
        Producer { words, data, capacity, size, limit: capacity, bound: capacity, asked: capacity, head, cached_tail, space_wake }
    }

    /// Bounds how far writes grow the ring (a program's `SO_SNDBUF`): `bytes` rounded up to a
    /// power of two, within the data region. A ring already larger keeps its size.
    pub fn set_limit(&mut self, bytes: usize) {
        self.asked = (bytes as u64).min(self.capacity);
        let bytes = (bytes as u64).max(u64::from(MIN_RING_SIZE)).next_power_of_two();
        self.limit = bytes.min(self.capacity);
        // A limit the program raised raises the bound; one it lowered leaves it (the ring
        // keeps a larger size it grew to).
        self.bound = self.bound.max(self.limit);
        if self.space_wake != 0 {
            self.mark_space_wake();
        }
    }

    /// Stores `space_wake`: seven eighths of the ring's size or of the bytes its limit asked
    /// for, whichever is smaller, so that a producer that waits for space waits until an eighth
    /// of what it may fill is free (the ring stands for a TCP sender's buffer and its receiver's,
    /// and TCP wakes a writer once a third of its own buffer, a sixth of both, is free: a reader
    /// that stops after freeing that much never strands a writer that TCP would have let go),
    /// and every waiter of this end (a poller included, which sleeps only at the asked bound)
    /// sleeps only with more than that unread. Relaxed: the producer's announcement of a sleep
    /// (the acquire-release read-modify-write in `notify::announce_sleep`, which a consumer's
    /// `peer_needs_space_wake` reads) comes after it, and the value changes only while this end
    /// writes, never while it sleeps.
    fn mark_space_wake(&mut self) {
        let fill = self.size.min(self.asked.max(u64::from(MIN_RING_SIZE)));
        let mark = fill - (fill / 8).max(1);
        if mark != self.space_wake {
            self.space_wake = mark;
            self.words.space_wake().store(mark as u32, Ordering::Relaxed);
        }
    }

    /// Bounds how many bytes the ring ever holds unread, whatever size its shared word says
    /// (a server's own bound, `colo::default_ring`: the peer made the segment and can write
    /// that word): `bytes` rounded up as for [`Producer::set_limit`], which it also sets.
    /// Only [`Producer::set_limit`] raises it again.
    pub fn set_bound(&mut self, bytes: usize) {
        self.set_limit(bytes);
        self.bound = self.limit;
    }

    /// The most bytes a write may leave unread now: the size, or the limit it may grow to,
    /// within the bound.
    fn room(&self) -> u64 {
        self.size.max(self.limit).min(self.bound)
    }

    /// The free space, if a producer that waits for space may stop waiting: at most
    /// `space_wake` bytes unread (any free byte before a first growth, when it is 0), else 0.
    /// The consumer wakes a sleeping producer exactly when its read takes the unread bytes to
    /// that mark ([`Consumer::space_wake_crossed`]).
    pub fn space_past_mark(&mut self) -> Result<usize, Corrupt> {
        let free = self.refresh()?;
        let used = self.size - free;
        // The shared word, if higher: another process holding this end (a fork) may have stored
        // its own mark, which the consumer wakes us at. A peer's scribble can only raise it.
        let mark = self.space_wake.max(u64::from(self.words.space_wake().load(Ordering::Relaxed)));
        Ok(if self.space_wake == 0 || used <= mark { self.room().saturating_sub(used) as usize } else { 0 })
    }

    fn refresh(&mut self) -> Result<u64, Corrupt> {
        if self.size == 0 {
            return Err(Corrupt("ring_size out of range"));
        }
        // SYNC POINT with the Release store of `ring_tail` in `Consumer::read`: the consumer's
        // copies out of the bytes it released happen before we overwrite them.
        let tail = self.words.tail().load(Ordering::Acquire);
        // `head - cached_tail <= size` always holds, so a genuine tail is at most `size` past the
        // cached one; a tail that went backwards wraps far beyond.
        if tail.wrapping_sub(self.cached_tail) > self.size {
            return Err(Corrupt("ring_tail moved backwards"));
        }
        let used = occupancy(self.head, tail, self.size)?;
        self.cached_tail = tail;
        Ok(self.size - used)
    }

    /// Bytes that can be written now, counting what growing the ring would make room for.
    pub fn space(&mut self) -> Result<usize, Corrupt> {
        let room = self.room();
        let cached = room.saturating_sub(self.head.wrapping_sub(self.cached_tail));
        Ok(if cached > 0 { cached } else { room.saturating_sub(self.size - self.refresh()?) } as usize)
    }

    /// A ring larger than the bound: its size was not this producer's to choose (the shared
    /// `ring_size` word, which the peer can write, in a fresh segment the peer made, or read
    /// back by [`Producer::resume`]). It holds no more than the bound unread (`write`,
    /// `space`), and goes down to the limit once it is empty (a producer may shrink an empty
    /// ring, spec/WIRE.md section 5): a peer that wrote a larger size and never reads holds
    /// no more of the producer's memory than the bound. Returns the free bytes within it.
    fn fit(&mut self) -> Result<u64, Corrupt> {
        let free = self.refresh()?;
        if free == self.size {
            // SYNC POINT with the Acquire load of `ring_size` in `Consumer::refresh`, as in
            // `shrink_if_empty`: nothing is readable.
            self.words.size().store(self.limit as u32, Ordering::Release);
            fence(Ordering::Release);
            self.size = self.limit;
            self.mark_space_wake();
            return Ok(self.size);
        }
        Ok(self.bound.saturating_sub(self.size - free))
    }

    /// Grows the ring so that `want` bytes fit beside the unread ones (within the limit); returns
    /// the free bytes.
    /// The unread bytes move to where the larger size puts them (byte `i` at `data[i % size]`):
    /// those whose place does not change stay, the others are copied to the new part of the
    /// region, which no reader of the old size looks at. A consumer that copied with the old size
    /// sees `ring_size` changed after its copy and copies again (`Consumer::copy_out`).
    fn grow(&mut self, want: u64) -> Result<u64, Corrupt> {
        let used = self.head.wrapping_sub(self.cached_tail);
        let target = (used + want).next_power_of_two().min(self.limit.max(self.size));
        let old = self.size;
        if target <= old {
            return Ok(old - used);
        }
        let mut buf = [0u8; 4096];
        let mut i = self.cached_tail;
        while i != self.head {
            let from = (i & (old - 1)) as usize;
            let to = (i & (target - 1)) as usize;
            let run = (self.head.wrapping_sub(i) as usize).min(old as usize - from).min(target as usize - to).min(buf.len());
            if to != from {
                // SAFETY: `from + run <= old <= capacity` and `to + run <= target <= capacity`;
                // sources lie below `old`, destinations at or above it (no overlap), and the
                // consumer reads neither place while the size it reads says `old` (section 5).
                unsafe {
                    self.data.load(from, &mut buf[..run]);
                    self.data.store(to, &buf[..run]);
                }
            }
            i = i.wrapping_add(run as u64);
        }
        // SYNC POINT with the Acquire load of `ring_size` in `Consumer::refresh`: a consumer that
        // sees the new size sees the bytes moved.
        self.words.size().store(target as u32, Ordering::Release);
        // SYNC POINT with the Acquire fence in `Consumer::copy_out`: a consumer whose copy with
        // the old size saw any byte we write from here on sees the new size after its copy.
        fence(Ordering::Release);
        self.size = target;
        self.mark_space_wake();
        Ok(target - used)
    }

    /// Shrinks an empty ring back to [`MIN_RING_SIZE`] bytes; returns the part of the data region
    /// whose pages the caller may now give back to the system (`MADV_REMOVE`). Nothing if bytes
    /// are in flight or the ring is already small.
    pub fn shrink_if_empty(&mut self) -> Result<Option<core::ops::Range<usize>>, Corrupt> {
        let small = u64::from(MIN_RING_SIZE);
        if self.size <= small || self.refresh()? != self.size {
            return Ok(None);
        }
        // SYNC POINT with the Acquire load of `ring_size` in `Consumer::refresh`, as in `grow`;
        // nothing is readable, so a consumer that copies with the old size copies nothing, or
        // bytes we publish later, and then sees the size changed.
        self.words.size().store(MIN_RING_SIZE, Ordering::Release);
        fence(Ordering::Release);
        let old = self.size;
        self.size = small;
        self.mark_space_wake();
        Ok(Some(small as usize..old as usize))
    }

    /// Copies as much of `src` as fits and publishes it, growing the ring first if `src` does
    /// not fit and the limit allows; returns the count (0 when full at the limit).
    pub fn write(&mut self, src: &[u8]) -> Result<usize, Corrupt> {
        let free = self.free_for(src.len())?;
        let (at, first, n) = self.place(free, src.len());
        // SAFETY: `place` keeps `at + first <= size <= capacity` and `n - first <= at`; the
        // consumer does not read these bytes until `publish` does.
        unsafe {
            self.data.store(at, &src[..first]);
            if first < n {
                self.data.store(0, &src[first..n]);
            }
        }
        self.publish(n);
        Ok(n)
    }

    /// The free bytes for a write of `want`: within the bound (`fit`), else at the current size,
    /// grown first if `want` does not fit and the limit allows.
    fn free_for(&mut self, want: usize) -> Result<u64, Corrupt> {
        if self.size > self.bound {
            return self.fit();
        }
        let mut free = self.size - self.head.wrapping_sub(self.cached_tail);
        if free < want as u64 {
            free = self.refresh()?;
            if free < want as u64 && self.size < self.limit {
                free = self.grow(want as u64)?;
            }
        }
        Ok(free)
    }

    /// Where a write of `want` bytes goes, `free` bytes being free at the current size: its
    /// offset `at`, the bytes `first` up to the ring's end, and the count `n` in all (those past
    /// `first` go to offset 0).
    fn place(&self, free: u64, want: usize) -> (usize, usize, usize) {
        let n = (free as usize).min(want);
        if n == 0 {
            // Nothing to place (a ring whose size word was never valid has size 0).
            return (0, 0, 0);
        }
        let at = (self.head & (self.size - 1)) as usize; // a power of two: `%` without a division
        (at, n.min(self.size as usize - at), n)
    }

    /// Publishes the `n` bytes stored after the head.
    fn publish(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        self.head = self.head.wrapping_add(n as u64);
        // SYNC POINT with the Acquire load of `ring_head` in `Consumer::refresh`: the bytes stored
        // before are visible to the consumer before it sees the new head.
        self.words.head().store(self.head, Ordering::Release);
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

    /// The ring's current size.
    pub fn size(&self) -> usize {
        self.size as usize
    }

    /// The most bytes the ring ever holds unread (see [`Producer::set_bound`]).
    pub fn bound(&self) -> usize {
        self.bound as usize
    }
}

impl Producer<RawBytes> {
    /// [`Producer::write`] of up to `want` bytes that `fill` stores in the ring itself, for a
    /// source that can write to memory (a file's `pread`): no copy of our own in between.
    /// `fill(dst, len)` stores at most `len` bytes at `dst` and returns how many; it is called
    /// for the free bytes up to the ring's end and, if it stored all of those, once more for
    /// the rest after the wrap. What it stored is published; returns the count (0: full at the
    /// limit, or `fill` stored nothing).
    ///
    /// # Safety
    /// `fill` stores only inside the range it is given, and only before it returns.
    pub unsafe fn write_with(&mut self, want: usize, mut fill: impl FnMut(*mut u8, usize) -> usize) -> Result<usize, Corrupt> {
        let free = self.free_for(want)?;
        let (at, first, n) = self.place(free, want);
        if n == 0 {
            return Ok(0);
        }
        // `at + first <= size <= capacity` and `n - first <= at` (`place`): both ranges lie in
        // the data region, in bytes the consumer does not read until `publish`.
        let mut stored = fill(self.data.as_ptr().wrapping_add(at), first).min(first);
        if stored == first && first < n {
            stored += fill(self.data.as_ptr(), n - first).min(n - first);
        }
        self.publish(stored);
        Ok(stored)
    }
}

/// The reading half of a byte ring.
#[derive(Debug)]
pub struct Consumer<B> {
    words: RingWords,
    data: B,
    capacity: u64,
    /// The size read with `cached_head`: where the bytes up to it lie, unless the producer grew
    /// the ring since (see `copy_out`).
    size: u64,
    tail: u64,
    cached_head: u64,
}

impl<B: Bytes> Consumer<B> {
    /// # Safety
    /// As for [`Producer::new`].
    pub unsafe fn new(words: RingWords, data: B) -> Self {
        let capacity = data.capacity() as u64;
        debug_assert!(capacity.is_power_of_two());
        Consumer { words, data, capacity, size: u64::from(MIN_RING_SIZE).min(capacity), tail: 0, cached_head: 0 }
    }

    /// Takes over the consuming end of a ring already in use: continues from the current
    /// `ring_tail`, which only the consumer writes. The cached head says "empty".
    ///
    /// # Safety
    /// As for [`Producer::resume`].
    pub unsafe fn resume(words: RingWords, data: B) -> Self {
        let capacity = data.capacity() as u64;
        let tail = words.tail().load(Ordering::Relaxed);
        Consumer { words, data, capacity, size: u64::from(MIN_RING_SIZE).min(capacity), tail, cached_head: tail }
    }

    fn refresh(&mut self) -> Result<u64, Corrupt> {
        // SYNC POINT with the Release store of `ring_head` in `Producer::write`: the bytes up to
        // it are visible, and so is the size they were written at.
        let head = self.words.head().load(Ordering::Acquire);
        // SYNC POINT with the Release stores of `ring_size` in `Producer::grow` and
        // `Producer::shrink_if_empty`: bytes moved for this size are visible. Loaded after the
        // head, it is the size those bytes were written at or a later one; while bytes are
        // unread the ring cannot shrink, so a later one is larger and holds them where it puts
        // them (loaded first, a shrink and a regrow to the same size between the two loads could
        // pass `copy_out`'s check with the bytes read from the wrong place).
        let size = valid_size(self.words.size().load(Ordering::Acquire), self.capacity)?;
        // As in `Producer::refresh`: a genuine head is at most the size past the cached one.
        if head.wrapping_sub(self.cached_head) > self.capacity {
            return Err(Corrupt("ring_head moved backwards"));
        }
        let avail = occupancy(head, self.tail, self.capacity)?;
        self.cached_head = head;
        self.size = size;
        Ok(avail)
    }

    /// Bytes that can be read now.
    pub fn available(&mut self) -> Result<usize, Corrupt> {
        let cached = self.cached_head.wrapping_sub(self.tail);
        Ok(if cached > 0 { cached } else { self.refresh()? } as usize)
    }

    /// Copies the next bytes out without releasing them. The producer may grow the ring (moving
    /// unread bytes) at any time, so the copy counts only if `ring_size` still holds the size it
    /// was made with (a sequence lock, the size its sequence number): otherwise it is made again.
    #[inline(always)]
    fn copy_out(&mut self, dst: &mut [u8]) -> Result<usize, Corrupt> {
        self.copy_out_at(0, dst)
    }

    /// As `copy_out`, from `skip` bytes past the first unread one (0 when none lies past it).
    fn copy_out_at(&mut self, skip: u64, dst: &mut [u8]) -> Result<usize, Corrupt> {
        for _ in 0..MAX_REREADS {
            let mut avail = self.cached_head.wrapping_sub(self.tail);
            if avail < skip.saturating_add(dst.len() as u64) {
                avail = self.refresh()?;
            }
            let n = (avail.saturating_sub(skip) as usize).min(dst.len());
            if n == 0 {
                return Ok(0);
            }
            if avail > self.size {
                // More than the size read allows: published under a size not yet seen.
                self.cached_head = self.tail;
                continue;
            }
            let at = (self.tail.wrapping_add(skip) & (self.size - 1)) as usize;
            let first = n.min(self.size as usize - at);
            // SAFETY: `at + first <= size <= capacity` and `n - first <= size - first`; the
            // producer published these bytes (Acquire in `refresh`) and will not overwrite them
            // before we release them by storing `ring_tail`, except by moving them when it grows
            // the ring, which the check below detects.
            unsafe {
                self.data.load(at, &mut dst[..first]);
                if first < n {
                    self.data.load(0, &mut dst[first..n]);
                }
            }
            // SYNC POINT with the Release fence in `Producer::grow`: if the copy saw a byte the
            // producer wrote after growing, this load sees the grown size.
            fence(Ordering::Acquire);
            // After the same fence: a producer sets DROPPED before it gives back the pages of its
            // unread bytes, so a copy that saw a page given back (zeros) sees the flag here, and
            // hands on nothing; the reset follows (spec/WIRE.md section 8, "Orphaned bytes").
            if self.words.flags().load(Ordering::Relaxed) & FLAG_DROPPED != 0 {
                return Ok(0);
            }
            if u64::from(self.words.size().load(Ordering::Relaxed)) == self.size {
                return Ok(n);
            }
            self.cached_head = self.tail;
        }
        Err(Corrupt("ring_size changes under every read"))
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

    /// Copies up to `dst.len()` bytes out without releasing them, from `skip` bytes past the
    /// first unread one (a reader that handed the first `skip` on already and releases them
    /// later); 0 when no byte lies past `skip`.
    pub fn peek_at(&mut self, skip: usize, dst: &mut [u8]) -> Result<usize, Corrupt> {
        self.copy_out_at(skip as u64, dst)
    }

    /// Releases up to `n` unread bytes without copying them (a reader that peeked them before,
    /// `peek_at`); returns the count, which is less than `n` only if fewer are unread.
    pub fn release(&mut self, n: usize) -> Result<usize, Corrupt> {
        let mut avail = self.cached_head.wrapping_sub(self.tail);
        if avail < n as u64 {
            avail = self.refresh()?;
        }
        let n = (avail as usize).min(n);
        if n > 0 {
            self.tail = self.tail.wrapping_add(n as u64);
            // SYNC POINT with the Acquire load of `ring_tail` in `Producer::refresh`: the copies
            // the earlier peeks made of these bytes come before the producer overwrites them.
            self.words.tail().store(self.tail, Ordering::Release);
        }
        Ok(n)
    }

    /// Releases the `n` bytes peeked from ring position `from` (`peek_at` with no skip) only
    /// if no other consumer of the ring (another process sharing this end) moved the tail
    /// since: the tail moves from `from` with a compare-and-swap, so that of two consumers that
    /// peeked the same bytes, one takes them and the other learns that it must not hand them
    /// on. `Ok(false)`: the tail moved (or fewer than `n` bytes are unread); nothing released.
    pub fn release_from(&mut self, from: u64, n: usize) -> Result<bool, Corrupt> {
        if self.tail != from {
            return Ok(false);
        }
        let mut avail = self.cached_head.wrapping_sub(self.tail);
        if avail < n as u64 {
            avail = self.refresh()?;
        }
        if avail < n as u64 {
            return Ok(false);
        }
        // SYNC POINT: Release, as in `release`: the copies the peek made of these bytes come
        // before the producer overwrites them.
        match self.words.tail().compare_exchange(from, from.wrapping_add(n as u64), Ordering::Release, Ordering::Relaxed) {
            Ok(_) => {
                self.tail = from.wrapping_add(n as u64);
                Ok(true)
            }
            Err(_) => Ok(false),
        }
    }

    /// Whether every byte of the ring at its current size is unread (a producer at its limit
    /// waits for space).
    pub fn full(&mut self) -> Result<bool, Corrupt> {
        let avail = self.refresh()?;
        Ok(avail >= self.size)
    }

    /// The producer's `ring_flags`.
    pub fn flags(&self) -> Result<u32, Corrupt> {
        // SYNC POINT with the Release fetch_or in `Producer::set_flags`.
        check_ring_flags(self.words.flags().load(Ordering::Acquire))
    }

    /// Whether a read that moved `ring_tail` from `tail_before` to where it is now should wake a
    /// producer waiting for space: it took the unread bytes from above the producer's
    /// `space_wake` mark to at most it (spec/WIRE.md section 6). A mark of 0 means "any free
    /// byte": the ring was full before the read (with the smaller of the size the consumer read
    /// with and `ring_size` now: a stale size only costs a futile wake-up). Loads `ring_head`
    /// afresh; the producer waits with `ring_head` fixed, so a wake-up is due only on the read that
    /// crosses the mark, and a peer waiting for our bytes instead is left asleep.
    pub fn space_wake_crossed(&self, tail_before: u64) -> bool {
        let size = u64::from(self.words.size().load(Ordering::Relaxed)).min(self.size);
        // No ordering of its own: the caller's `peer_needs_space_wake` read-modify-write of the
        // producer's `waiting` word ordered the producer's store before its announcement.
        let mark = match u64::from(self.words.space_wake().load(Ordering::Relaxed)) {
            0 => size.saturating_sub(1),
            m => m,
        };
        // SYNC POINT with the Release store of `ring_head` in `Producer::write` (see
        // `notify::peer_needs_space_wake` for why this load sees a blocked producer's head).
        let head = self.words.head().load(Ordering::Acquire);
        head.wrapping_sub(tail_before) > mark && head.wrapping_sub(self.tail) <= mark
    }

    /// Bytes ever read.
    pub fn consumed(&self) -> u64 {
        self.tail
    }
}
