//! A live segment's shared words, written by a hostile peer (spec/WIRE.md sections 5 and 7):
//! the byte ring's counters and flags, the message queue's counters and `{slot, len}` entries,
//! the free queue's counters and entries. The input picks a geometry, then a sequence of honest
//! operations on both ends of one direction (colo-ring's producer, consumer and the two queues,
//! as colo's streams drive them) interleaved with arbitrary stores anywhere in the block's
//! control area (counters, flags, both queues' entries).
//!
//! Checked: no panic; every copy the ring makes stays inside its data region (the `Bytes`
//! below asserts it on each access, where the production `RawBytes` only debug-asserts); no
//! count exceeds what was asked or the capacity; a popped message entry the consumer validates
//! as colo does (`slot < slot_count`, `len <= slot_size`) addresses memory inside the pool.
//! Until the first scribble the ring must also behave honestly: bytes come out in order.
#![no_main]

use colo_ring::layout::{block, Geometry, FLAG_DROPPED, RING_FLAGS};
use colo_ring::queue::{QueueReceiver, QueueSender, QueueWords};
use colo_ring::ring::{Bytes, Consumer, Producer, RawBytes, RingWords};
use colo_ring::sync::{AtomicU32, AtomicU64, Ordering};
use libfuzzer_sys::fuzz_target;
use std::collections::VecDeque;

/// The production copy over a region, with the contract of `Bytes` asserted on every access.
#[derive(Clone, Copy)]
struct Checked(RawBytes, usize);

