//! The types of the handle table ([`Table`], its entries, the counted [`Ref`], the per-call
//! [`Cx`], the [`Taken`] guard) and each thread's side of it ([`Local`], [`Guard`], registered
//! on first use and given back when the thread exits). The table's operations are in the sibling
//! modules: `refs` (insert, look up, close, take), `cache` (cached references), `free` (chunks
//! and free indices).

use super::state::{CACHE_CAP, CHUNKS, HELD};
use std::cell::{Cell, UnsafeCell};
use std::mem::MaybeUninit;
use std::ops::Deref;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64};
use std::sync::Mutex;
use std::thread::LocalKey;

/// One object slot. Aligned to 128 bytes (two cache lines, as the x86 adjacent-line prefetcher
/// pairs them) so that objects used by different threads do not share a line.
#[repr(align(128))]
pub(super) struct Entry<T: 'static> {
    pub(super) state: AtomicU64,
    pub(super) obj: UnsafeCell<MaybeUninit<T>>,
    /// The table and index of this entry (fixed at allocation), so that a [`Ref`] is one pointer.
    pub(super) table: &'static Table<T>,
    pub(super) index: u32,
}

impl<T> Entry<T> {
    /// The object of an entry on which the caller holds a reference.
    ///
    /// # Safety
    /// The caller holds one of the entry's counted references (or owns the entry exclusively), so
    /// the object is initialised and is not dropped or moved for as long as the borrow lives.
    pub(super) unsafe fn obj(&self) -> &T {
        // SAFETY: per this function's contract the object is initialised and stays so; other
        // holders only take shared references to it too.
        unsafe { (*self.obj.get()).assume_init_ref() }
    }
}

/// A thread's cached references on one entry.
pub(super) struct Held<T: 'static> {
    /// While `n > 0`, a live entry on which this slot holds `n` counted references (so it stays
    /// live). With `n == 0` only a hint: a cached `Ref` of that entry dropped on this thread may
    /// put its reference here (it is a reference on the entry's current occupant, the only one a
    /// cached `Ref` can hold), but nothing is read through it.
    pub(super) entry: Cell<*const Entry<T>>,
    pub(super) n: Cell<u32>,
}

/// Whether a thread's [`Local`] may be used: its [`Guard`] is registered and not yet dropped.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Life {
    Fresh,
    Ready,
    Gone,
}

/// A thread's free indices and cached references (see the module doc).
pub(crate) struct Local<T: 'static> {
    pub(super) life: Cell<Life>,
    pub(super) nfree: Cell<usize>,
    /// Free entries (of this table: chunks are never freed, so the pointers stay valid).
    pub(super) free: [Cell<*const Entry<T>>; CACHE_CAP],
    pub(super) held: [Held<T>; HELD],
    /// The table's close epoch when this thread last gave back the references of closed entries.
    pub(super) epoch: Cell<u64>,
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
    pub(super) chunks: [AtomicPtr<Entry<T>>; CHUNKS],
    /// Indices ever given out (the next never-used index).
    pub(super) next: AtomicU32,
    pub(super) overflow: Mutex<Vec<u32>>,
    /// Bumped by a close that leaves references behind (see *Cached references*).
    pub(super) epoch: AtomicU64,
    pub(super) local: &'static LocalKey<Local<T>>,
    pub(super) guard: &'static LocalKey<Guard<T>>,
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
    pub(super) entry: &'static Entry<T>,
    /// From [`Table::get_cached`]: goes back to this thread's cache if it has a slot for the entry.
    pub(super) cached: bool,
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
    pub(super) table: &'static Table<T>,
    pub(super) l: &'a Local<T>,
    pub(super) entry: &'static Entry<T>,
    pub(super) gen: u32,
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

    /// Whether this thread's `Local` may be used; registers its `Guard` on first use.
    #[inline]
    pub(super) fn ready(&'static self, l: &Local<T>) -> bool {
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
}
