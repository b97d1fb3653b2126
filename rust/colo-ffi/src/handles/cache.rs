//! Cached references (see *Cached references* in the module doc of `handles`): lookups that take
//! a reference from this thread's [`Local`] slots, and the paths that give references back.

use super::state::{decode, live, BATCH, CLOSED, HELD, HELD_MAX, REFS_MASK};
use super::table::{Entry, Life, Local, Ref, Table};
use std::ptr;
use std::sync::atomic::Ordering;

impl<T: 'static> Table<T> {
    /// As [`Table::get`], through this thread's cached references (see the module doc): usually
    /// a plain load instead of a compare-and-swap. For kinds that may be closed while references
    /// are out (not for [`Table::take`]n ones, whose take would wait for the cached references).
    pub(crate) fn get_cached(&'static self, h: usize, kind: u8) -> Option<Ref<T>> {
        self.cx(|cx| cx.get_cached(h, kind))
    }

    #[inline(always)]
    pub(super) fn get_cached_in(&'static self, l: &Local<T>, h: usize, kind: u8) -> Option<Ref<T>> {
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

    /// Puts a cached `Ref`'s reference back into this thread's slot for its entry; false if there
    /// is none (the caller releases it).
    pub(super) fn put_back(&'static self, entry: &'static Entry<T>) -> bool {
        self.local.with(|l| self.put_back_in(l, entry))
    }

    #[inline]
    pub(super) fn put_back_in(&'static self, l: &Local<T>, entry: &'static Entry<T>) -> bool {
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
}
