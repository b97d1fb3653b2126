//! Counted references: inserting an object, looking it up ([`Table::get`]), closing and taking
//! its handle, and the compare-and-swaps on the state word that they are made of.

use super::state::{decode, encode, gen_of, live, CLOSED, HELD, REFS_MASK};
use super::table::{Entry, Local, Ref, Table, TakeError, Taken};
use std::ptr;
use std::sync::atomic::{fence, Ordering};

impl<T: 'static> Table<T> {
    /// Stores `obj` as a new open object of `kind` (1 to 7) and returns its handle, which holds
    /// the owner reference. Gives `obj` back if the table is full ([`MAX_ENTRIES`]).
    ///
    /// [`MAX_ENTRIES`]: super::state::MAX_ENTRIES
    #[cfg(test)]
    pub(crate) fn insert(&'static self, kind: u8, obj: T) -> Result<usize, T> {
        self.cx(|cx| cx.insert_with(kind, || obj)).map_err(|make| make())
    }

    #[inline(always)]
    pub(super) fn insert_in<F: FnOnce() -> T>(&'static self, l: &Local<T>, kind: u8, make: F) -> Result<usize, F> {
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
    pub(super) fn take_in<'a, E>(&'static self, l: &'a Local<T>, h: usize, kind: u8, check: impl FnOnce(&T) -> Result<(), E>) -> Result<Taken<'a, T>, TakeError<E>> {
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
    pub(super) fn acquire(&self, entry: &Entry<T>, want: u64, n: u32) -> Option<()> {
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
    pub(super) fn release(&'static self, entry: &'static Entry<T>, n: u32) {
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
}
