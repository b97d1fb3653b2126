//! The sleep/wake protocol (spec/WIRE.md section 6), independent of how a side actually blocks.
//!
//! A sleeper exchanges `waiting` to 1, re-checks, and only then blocks; a waker publishes, then
//! exchanges the peer's `waiting` to 0 and rings the doorbell only if it was 1. Every write of
//! `waiting` is an acquire-release exchange, so the flag's modification order is one release
//! sequence: either the waker's exchange comes later and reads 1 (it rings), or the sleeper's comes
//! later and synchronises with the waker's, so the re-check sees the progress. No wake-up is lost.
//! (A fence-based Dekker pairing would do too on paper; this form costs the same one locked
//! instruction on x86 and is verified by the loom model in `tests/loom.rs`.)

use crate::spin::Spinner;
use crate::sync::{AtomicU32, Ordering};

/// `waiting` bit: the side sleeps on its doorbell (the waker rings it: one byte on its end).
pub const SLEEP_DOORBELL: u32 = 1;
/// `waiting` bit: the side sleeps on a futex at the `waiting` word itself (the waker calls
/// `FUTEX_WAKE` on it).
pub const SLEEP_FUTEX: u32 = 2;

/// The bits of a `waiting` word that say how a side sleeps; the rest (`ANNOUNCE_SEQ`) make each
/// announcement's value distinct (spec/WIRE.md section 6).
pub const SLEEP_BITS: u32 = 0xFF;
#[cfg(not(loom))]
const ANNOUNCE_SEQ: u32 = !SLEEP_BITS;

/// A sleep announcement, as [`announce_sleep`] made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Announced {
    /// The word's new value (what a futex sleep must expect).
    pub value: u32,
    /// The `SLEEP_*` bit announced.
    pub bit: u32,
    /// No earlier announcement was pending: the word had no `SLEEP_*` bit, because a wake-up
    /// took them (or nobody had announced). Another thread of this side that announced before
    /// that wake-up and has not looked at its condition since may have lost its wake-up to it
    /// (it was not asleep yet, so the wake-up reached nobody): a side whose waiting threads
    /// take turns sleeping must have them look again.
    pub fresh: bool,
}

/// Announces that this side is about to block the way `bit` says. Follow with a re-check of the
/// condition; the announcement is never withdrawn (see `wait`).
///
/// Each announcement writes a new sequence number into the upper bits. Two threads of one side
/// (a reader and a writer) share the word: without the number, the peer's wake-up (the word back
/// to 0) followed by the other thread's announcement (the same value again) would let a thread
/// that announced before the wake-up go into `FUTEX_WAIT` expecting an unchanged word, and sleep
/// through the progress it waited for (docs/ARCHITECTURE.md, "Two ways to sleep").
#[inline]
pub fn announce_sleep(own_waiting: &AtomicU32, bit: u32) -> Announced {
    // The loom models check the ordering of the protocol, which the sequence number does not
    // change (one acquire-release read-modify-write either way); a compare-and-swap loop would
    // multiply their state space past what CI can explore.
    #[cfg(loom)]
    {
        // SYNC POINT with the exchange in `peer_needs_wake` (as below).
        let old = own_waiting.fetch_or(bit, Ordering::AcqRel);
        Announced { value: old | bit, bit, fresh: old & SLEEP_BITS == 0 }
    }
    #[cfg(not(loom))]
    {
        // Only uniqueness matters here, not ordering: a plain process-wide counter.
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let seq = SEQ.fetch_add(SLEEP_BITS + 1, std::sync::atomic::Ordering::Relaxed).wrapping_add(SLEEP_BITS + 1) & ANNOUNCE_SEQ;
        let mut old = own_waiting.load(Ordering::Relaxed);
        loop {
            let new = seq | (old & SLEEP_BITS) | bit;
            // SYNC POINT with the exchange in `peer_needs_wake`: reading the waker's release
            // exchange (this read-modify-write continues the word's release sequence, as
            // `fetch_or` did) makes its published progress visible to our re-check.
            match own_waiting.compare_exchange_weak(old, new, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Announced { value: new, bit, fresh: old & SLEEP_BITS == 0 },
                Err(now) => old = now,
            }
        }
    }
}

/// Called after publishing progress the peer may wait for. Returns the `SLEEP_*` bits the peer had
/// announced: the caller rings its doorbell for `SLEEP_DOORBELL` and wakes its futex for
/// `SLEEP_FUTEX` (exactly one waker takes the bits, so one sleep costs at most one wake-up).
#[inline]
pub fn peer_needs_wake(peer_waiting: &AtomicU32) -> u32 {
    // SYNC POINT with the RMW in `announce_sleep`: the caller's progress (a Release store made
    // before this call) is released by this exchange.
    peer_waiting.swap(0, Ordering::AcqRel)
}

