//! The handle table's tests: encoding, lookups, generations, closes and takes, cached references,
//! threads exiting, and a stress run of lookups racing closes and reuse.

use super::state::*;
use super::table::{Guard, Local, Ref, Table, TakeError};
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

/// A test object: counts its drops and checks it is alive whenever it is read.
struct Obj {
    magic: u64,
    serial: u64,
    drops: Arc<AtomicUsize>,
}

const ALIVE: u64 = 0x00c0_10a1_17e0;
const DEAD: u64 = 0xdead;

impl Obj {
    fn new(serial: u64, drops: &Arc<AtomicUsize>) -> Self {
        Obj { magic: ALIVE, serial, drops: drops.clone() }
    }
    fn check(&self) -> u64 {
        // A volatile read: a use after drop shows up as DEAD (or as a sanitizer report).
        // SAFETY: `self` is a valid reference.
        assert_eq!(unsafe { ptr::read_volatile(&self.magic) }, ALIVE);
        self.serial
    }
}

impl Drop for Obj {
    fn drop(&mut self) {
        assert_eq!(self.magic, ALIVE, "dropped twice");
        // SAFETY: `self` is valid for writes.
        unsafe { ptr::write_volatile(&mut self.magic, DEAD) };
        self.drops.fetch_add(1, Ordering::Relaxed);
    }
}

macro_rules! table {
    ($name:ident) => {
        thread_local! {
            static LOCAL: Local<Obj> = const { Local::new() };
            static GUARD: Guard<Obj> = const { Guard::new() };
        }
        static $name: Table<Obj> = Table::new(&LOCAL, &GUARD);
    };
}

const A: u8 = 1;
const B: u8 = 2;

fn ok<E>(_: &Obj) -> Result<(), E> {
    Ok(())
}

fn drops(d: &AtomicUsize) -> usize {
    d.load(Ordering::Relaxed)
}

#[test]
fn encoding_round_trips() {
    for (i, g) in [(0, 1), (1, 7), (MAX_ENTRIES - 1, u32::MAX), (12345, 0x8000_0000)] {
        let h = encode(i, g);
        assert_ne!(h, 0);
        assert_eq!(h % 16, 0);
        assert_eq!(decode(h), Some((i, g)));
    }
    assert_eq!(decode(0), None);
    assert_eq!(decode(8), None);
    assert_eq!(decode(1 << 32), None, "index field 0");
    for i in (0..100_000u32).chain(MAX_ENTRIES - 100..MAX_ENTRIES) {
        let (k, off) = locate(i);
        assert!(k < CHUNKS && off < FIRST_CHUNK << k);
        assert_eq!(FIRST_CHUNK * ((1 << k) - 1) + off, i as usize);
    }
}

#[test]
fn lookups_check_kind_generation_and_state() {
    table!(T);
    let d = Arc::new(AtomicUsize::new(0));
    let h = T.insert(A, Obj::new(1, &d)).ok().unwrap();
    assert!(h != 0 && h & 15 == 0);
    for cached in [false, true] {
        let get = |h, k| if cached { T.get_cached(h, k) } else { T.get(h, k) };
        assert_eq!(get(h, A).unwrap().check(), 1);
        assert!(get(h, B).is_none(), "wrong kind");
        assert!(get(0, A).is_none());
        assert!(get(h + 16, A).is_none(), "an index never given out");
        assert!(get(h ^ (1 << 32), A).is_none(), "another generation");
        assert!(get(h | 8, A).is_none(), "not a multiple of 16");
        assert!(get(0x123450, A).is_none(), "made up (generation 0)");
        assert!(get(usize::MAX & !15, A).is_none(), "made up (chunk not allocated)");
    }
    assert!(T.close(h, B).is_none());
    let (owner, shared) = T.close(h, A).unwrap();
    assert!(!shared, "only this thread's cached references besides the owner's");
    assert_eq!(T.refs(h), 1, "close gave this thread's cached references back");
    assert!(T.get(h, A).is_none(), "closed");
    assert!(T.get_cached(h, A).is_none(), "closed");
    assert!(T.close(h, A).is_none(), "closed twice");
    assert!(matches!(T.take(h, A, ok::<()>), Err(TakeError::BadHandle)));
    assert_eq!(drops(&d), 0, "the owner reference is still out");
    drop(owner);
    assert_eq!(drops(&d), 1);
}

