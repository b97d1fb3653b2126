//! Zero-copy messages: a [`Loan`] is a buffer in the shared segment that the application fills in
//! place and sends; a [`Message`] is a view of a received buffer, read in place and released on
//! drop (spec/WIRE.md section 7). Over a TCP fallback the same calls frame messages on the stream.

use crate::raw::{RawLoan, RawMessage};
use crate::stream::Stream;
use std::io;
use std::ops::{Deref, DerefMut};

/// A buffer loaned for one outgoing message. Fill it, then [`Loan::send`]. Dropping it unsent gives
/// the slot back.
pub struct Loan<'a> {
    stream: &'a Stream,
    raw: RawLoan,
    len: usize,
}

impl<'a> Loan<'a> {
    #[inline]
    fn new(stream: &'a Stream, raw: RawLoan, len: usize) -> Self {
        Loan { stream, raw, len }
    }

    /// Most bytes this loan can hold.
    pub fn capacity(&self) -> usize {
        self.raw.capacity()
    }

    /// Changes the message length (at most [`Loan::capacity`]); the buffer keeps its capacity and
    /// its bytes, so a length raised again shows what was written there before.
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.capacity(), "message longer than its loan");
        self.len = len;
    }

    /// Whether this loan lives in shared memory (false over a TCP fallback).
    pub fn is_zero_copy(&self) -> bool {
        self.raw.is_zero_copy()
    }

    /// Sends the message: only a descriptor moves; the receiver reads these very bytes.
    pub fn send(self) -> io::Result<()> {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: the loan came from `this.stream` and ends here, once: `this` is never dropped.
        unsafe { this.stream.send_raw(std::ptr::read(&this.raw), this.len) }
    }
}

impl Deref for Loan<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the buffer is ours (loaned, not yet sent) for the life of the loan, holds
        // `capacity >= len` bytes, and the segment outlives the stream we borrow.
        unsafe { std::slice::from_raw_parts(self.raw.as_mut_ptr(), self.len) }
    }
}

impl DerefMut for Loan<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; the peer does not read a slot before it is sent.
        unsafe { std::slice::from_raw_parts_mut(self.raw.as_mut_ptr(), self.len) }
    }
}

impl Drop for Loan<'_> {
    fn drop(&mut self) {
        // SAFETY: the loan came from `self.stream` and was neither sent (`send` does not drop)
        // nor cancelled; `raw` is read out once, as the loan ends.
        unsafe { self.stream.cancel_raw(std::ptr::read(&self.raw)) }
    }
}

/// A received message, read in place in the shared segment; dropping it releases the slot.
pub struct Message<'a> {
    stream: &'a Stream,
    raw: RawMessage,
}

impl<'a> Message<'a> {
    #[inline]
    fn new(stream: &'a Stream, raw: RawMessage) -> Self {
        Message { stream, raw }
    }
    /// Whether the bytes are read in place in shared memory.
    pub fn is_zero_copy(&self) -> bool {
        self.raw.is_zero_copy()
    }
}

impl Deref for Message<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the slot was validated (`slot < count`, `len <= slot_size`) and stays held
        // by us until drop; the segment outlives the borrowed stream. The peer must not write
        // a sent slot; if it does anyway, we see changed bytes, never out-of-bounds memory. A
        // heap copy is ours until drop.
        unsafe { std::slice::from_raw_parts(self.raw.as_ptr(), self.raw.len()) }
    }
}

impl Drop for Message<'_> {
    fn drop(&mut self) {
        // SAFETY: the message came from `self.stream` and is released once, here (`raw` read
        // out as the message ends).
        unsafe { self.stream.release_raw(std::ptr::read(&self.raw)) }
    }
}

impl Stream {
    /// Loans a buffer of `len` bytes for one zero-copy message: fill it in place, then send it.
    /// Waits while every slot of the pool is in flight. `EMSGSIZE` if `len` exceeds the slot
    /// size, `ENOBUFS` if the connection has no pool, `EPIPE` (at send) if either side closed.
    /// Over a TCP fallback, a heap buffer, sent framed on the byte stream (spec/WIRE.md section 7):
    /// there, messages and stream bytes are one sequence, so use one or the other.
    ///
    /// ```no_run
    /// let s = colo::Stream::connect("127.0.0.1:7000")?;
    /// let mut loan = s.loan(5)?;
    /// loan.copy_from_slice(b"hello");
    /// loan.send()?;
    /// let reply = s.recv_message()?.expect("a reply");
    /// assert_eq!(&reply[..], b"hello");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn loan(&self, len: usize) -> io::Result<Loan<'_>> {
        Ok(Loan::new(self, self.loan_raw(len)?, len))
    }

    /// Receives the next zero-copy message (`None` at end of stream, `ConnectionReset` if the peer
    /// died or reset); the bytes are read in place and the slot is released when the [`Message`]
    /// is dropped. Over a TCP fallback a timeout or `WouldBlock` keeps the part of a message
    /// already read for the next call.
    pub fn recv_message(&self) -> io::Result<Option<Message<'_>>> {
        Ok(self.recv_raw()?.map(|m| Message::new(self, m)))
    }
}
