//! Entries and free indices (see *Entries* and *Free indices* in the module doc of `handles`):
//! the chunks that hold the entries, vacating an entry under its next generation, and the
//! per-thread and global lists of free indices.

use super::state::{locate, CACHE_CAP, FIRST_CHUNK, FIRST_GEN, FREE_BATCH, GEN_SHIFT, MAX_ENTRIES};
use super::table::{Entry, Life, Local, Table};
use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};

impl<T: 'static> Table<T> {
    /// Marks an entry whose object is gone as vacant under the next generation and frees its
    /// index; retires it instead when the generation would wrap.
    pub(super) fn vacate(&'static self, entry: &'static Entry<T>, index: u32, gen: u32) {
        self.local.with(|l| self.vacate_in(l, entry, index, gen));
    }

    #[inline]
    pub(super) fn vacate_in(&'static self, l: &Local<T>, entry: &'static Entry<T>, index: u32, gen: u32) {
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
    pub(super) fn entry(&self, index: u32) -> Option<&'static Entry<T>> {
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

    pub(super) fn lock_overflow(&self) -> std::sync::MutexGuard<'_, Vec<u32>> {
        self.overflow.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[inline]
    pub(super) fn alloc_entry_in(&'static self, l: &Local<T>) -> Option<&'static Entry<T>> {
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
}