#[test]
fn a_reused_entry_gets_a_new_generation() {
    table!(T);
    let d = Arc::new(AtomicUsize::new(0));
    let h1 = T.insert(A, Obj::new(1, &d)).ok().unwrap();
    let o = T.take(h1, A, ok::<()>).ok().unwrap();
    assert_eq!(o.check(), 1);
    drop(o);
    assert!(matches!(T.take(h1, A, ok::<()>), Err(TakeError::BadHandle)), "taken twice");
    let h2 = T.insert(A, Obj::new(2, &d)).ok().unwrap();
    assert_eq!(decode(h1).unwrap().0, decode(h2).unwrap().0, "same entry (this thread's cache)");
    assert_ne!(h1, h2);
    assert!(T.get(h1, A).is_none(), "the stale handle does not reach the new object");
    assert!(T.get_cached(h1, A).is_none());
    assert!(T.close(h1, A).is_none());
    assert_eq!(T.get(h2, A).unwrap().check(), 2);
    // the same with cached references: a stale handle misses even with the slot warm
    assert_eq!(T.get_cached(h2, A).unwrap().check(), 2);
    drop(T.close(h2, A));
    let h3 = T.insert(A, Obj::new(3, &d)).ok().unwrap();
    assert_eq!(decode(h3).unwrap().0, decode(h2).unwrap().0);
    assert_eq!(T.get_cached(h3, A).unwrap().check(), 3);
    assert!(T.get_cached(h2, A).is_none(), "a stale handle with this thread's slot warm");
    assert!(T.get_cached(h3, B).is_none(), "wrong kind with the slot warm");
    drop(T.close(h3, A));
    assert_eq!(drops(&d), 3);
    assert_eq!(T.used(), 1);
}

#[test]
fn refused_take_leaves_the_handle_alone() {
    table!(T);
    let d = Arc::new(AtomicUsize::new(0));
    let h = T.insert(B, Obj::new(5, &d)).ok().unwrap();
    assert!(matches!(T.take(h, B, |o| if o.serial > 3 { Err(7) } else { Ok(()) }), Err(TakeError::Refused(7))));
    assert_eq!(T.get(h, B).unwrap().check(), 5);
    let o = T.take(h, B, ok::<()>).ok().unwrap();
    assert_eq!(o.serial, 5);
    assert!(T.get(h, B).is_none());
}

#[test]
fn close_keeps_the_object_until_the_last_reference() {
    table!(T);
    let d = Arc::new(AtomicUsize::new(0));
    let h = T.insert(A, Obj::new(9, &d)).ok().unwrap();
    let r1 = T.get(h, A).unwrap();
    let r2 = T.get_cached(h, A).unwrap();
    let (owner, shared) = T.close(h, A).unwrap();
    assert!(shared, "two references besides the owner");
    drop(owner);
    assert!(T.get(h, A).is_none());
    assert_eq!(r1.check(), 9);
    drop(r1);
    assert_eq!(drops(&d), 0);
    // the object outlives its handle on another thread too
    std::thread::spawn(move || assert_eq!(r2.check(), 9)).join().unwrap();
    assert_eq!(drops(&d), 1);
    // ... and the entry was freed only then: a new insert reuses nothing stale
    let h2 = T.insert(A, Obj::new(10, &d)).ok().unwrap();
    assert_ne!(h2, h);
    assert!(T.get(h, A).is_none());
}

#[test]
fn cached_references_are_given_back() {
    table!(T);
    let d = Arc::new(AtomicUsize::new(0));
    let h = T.insert(A, Obj::new(1, &d)).ok().unwrap();
    let other = T.insert(A, Obj::new(2, &d)).ok().unwrap();
    // A thread that looked `h` up keeps a batch of references to it.
    let (go, wait) = mpsc::channel::<()>();
    let (done, seen) = mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        assert_eq!(T.get_cached(h, A).unwrap().check(), 1);
        done.send(()).unwrap();
        wait.recv().unwrap();
        // its next cached lookup (of anything) sees the close and gives them back
        assert_eq!(T.get_cached(other, A).unwrap().check(), 2);
        done.send(()).unwrap();
        wait.recv().unwrap();
    });
    seen.recv().unwrap();
    assert_eq!(T.refs(h), 1 + u64::from(BATCH) + 1, "owner + the thread's batch and the reference it put back");
    let (owner, shared) = T.close(h, A).unwrap();
    assert!(shared, "another thread holds cached references");
    drop(owner);
    assert_eq!(drops(&d), 0, "still held by the other thread's cache");
    go.send(()).unwrap();
    seen.recv().unwrap();
    assert_eq!(drops(&d), 1, "given back at the thread's next lookup");
    // a thread's exit gives its cached references back
    assert!(T.refs(other) > 1);
    go.send(()).unwrap();
    t.join().unwrap();
    assert_eq!(T.refs(other), 1);
    // a cached reference dropped after a close lets the object go at once
    let r = T.get_cached(other, A).unwrap();
    let (owner, _) = T.close(other, A).unwrap();
    drop(owner);
    assert_eq!(drops(&d), 1);
    drop(r);
    assert_eq!(drops(&d), 2);
}

