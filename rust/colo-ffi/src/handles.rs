//! The handle table behind the C API: a grow-only array of entries, each holding one object
//! (listener, connection, message, loan) and one atomic state word. A handle is an index plus a
//! generation; looking it up is one load and one compare-and-swap, never a lock, and for
//! connections usually no read-modify-write at all (see *Cached references*).
//!
//! # Entries
//!
//! Entries live in chunks of 64, 128, 256, ... entries, allocated when first needed and never
//! freed, so an entry's address is fixed and its memory is always a valid `Entry<T>` (type-stable:
//! a stale handle may read any entry's state word, never freed memory). Its state packs:
//!
//! ```text
//!  63            32 31  29   28    27          0
//! +----------------+------+------+-------------+
//! |   generation   | kind |CLOSED|    refs     |
//! +----------------+------+------+-------------+
//! ```
//!
//! - `kind` 0: vacant (no object). Otherwise the object was written by [`Table::insert`] and is
//!   alive until the entry is vacated.
//! - `refs`: counted references to the object. [`Table::insert`] hands out one, the *owner*
//!   reference, which the handle itself stands for; every [`Ref`] is another, and so is every
//!   reference a thread keeps cached.
//! - `CLOSED`: the handle is dead: no new reference can be taken. Set once, by [`Table::close`]
//!   (the object is dropped when the last reference goes) or [`Table::take`] (the caller moves the
//!   object out once the other references are gone).
//! - `generation`: bumped each time the entry is vacated. A handle carries the generation it was
//!   given out with; after a reuse the generations differ and the stale handle finds nothing.
//!   An entry whose generation would wrap is retired instead of reused, so that a handle value is
//!   never given out twice.
//!
//! Every change to a live entry's state is a compare-and-swap that first checked generation,
//! kind and `CLOSED`, or a decrement by a holder of references: a failed lookup never writes, so
//! a stale or made-up handle cannot disturb the entry's current occupant. The object is dropped
//! by whoever gives back the last reference of a closed entry, exactly once (`Arc`'s argument).
//!
//! # Handles
//!
//! `handle = generation << 32 | (index + 1) << 4`: multiples of 16 (they look like aligned
//! pointers to C) and never 0. Generations start at 1, so small made-up values (generation 0)
//! never name an object.
//!
//! # Cached references
//!
//! [`Table::get_cached`] (used for connections, which every message call looks up) takes
//! [`BATCH`] extra references with its compare-and-swap and keeps them in a small per-thread
//! array ([`HELD`] slots, indexed by entry index); later lookups of the same entry on the same
//! thread take one from there after a plain load of the state (to check generation, kind and
//! `CLOSED`), and a dropped cached [`Ref`] puts its reference back. The cached references are real
//! counts, so the object cannot go while a thread holds some: the plain load decides only whether
//! the handle is still open, not whether the memory is alive. They are given back when the slot is
//! needed for another entry, when the thread sees that the entry was closed (a dropped `Ref` checks
//! `CLOSED`; a close that leaves references behind bumps a global epoch that every cached lookup
//! compares, so each thread gives back the references of closed entries at its next lookup), and
//! when the thread exits. [`Table::close`] gives back the closing thread's own at once, so a
//! single-threaded program frees a closed connection at `colo_close`, as before.
//!
//! # Free indices
//!
//! Vacated indices go to a per-thread cache of up to [`CACHE_CAP`]; a full cache moves half of
//! itself to a global list behind a mutex, and an empty one refills from there in the same batches
//! (or takes a never-used index). A thread's cache is given back to the global list when the
//! thread exits. A message received on one thread and released on another therefore costs a lock
//! only once per [`FREE_BATCH`] messages.
//!
//! # Thread-local state
//!
//! Each table has a [`Local`] (free indices and cached references; plain `Cell`s, no destructor,
//! so reaching it is a bare thread-local access) and a [`Guard`] whose destructor gives the
//! thread's cached indices and references back when the thread exits. After that (in other
//! thread-local destructors) the thread uses the global paths only.

