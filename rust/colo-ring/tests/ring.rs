//! Unit and property tests of the byte ring and the slot queues, and the shared vectors.
#![cfg(not(loom))]
mod common;

use colo_ring::layout::{Geometry, FLAG_DROPPED, FLAG_FIN, FLAG_RESET};
use colo_ring::ring::{occupancy, Consumer, Producer, RawBytes};
use colo_ring::snapshot::RingState;
use colo_ring::sync::Ordering;
use proptest::prelude::*;
use std::collections::VecDeque;

fn heap_bytes(len: usize) -> RawBytes {
    let mem: &'static mut [u8] = Box::leak(vec![0u8; len].into_boxed_slice());
    // SAFETY: leaked, so valid forever.
    unsafe { RawBytes::new(mem.as_mut_ptr(), len) }
}

fn vectors(name: &str) -> serde_json::Value {
    let path = format!("{}/../../spec/vectors/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn layout_matches_vectors() {
    for v in vectors("layout.json").as_array().unwrap() {
        let g = Geometry {
            ring_capacity: v["ring_capacity"].as_u64().unwrap() as u32,
            slot_size: v["slot_size"].as_u64().unwrap() as u32,
            slot_count: v["slot_count"].as_u64().unwrap() as u32,
        };
        let l = g.layout().unwrap();
        assert_eq!(l.data_off as u64, v["data_off"].as_u64().unwrap(), "{v}");
        assert_eq!(l.pool_off as u64, v["pool_off"].as_u64().unwrap(), "{v}");
        assert_eq!(l.block_size as u64, v["block_size"].as_u64().unwrap(), "{v}");
        assert_eq!(l.segment_size as u64, v["segment_size"].as_u64().unwrap(), "{v}");
    }
}

#[test]
fn bad_geometry_is_refused() {
    for (cap, size, count) in [(4095, 0, 0), (2048, 0, 0), (1 << 31, 0, 0), (4096, 64, 0), (4096, 0, 4), (4096, 100, 1), (4096, 64, 65537)] {
        assert!(Geometry { ring_capacity: cap, slot_size: size, slot_count: count }.layout().is_err());
    }
}

#[test]
fn ring_states_match_vectors() {
    for v in vectors("ring.json").as_array().unwrap() {
        let cap = v["capacity"].as_u64().unwrap();
        let head: u64 = v["head"].as_str().unwrap().parse().unwrap();
        let tail: u64 = v["tail"].as_str().unwrap().parse().unwrap();
        match occupancy(head, tail, cap) {
            Ok(n) => {
                assert!(v["valid"].as_bool().unwrap(), "{v}");
                assert_eq!(n, v["readable"].as_u64().unwrap(), "{v}");
                assert_eq!(cap - n, v["writable"].as_u64().unwrap(), "{v}");
                assert_eq!(tail % cap, v["read_at"].as_u64().unwrap(), "{v}");
            }
            Err(_) => assert!(!v["valid"].as_bool().unwrap(), "{v}"),
        }
    }
}

#[test]
fn producer_refuses_tail_ahead_of_head() {
    let (mut p, _c, w) = common::ring_pair(heap_bytes(4096));
    assert_eq!(p.write(&[1; 4096]).unwrap(), 4096);
    w.tail.store(5000, Ordering::Relaxed);
    assert!(p.write(&[1]).is_err());
}

#[test]
fn counters_that_move_backwards_are_corruption() {
    // Backwards by less than the capacity: occupancy alone would not notice.
    let (mut p, mut c, w) = common::ring_pair(heap_bytes(4096));
    assert_eq!(p.write(&[1; 100]).unwrap(), 100);
    let mut b = [0u8; 40];
    assert_eq!(c.read(&mut b).unwrap(), 40);
    w.head.store(90, Ordering::Relaxed);
    // Seen at the consumer's next look at the head (bytes it already saw are read first).
    let r = (0..3).map(|_| c.read(&mut b)).find(|r| r.is_err());
    assert!(r.is_some(), "head went back from 100 to 90");
    let (mut p, mut c, w) = common::ring_pair(heap_bytes(4096));
    assert_eq!(p.write(&[1; 4096]).unwrap(), 4096);
    let mut b = [0u8; 100];
    assert_eq!(c.read(&mut b).unwrap(), 100);
    assert_eq!(p.write(&[1; 50]).unwrap(), 50);
    w.tail.store(60, Ordering::Relaxed);
    let r = (0..3).map(|_| p.write(&[1; 4096])).find(|r| r.is_err());
    assert!(r.is_some(), "tail went back from 100 to 60");
}

#[test]
fn consumer_refuses_unknown_flags() {
    let (_p, c, w) = common::ring_pair(heap_bytes(4096));
    w.flags.store(0x40, Ordering::Relaxed);
    assert!(c.flags().is_err());
}

/// A producer that gave back the pages of its unread bytes (DROPPED, with RESET) may have left
/// zeros where they were: a read or a peek hands on none of them, and the tail stays.
#[test]
fn dropped_bytes_are_never_read() {
    let (mut p, mut c, w) = common::ring_pair(heap_bytes(4096));
    p.write(b"abc").unwrap();
    let mut b = [0u8; 8];
    assert_eq!(c.peek(&mut b).unwrap(), 3);
    p.set_flags(FLAG_RESET | FLAG_DROPPED);
    assert_eq!(c.peek(&mut b).unwrap(), 0);
    assert_eq!(c.read(&mut b).unwrap(), 0);
    assert_eq!(w.tail.load(Ordering::Relaxed), 0);
    assert_eq!(c.flags().unwrap(), FLAG_RESET | FLAG_DROPPED);
}

#[test]
fn fin_is_seen_after_data() {
    let (mut p, mut c, _w) = common::ring_pair(heap_bytes(4096));
    p.write(b"abc").unwrap();
    p.set_flags(FLAG_FIN);
    assert_eq!(c.flags().unwrap(), FLAG_FIN);
    let mut b = [0u8; 8];
    assert_eq!(c.read(&mut b).unwrap(), 3);
    assert_eq!(&b[..3], b"abc");
}

#[test]
fn queue_round_trip_and_overflow() {
    let (mut s, mut r, q) = common::queue_pair::<2>(3);
    for i in 0..3 { s.push([i, i * 10]).unwrap(); }
    assert!(s.push([9, 9]).is_err());
    assert_eq!(r.pop().unwrap(), Some([0, 0]));
    s.push([3, 30]).unwrap();
    for i in 1..4 { assert_eq!(r.pop().unwrap(), Some([i, i * 10])); }
    assert_eq!(r.pop().unwrap(), None);
    q.head.store(100, Ordering::Relaxed);
    assert!(r.pop().is_err());
    // The sender caches the tail; when the cache says full it re-reads it: room the receiver
    // made is found, and a tail past the sender's head (scribbled) is corruption, not room.
    for i in 4..7 { s.push([i, 0]).unwrap(); }
    assert_eq!(r.pop().unwrap(), Some([4, 0]));
    s.push([7, 0]).unwrap();
    assert_eq!(r.pop().unwrap(), Some([5, 0]));
    q.tail.store(u64::MAX, Ordering::Relaxed);
    assert!(s.push([8, 0]).is_err(), "a scribbled tail is not room");
}

proptest! {
    /// Any interleaving of writes and reads of any sizes delivers the bytes in order, with wrap.
    #[test]
    fn ring_behaves_like_a_fifo(ops in proptest::collection::vec((any::<bool>(), 1usize..9000), 1..200)) {
        let cap = 8192;
        let (mut p, mut c, _w) = common::ring_pair(heap_bytes(cap));
        let mut model = VecDeque::new();
        let mut next = 0u8;
        for (write, len) in ops {
            if write {
                let src: Vec<u8> = (0..len).map(|_| { next = next.wrapping_add(1); next }).collect();
                let n = p.write(&src).unwrap();
                prop_assert_eq!(n, len.min(cap - model.len()));
                model.extend(&src[..n]);
                // Undo the bytes that did not fit in the pattern counter.
                next = next.wrapping_sub((len - n) as u8);
            } else {
                let mut dst = vec![0u8; len];
                let n = c.read(&mut dst).unwrap();
                prop_assert_eq!(n, len.min(model.len()));
                let expect: Vec<u8> = model.drain(..n).collect();
                prop_assert_eq!(&dst[..n], &expect[..]);
            }
            let space = p.space().unwrap();
            prop_assert!(space <= cap - model.len() && (space > 0) == (model.len() < cap));
        }
    }

    /// Growth and shrinking in any order with reads and writes: the stream stays a FIFO, a write
    /// takes what fits in the largest size, and the ring never holds more than its current size.
    #[test]
    fn a_growing_ring_stays_a_fifo(ops in proptest::collection::vec((0u8..5, 1usize..40000), 1..300)) {
        let cap = 65536;
        let (mut p, mut c, w) = common::growing_pair(heap_bytes(cap), 4096);
        let mut model = VecDeque::new();
        let mut next = 0u8;
        for (op, len) in ops {
            match op {
                0 | 1 => {
                    let src: Vec<u8> = (0..len).map(|_| { next = next.wrapping_add(1); next }).collect();
                    let n = p.write(&src).unwrap();
                    prop_assert_eq!(n, len.min(cap - model.len()));
                    model.extend(&src[..n]);
                    next = next.wrapping_sub((len - n) as u8);
                }
                2 | 3 => {
                    let mut dst = vec![0u8; len];
                    let n = c.read(&mut dst).unwrap();
                    prop_assert_eq!(n, len.min(model.len()));
                    let expect: Vec<u8> = model.drain(..n).collect();
                    prop_assert_eq!(&dst[..n], &expect[..]);
                }
                _ => {
                    if let Some(r) = p.shrink_if_empty().unwrap() {
                        prop_assert!(model.is_empty());
                        prop_assert_eq!(r.start, 2048);
                    }
                }
            }
            let size = w.size.load(Ordering::Relaxed) as usize;
            prop_assert!(model.len() <= size && size <= cap && size == p.size());
        }
    }
}

proptest! {
    /// A reader that peeks ahead of what it handed on (`peek_at`) and releases later
    /// (`release`), as a relay does for a program that reads at its own pace, while the ring
    /// grows: every byte is peeked once, in order, and a release takes the oldest unread ones.
    #[test]
    fn peeking_ahead_and_releasing_later_keeps_the_stream(ops in proptest::collection::vec((0u8..4, 1usize..20000), 1..300)) {
        let cap = 65536;
        let (mut p, mut c, _w) = common::growing_pair(heap_bytes(cap), 4096);
        // `model`: the unread bytes; the first `skip` of them were peeked (handed on) already.
        let mut model = VecDeque::new();
        let mut skip = 0usize;
        let mut next = 0u8;
        for (op, len) in ops {
            match op {
                0 => {
                    let src: Vec<u8> = (0..len).map(|_| { next = next.wrapping_add(1); next }).collect();
                    let n = p.write(&src).unwrap();
                    model.extend(&src[..n]);
                    next = next.wrapping_sub((len - n) as u8);
                }
                1 | 2 => {
                    let mut dst = vec![0u8; len];
                    let n = c.peek_at(skip, &mut dst).unwrap();
                    prop_assert_eq!(n, len.min(model.len() - skip));
                    let expect: Vec<u8> = model.iter().skip(skip).take(n).copied().collect();
                    prop_assert_eq!(&dst[..n], &expect[..]);
                    skip += n;
                }
                _ => {
                    let n = c.release(len).unwrap();
                    prop_assert_eq!(n, len.min(model.len()));
                    model.drain(..n);
                    skip = skip.saturating_sub(n);
                }
            }
            prop_assert_eq!(c.full().unwrap(), model.len() == p.size());
        }
    }
}

#[test]
fn a_full_ring_grows_to_its_limit_and_keeps_its_bytes() {
    let (mut p, mut c, w) = common::growing_pair(heap_bytes(1 << 20), 4096);
    p.set_limit(1 << 19);
    let data: Vec<u8> = (0..1_000_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    let mut sent = 0;
    // Nothing is read: small writes grow the ring up to the limit, no further.
    while sent < data.len() {
        let n = p.write(&data[sent..(sent + 3000).min(data.len())]).unwrap();
        if n == 0 {
            break;
        }
        sent += n;
    }
    assert_eq!(sent, 1 << 19);
    assert_eq!(w.size.load(Ordering::Relaxed), 1 << 19);
    assert_eq!(p.space().unwrap(), 0);
    let mut out = vec![0u8; sent];
    assert_eq!(c.read(&mut out).unwrap(), sent);
    assert!(out[..] == data[..sent]);
}

/// `write_with` hands `fill` the free bytes where they lie, the part after the wrap only once
/// the part before it is filled, grows the ring as `write` does, and publishes only what `fill`
/// stored: a short fill (its source ended) publishes that much and no more.
#[test]
fn write_with_fills_the_ring_in_place_across_the_wrap_and_publishes_what_was_stored() {
    let (mut p, mut c, w) = common::growing_pair(heap_bytes(1 << 16), 4096);
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 13 + i / 253) as u8).collect();
    let (mut sent, mut got, mut calls) = (0, Vec::new(), 0);
    let mut buf = vec![0u8; 7000];
    while got.len() < data.len() {
        let want = (data.len() - sent).min(5000);
        // SAFETY: the closure stores only inside the range it is given.
        let n = unsafe {
            p.write_with(want, |dst, len| {
                calls += 1;
                let take = len.min(data.len() - sent);
                std::ptr::copy_nonoverlapping(data[sent..].as_ptr(), dst, take);
                sent += take;
                take
            })
        }
        .unwrap();
        assert!(n <= want);
        let r = c.read(&mut buf).unwrap();
        got.extend_from_slice(&buf[..r]);
    }
    assert!(got == data, "the bytes read are the bytes filled, in order");
    assert_eq!(w.size.load(Ordering::Relaxed), 8192, "the first fill of 5000 bytes grew the ring");
    assert!(calls > data.len() / 5000, "some writes wrapped: {calls} fills");
    // A fill that stores less than it was given publishes what it stored.
    // SAFETY: as above.
    let n = unsafe {
        p.write_with(1000, |dst, len| {
            assert!(len >= 10);
            std::ptr::write_bytes(dst, 7, 10);
            10
        })
    }
    .unwrap();
    assert_eq!(n, 10);
    assert_eq!(c.read(&mut buf).unwrap(), 10);
    assert_eq!(&buf[..10], &[7u8; 10]);
}

