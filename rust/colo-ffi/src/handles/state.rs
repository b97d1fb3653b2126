//! The state word's bit layout, the handle encoding and where an index lives in the chunks (see
//! the module doc of `handles`): plain functions of integers.

pub(super) const REFS_MASK: u64 = (1 << 28) - 1;
pub(super) const CLOSED: u64 = 1 << 28;
pub(super) const KIND_SHIFT: u32 = 29;
pub(super) const GEN_SHIFT: u32 = 32;
/// Generation of a never-used entry (0 is never given out).
pub(super) const FIRST_GEN: u32 = 1;

/// Entries in the first chunk; chunk `k` has `FIRST_CHUNK << k`.
pub(super) const FIRST_CHUNK: usize = 64;
pub(super) const FIRST_CHUNK_BITS: u32 = FIRST_CHUNK.trailing_zeros();
/// Handles keep `index + 1` in 28 bits.
pub(crate) const MAX_ENTRIES: u32 = (1 << 28) - 1;
/// Enough chunks for `MAX_ENTRIES`: `FIRST_CHUNK * (2^CHUNKS - 1) >= MAX_ENTRIES`.
pub(super) const CHUNKS: usize = 23;
const _: () = assert!(FIRST_CHUNK as u64 * ((1 << CHUNKS) - 1) >= MAX_ENTRIES as u64);
// Handles are pointers to C: the encoding needs 64 of them.
const _: () = assert!(usize::BITS == 64);

/// Most free indices a thread keeps to itself.
pub(crate) const CACHE_CAP: usize = 64;
/// How many free indices move between a thread's cache and the global list at once.
pub(crate) const FREE_BATCH: usize = CACHE_CAP / 2;
/// Cached-reference slots per thread (direct-mapped by entry index).
pub(crate) const HELD: usize = 4;
/// References a cache miss takes at once (besides the one it returns).
pub(crate) const BATCH: u32 = 64;
/// A slot holding more than this (references given back on this thread that were taken on
/// another) returns the excess.
pub(super) const HELD_MAX: u32 = 4 * BATCH;
// The counts stay far from the 28-bit field even with many threads.
const _: () = assert!((HELD_MAX as u64 + 1) * 1024 < REFS_MASK);

pub(super) fn gen_of(state: u64) -> u32 {
    (state >> GEN_SHIFT) as u32
}

/// The state of a live, open entry of `kind` and generation `gen`, without its reference count.
pub(super) fn live(gen: u32, kind: u8) -> u64 {
    u64::from(gen) << GEN_SHIFT | u64::from(kind) << KIND_SHIFT
}

pub(super) fn encode(index: u32, gen: u32) -> usize {
    ((u64::from(gen) << 32) | (u64::from(index) + 1) << 4) as usize
}

/// `(index, generation)` of a well-formed handle value.
#[inline]
pub(super) fn decode(h: usize) -> Option<(u32, u32)> {
    let h = h as u64;
    let slot = (h >> 4) as u32 & MAX_ENTRIES;
    if h & 0xf != 0 || slot == 0 {
        return None;
    }
    Some((slot - 1, (h >> 32) as u32))
}

/// `(chunk, offset in the chunk)` of an index.
#[inline]
pub(super) fn locate(index: u32) -> (usize, usize) {
    let i = index as usize + FIRST_CHUNK;
    let k = (usize::BITS - 1 - i.leading_zeros() - FIRST_CHUNK_BITS) as usize;
    (k, i - (FIRST_CHUNK << k))
}