use std::cell::{Cell, UnsafeCell};
use std::mem::MaybeUninit;
use std::ops::Deref;
use std::ptr;
use std::sync::atomic::{fence, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread::LocalKey;

const REFS_MASK: u64 = (1 << 28) - 1;
const CLOSED: u64 = 1 << 28;
const KIND_SHIFT: u32 = 29;
const GEN_SHIFT: u32 = 32;
/// Generation of a never-used entry (0 is never given out).
const FIRST_GEN: u32 = 1;

/// Entries in the first chunk; chunk `k` has `FIRST_CHUNK << k`.
const FIRST_CHUNK: usize = 64;
const FIRST_CHUNK_BITS: u32 = FIRST_CHUNK.trailing_zeros();
/// Handles keep `index + 1` in 28 bits.
pub(crate) const MAX_ENTRIES: u32 = (1 << 28) - 1;
/// Enough chunks for `MAX_ENTRIES`: `FIRST_CHUNK * (2^CHUNKS - 1) >= MAX_ENTRIES`.
const CHUNKS: usize = 23;
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
const HELD_MAX: u32 = 4 * BATCH;
// The counts stay far from the 28-bit field even with many threads.
const _: () = assert!((HELD_MAX as u64 + 1) * 1024 < REFS_MASK);

/// One object slot. Aligned to 128 bytes (two cache lines, as the x86 adjacent-line prefetcher
/// pairs them) so that objects used by different threads do not share a line.
#[repr(align(128))]
struct Entry<T: 'static> {
    state: AtomicU64,
    obj: UnsafeCell<MaybeUninit<T>>,
    /// The table and index of this entry (fixed at allocation), so that a [`Ref`] is one pointer.
    table: &'static Table<T>,
    index: u32,
}

impl<T> Entry<T> {
    /// The object of an entry on which the caller holds a reference.
    ///
    /// # Safety
    /// The caller holds one of the entry's counted references (or owns the entry exclusively), so
    /// the object is initialised and is not dropped or moved for as long as the borrow lives.
    unsafe fn obj(&self) -> &T {
        // SAFETY: per this function's contract the object is initialised and stays so; other
        // holders only take shared references to it too.
        unsafe { (*self.obj.get()).assume_init_ref() }
    }
}

fn gen_of(state: u64) -> u32 {
    (state >> GEN_SHIFT) as u32
}

/// The state of a live, open entry of `kind` and generation `gen`, without its reference count.
fn live(gen: u32, kind: u8) -> u64 {
    u64::from(gen) << GEN_SHIFT | u64::from(kind) << KIND_SHIFT
}

fn encode(index: u32, gen: u32) -> usize {
    ((u64::from(gen) << 32) | (u64::from(index) + 1) << 4) as usize
}

/// `(index, generation)` of a well-formed handle value.
#[inline]
fn decode(h: usize) -> Option<(u32, u32)> {
    let h = h as u64;
    let slot = (h >> 4) as u32 & MAX_ENTRIES;
    if h & 0xf != 0 || slot == 0 {
        return None;
    }
    Some((slot - 1, (h >> 32) as u32))
}

/// `(chunk, offset in the chunk)` of an index.
#[inline]
fn locate(index: u32) -> (usize, usize) {
    let i = index as usize + FIRST_CHUNK;
    let k = (usize::BITS - 1 - i.leading_zeros() - FIRST_CHUNK_BITS) as usize;
    (k, i - (FIRST_CHUNK << k))
}

/// A thread's cached references on one entry.
struct Held<T: 'static> {
    /// While `n > 0`, a live entry on which this slot holds `n` counted references (so it stays
    /// live). With `n == 0` only a hint: a cached `Ref` of that entry dropped on this thread may
    /// put its reference here (it is a reference on the entry's current occupant, the only one a
    /// cached `Ref` can hold), but nothing is read through it.
    entry: Cell<*const Entry<T>>,
    n: Cell<u32>,
}

/// Whether a thread's [`Local`] may be used: its [`Guard`] is registered and not yet dropped.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Life {
    Fresh,
    Ready,
    Gone,
}

/// A thread's free indices and cached references (see the module doc).
pub(crate) struct Local<T: 'static> {
    life: Cell<Life>,
    nfree: Cell<usize>,
    /// Free entries (of this table: chunks are never freed, so the pointers stay valid).
    free: [Cell<*const Entry<T>>; CACHE_CAP],
    held: [Held<T>; HELD],
    /// The table's close epoch when this thread last gave back the references of closed entries.
    epoch: Cell<u64>,
}

impl<T> Local<T> {
    pub(crate) const fn new() -> Self {
        Local {
            life: Cell::new(Life::Fresh),
            nfree: Cell::new(0),
            free: [const { Cell::new(ptr::null()) }; CACHE_CAP],
            held: [const { Held { entry: Cell::new(ptr::null()), n: Cell::new(0) } }; HELD],
            epoch: Cell::new(0),
        }
    }
}

/// Gives the thread's [`Local`] state back to its table when the thread exits.
pub(crate) struct Guard<T: 'static> {
    table: Cell<Option<&'static Table<T>>>,
}

impl<T> Guard<T> {
    pub(crate) const fn new() -> Self {
        Guard { table: Cell::new(None) }
    }
}

impl<T> Drop for Guard<T> {
    fn drop(&mut self) {
        if let Some(t) = self.table.get() {
            t.retire_thread();
        }
    }
}

