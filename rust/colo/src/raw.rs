//! Zero-copy buffers without the borrow of their stream ([`RawLoan`], [`RawMessage`]): what a
//! [`Loan`](crate::Loan) or a [`Message`](crate::Message) holds, and what bindings that keep
//! loans in handle tables of their own (colo-ffi) hold instead.

/// `slot` of a buffer on the heap (a TCP fallback) rather than in the segment.
const HEAP: u32 = u32::MAX;

/// A slot number and a size in one word, `slot << 32 | size`, stored and loaded as one 8-byte
/// value: as two `u32` fields, a raw loan or message returned and moved on would be written with
/// two 4-byte stores and read back with one 8-byte load, which stalls store forwarding.
#[derive(Clone, Copy, Debug)]
struct SlotSize(u64);

impl SlotSize {
    #[inline]
    fn new(slot: u32, size: u32) -> Self {
        SlotSize(u64::from(slot) << 32 | u64::from(size))
    }
    #[inline]
    fn slot(self) -> u32 {
        (self.0 >> 32) as u32
    }
    #[inline]
    fn size(self) -> usize {
        self.0 as u32 as usize
    }
}

/// A loaned buffer without the borrow of its stream, for bindings that keep loans in handle
/// tables of their own (colo-ffi): [`Stream::loan_raw`](crate::Stream::loan_raw), then exactly one of
/// [`Stream::send_raw`](crate::Stream::send_raw) or [`Stream::cancel_raw`](crate::Stream::cancel_raw) on the same stream (dropping it unsent leaks
/// the slot). Plain data of two words, so a binding stores and moves it for nothing (sizes fit
/// in 32 bits: pool slots, and messages over TCP, whose frame length is a `u32`); [`Loan`](crate::Loan) is this
/// plus the borrow and the length.
#[derive(Debug)]
pub struct RawLoan {
    ptr: *mut u8,
    /// The pool slot (or `HEAP`: then `ptr` and the capacity are a leaked `Box<[u8]>`) and the
    /// capacity.
    at: SlotSize,
}

impl RawLoan {
    #[inline]
    pub(crate) fn slot(slot: u32, ptr: *mut u8, capacity: u32) -> Self {
        RawLoan { ptr, at: SlotSize::new(slot, capacity) }
    }

    pub(crate) fn heap(len: u32) -> Self {
        let b = Box::into_raw(vec![0u8; len as usize].into_boxed_slice());
        RawLoan { ptr: b.cast(), at: SlotSize::new(HEAP, len) }
    }

    /// The buffer (`capacity` bytes, writable until the loan is sent or cancelled).
    #[inline]
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Most bytes this loan can hold.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.at.size()
    }

    /// Whether this loan lives in shared memory (false over a TCP fallback).
    #[inline]
    pub fn is_zero_copy(&self) -> bool {
        self.at.slot() != HEAP
    }

    /// The pool slot, or the heap buffer (which the caller then owns).
    #[inline]
    pub(crate) fn into_parts(self) -> Result<u32, Box<[u8]>> {
        if self.at.slot() != HEAP {
            return Ok(self.at.slot());
        }
        // SAFETY: a `HEAP` loan's pointer and capacity are the leaked box of `heap`, given back
        // once: the contract of `send_raw` / `cancel_raw` lets a loan end only once.
        Err(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.capacity())) })
    }
}

/// A received message without the borrow of its stream ([`Stream::recv_raw`](crate::Stream::recv_raw)), released exactly
/// once with [`Stream::release_raw`](crate::Stream::release_raw) on the same stream. See [`RawLoan`].
#[derive(Debug)]
pub struct RawMessage {
    ptr: *const u8,
    /// The pool slot (or `HEAP`: then `ptr` and the length are a leaked `Box<[u8]>`) and the
    /// length.
    at: SlotSize,
}

impl RawMessage {
    #[inline]
    pub(crate) fn slot(slot: u32, ptr: *const u8, len: u32) -> Self {
        RawMessage { ptr, at: SlotSize::new(slot, len) }
    }

    /// A message received over TCP (its frame length is a `u32`).
    pub(crate) fn heap(v: Vec<u8>) -> Self {
        let len = u32::try_from(v.len()).expect("a frame's length fits its u32 header");
        let b = Box::into_raw(v.into_boxed_slice());
        RawMessage { ptr: b.cast::<u8>(), at: SlotSize::new(HEAP, len) }
    }

    /// The bytes (`len` of them, readable until released).
    #[inline]
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    /// The message's length.
    #[inline]
    pub fn len(&self) -> usize {
        self.at.size()
    }

    /// Whether the message is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the bytes are read in place in shared memory.
    #[inline]
    pub fn is_zero_copy(&self) -> bool {
        self.at.slot() != HEAP
    }

    /// The pool slot to release, or `None` for a heap copy (freed here).
    #[inline]
    pub(crate) fn into_slot(self) -> Option<u32> {
        if self.at.slot() != HEAP {
            return Some(self.at.slot());
        }
        // SAFETY: as in `RawLoan::into_parts`: the leaked box of `heap`, given back once.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr.cast_mut(), self.len())) });
        None
    }
}