/// A producer full at its limit waits until an eighth of the ring is free (`space_wake`), and only
/// the read that takes the unread bytes down to that mark asks for its wake-up; before the ring
/// first grew, any free byte ends the wait and the read that frees the first byte wakes it.
#[test]
fn a_full_ring_wakes_its_producer_once_an_eighth_is_free() {
    let (mut p, mut c, w) = common::growing_pair(heap_bytes(1 << 16), 4096);
    // Not grown yet: mark 0, the wire's "any free byte".
    assert_eq!(p.write(&[7u8; 4096]).unwrap(), 4096);
    p.set_limit(4096);
    assert_eq!(w.space_wake.load(Ordering::Relaxed), 0);
    let mut b = [0u8; 100];
    let before = c.consumed();
    c.read(&mut b).unwrap();
    assert!(c.space_wake_crossed(before), "the first byte freed in a full ring");
    assert_eq!(p.space_past_mark().unwrap(), 100);
    let before = c.consumed();
    c.read(&mut b).unwrap();
    assert!(!c.space_wake_crossed(before), "the ring was not full");
    let mut rest = vec![0u8; 4096];
    c.read(&mut rest).unwrap();

    // Grown to 16 KiB: the mark is 14 KiB.
    p.set_limit(1 << 14);
    assert_eq!(p.write(&[1u8; 1 << 14]).unwrap(), 1 << 14);
    assert_eq!(w.space_wake.load(Ordering::Relaxed), 14 << 10);
    assert_eq!(p.space().unwrap(), 0);
    let mut chunk = [0u8; 1000];
    let mut wakes = Vec::new();
    for i in 0..16 {
        let before = c.consumed();
        assert_eq!(c.read(&mut chunk).unwrap(), 1000);
        let unread = (1 << 14) - 1000 * (i + 1);
        assert_eq!(p.space_past_mark().unwrap(), if unread <= 14 << 10 { (1 << 14) - unread } else { 0 });
        if c.space_wake_crossed(before) {
            wakes.push(unread);
        }
    }
    assert_eq!(wakes, [(1 << 14) - 3000], "one wake-up, at the read that reaches the mark");
    // A smaller limit lowers the mark with it: seven eighths of the bytes asked for, of at
    // least the smallest ring.
    p.set_limit(5000);
    assert_eq!(w.space_wake.load(Ordering::Relaxed), 4375);
    p.set_limit(0);
    assert_eq!(w.space_wake.load(Ordering::Relaxed), 1792);
}