#[test]
fn cached_references_move_between_threads() {
    table!(T);
    let d = Arc::new(AtomicUsize::new(0));
    let h = T.insert(A, Obj::new(1, &d)).ok().unwrap();
    // taken here, given back on other threads (and the other way round), many times over
    let refs: Vec<Ref<Obj>> = (0..1000).map(|_| T.get_cached(h, A).unwrap()).collect();
    std::thread::spawn(move || {
        let mine: Vec<Ref<Obj>> = (0..500).map(|_| T.get_cached(h, A).unwrap()).collect();
        drop(refs);
        mine
    })
    .join()
    .unwrap()
    .into_iter()
    .for_each(drop);
    assert_eq!(T.refs(h) - 1, T.local.with(|l| u64::from(l.held.iter().map(|s| s.n.get()).sum::<u32>())));
    drop(T.close(h, A));
    assert_eq!(drops(&d), 1);
    assert_eq!(T.refs(h), 0);
}

#[test]
fn take_waits_for_concurrent_readers() {
    table!(T);
    let d = Arc::new(AtomicUsize::new(0));
    let h = T.insert(A, Obj::new(3, &d)).ok().unwrap();
    let r = T.get(h, A).unwrap();
    let t = std::thread::spawn(move || T.take(h, A, ok::<()>).ok().unwrap());
    let end = std::time::Instant::now() + std::time::Duration::from_secs(60); // a watchdog
    while T.get(h, A).is_some() { assert!(std::time::Instant::now() < end, "the take never closed the entry"); std::thread::yield_now() }
    assert!(!t.is_finished() && r.check() == 3, "the take waits for our reference; not moved out under it");
    drop(r);
    assert_eq!(t.join().unwrap().check(), 3);
}

#[test]
fn a_wrapping_generation_retires_the_entry() {
    table!(T);
    let d = Arc::new(AtomicUsize::new(0));
    let h = T.insert(A, Obj::new(1, &d)).ok().unwrap();
    drop(T.take(h, A, ok::<()>).ok().unwrap());
    T.set_vacant_gen(h, u32::MAX);
    let last = T.insert(A, Obj::new(2, &d)).ok().unwrap();
    assert_eq!(decode(last).unwrap(), (decode(h).unwrap().0, u32::MAX));
    drop(T.take(last, A, ok::<()>).ok().unwrap());
    let next = T.insert(A, Obj::new(3, &d)).ok().unwrap();
    assert_ne!(decode(next).unwrap().0, decode(h).unwrap().0, "the entry was retired");
    assert!(T.get(last, A).is_none());
    assert_eq!(T.used(), 2);
}

#[test]
fn exiting_threads_give_their_free_indices_back() {
    table!(T);
    let d = Arc::new(AtomicUsize::new(0));
    for round in 0..50 {
        let d = d.clone();
        std::thread::spawn(move || {
            let hs: Vec<usize> = (0..CACHE_CAP as u64 + 10).map(|i| T.insert(A, Obj::new(i, &d)).ok().unwrap()).collect();
            for h in hs {
                drop(T.take(h, A, ok::<()>).ok().unwrap());
            }
        })
        .join()
        .unwrap();
        assert!(T.used() <= CACHE_CAP as u32 + 10, "round {round}: {} indices used", T.used());
    }
    assert_eq!(drops(&d), 50 * (CACHE_CAP + 10));
}

