//! loom models of the ring and the sleep/wake protocol. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p colo-ring --test loom --release`.
#![cfg(loom)]
mod common;

use colo_ring::notify;
use colo_ring::ring::Bytes;
use colo_ring::snapshot::RingState;
use colo_ring::spin::{SpinMode, Spinner};
use colo_ring::sync::AtomicU32;
use loom::cell::UnsafeCell;
use loom::sync::{Arc, Condvar, Mutex};

/// Ring bytes in loom cells, so loom reports any unsynchronised access as a torn read.
#[derive(Clone)]
struct CellBytes(Arc<Vec<UnsafeCell<u8>>>);

// SAFETY: accesses stay in bounds by the callers' contract; loom checks their synchronisation.
unsafe impl Bytes for CellBytes {
    fn capacity(&self) -> usize {
        self.0.len()
    }
    unsafe fn store(&self, at: usize, src: &[u8]) {
        for (i, b) in src.iter().enumerate() {
            // SAFETY: `at + i` is in bounds (the caller's contract); loom checks the access.
            self.0[at + i].with_mut(|p| unsafe { *p = *b });
        }
    }
    unsafe fn load(&self, at: usize, dst: &mut [u8]) {
        for (i, b) in dst.iter_mut().enumerate() {
            // SAFETY: as in `store`.
            *b = self.0[at + i].with(|p| unsafe { *p });
        }
    }
}

fn cells(n: usize) -> CellBytes {
    CellBytes(Arc::new((0..n).map(|_| UnsafeCell::new(0)).collect()))
}

/// A doorbell: a counter under a mutex, like an eventfd.
#[derive(Default)]
struct Bell {
    count: Mutex<u64>,
    cv: Condvar,
}

impl Bell {
    fn ring(&self) {
        *self.count.lock().unwrap() += 1;
        self.cv.notify_one();
    }
    fn wait_and_drain(&self) {
        let mut c = self.count.lock().unwrap();
        while *c == 0 {
            c = self.cv.wait(c).unwrap();
        }
        *c = 0;
    }
}

/// Bytes cross a 4-byte ring in order and untorn while it wraps.
#[test]
fn ring_transfers_in_order() {
    loom::model(|| {
        let (mut p, mut c, _w) = common::ring_pair(cells(4));
        let t = loom::thread::spawn(move || {
            let src = [1u8, 2, 3, 4, 5, 6];
            let mut off = 0;
            while off < src.len() {
                off += p.write(&src[off..]).unwrap();
                loom::thread::yield_now();
            }
        });
        let mut got = Vec::new();
        while got.len() < 6 {
            let mut b = [0u8; 3];
            let n = c.read(&mut b).unwrap();
            got.extend_from_slice(&b[..n]);
            loom::thread::yield_now();
        }
        assert_eq!(got, [1, 2, 3, 4, 5, 6]);
        t.join().unwrap();
    });
}

/// A consumer that sleeps by the protocol is always woken: loom fails with a deadlock otherwise.
#[test]
fn no_lost_wakeup() {
    loom::model(|| {
        let (mut p, mut c, _w) = common::ring_pair(cells(4));
        let waiting = Arc::new(AtomicU32::new(0));
        let bell = Arc::new(Bell::default());
        let (w2, b2) = (waiting.clone(), bell.clone());
        let t = loom::thread::spawn(move || {
            for b in [7u8, 8] {
                assert_eq!(p.write(&[b]).unwrap(), 1);
                if notify::peer_needs_wake(&w2) != 0 {
                    b2.ring();
                }
            }
        });
        let mut spinner = Spinner::new(SpinMode::Never);
        let mut got = Vec::new();
        while got.len() < 2 {
            let b = notify::wait(
                &mut spinner,
                || {
                    let mut b = [0u8; 1];
                    Ok::<_, ()>((c.read(&mut b).unwrap() == 1).then_some(b[0]))
                },
                || notify::announce_sleep(&waiting, notify::SLEEP_DOORBELL),
                |_| {
                    bell.wait_and_drain();
                    Ok(())
                },
            )
            .unwrap();
            got.push(b);
        }
        assert_eq!(got, [7, 8]);
        t.join().unwrap();
    });
}