/// Two holders of one producing end (a fork) with different `SO_SNDBUF` limits: the consumer wakes
/// at the mark in the shared word, so a holder that waits honours that mark if it is higher.
#[test]
fn a_writer_woken_at_a_sibling_holders_higher_mark_takes_the_space() {
    let data = heap_bytes(1 << 16);
    let (mut b, mut c, w) = common::growing_pair(data, 2048);
    // B grows the ring to 16 KiB (mark 14 KiB), then a program's small SO_SNDBUF: mark 3.5 KiB.
    assert_eq!(b.write(&[1u8; 1 << 14]).unwrap(), 1 << 14);
    let mut sink = vec![0u8; 1 << 14];
    assert_eq!(c.read(&mut sink).unwrap(), 1 << 14);
    // A forked copy of this end (as the shim's fork leaves one): here, a resumed producer.
    // SAFETY: the same leaked words and data; A and B take turns as the test drives them.
    let mut a = unsafe { Producer::resume(w.raw(), data) };
    b.set_limit(4096);
    assert_eq!(w.space_wake.load(Ordering::Relaxed), 3584);
    // B fills the ring (16 KiB, above its 4 KiB limit: it keeps its size) and must wait.
    assert_eq!(b.write(&[2u8; 1 << 14]).unwrap(), 1 << 14);
    assert_eq!(b.space().unwrap(), 0);
    // While B sleeps (the consumer has seen B's bit), A's program sets SO_SNDBUF 8 KiB: A stores
    // seven eighths of min(16 KiB, 8 KiB) = 7 KiB, above B's own 3.5 KiB.
    a.set_limit(8192);
    assert_eq!(w.space_wake.load(Ordering::Relaxed), 7168);
    // The consumer reads the ring empty in 1 KiB reads, asking for B's wake-up as the wire says.
    let mut woken_with_room = false;
    let mut chunk = [0u8; 1024];
    for _ in 0..16 {
        let before = c.consumed();
        c.read(&mut chunk).unwrap();
        if c.space_wake_crossed(before) {
            // B wakes and re-checks against its own mark; if that fails it sleeps again.
            woken_with_room |= b.space_past_mark().unwrap() > 0;
        }
    }
    // B is woken once, at 7 KiB unread: it must take the space then, as no later read crosses
    // a mark and the consumer, once the ring is empty, owes nothing.
    assert!(woken_with_room, "B sleeps on an empty ring: no read after its last re-check crossed the mark");
}

