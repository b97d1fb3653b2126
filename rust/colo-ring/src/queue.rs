//! The two small queues of zero-copy messages (spec/WIRE.md section 7): `msg` entries `{slot, len}`
//! from producer to consumer and `free` entries `{slot}` back. Entries are `W` atomic words, so a
//! peer scribbling over them can only make us read a wrong number, which the caller validates.

use crate::sync::{AtomicU32, AtomicU64, Ordering};
use crate::Corrupt;

/// Where a queue lives: its two counters and `n` entries of `W` words each.
#[derive(Debug, Clone, Copy)]
pub struct QueueWords {
    /// Entries ever pushed.
    pub head: *const AtomicU64,
    /// Entries ever popped.
    pub tail: *const AtomicU64,
    /// The first word of entry 0.
    pub entries: *const AtomicU32,
    /// Number of entries.
    pub len: u32,
}

// SAFETY: the pointers refer to atomics that outlive the queue halves (their constructors' contract).
unsafe impl Send for QueueWords {}

impl QueueWords {
    fn head(&self) -> &AtomicU64 {
        // SAFETY: valid for the life of the queue half (constructor contract).
        unsafe { &*self.head }
    }
    fn tail(&self) -> &AtomicU64 {
        // SAFETY: as in `head`.
        unsafe { &*self.tail }
    }
    fn word(&self, index: u64, w: usize, width: usize) -> &AtomicU32 {
        let i = (index % u64::from(self.len)) as usize * width + w;
        // SAFETY: `i < len * width`, inside the entries the constructor vouched for.
        unsafe { &*self.entries.add(i) }
    }
}

/// The pushing half of a queue.
#[derive(Debug)]
pub struct QueueSender<const W: usize> {
    words: QueueWords,
    head: u64,
    /// The receiver's `tail` as last read: re-read only when it says full, as the byte ring's
    /// producer does (the receiver stores `tail` on every pop; loading its line on every push
    /// would cost a cache-line transfer per message).
    cached_tail: u64,
}

impl<const W: usize> QueueSender<W> {
    /// # Safety
    /// `words` point to live atomics of a fresh (zeroed) queue for the life of the sender;
    /// `words.len > 0`.
    pub unsafe fn new(words: QueueWords) -> Self {
        QueueSender { words, head: 0, cached_tail: 0 }
    }

    /// Pushes an entry; `Err` if the queue is full, which the protocol makes impossible for an
    /// honest peer (at most `len` slots are ever in flight).
    pub fn push(&mut self, entry: [u32; W]) -> Result<(), Corrupt> {
        let len = u64::from(self.words.len);
        if self.head.wrapping_sub(self.cached_tail) >= len {
            // SYNC POINT with the Release store of `tail` in `QueueReceiver::pop`.
            let tail = self.words.tail().load(Ordering::Acquire);
            // A tail past our head (scribbled) wraps far beyond `len` as well.
            if self.head.wrapping_sub(tail) >= len {
                return Err(Corrupt("queue overflow"));
            }
            self.cached_tail = tail;
        }
        for (w, v) in entry.iter().enumerate() {
            self.words.word(self.head, w, W).store(*v, Ordering::Relaxed);
        }
        self.head = self.head.wrapping_add(1);
        // SYNC POINT with the Acquire load of `head` in `QueueReceiver::pop`: the entry's words
        // are visible before the new head.
        self.words.head().store(self.head, Ordering::Release);
        Ok(())
    }

    /// Entries ever pushed.
    pub fn pushed(&self) -> u64 {
        self.head
    }
}

/// The popping half of a queue.
#[derive(Debug)]
pub struct QueueReceiver<const W: usize> {
    words: QueueWords,
    tail: u64,
}

impl<const W: usize> QueueReceiver<W> {
    /// # Safety
    /// As for [`QueueSender::new`].
    pub unsafe fn new(words: QueueWords) -> Self {
        QueueReceiver { words, tail: 0 }
    }

    /// Pops the oldest entry, if any.
    pub fn pop(&mut self) -> Result<Option<[u32; W]>, Corrupt> {
        // SYNC POINT with the Release store of `head` in `QueueSender::push`.
        let head = self.words.head().load(Ordering::Acquire);
        let queued = head.wrapping_sub(self.tail);
        if queued > u64::from(self.words.len) {
            return Err(Corrupt("queue head out of range"));
        }
        if queued == 0 {
            return Ok(None);
        }
        let mut entry = [0u32; W];
        for (w, v) in entry.iter_mut().enumerate() {
            *v = self.words.word(self.tail, w, W).load(Ordering::Relaxed);
        }
        self.tail = self.tail.wrapping_add(1);
        // SYNC POINT with the Acquire load of `tail` in `QueueSender::push`: we have read the
        // entry before the sender may overwrite it.
        self.words.tail().store(self.tail, Ordering::Release);
        Ok(Some(entry))
    }

    /// Whether an entry is waiting (without popping it).
    pub fn is_ready(&self) -> Result<bool, Corrupt> {
        // SYNC POINT with the Release store of `head` in `QueueSender::push`.
        let queued = self.words.head().load(Ordering::Acquire).wrapping_sub(self.tail);
        if queued > u64::from(self.words.len) {
            return Err(Corrupt("queue head out of range"));
        }
        Ok(queued > 0)
    }

    /// Entries ever popped.
    pub fn popped(&self) -> u64 {
        self.tail
    }
}
