//! Heap-backed rings for tests: the same code as production, over boxed atomics.
#![allow(dead_code)]

use colo_ring::queue::{QueueReceiver, QueueSender, QueueWords};
use colo_ring::ring::{Bytes, Consumer, Producer, RingWords};
use colo_ring::sync::{AtomicU32, AtomicU64};

pub struct Words {
    pub head: AtomicU64,
    pub flags: AtomicU32,
    pub size: AtomicU32,
    pub space_wake: AtomicU32,
    pub tail: AtomicU64,
    pub read_flags: AtomicU32,
}

impl Words {
    pub fn new() -> Self {
        Words { head: AtomicU64::new(0), flags: AtomicU32::new(0), size: AtomicU32::new(0), space_wake: AtomicU32::new(0), tail: AtomicU64::new(0), read_flags: AtomicU32::new(0) }
    }
    /// The words as a ring sees them (the tests leak every `Words`, hence `'static`).
    pub fn raw(&'static self) -> RingWords {
        // SAFETY: aligned atomics borrowed for `'static`: live for as long as any copy is used.
        unsafe { RingWords::new(&self.head, &self.flags, &self.size, &self.space_wake, &self.tail, &self.read_flags) }
    }
}

/// Leaks the words and returns a producer/consumer pair over `data` clones, the ring as large as
/// the data region.
pub fn ring_pair<B: Bytes + Clone>(data: B) -> (Producer<B>, Consumer<B>, &'static Words) {
    let size = data.capacity() as u32;
    growing_pair(data, size)
}

/// As [`ring_pair`], the ring starting at `size` bytes (it may grow to the data region's).
pub fn growing_pair<B: Bytes + Clone>(data: B, size: u32) -> (Producer<B>, Consumer<B>, &'static Words) {
    let w: &'static Words = Box::leak(Box::new(Words::new()));
    w.size.store(size, colo_ring::sync::Ordering::Relaxed);
    // SAFETY: leaked, so the words live forever; fresh and zero.
    unsafe { (Producer::new(w.raw(), data.clone()), Consumer::new(w.raw(), data), w) }
}

pub struct Queue {
    pub head: AtomicU64,
    pub tail: AtomicU64,
    pub entries: Vec<AtomicU32>,
}

pub fn queue_pair<const W: usize>(len: u32) -> (QueueSender<W>, QueueReceiver<W>, &'static Queue) {
    let q: &'static Queue = Box::leak(Box::new(Queue {
        head: AtomicU64::new(0),
        tail: AtomicU64::new(0),
        entries: (0..len as usize * W).map(|_| AtomicU32::new(0)).collect(),
    }));
    let words = QueueWords { head: &q.head, tail: &q.tail, entries: q.entries.as_ptr(), len };
    // SAFETY: leaked and zeroed; `len * W` entries words.
    unsafe { (QueueSender::new(words), QueueReceiver::new(words), q) }
}

/// Aborts the whole test process if the test holding the guard runs longer than `secs` (a hung
/// ring test would otherwise hang the suite).
#[must_use = "the watchdog is disarmed when the guard drops"]
pub struct Watchdog(Option<std::sync::mpsc::Sender<()>>);

pub fn watchdog(secs: u64) -> Watchdog {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(std::time::Duration::from_secs(secs)) {
            eprintln!("watchdog: test hung for {secs}s");
            std::process::abort();
        }
    });
    Watchdog(Some(tx))
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}