#[test]
fn a_peer_that_scribbles_over_ring_size_is_corruption() {
    for size in [0u32, 3000, 1024, 1 << 20, 12288] {
        let (mut p, mut c, w) = common::growing_pair(heap_bytes(1 << 16), 4096);
        p.write(&[1u8; 10]).unwrap();
        w.size.store(size, Ordering::Relaxed);
        let mut b = [0u8; 4];
        assert!(c.read(&mut b).is_err(), "size {size}");
    }
}

#[test]
fn a_ring_growing_under_a_concurrent_reader_delivers_every_byte_once_in_order() {
    for round in 0..4u64 {
        let (mut p, mut c, w) = common::growing_pair(heap_bytes(1 << 22), 4096);
        let total: u64 = 16 << 20;
        let reader = std::thread::spawn(move || {
            let mut got = 0u64;
            let mut b = vec![0u8; 1 << 16];
            let mut k = 0usize;
            while got < total {
                // Reads of many sizes, some smaller than what is cached.
                k = (k * 7 + 13) % b.len() + 1;
                let n = c.read(&mut b[..k]).unwrap();
                for (j, &x) in b[..n].iter().enumerate() {
                    assert_eq!(x, ((got + j as u64) % 251) as u8, "byte {}", got + j as u64);
                }
                got += n as u64;
                if n == 0 {
                    std::thread::yield_now();
                }
            }
            got
        });
        let pattern: Vec<u8> = (0..(1u64 << 20) + 251).map(|i| (i % 251) as u8).collect();
        let mut sent = 0u64;
        let mut len = 1usize + round as usize;
        while sent < total {
            len = (len * 5 + 1) % (1 << 19) + 1;
            let len = len.min((total - sent) as usize);
            let start = (sent % 251) as usize;
            let n = p.write(&pattern[start..start + len.min(1 << 20)]).unwrap();
            sent += n as u64;
            if n == 0 {
                std::thread::yield_now();
            }
        }
        assert_eq!(reader.join().unwrap(), total);
        assert!(w.size.load(Ordering::Relaxed) > 4096, "the ring grew");
    }
}