/// The non-blocking form: after `poll_once` says "would block", the producer's next publish
/// leaves the doorbell rung (the readiness fd becomes readable).
#[test]
fn poll_once_leaves_doorbell_armed() {
    loom::model(|| {
        let (mut p, mut c, _w) = common::ring_pair(cells(4));
        let waiting = Arc::new(AtomicU32::new(0));
        let bell = Arc::new(Bell::default());
        let (w2, b2) = (waiting.clone(), bell.clone());
        let t = loom::thread::spawn(move || {
            p.write(&[9]).unwrap();
            if notify::peer_needs_wake(&w2) != 0 {
                b2.ring();
            }
        });
        let mut b = [0u8; 1];
        let first = notify::poll_once(
            || Ok::<_, ()>((c.read(&mut b).unwrap() == 1).then_some(())),
            || *bell.count.lock().unwrap() = 0,
            || notify::announce_sleep(&waiting, notify::SLEEP_DOORBELL),
        )
        .unwrap();
        if first.is_none() {
            // Would block: the doorbell must ring (a level-triggered poller waits on it).
            bell.wait_and_drain();
            assert_eq!(c.read(&mut b).unwrap(), 1);
        }
        assert_eq!(b[0], 9);
        t.join().unwrap();
    });
}

/// A producer blocked on a full ring is always woken by the consumer's conditional wake
/// (`peer_needs_space_wake`), while the consumer itself sleeps on the same protocol for data:
/// loom fails with a deadlock if either wake-up can be lost.
#[test]
fn no_lost_wakeup_for_space() {
    loom::model(|| {
        let (mut p, mut c, _w) = common::ring_pair(cells(1));
        // One `waiting` word and doorbell per side, as in a segment.
        let (prod_waiting, cons_waiting) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let (prod_bell, cons_bell) = (Arc::new(Bell::default()), Arc::new(Bell::default()));
        let (pw, cw, pb, cb) = (prod_waiting.clone(), cons_waiting.clone(), prod_bell.clone(), cons_bell.clone());
        let t = loom::thread::spawn(move || {
            let mut spinner = Spinner::new(SpinMode::Never);
            for b in [1u8, 2] {
                notify::wait(
                    &mut spinner,
                    || Ok::<_, ()>((p.write(&[b]).unwrap() == 1).then_some(())),
                    || notify::announce_sleep(&pw, notify::SLEEP_DOORBELL),
                    |_| {
                        pb.wait_and_drain();
                        Ok(())
                    },
                )
                .unwrap();
                if notify::peer_needs_wake(&cw) != 0 {
                    cb.ring();
                }
            }
        });
        let mut spinner = Spinner::new(SpinMode::Never);
        let mut got = Vec::new();
        while got.len() < 2 {
            let before = c.consumed();
            let b = notify::wait(
                &mut spinner,
                || {
                    let mut b = [0u8; 1];
                    Ok::<_, ()>((c.read(&mut b).unwrap() == 1).then_some(b[0]))
                },
                || notify::announce_sleep(&cons_waiting, notify::SLEEP_DOORBELL),
                |_| {
                    cons_bell.wait_and_drain();
                    Ok(())
                },
            )
            .unwrap();
            if notify::peer_needs_space_wake(&prod_waiting, || c.space_wake_crossed(before)) != 0 {
                prod_bell.ring();
            }
            got.push(b);
        }
        assert_eq!(got, [1, 2]);
        t.join().unwrap();
    });
}

/// As `no_lost_wakeup_for_space`, with a ring that grew (so its producer set a `space_wake`
/// mark): the blocked producer waits until the unread bytes are down to the mark
/// (`space_past_mark`), and only the consumer's read that crosses the mark wakes it
/// (`space_wake_crossed`): loom fails with a deadlock if that wake-up can be lost.
#[test]
fn no_lost_wakeup_at_the_space_mark() {
    // Three preemptions cover the races the mark adds (announce against a crossing read); the
    // unbounded model does not finish in minutes.
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(3);
    model.check(|| {
        // Starts at 2 bytes and grows to 4, full, at the first write: mark 3.
        let (mut p, mut c, _w) = common::growing_pair(cells(4), 2);
        let (prod_waiting, cons_waiting) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let (prod_bell, cons_bell) = (Arc::new(Bell::default()), Arc::new(Bell::default()));
        let (pw, cw, pb, cb) = (prod_waiting.clone(), cons_waiting.clone(), prod_bell.clone(), cons_bell.clone());
        let t = loom::thread::spawn(move || {
            assert_eq!(p.write(&[1, 2, 3, 4]).unwrap(), 4);
            if notify::peer_needs_wake(&cw) != 0 {
                cb.ring();
            }
            let mut spinner = Spinner::new(SpinMode::Never);
            let mut waited = false;
            notify::wait(
                &mut spinner,
                || {
                    let space = if waited { p.space_past_mark() } else { p.space() }.unwrap();
                    waited = space == 0;
                    Ok::<_, ()>((space > 0).then_some(()))
                },
                || notify::announce_sleep(&pw, notify::SLEEP_DOORBELL),
                |_| {
                    pb.wait_and_drain();
                    Ok(())
                },
            )
            .unwrap();
            assert_eq!(p.write(&[5]).unwrap(), 1);
            if notify::peer_needs_wake(&cw) != 0 {
                cb.ring();
            }
        });
        let mut spinner = Spinner::new(SpinMode::Never);
        let mut got = Vec::new();
        while got.len() < 5 {
            let before = c.consumed();
            let b = notify::wait(
                &mut spinner,
                || {
                    let mut b = [0u8; 2];
                    let n = c.read(&mut b).unwrap();
                    Ok::<_, ()>((n > 0).then(|| b[..n].to_vec()))
                },
                || notify::announce_sleep(&cons_waiting, notify::SLEEP_DOORBELL),
                |_| {
                    cons_bell.wait_and_drain();
                    Ok(())
                },
            )
            .unwrap();
            if notify::peer_needs_space_wake(&prod_waiting, || c.space_wake_crossed(before)) != 0 {
                prod_bell.ring();
            }
            got.extend(b);
        }
        assert_eq!(got, [1, 2, 3, 4, 5]);
        t.join().unwrap();
    });
}