// SAFETY: every access is checked against the region's length before it reaches `RawBytes`,
// which copies exactly `at..at + len` of a region that lives as long as the segment below.
unsafe impl Bytes for Checked {
    fn capacity(&self) -> usize {
        self.1
    }
    unsafe fn store(&self, at: usize, src: &[u8]) {
        assert!(at.checked_add(src.len()).is_some_and(|end| end <= self.1), "ring store out of bounds");
        // SAFETY: in bounds (asserted above).
        unsafe { self.0.store(at, src) }
    }
    unsafe fn load(&self, at: usize, dst: &mut [u8]) {
        assert!(at.checked_add(dst.len()).is_some_and(|end| end <= self.1), "ring load out of bounds");
        // SAFETY: in bounds (asserted above).
        unsafe { self.0.load(at, dst) }
    }
}

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes([self.byte()?, self.byte()?]))
    }
    fn u64(&mut self) -> Option<u64> {
        let mut v = [0u8; 8];
        for b in &mut v {
            *b = self.byte()?;
        }
        Some(u64::from_le_bytes(v))
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let (Some(a), Some(b)) = (input.byte(), input.byte()) else { return };
    let slot_count = u32::from(b % 9);
    let geometry = Geometry {
        ring_capacity: 4096 << (a % 3),
        slot_size: if slot_count == 0 { 0 } else { 64 * u32::from(1 + (a >> 2) % 4) },
        slot_count,
    };
    let layout = geometry.layout().expect("a valid geometry");
    // The segment: zeroed, 8-byte aligned, alive until the end of this input.
    let mut mem = vec![0u64; layout.segment_size / 8];
    let base = mem.as_mut_ptr().cast::<u8>();
    let blk = layout.block_offset(true);
    // Addresses inside the direction block: callers pass offsets inside it, aligned for the atomic.
    let at64 = |off: usize| base.wrapping_add(blk + off) as *const AtomicU64;
    let at32 = |off: usize| base.wrapping_add(blk + off) as *const AtomicU32;
    // SAFETY: aligned atomics inside `mem`, which outlives every use of the words.
    let words = unsafe {
        RingWords::new(
            at64(block::RING_HEAD),
            at32(block::RING_FLAGS),
            at32(block::RING_SIZE),
            at32(block::SPACE_WAKE),
            at64(block::RING_TAIL),
            at32(block::READ_FLAGS),
        )
    };
    let cap = geometry.ring_capacity as usize;
    // SAFETY: the data region lies inside `mem`, which outlives the ring halves.
    let region = Checked(unsafe { RawBytes::new(base.add(blk + layout.data_off), cap) }, cap);
    // As the segment's creator does: the ring starts small and grows as writes need.
    words.start_small();
    // SAFETY: fresh, zeroed words and data inside `mem`, which outlives both halves.
    let (mut prod, mut cons) = unsafe { (Producer::new(words, region), Consumer::new(words, region)) };
    let queue = |head: usize, tail: usize, entries: usize| QueueWords {
        head: at64(head),
        tail: at64(tail),
        entries: at32(entries),
        len: slot_count,
    };
    // SAFETY: fresh, zeroed queues inside `mem` (`slot_count` entries each, from the layout).
    let mut queues = (slot_count > 0).then(|| unsafe {
        let msgs = queue(block::MSG_HEAD, block::MSG_TAIL, block::MSG_ENTRIES);
        let frees = queue(block::FREE_HEAD, block::FREE_TAIL, layout.free_entries);
        (QueueSender::<2>::new(msgs), QueueReceiver::<2>::new(msgs), QueueSender::<1>::new(frees), QueueReceiver::<1>::new(frees))
    });
    // What an honest ring must give back, until the first scribble.
    let mut sent: VecDeque<u8> = VecDeque::new();
    let mut honest = true;
    let mut counter = 0u8;
    let mut buf = vec![0u8; 2 * cap];
    while let Some(op) = input.byte() {
        match op % 12 {
            0 => {
                let n = usize::from(input.u16().unwrap_or(0)) % (2 * cap);
                let src: Vec<u8> = (0..n).map(|i| counter.wrapping_add(i as u8)).collect();
                if let Ok(k) = prod.write(&src) {
                    assert!(k <= n);
                    if honest {
                        assert_eq!(k, n.min(cap - sent.len()), "an honest ring takes what fits");
                        sent.extend(&src[..k]);
                    }
                    counter = counter.wrapping_add(k as u8);
                } else {
                    assert!(!honest, "an honest ring reported corruption");
                }
            }
            1 | 2 => {
                let n = usize::from(input.u16().unwrap_or(0)) % (2 * cap);
                let r = if op % 12 == 1 { cons.read(&mut buf[..n]) } else { cons.peek(&mut buf[..n]) };
                if let Ok(k) = r {
                    assert!(k <= n);
                    if honest {
                        assert_eq!(k, n.min(sent.len()), "an honest ring gives what was sent");
                        assert!(buf[..k].iter().zip(sent.iter()).all(|(x, y)| x == y), "bytes out of order");
                        if op % 12 == 1 {
                            sent.drain(..k);
                        }
                    }
                } else {
                    assert!(!honest, "an honest ring reported corruption");
                }
            }
            3 => {
                if let Ok(n) = cons.available() {
                    assert!(n <= cap);
                }
                if let Ok(n) = prod.space() {
                    assert!(n <= cap);
                }
                if let Ok(f) = cons.flags() {
                    assert_eq!(f & !RING_FLAGS, 0);
                }
                let _ = cons.space_wake_crossed(input.u64().unwrap_or(0));
                if let Ok(Some(freed)) = prod.shrink_if_empty() {
                    assert!(!honest || sent.is_empty(), "an honest ring shrank with bytes in flight");
                    assert!(freed.end <= cap);
                }
            }
            4 => {
                let flags = u32::from(input.byte().unwrap_or(0)) & RING_FLAGS;
                prod.set_flags(flags);
                // DROPPED gives the bytes up (a read hands on none; without RESET it is
                // corruption): what the ring gives is no longer what was sent.
                if flags & FLAG_DROPPED != 0 {
                    honest = false;
                }
            }
            5 => {
                // A program that inherited this end continues from the shared counters.
                // SAFETY: as for `new`; the old half is replaced, so one producer remains.
                prod = unsafe { Producer::resume(words, region) };
                honest = false;
            }
            6 => {
                // SAFETY: as above, for the consumer.
                cons = unsafe { Consumer::resume(words, region) };
                honest = false;
            }
            7 => {
                if let Some((tx, _, _, _)) = queues.as_mut() {
                    let entry = [u32::from(input.byte().unwrap_or(0)), u32::from(input.u16().unwrap_or(0))];
                    let _ = tx.push(entry);
                }
            }
            8 => {
                if let Some((_, rx, _, _)) = queues.as_mut() {
                    let _ = rx.is_ready();
                    if let Ok(Some([slot, len])) = rx.pop() {
                        // colo's receiver takes an entry only after this check (shm.rs); what it
                        // then reads must lie inside this direction's pool.
                        if slot < geometry.slot_count && len <= geometry.slot_size {
                            let start = layout.pool_off + slot as usize * geometry.slot_size as usize;
                            assert!(start + len as usize <= layout.block_size);
                        }
                    }
                }
            }
            9 => {
                if let Some((_, _, tx, _)) = queues.as_mut() {
                    let _ = tx.push([u32::from(input.byte().unwrap_or(0))]);
                }
            }
            10 => {
                if let Some((_, _, _, rx)) = queues.as_mut() {
                    let _ = rx.pop();
                }
            }
            _ => {
                // The peer scribbles: any value into an aligned word anywhere before the ring
                // data (counters, flags, both queues' entries).
                let off = (usize::from(input.u16().unwrap_or(0)) % layout.data_off) & !7;
                let v = input.u64().unwrap_or(u64::MAX);
                // SAFETY: `off + 8 <= data_off <= block_size`, 8-aligned, inside `mem`.
                unsafe { &*at64(off) }.store(v, Ordering::Relaxed);
                honest = false;
            }
        }
    }
    // The halves point into `mem`: they go first.
    #[allow(clippy::drop_non_drop)]
    drop((prod, cons, queues));
    drop(mem);
});
