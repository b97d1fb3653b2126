//! Zero-copy messages: a [`Loan`] is a buffer in the shared segment that the application fills in
//! place and sends; a [`Message`] is a view of a received buffer, read in place and released on
//! drop (spec/WIRE.md section 7). Over a TCP fallback the same calls frame messages on the stream.

use crate::stream::Stream;
use std::io;
use std::ops::{Deref, DerefMut};

enum LoanBuf {
    Slot { slot: u32, ptr: *mut u8, capacity: usize },
    Heap(Vec<u8>),
}

/// A buffer loaned for one outgoing message. Fill it, then [`Loan::send`]. Dropping it unsent gives
/// the slot back.
pub struct Loan<'a> {
    stream: &'a Stream,
    buf: LoanBuf,
    len: usize,
    sent: bool,
}

impl<'a> Loan<'a> {
    pub(crate) fn slot(stream: &'a Stream, slot: u32, ptr: *mut u8, capacity: usize, len: usize) -> Self {
        Loan { stream, buf: LoanBuf::Slot { slot, ptr, capacity }, len, sent: false }
    }

    pub(crate) fn heap(stream: &'a Stream, len: usize) -> Self {
        Loan { stream, buf: LoanBuf::Heap(vec![0; len]), len, sent: false }
    }

    /// Most bytes this loan can hold.
    pub fn capacity(&self) -> usize {
        match &self.buf {
            LoanBuf::Slot { capacity, .. } => *capacity,
            LoanBuf::Heap(v) => v.len(),
        }
    }

    /// Changes the message length (at most [`Loan::capacity`]).
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.capacity(), "message longer than its loan");
        if let LoanBuf::Heap(v) = &mut self.buf {
            v.resize(len, 0);
        }
        self.len = len;
    }

    /// Whether this loan lives in shared memory (false over a TCP fallback).
    pub fn is_zero_copy(&self) -> bool {
        matches!(self.buf, LoanBuf::Slot { .. })
    }

    /// Sends the message: only a descriptor moves; the receiver reads these very bytes.
    pub fn send(mut self) -> io::Result<()> {
        self.sent = true;
        match &self.buf {
            LoanBuf::Slot { slot, .. } => self.stream.shm().expect("slot loans come from shm").send_slot(*slot, self.len),
            LoanBuf::Heap(v) => self.stream.send_framed(&v[..self.len]),
        }
    }
}

impl Deref for Loan<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.buf {
            // SAFETY: the slot is ours (loaned, not yet sent) for the life of the loan, `len <=
            // capacity`, and the segment outlives the stream we borrow.
            LoanBuf::Slot { ptr, .. } => unsafe { std::slice::from_raw_parts(*ptr, self.len) },
            LoanBuf::Heap(v) => &v[..self.len],
        }
    }
}

impl DerefMut for Loan<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.buf {
            // SAFETY: as in `deref`; the peer does not read a slot before it is sent.
            LoanBuf::Slot { ptr, .. } => unsafe { std::slice::from_raw_parts_mut(*ptr, self.len) },
            LoanBuf::Heap(v) => &mut v[..self.len],
        }
    }
}

impl Drop for Loan<'_> {
    fn drop(&mut self) {
        if let (false, LoanBuf::Slot { slot, .. }) = (self.sent, &self.buf) {
            if let Some(shm) = self.stream.shm() {
                shm.unloan(*slot);
            }
        }
    }
}

enum MsgBuf {
    Slot { slot: u32, ptr: *const u8, len: usize },
    Heap(Vec<u8>),
}

/// A received message, read in place in the shared segment; dropping it releases the slot.
pub struct Message<'a> {
    stream: &'a Stream,
    buf: MsgBuf,
}

impl<'a> Message<'a> {
    pub(crate) fn slot(stream: &'a Stream, slot: u32, ptr: *const u8, len: usize) -> Self {
        Message { stream, buf: MsgBuf::Slot { slot, ptr, len } }
    }
    pub(crate) fn heap(stream: &'a Stream, v: Vec<u8>) -> Self {
        Message { stream, buf: MsgBuf::Heap(v) }
    }
    /// Whether the bytes are read in place in shared memory.
    pub fn is_zero_copy(&self) -> bool {
        matches!(self.buf, MsgBuf::Slot { .. })
    }
}

impl Deref for Message<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.buf {
            // SAFETY: the slot was validated (`slot < count`, `len <= slot_size`) and stays held
            // by us until drop; the segment outlives the borrowed stream. The peer must not write
            // a sent slot; if it does anyway, we see changed bytes, never out-of-bounds memory.
            MsgBuf::Slot { ptr, len, .. } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
            MsgBuf::Heap(v) => v,
        }
    }
}

impl Drop for Message<'_> {
    fn drop(&mut self) {
        if let MsgBuf::Slot { slot, .. } = self.buf {
            if let Some(shm) = self.stream.shm() {
                shm.release(slot);
            }
        }
    }
}