/// Called by a consumer after it moved `ring_tail` (a Release store): the bits to wake the peer
/// with if it may be blocked waiting for space, else 0. A producer blocks only on a full ring, so
/// a peer that announced a sleep while the ring was not full before our read waits for something
/// else (data from us) and is left asleep: waking it would cost it a futile wake-up per read.
///
/// `was_full()` loads `ring_head` (Acquire) and compares it with the tail before the read.
#[inline]
pub fn peer_needs_space_wake(peer_waiting: &AtomicU32, was_full: impl FnOnce() -> bool) -> u32 {
    // SYNC POINT with the RMW in `announce_sleep`: this read-modify-write (it writes the value it
    // read) takes the latest value of the word's release sequence. If the producer announced
    // before it, we synchronise with that announcement and `was_full` sees the head the producer
    // stored before announcing. If the producer announces after it, its announcement reads ours
    // and its re-check sees our new tail, so it does not sleep.
    if peer_waiting.fetch_or(0, Ordering::AcqRel) == 0 || !was_full() {
        return 0;
    }
    // SYNC POINT with the RMW in `announce_sleep`, as in `peer_needs_wake`.
    peer_waiting.swap(0, Ordering::AcqRel)
}

/// Waits until `check` yields a value: first `check`, then a bounded spin, then the announce /
/// re-check / `block` loop. `announce` makes each announcement ([`announce_sleep`], with the
/// `SLEEP_*` bit the caller chooses; a caller whose threads take turns sleeping also acts on
/// [`Announced::fresh`] there, whatever the re-check then finds). `block(announced)` sleeps that
/// way (`announced.value` is the word a futex sleep expects) until woken, a timeout or the
/// control socket, draining the doorbell if it rang; its error ends the wait. With a spin-only
/// spinner `block` is never called.
pub fn wait<T, E>(
    spinner: &mut Spinner,
    mut check: impl FnMut() -> Result<Option<T>, E>,
    announce: impl FnMut() -> Announced,
    block: impl FnMut(Announced) -> Result<(), E>,
) -> Result<T, E> {
    if let Some(v) = check()? {
        return Ok(v);
    }
    wait_after_miss(spinner, check, announce, block)
}

/// [`wait`] for a caller whose own `check` just found nothing: starts with the spin.
pub fn wait_after_miss<T, E>(
    spinner: &mut Spinner,
    mut check: impl FnMut() -> Result<Option<T>, E>,
    mut announce: impl FnMut() -> Announced,
    mut block: impl FnMut(Announced) -> Result<(), E>,
) -> Result<T, E> {
    let mut found = None;
    let mut failed = None;
    let spun = spinner.spin(|| match check() {
        Ok(Some(v)) => {
            found = Some(v);
            true
        }
        Ok(None) => false,
        Err(e) => {
            failed = Some(e);
            true
        }
    });
    if let Some(e) = failed {
        return Err(e);
    }
    if let Some(v) = found {
        return Ok(v);
    }
    debug_assert!(!spun);
    loop {
        let announced = announce();
        // The flag is left at 1 when the re-check succeeds: another half of this side may be
        // asleep on it, and a stale 1 costs the peer at most one spurious ring.
        if let Some(v) = check()? {
            return Ok(v);
        }
        block(announced)?;
    }
}

/// The non-blocking form of [`wait`]: `drain` empties the doorbell *before* the announcement (a
/// ring that lands after it stays pending, so a readiness poller wakes), then one re-check.
/// `announce` announces a `SLEEP_DOORBELL` sleep (as in [`wait`]). `Ok(None)` means "would
/// block" with `waiting` left at 1.
pub fn poll_once<T, E>(
    mut check: impl FnMut() -> Result<Option<T>, E>,
    drain: impl FnOnce(),
    announce: impl FnOnce() -> Announced,
) -> Result<Option<T>, E> {
    if let Some(v) = check()? {
        return Ok(Some(v));
    }
    poll_after_miss(check, drain, announce)
}

/// [`poll_once`] for a caller whose own `check` just found nothing: drains, announces, looks.
pub fn poll_after_miss<T, E>(
    mut check: impl FnMut() -> Result<Option<T>, E>,
    drain: impl FnOnce(),
    announce: impl FnOnce() -> Announced,
) -> Result<Option<T>, E> {
    drain();
    announce();
    check()
}