#[test]
fn snapshots_count_what_the_halves_wrote_read_and_flagged() {
    let (mut p, mut c, w) = common::ring_pair(heap_bytes(4096));
    let views = || {
        (RingState::consumer_view(&w.raw()), RingState::producer_view(&w.raw()), RingState::relaxed(&w.raw()))
    };
    let (cv, pv, rv) = views();
    assert_eq!(cv, RingState { head: 0, tail: 0, flags: 0 });
    assert_eq!((pv, rv), (cv, cv));
    assert_eq!(cv.used(4096), Ok(0));
    assert_eq!(p.write(&[7; 100]).unwrap(), 100);
    let (cv, pv, rv) = views();
    assert_eq!(cv, RingState { head: 100, tail: 0, flags: 0 });
    assert_eq!((pv, rv), (cv, cv));
    assert_eq!(cv.used(4096), Ok(100));
    let mut b = [0u8; 40];
    assert_eq!(c.read(&mut b).unwrap(), 40);
    p.set_flags(FLAG_FIN);
    let (cv, pv, rv) = views();
    assert_eq!(cv, RingState { head: 100, tail: 40, flags: FLAG_FIN });
    assert_eq!((pv, rv), (cv, cv));
    assert_eq!(cv.used(4096), Ok(60));
    // A full ring, its counters past the 2^64 wrap.
    w.head.store(u64::MAX - 5, Ordering::Relaxed);
    w.tail.store(u64::MAX - 5, Ordering::Relaxed);
    let (mut p, _c) = {
        // SAFETY: the only halves of this ring now; `resume` continues from the counters just stored.
        unsafe { (Producer::resume(w.raw(), heap_bytes(4096)), Consumer::resume(w.raw(), heap_bytes(4096))) }
    };
    assert_eq!(p.write(&[1; 4096]).unwrap(), 4096);
    let (cv, pv, _) = views();
    assert_eq!(cv.head, 4090);
    assert_eq!((cv.used(4096), pv.used(4096)), (Ok(4096), Ok(4096)));
}