/// Threads insert objects of two kinds (A: looked up through cached references, finished by
/// `close`; B: looked up uncached, finished by `take`), and look up each other's handles
/// (current and stale, either kind, both ways) at random, holding some references of A objects
/// across the owner's close and dropping them on other threads: a lookup that succeeds must
/// reach the object inserted under that very handle, every object is dropped exactly once,
/// and no handle value is given out twice.
#[test]
fn stress_acquire_close_reuse() {
    table!(T);
    const THREADS: usize = 4;
    const ROUNDS: u64 = 100_000;
    const SHARED: usize = 64;
    let d = Arc::new(AtomicUsize::new(0));
    // Recently inserted (handle, serial) pairs, readable by every thread.
    let shared: Arc<Vec<Mutex<(usize, u64)>>> = Arc::new((0..SHARED).map(|_| Mutex::new((0, 0))).collect());
    // References handed from one thread to another.
    let passed: Arc<Mutex<Vec<Ref<Obj>>>> = Arc::new(Mutex::new(Vec::new()));
    let hits = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..THREADS as u64)
        .map(|t| {
            let (d, shared, passed, hits) = (d.clone(), shared.clone(), passed.clone(), hits.clone());
            std::thread::spawn(move || {
                let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (t + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
                let mut next = || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                let kind_of = |serial: u64| if serial & 1 == 0 { A } else { B };
                let mut mine: Vec<(usize, u64)> = Vec::new();
                let mut given = Vec::new();
                let mut held: Vec<Ref<Obj>> = Vec::new();
                for i in 0..ROUNDS {
                    let serial = t << 48 | i;
                    let h = T.insert(kind_of(serial), Obj::new(serial, &d)).ok().unwrap();
                    given.push(h);
                    mine.push((h, serial));
                    *shared[(next() as usize) % SHARED].lock().unwrap() = (h, serial);
                    // look up someone's handle, possibly stale, possibly the wrong kind
                    let (oh, os) = *shared[(next() as usize) % SHARED].lock().unwrap();
                    for k in [A, B] {
                        let cached = k == A && next() % 2 == 0;
                        let r = if cached { T.get_cached(oh, k) } else { T.get(oh, k) };
                        if let Some(r) = r {
                            assert_eq!(r.check(), os, "a handle reached another object");
                            assert_eq!(kind_of(os), k);
                            hits.fetch_add(1, Ordering::Relaxed);
                            // Keep some across the owner's close (kind A only: `take`, used
                            // for B, waits for references, which must be brief).
                            if k == A {
                                match next() % 8 {
                                    0 | 1 => held.push(r),
                                    2 => passed.lock().unwrap().push(r),
                                    _ => {}
                                }
                            }
                        }
                    }
                    if held.len() > 8 || next() % 16 == 0 {
                        held.clear();
                    }
                    if next() % 8 == 0 {
                        let theirs = std::mem::take(&mut *passed.lock().unwrap());
                        for r in &theirs {
                            r.check();
                        }
                    }
                    // finish one of ours
                    if mine.len() > 16 || next() % 3 == 0 {
                        let (h, s) = mine.swap_remove((next() as usize) % mine.len());
                        let kind = kind_of(s);
                        if kind == A {
                            let (owner, _) = T.close(h, kind).unwrap();
                            assert_eq!(owner.check(), s);
                        } else {
                            let o = T.take(h, kind, ok::<()>).ok().unwrap();
                            assert_eq!(o.check(), s);
                        }
                        assert!(T.get(h, kind).is_none());
                        assert!(T.get_cached(h, kind).is_none());
                    }
                }
                for (h, s) in mine {
                    drop(T.close(h, kind_of(s)).unwrap());
                }
                given
            })
        })
        .collect();
    let mut all: Vec<usize> = workers.into_iter().flat_map(|w| w.join().unwrap()).collect();
    passed.lock().unwrap().clear();
    let n = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), n, "a handle value was given out twice");
    assert_eq!(drops(&d), n, "every object dropped exactly once (cached references given back)");
    assert!(hits.load(Ordering::Relaxed) > 1000, "lookups did reach live objects");
    assert!(T.used() < 5000, "indices are reused ({} used)", T.used());
}

/// What the tests read of a table's insides.
impl<T: 'static> Table<T> {
    /// Indices ever given out (for tests).
    fn used(&self) -> u32 {
        self.next.load(Ordering::Relaxed)
    }

    /// References counted on the entry behind `h` (for tests).
    fn refs(&self, h: usize) -> u64 {
        self.entry(decode(h).unwrap().0).unwrap().state.load(Ordering::Relaxed) & REFS_MASK
    }

    /// Sets the generation of the vacant entry behind a handle's index (for tests).
    fn set_vacant_gen(&self, h: usize, gen: u32) {
        let (index, _) = decode(h).unwrap();
        let e = self.entry(index).unwrap();
        assert_eq!(e.state.load(Ordering::Relaxed) >> KIND_SHIFT & 7, 0, "entry is vacant");
        e.state.store(u64::from(gen) << GEN_SHIFT, Ordering::Relaxed);
    }
}