/// The table. Lives in a `static`, with its own thread-locals:
///
/// ```ignore
/// thread_local! {
///     static LOCAL: Local<Obj> = const { Local::new() };
///     static GUARD: Guard<Obj> = const { Guard::new() };
/// }
/// static TABLE: Table<Obj> = Table::new(&LOCAL, &GUARD);
/// ```
///
/// Kinds are 1 to 7, chosen by the user of the table; lookups name the kind they expect.
pub(crate) struct Table<T: 'static> {
    chunks: [AtomicPtr<Entry<T>>; CHUNKS],
    /// Indices ever given out (the next never-used index).
    next: AtomicU32,
    overflow: Mutex<Vec<u32>>,
    /// Bumped by a close that leaves references behind (see *Cached references*).
    epoch: AtomicU64,
    local: &'static LocalKey<Local<T>>,
    guard: &'static LocalKey<Guard<T>>,
}

// SAFETY: the table hands `&T` to any thread (through `Ref`) and moves `T` out on any thread
// (`take`, or the drop by the last reference), which is what `T: Send + Sync` allows. Its own
// fields are atomics, a mutex and references to thread-local keys.
unsafe impl<T: Send + Sync> Sync for Table<T> {}
// SAFETY: as above.
unsafe impl<T: Send + Sync> Send for Table<T> {}

/// A counted reference to a live object; dropping it gives the reference back (and drops the
/// object if it was the last one of a closed handle). Like an `Arc` clone.
pub(crate) struct Ref<T: 'static> {
    entry: &'static Entry<T>,
    /// From [`Table::get_cached`]: goes back to this thread's cache if it has a slot for the entry.
    cached: bool,
}

// SAFETY: a `Ref` gives `&T` on whichever thread holds it and may drop the `T` there: as for
// `Arc<T>`, that needs `T: Send + Sync`.
unsafe impl<T: Send + Sync> Send for Ref<T> {}
// SAFETY: as above.
unsafe impl<T: Send + Sync> Sync for Ref<T> {}

impl<T> Deref for Ref<T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: a `Ref` is a counted reference on its entry.
        unsafe { self.entry.obj() }
    }
}

impl<T> Drop for Ref<T> {
    #[inline]
    fn drop(&mut self) {
        let (entry, table) = (self.entry, self.entry.table);
        if self.cached && table.put_back(entry) {
            return;
        }
        table.release(entry, 1);
    }
}

/// This thread's side of a table for the length of one call: the thread-local state is looked up
/// once (in a shared library each lookup is a call into the dynamic linker), then the table's fast
/// paths are plain field accesses. From [`Table::cx`].
pub(crate) struct Cx<'a, T: 'static> {
    table: &'static Table<T>,
    l: &'a Local<T>,
}

impl<T> Cx<'_, T> {
    /// [`Table::insert`], with the object made by `make` once its entry is found: it is written
    /// straight into the entry (an object passed by value was built on the stack and copied, in
    /// 16-byte loads of fields just written one by one, which stalled store forwarding). Gives
    /// `make` back, not called, if the table is full.
    #[inline]
    pub(crate) fn insert_with<F: FnOnce() -> T>(&self, kind: u8, make: F) -> Result<usize, F> {
        self.table.insert_in(self.l, kind, make)
    }

    /// [`Table::get_cached`].
    #[inline]
    pub(crate) fn get_cached(&self, h: usize, kind: u8) -> Option<Ref<T>> {
        self.table.get_cached_in(self.l, h, kind)
    }

    /// [`Table::take`], leaving the object in place: the returned guard owns it (and the entry),
    /// and drops it and frees the entry when dropped.
    #[inline]
    pub(crate) fn take<E>(&self, h: usize, kind: u8, check: impl FnOnce(&T) -> Result<(), E>) -> Result<Taken<'_, T>, TakeError<E>> {
        self.table.take_in(self.l, h, kind, check)
    }

    /// Drops `r` (as its `Drop` would, without looking up the thread-local state again).
    #[inline]
    pub(crate) fn put(&self, r: Ref<T>) {
        let (entry, cached) = (r.entry, r.cached);
        std::mem::forget(r);
        if !(cached && self.table.put_back_in(self.l, entry)) {
            self.table.release(entry, 1);
        }
    }
}

/// An object taken out of its handle ([`Cx::take`]) but still in its entry, which the guard owns:
/// the handle is dead, no reference to the entry exists, and no one else can reach it. Dropping
/// the guard drops the object in place and frees the entry (so that callers can move just the
/// parts they need out of the object, instead of the whole of it).
pub(crate) struct Taken<'a, T: 'static> {
    table: &'static Table<T>,
    l: &'a Local<T>,
    entry: &'static Entry<T>,
    gen: u32,
}

impl<T> Taken<'_, T> {
    /// Frees the entry without dropping what is left of the object, for a caller that moved
    /// everything that needs dropping out of it (anything left is leaked, which is safe).
    #[inline]
    pub(crate) fn discard(self) {
        let this = std::mem::ManuallyDrop::new(self);
        this.table.vacate_in(this.l, this.entry, this.entry.index, this.gen);
    }

    /// Moves the whole object out (and frees the entry).
    #[cfg(test)]
    pub(crate) fn into_inner(self) -> T {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: the guard owns the initialised object; it is read once, here, and the entry is
        // vacated without dropping it (the guard's `Drop` does not run).
        let obj = unsafe { (*this.entry.obj.get()).assume_init_read() };
        this.table.vacate_in(this.l, this.entry, this.entry.index, this.gen);
        obj
    }
}