#[test]
fn snapshots_report_corrupt_counters() {
    let (_p, _c, w) = common::ring_pair(heap_bytes(4096));
    let views = || [RingState::consumer_view(&w.raw()), RingState::producer_view(&w.raw()), RingState::relaxed(&w.raw())];
    for (head, tail, ok) in [(4096, 0, true), (4097, 0, false), (5, 10, false), (u64::MAX, 1, false), (3, u64::MAX - 4092, true)] {
        w.head.store(head, Ordering::Relaxed);
        w.tail.store(tail, Ordering::Relaxed);
        for v in views() {
            assert_eq!((v.head, v.tail), (head, tail));
            assert_eq!(v.used(4096).is_ok(), ok, "head {head} tail {tail}");
        }
    }
    // Flag bits are passed on as the peer left them; the halves validate them.
    w.flags.store(0x40 | FLAG_FIN, Ordering::Relaxed);
    assert!(views().iter().all(|v| v.flags == 0x40 | FLAG_FIN));
}

/// A poller's snapshots, taken while this side's reading half (another thread) and the peer's
/// writing half move the counters, are never inconsistent: the tail is loaded first, so an
/// honest ring never looks corrupt however the loads interleave with a read.
#[test]
fn snapshots_taken_during_concurrent_reads_are_never_corrupt() {
    let _dog = common::watchdog(120);
    let (mut p, mut c, w) = common::ring_pair(heap_bytes(4096));
    let total: u64 = 64 << 20;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = std::thread::spawn(move || {
        let mut b = [0u8; 97];
        let mut got = 0u64;
        while got < total {
            got += c.read(&mut b).unwrap() as u64;
        }
        got
    });
    let poller = {
        let done = done.clone();
        std::thread::spawn(move || {
            let (mut looks, mut bad) = (0u64, 0u64);
            while !done.load(Ordering::Relaxed) {
                let (cv, pv) = (RingState::consumer_view(&w.raw()), RingState::producer_view(&w.raw()));
                bad += u64::from(cv.used(4096).is_err()) + u64::from(pv.used(4096).is_err());
                looks += 1;
            }
            (looks, bad)
        })
    };
    let chunk = [5u8; 61];
    let mut sent = 0u64;
    while sent < total {
        sent += p.write(&chunk[..chunk.len().min((total - sent) as usize)]).unwrap() as u64;
    }
    assert_eq!(reader.join().unwrap(), total);
    done.store(true, Ordering::Relaxed);
    let (looks, bad) = poller.join().unwrap();
    assert!(looks > 0);
    assert_eq!(bad, 0, "{bad} of {looks} snapshots looked corrupt");
}