/// Ring bytes in relaxed atomics: a consumer's copy may race with a producer that grows the ring
/// (a sequence lock, spec/WIRE.md section 5), so the model lets it and checks that no torn or
/// misplaced byte is ever delivered.
#[derive(Clone)]
struct RacyBytes(Arc<Vec<AtomicU32>>);

// SAFETY: accesses stay in bounds by the callers' contract.
unsafe impl Bytes for RacyBytes {
    fn capacity(&self) -> usize {
        self.0.len()
    }
    unsafe fn store(&self, at: usize, src: &[u8]) {
        for (i, b) in src.iter().enumerate() {
            self.0[at + i].store(u32::from(*b), colo_ring::sync::Ordering::Relaxed);
        }
    }
    unsafe fn load(&self, at: usize, dst: &mut [u8]) {
        for (i, b) in dst.iter_mut().enumerate() {
            *b = self.0[at + i].load(colo_ring::sync::Ordering::Relaxed) as u8;
        }
    }
}

/// A ring that grows (and moves unread bytes) while the consumer copies delivers every byte once,
/// in order.
#[test]
fn a_ring_growing_under_a_reader_delivers_in_order() {
    loom::model(|| {
        let bytes = RacyBytes(Arc::new((0..4).map(|_| AtomicU32::new(0)).collect()));
        let (mut p, mut c, _w) = common::growing_pair(bytes, 2);
        let t = loom::thread::spawn(move || {
            let src = [1u8, 2, 3, 4, 5];
            let mut off = 0;
            while off < src.len() {
                off += p.write(&src[off..(off + 2).min(src.len())]).unwrap();
                loom::thread::yield_now();
            }
        });
        let mut got = Vec::new();
        while got.len() < 5 {
            let mut b = [0u8; 2];
            let n = c.read(&mut b).unwrap();
            got.extend_from_slice(&b[..n]);
            loom::thread::yield_now();
        }
        assert_eq!(got, [1, 2, 3, 4, 5]);
        t.join().unwrap();
    });
}

/// A poller's snapshots of a ring whose consumer and producer (other threads) both move its
/// counters are never out of step: `used()` is always within capacity (a view that loaded each
/// counter once, in either order, can see a read and a write fall between its loads).
#[test]
fn snapshots_during_a_read_and_a_write_are_consistent() {
    loom::model(|| {
        let (mut p, mut c, w) = common::ring_pair(cells(1));
        assert_eq!(p.write(&[1]).unwrap(), 1);
        let reader = loom::thread::spawn(move || {
            let mut b = [0u8; 1];
            assert_eq!(c.read(&mut b).unwrap(), 1);
        });
        // The write finds room once the read released the byte, or the ring still full.
        let writer = loom::thread::spawn(move || {
            let _ = p.write(&[2]).unwrap();
        });
        let (cv, pv) = (RingState::consumer_view(&w.raw()), RingState::producer_view(&w.raw()));
        assert!(cv.used(1).is_ok(), "{cv:?}");
        assert!(pv.used(1).is_ok(), "{pv:?}");
        reader.join().unwrap();
        writer.join().unwrap();
    });
}