impl<T> Deref for Taken<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard owns the entry (see the type's doc); the object is initialised.
        unsafe { self.entry.obj() }
    }
}

impl<T> std::ops::DerefMut for Taken<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; no other reference to the object exists while the guard lives.
        unsafe { (*self.entry.obj.get()).assume_init_mut() }
    }
}

impl<T> Drop for Taken<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: the guard owns the initialised object and drops it once, here; the entry is
        // vacated right after, so nothing reads it again.
        unsafe { (*self.entry.obj.get()).assume_init_drop() };
        self.table.vacate_in(self.l, self.entry, self.entry.index, self.gen);
    }
}

/// Why [`Table::take`] did not take the object.
pub(crate) enum TakeError<E> {
    /// No open object of that kind under that handle.
    BadHandle,
    /// The check refused; the handle is as it was.
    Refused(E),
}

impl<T: 'static> Table<T> {
    pub(crate) const fn new(local: &'static LocalKey<Local<T>>, guard: &'static LocalKey<Guard<T>>) -> Self {
        Table {
            chunks: [const { AtomicPtr::new(ptr::null_mut()) }; CHUNKS],
            next: AtomicU32::new(0),
            overflow: Mutex::new(Vec::new()),
            epoch: AtomicU64::new(0),
            local,
            guard,
        }
    }

    /// Runs `f` with this thread's side of the table (see [`Cx`]).
    #[inline]
    pub(crate) fn cx<R>(&'static self, f: impl FnOnce(&Cx<'_, T>) -> R) -> R {
        self.local.with(|l| f(&Cx { table: self, l }))
    }

    /// [`Table::cx`] with this thread's [`Local`] of the table, which the caller looked up
    /// through the thread-local key itself: named directly, the key's access is inlined (through
    /// the table's reference to it, it is an indirect call, about 20 instructions per call).
    #[inline]
    pub(crate) fn cx_in<R>(&'static self, l: &Local<T>, f: impl FnOnce(&Cx<'_, T>) -> R) -> R {
        debug_assert!(self.local.with(|mine| ptr::eq(mine, l)), "the table's own thread-local");
        f(&Cx { table: self, l })
    }

    /// Stores `obj` as a new open object of `kind` (1 to 7) and returns its handle, which holds
    /// the owner reference. Gives `obj` back if the table is full ([`MAX_ENTRIES`]).
    #[cfg(test)]
    pub(crate) fn insert(&'static self, kind: u8, obj: T) -> Result<usize, T> {
        self.cx(|cx| cx.insert_with(kind, || obj)).map_err(|make| make())
    }

    #[inline(always)]
    fn insert_in<F: FnOnce() -> T>(&'static self, l: &Local<T>, kind: u8, make: F) -> Result<usize, F> {
        debug_assert!((1..8).contains(&kind));
        let Some(entry) = self.alloc_entry_in(l) else { return Err(make) };
        let index = entry.index;
        // The entry is vacant and ours: no one else writes its state (stale lookups only read it).
        let gen = gen_of(entry.state.load(Ordering::Relaxed));
        // SAFETY: the index came off a free list (or is new), so no object lives in the entry and
        // no one else uses it: lookups cannot take a reference on a vacant entry.
        unsafe { (*entry.obj.get()).write(make()) };
        // SYNC POINT with the Acquire compare-and-swaps in `acquire`, `take` and `mark_closed`: the
        // object written above is visible to whoever takes a reference through this state.
        entry.state.store(live(gen, kind) | 1, Ordering::Release);
        Ok(encode(index, gen))
    }

    /// A counted reference to the open object of `kind` under `h`, or `None` (NULL, made-up,
    /// stale, closed or wrong-kind handle). One compare-and-swap.
    #[inline]
    pub(crate) fn get(&'static self, h: usize, kind: u8) -> Option<Ref<T>> {
        let (index, gen) = decode(h)?;
        let entry = self.entry(index)?;
        self.acquire(entry, live(gen, kind), 1)?;
        Some(Ref { entry, cached: false })
    }

    /// As [`Table::get`], through this thread's cached references (see the module doc): usually
    /// a plain load instead of a compare-and-swap. For kinds that may be closed while references
    /// are out (not for [`Table::take`]n ones, whose take would wait for the cached references).
    pub(crate) fn get_cached(&'static self, h: usize, kind: u8) -> Option<Ref<T>> {
        self.cx(|cx| cx.get_cached(h, kind))
    }

    #[inline(always)]
    fn get_cached_in(&'static self, l: &Local<T>, h: usize, kind: u8) -> Option<Ref<T>> {
        let (index, gen) = decode(h)?;
        let entry = self.entry(index)?;
        let want = live(gen, kind);
        let slot = &l.held[index as usize % HELD];
        let n = slot.n.get();
        // The hit: this thread holds references to the entry (so `l` is in use: `Life::Ready`), no
        // close happened since it last looked (epoch), and the handle names the open object. The
        // cached references keep the entry live under its current generation and kind, and the
        // object was published to us when we took them (an Acquire compare-and-swap): the plain
        // load only tells whether the handle is still open and names this object.
        if n > 0
            && ptr::eq(slot.entry.get(), entry)
            && self.epoch.load(Ordering::Relaxed) == l.epoch.get()
            && entry.state.load(Ordering::Relaxed) & !REFS_MASK == want
        {
            slot.n.set(n - 1);
            return Some(Ref { entry, cached: true });
        }
        self.get_cached_slow(l, entry, index, want)
    }

    #[cold]
    #[inline(never)]
    fn get_cached_slow(&'static self, l: &Local<T>, entry: &'static Entry<T>, index: u32, want: u64) -> Option<Ref<T>> {
        let hit = (|| {
            if !self.ready(l) {
                return None;
            }
            if self.epoch.load(Ordering::Relaxed) != l.epoch.get() {
                self.give_back_closed(l);
            }
            let slot = &l.held[index as usize % HELD];
            let n = slot.n.get();
            if n > 0 && ptr::eq(slot.entry.get(), entry) {
                // As in `get_cached_in`.
                let s = entry.state.load(Ordering::Relaxed);
                if s & !REFS_MASK == want {
                    slot.n.set(n - 1);
                    return Some(true);
                }
                if s & CLOSED != 0 {
                    slot.n.set(0);
                    self.release(entry, n);
                }
                return Some(false);
            }
            // A miss: one compare-and-swap takes this reference and a batch for the slot, whose
            // previous references are given back (after the slot is updated: the release may drop
            // an object, whose destructor may use this thread's state).
            self.acquire(entry, want, 1 + BATCH)?;
            let old = slot.entry.replace(entry);
            slot.n.set(BATCH);
            if n > 0 {
                // SAFETY: a slot's entry pointer with `n > 0` names a live entry (see `Held`).
                self.release(unsafe { &*old }, n);
            }
            Some(true)
        })();
        match hit {
            Some(true) => Some(Ref { entry, cached: true }),
            Some(false) => None,
            // No usable thread-local state (thread exiting) or a failed acquire: uncached.
            None => {
                self.acquire(entry, want, 1)?;
                Some(Ref { entry, cached: false })
            }
        }
    }

    /// Closes the open object of `kind` under `h`: the handle stops working at once, and the object
    /// is dropped when the last reference goes. Returns the owner reference (drop it to finish the
    /// close) and whether references other than the owner's and this thread's cached ones existed
    /// at that moment; `None` for a bad handle.
    pub(crate) fn close(&'static self, h: usize, kind: u8) -> Option<(Ref<T>, bool)> {
        let (index, gen) = decode(h)?;
        let entry = self.entry(index)?;
        let s = self.mark_closed(entry, live(gen, kind))?;
        // Give back this thread's cached references now (they are counted in `s`).
        let own = self
            .local
            .try_with(|l| {
                let slot = &l.held[index as usize % HELD];
                let n = slot.n.get();
                if n > 0 && ptr::eq(slot.entry.get(), entry) {
                    slot.n.set(0);
                    n
                } else {
                    0
                }
            })
            .unwrap_or(0);
        let shared = s & REFS_MASK > 1 + u64::from(own);
        if shared {
            // Other threads may hold cached references: have them give those back soon.
            self.epoch.fetch_add(1, Ordering::Relaxed);
        }
        if own > 0 {
            // Not the last: the owner reference is still counted.
            self.release(entry, own);
        }
        Some((Ref { entry, cached: false }, shared))
    }

    /// Takes the open object of `kind` under `h` out of the table, if `check` accepts it: the
    /// handle is dead once this returns `Ok`, and untouched otherwise. Waits for other references
    /// to go, so use it only for kinds whose `Ref`s are held briefly (not across blocking calls,
    /// never cached).
    #[cfg(test)]
    pub(crate) fn take<E>(&'static self, h: usize, kind: u8, check: impl FnOnce(&T) -> Result<(), E>) -> Result<T, TakeError<E>> {
        self.cx(|cx| cx.take(h, kind, check).map(Taken::into_inner))
    }

    #[inline]
    fn take_in<'a, E>(&'static self, l: &'a Local<T>, h: usize, kind: u8, check: impl FnOnce(&T) -> Result<(), E>) -> Result<Taken<'a, T>, TakeError<E>> {
        let (index, gen) = decode(h).ok_or(TakeError::BadHandle)?;
        let entry = self.entry(index).ok_or(TakeError::BadHandle)?;
        let want = live(gen, kind);
        let s = self.mark_closed(entry, want).ok_or(TakeError::BadHandle)?;
        if s & REFS_MASK != 1 {
            Self::wait_alone(entry);
        }
        // SAFETY: we set CLOSED and ours is the only reference left: the entry is ours alone.
        if let Err(e) = check(unsafe { entry.obj() }) {
            // SYNC POINT with the Acquire compare-and-swaps of later lookups (the object is as
            // `insert` published it; this store restarts the release sequence).
            entry.state.store(want | 1, Ordering::Release);
            return Err(TakeError::Refused(e));
        }
        Ok(Taken { table: self, l, entry, gen })
    }

    /// Waits until the only reference left on a closed entry is the caller's (other holders are
    /// brief `get`s, and none can start now).
    #[cold]
    fn wait_alone(entry: &Entry<T>) {
        let mut spins = 0u32;
        // SYNC POINT with the Release decrements in `release`: their reads of the object happen
        // before we move or drop it.
        while entry.state.load(Ordering::Acquire) & REFS_MASK != 1 {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Takes `n` references on an entry whose state is `want` plus some references.
    #[inline]
    fn acquire(&self, entry: &Entry<T>, want: u64, n: u32) -> Option<()> {
        let mut s = entry.state.load(Ordering::Relaxed);
        loop {
            // One comparison checks generation, kind and CLOSED; a count near saturation refuses
            // too (unreachable: it would take 2^28 live references).
            if s & !REFS_MASK != want || s & REFS_MASK > REFS_MASK - u64::from(n) {
                return None;
            }
            // SYNC POINT with the Release store in `insert` (and the Release decrements of earlier
            // holders, in the same release sequence): the object is fully written before we use it.
            match entry.state.compare_exchange_weak(s, s + u64::from(n), Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return Some(()),
                Err(now) => s = now,
            }
        }
    }

    /// Sets CLOSED on an entry whose state is `want` plus some references; returns the state seen.
    fn mark_closed(&self, entry: &Entry<T>, want: u64) -> Option<u64> {
        let mut s = entry.state.load(Ordering::Relaxed);
        loop {
            if s & !REFS_MASK != want {
                return None;
            }
            // SYNC POINT with the Release store in `insert` (and the release sequence after it): we
            // may use the object after this.
            match entry.state.compare_exchange_weak(s, s | CLOSED, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return Some(s),
                Err(now) => s = now,
            }
        }
    }

    /// Gives back `n` references; the last one of a closed entry drops the object.
    fn release(&'static self, entry: &'static Entry<T>, n: u32) {
        // SYNC POINT with the Acquire fence below, in whichever thread drops the last reference
        // (and with the Acquire wait in `take`): our uses of the object happen before its drop.
        let prev = entry.state.fetch_sub(u64::from(n), Ordering::Release);
        if prev & (CLOSED | REFS_MASK) != CLOSED | u64::from(n) {
            return;
        }
        // SYNC POINT with the Release decrements of the other holders (see above).
        fence(Ordering::Acquire);
        // SAFETY: the handle is closed and these were the last references: no one can reach the
        // object any more. It is dropped once, here; the entry is vacated right after.
        unsafe { (*entry.obj.get()).assume_init_drop() };
        self.vacate(entry, entry.index, gen_of(prev));
    }

    /// Puts a cached `Ref`'s reference back into this thread's slot for its entry; false if there
    /// is none (the caller releases it).
    fn put_back(&'static self, entry: &'static Entry<T>) -> bool {
        self.local.with(|l| self.put_back_in(l, entry))
    }

    #[inline]
    fn put_back_in(&'static self, l: &Local<T>, entry: &'static Entry<T>) -> bool {
        {
            if l.life.get() != Life::Ready {
                return false;
            }
            let slot = &l.held[entry.index as usize % HELD];
            if !ptr::eq(slot.entry.get(), entry) {
                return false;
            }
            let n = slot.n.get() + 1;
            if entry.state.load(Ordering::Relaxed) & CLOSED != 0 {
                // Closed meanwhile (a blocked call woken by the close): let the object go now.
                slot.n.set(0);
                self.release(entry, n);
            } else if n > HELD_MAX {
                slot.n.set(BATCH);
                self.release(entry, n - BATCH);
            } else {
                slot.n.set(n);
            }
            true
        }
    }

    /// Gives back this thread's cached references on closed entries (after an epoch change).
    #[cold]
    fn give_back_closed(&'static self, l: &Local<T>) {
        l.epoch.set(self.epoch.load(Ordering::Relaxed));
        for slot in &l.held {
            let n = slot.n.get();
            if n == 0 {
                continue;
            }
            // SAFETY: a slot's entry pointer with `n > 0` names a live entry (see `Held`).
            let entry = unsafe { &*slot.entry.get() };
            if entry.state.load(Ordering::Relaxed) & CLOSED != 0 {
                slot.n.set(0);
                self.release(entry, n);
            }
        }
    }

    /// Whether this thread's `Local` may be used; registers its `Guard` on first use.
    #[inline]
    fn ready(&'static self, l: &Local<T>) -> bool {
        match l.life.get() {
            Life::Ready => true,
            Life::Gone => false,
            Life::Fresh => self.register(l),
        }
    }

    #[cold]
    fn register(&'static self, l: &Local<T>) -> bool {
        let ok = self.guard.try_with(|g| g.table.set(Some(self))).is_ok();
        l.life.set(if ok { Life::Ready } else { Life::Gone });
        ok
    }

    /// The exiting thread's `Guard`: gives back its cached references and free indices; the
    /// thread uses the global paths from now on.
    fn retire_thread(&'static self) {
        // `Local` has no destructor: it is still there while other thread-locals are dropped.
        self.local.with(|l| {
            l.life.set(Life::Gone);
            for slot in &l.held {
                let n = slot.n.replace(0);
                if n > 0 {
                    // SAFETY: a slot's entry pointer with `n > 0` names a live entry (see `Held`).
                    self.release(unsafe { &*slot.entry.get() }, n);
                }
            }
            let n = l.nfree.replace(0);
            let mut g = self.lock_overflow();
            // SAFETY: the cache holds pointers to entries of this table, which are never freed.
            g.extend(l.free[..n].iter().map(|e| unsafe { (*e.get()).index }));
        });
    }

    /// Marks an entry whose object is gone as vacant under the next generation and frees its
    /// index; retires it instead when the generation would wrap.
    fn vacate(&'static self, entry: &'static Entry<T>, index: u32, gen: u32) {
        self.local.with(|l| self.vacate_in(l, entry, index, gen));
    }

    #[inline]
    fn vacate_in(&'static self, l: &Local<T>, entry: &'static Entry<T>, index: u32, gen: u32) {
        let Some(next) = gen.checked_add(1) else {
            // Retired: stays vacant under the last generation, never reused.
            entry.state.store(u64::from(gen) << GEN_SHIFT, Ordering::Relaxed);
            return;
        };
        // Relaxed: lookups only compare this value (and reject it); the next `insert` into this
        // entry is ordered after this store by the free list (same thread, or its mutex).
        entry.state.store(u64::from(next) << GEN_SHIFT, Ordering::Relaxed);
        self.free_entry_in(l, entry, index);
    }

    #[inline]
    fn entry(&self, index: u32) -> Option<&'static Entry<T>> {
        let (k, off) = locate(index);
        // SYNC POINT with the Release compare-and-swap in `chunk`: the entries are initialised.
        let base = self.chunks.get(k)?.load(Ordering::Acquire);
        if base.is_null() {
            return None;
        }
        // SAFETY: chunk `k` holds `FIRST_CHUNK << k` entries, `off` is below that (see `locate`),
        // and chunks are never freed.
        Some(unsafe { &*base.add(off) })
    }

    /// Makes sure the chunk of `index` exists.
    fn chunk(&'static self, index: u32) {
        let (k, _) = locate(index);
        // SYNC POINT with the Release compare-and-swap below (another thread's allocation).
        if !self.chunks[k].load(Ordering::Acquire).is_null() {
            return;
        }
        let first = (FIRST_CHUNK * ((1 << k) - 1)) as u32;
        let entries: Box<[Entry<T>]> = (0..(FIRST_CHUNK << k) as u32)
            .map(|i| Entry {
                state: AtomicU64::new(u64::from(FIRST_GEN) << GEN_SHIFT),
                obj: UnsafeCell::new(MaybeUninit::uninit()),
                table: self,
                index: first + i,
            })
            .collect();
        let p = Box::into_raw(entries).cast::<Entry<T>>();
        // SYNC POINT with the Acquire loads in `entry` and above: the entries are initialised
        // before the chunk is visible.
        if self.chunks[k].compare_exchange(ptr::null_mut(), p, Ordering::Release, Ordering::Acquire).is_err() {
            // Another thread installed the chunk first: ours was never shared.
            // SAFETY: `p` came from `Box::into_raw` of a slice of this length just above.
            drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(p, FIRST_CHUNK << k)) });
        }
    }

    /// A never-used index (with its chunk), or `None` when the table is full.
    #[cold]
    fn fresh(&'static self) -> Option<u32> {
        let index = self.next.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n < MAX_ENTRIES).then_some(n + 1)).ok()?;
        self.chunk(index);
        Some(index)
    }

    fn lock_overflow(&self) -> std::sync::MutexGuard<'_, Vec<u32>> {
        self.overflow.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[inline]
    fn alloc_entry_in(&'static self, l: &Local<T>) -> Option<&'static Entry<T>> {
        let n = l.nfree.get();
        if n > 0 && l.life.get() == Life::Ready {
            l.nfree.set(n - 1);
            // SAFETY: the cache holds pointers to entries of this table, which are never freed.
            return Some(unsafe { &*l.free[n - 1].get() });
        }
        self.alloc_entry_slow()
    }

    #[cold]
    fn alloc_entry_slow(&'static self) -> Option<&'static Entry<T>> {
        let refilled = self.local.with(|l| {
            if !self.ready(l) {
                return None;
            }
            let mut g = self.lock_overflow();
            let n = g.len().min(FREE_BATCH);
            if n == 0 {
                return None;
            }
            let from = g.len() - n;
            for (c, &i) in l.free.iter().zip(&g[from..]) {
                c.set(self.entry(i).expect("a freed index has its chunk"));
            }
            g.truncate(from);
            l.nfree.set(n - 1);
            // SAFETY: as in `alloc_entry_in`.
            Some(unsafe { &*l.free[n - 1].get() })
        });
        // Thread exiting, or nothing on the global list: the global list, else a new index.
        let index = match refilled {
            Some(e) => return Some(e),
            None => self.lock_overflow().pop().or_else(|| self.fresh())?,
        };
        Some(self.entry(index).expect("an allocated index has its chunk"))
    }

    #[inline]
    fn free_entry_in(&'static self, l: &Local<T>, entry: &'static Entry<T>, index: u32) {
        let n = l.nfree.get();
        if n < CACHE_CAP && l.life.get() == Life::Ready {
            l.free[n].set(entry);
            l.nfree.set(n + 1);
            return;
        }
        self.free_entry_slow(entry, index);
    }

    #[cold]
    fn free_entry_slow(&'static self, entry: &'static Entry<T>, index: u32) {
        let cached = self.local.with(|l| {
            if !self.ready(l) {
                return false;
            }
            let mut n = l.nfree.get();
            if n == CACHE_CAP {
                n = CACHE_CAP - FREE_BATCH;
                // SAFETY: as in `alloc_entry_in`.
                self.lock_overflow().extend(l.free[n..].iter().map(|e| unsafe { (*e.get()).index }));
            }
            l.free[n].set(entry);
            l.nfree.set(n + 1);
            true
        });
        if !cached {
            self.lock_overflow().push(index);
        }
    }

    /// Indices ever given out (for tests).
    #[cfg(test)]
    fn used(&self) -> u32 {
        self.next.load(Ordering::Relaxed)
    }

    /// References counted on the entry behind `h` (for tests).
    #[cfg(test)]
    fn refs(&self, h: usize) -> u64 {
        self.entry(decode(h).unwrap().0).unwrap().state.load(Ordering::Relaxed) & REFS_MASK
    }

    /// Sets the generation of the vacant entry behind a handle's index (for tests).
    #[cfg(test)]
    fn set_vacant_gen(&self, h: usize, gen: u32) {
        let (index, _) = decode(h).unwrap();
        let e = self.entry(index).unwrap();
        assert_eq!(e.state.load(Ordering::Relaxed) >> KIND_SHIFT & 7, 0, "entry is vacant");
        e.state.store(u64::from(gen) << GEN_SHIFT, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::mpsc;
    use std::sync::Arc;

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
}

#[cfg(test)]
mod timing {
    use super::*;
    use std::time::Instant;

    #[allow(dead_code)] // only moved around
    struct Big([u64; 11]);

    /// `cargo test --release -p colo-ffi timing -- --ignored --nocapture`
    #[test]
    #[ignore = "timing, not a test"]
    fn table_operations() {
        thread_local! {
            static LOCAL: Local<Big> = const { Local::new() };
            static GUARD: Guard<Big> = const { Guard::new() };
        }
        static T: Table<Big> = Table::new(&LOCAL, &GUARD);
        let n = 5_000_000u64;
        let c = T.insert(2, Big([1; 11])).ok().unwrap();
        let t0 = Instant::now();
        for i in 0..n {
            let h = T.insert(1, Big([i; 11])).ok().unwrap();
            let b = T.take(std::hint::black_box(h), 1, |_| Ok::<(), ()>(())).ok().unwrap();
            std::hint::black_box(b);
        }
        let t1 = Instant::now();
        for _ in 0..n {
            std::hint::black_box(&*T.get(std::hint::black_box(c), 2).unwrap());
        }
        let t2 = Instant::now();
        for _ in 0..n {
            std::hint::black_box(&*T.get_cached(std::hint::black_box(c), 2).unwrap());
        }
        let t3 = Instant::now();
        let ns = |a: Instant, b: Instant| (b - a).as_nanos() as f64 / n as f64;
        println!("insert+take {:.1} ns, get+drop {:.1} ns, get_cached+drop {:.1} ns", ns(t0, t1), ns(t1, t2), ns(t2, t3));
    }
}