#[test]
fn release_from_takes_peeked_bytes_only_from_where_they_were_peeked() {
    let (mut p, mut c, _w) = common::growing_pair(heap_bytes(65536), 4096);
    assert_eq!(p.write(b"abcdef").unwrap(), 6);
    let mut dst = [0u8; 4];
    assert_eq!(c.peek_at(0, &mut dst).unwrap(), 4);
    let from = c.consumed();
    // Another position (a consumer beside that took bytes meanwhile), or more than is unread:
    // nothing released.
    assert!(!c.release_from(from + 1, 4).unwrap());
    assert!(!c.release_from(from, 7).unwrap());
    assert_eq!(c.consumed(), from);
    assert!(c.release_from(from, 4).unwrap());
    assert_eq!(c.consumed(), from + 4);
    // The peek's position is gone: a second release from it takes nothing.
    assert!(!c.release_from(from, 2).unwrap());
    let mut rest = [0u8; 8];
    assert_eq!(c.peek_at(0, &mut rest).unwrap(), 2);
    assert_eq!(&rest[..2], b"ef");
}

/// A peer that made the segment with the producer's ring at its largest size, or wrote that
/// size over it later (read back by a resume), holds no more than the producer's bound unread:
/// a fresh (empty) ring goes down to the limit at the first write, and one with bytes unread
/// is filled only to the bound and goes down once the consumer took them.
#[test]
fn a_size_the_peer_wrote_above_the_bound_holds_no_more_than_the_bound() {
    let data = heap_bytes(1 << 16);
    let (mut p, mut c, w) = common::growing_pair(data, 1 << 16);
    p.set_bound(4096);
    assert_eq!(p.space().unwrap(), 4096);
    assert_eq!(p.write(&[1u8; 1 << 16]).unwrap(), 4096, "filled only to the bound");
    assert_eq!(w.size.load(Ordering::Relaxed), 4096, "an empty ring found too large went down to the limit");
    let mut sink = vec![0u8; 1 << 16];
    assert_eq!(c.read(&mut sink).unwrap(), 4096);
    // The peer writes the largest size again with one byte unread; a resume reads it back.
    assert_eq!(p.write(&[2u8; 1]).unwrap(), 1);
    w.size.store(1 << 16, Ordering::Relaxed);
    // SAFETY: the same leaked words and data; the old producer is not used again.
    let mut p = unsafe { Producer::resume(w.raw(), data) };
    p.set_bound(4096);
    assert_eq!(p.write(&[3u8; 1 << 16]).unwrap(), 4095, "bytes unread: filled to the bound, no further");
    assert_eq!(p.space().unwrap(), 0);
    assert_eq!(c.read(&mut sink).unwrap(), 4096);
    assert_eq!(p.write(&[4u8; 1 << 16]).unwrap(), 4096);
    assert_eq!(w.size.load(Ordering::Relaxed), 4096, "went down once empty");
}
