//! The record of the library's own descriptors placed out of the application's way
//! (`preload::move_all_above`): a connection's control socket and self bell, the holders page, a
//! listener's rendezvous, the offer service's socket pair. Over TCP those numbers are not open,
//! so the application's closes must not reach them: a `close_range` or `closefrom` that spans
//! them (a forked child closing all but its connection) is made around them ([`in_range`]), and
//! a `close` of one of them (a daemon's loop over every number up to its limit) fails with
//! `EBADF`, as over TCP ([`refused`]).
//!
//! The library's own closes of them go through the same `close` symbol: the shim tells them
//! by their caller (code inside the shim) and calls [`closing`] for those, which forgets the
//! number first. A number closed past the record (a raw system call, a fork child's handler,
//! which writes nothing it need not) is forgotten when next looked at, as its file changed.
//! A number the application takes with `dup2` while something of the library's still holds it
//! is its from then on: the library's own close of it closes nothing ([`give_away`]).

use rustix::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, TryLockError};

/// Each placed number with the device and inode of what was placed there.
static PLACED: Mutex<BTreeMap<i32, (u64, u64)>> = Mutex::new(BTreeMap::new());

/// Numbers the application took with `dup2` while something of the library's still held them
/// ([`give_away`]): the library's own close of such a number closes nothing ([`closing`]).
/// Locked inside [`PLACED`]'s lock where both are taken.
static GIVEN: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// Numbers below this have a bit in [`HINT`]; those above count in [`HIGH`].
const HINTED: usize = 1 << 20;

/// One bit a number, set while [`PLACED`] holds it (changed under its lock): a `close` of any
/// other number costs one load ([`maybe`]). 128 KiB of zero pages, touched only where numbers
/// are placed.
static HINT: [AtomicU64; HINTED / 64] = [const { AtomicU64::new(0) }; HINTED / 64];

/// How many numbers at or above [`HINTED`] may be recorded.
static HIGH: AtomicUsize = AtomicUsize::new(0);

/// Whether `fd` may be one of the library's placed descriptors (no false negatives).
#[inline]
pub fn maybe(fd: i32) -> bool {
    match usize::try_from(fd) {
        Ok(n) if n < HINTED => HINT[n / 64].load(Relaxed) & (1 << (n % 64)) != 0,
        Ok(_) => HIGH.load(Relaxed) != 0,
        Err(_) => false,
    }
}

fn hint(fd: i32, on: bool) {
    match usize::try_from(fd) {
        Ok(n) if n < HINTED => {
            let bit = 1 << (n % 64);
            if on {
                HINT[n / 64].fetch_or(bit, Relaxed);
            } else {
                HINT[n / 64].fetch_and(!bit, Relaxed);
            }
        }
        Ok(_) if on => {
            HIGH.fetch_add(1, Relaxed);
        }
        Ok(_) => {
            HIGH.fetch_sub(1, Relaxed);
        }
        Err(_) => {}
    }
}

/// [`PLACED`], or `None` if it cannot be had soon: a thread that held it when this process
/// was forked never lets go of it in the child.
fn record() -> Option<MutexGuard<'static, BTreeMap<i32, (u64, u64)>>> {
    soon(&PLACED)
}

/// `m` locked, or `None` if it cannot be had soon (see [`record`]).
fn soon<T>(m: &'static Mutex<T>) -> Option<MutexGuard<'static, T>> {
    for _ in 0..100 {
        match m.try_lock() {
            Ok(g) => return Some(g),
            Err(TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => std::thread::yield_now(),
        }
    }
    None
}

/// The device and inode of what `fd` refers to, if it is open.
fn identity(fd: i32) -> Option<(u64, u64)> {
    // SAFETY: only looked at; a number not open fails the `fstat`.
    let st = rustix::fs::fstat(unsafe { BorrowedFd::borrow_raw(fd) }).ok()?;
    Some((st.st_dev as u64, st.st_ino as u64))
}

/// Records `fds` as the library's.
pub(crate) fn note(fds: &[OwnedFd]) {
    let Some(mut map) = record() else { return };
    let given = soon(&GIVEN);
    for fd in fds {
        let n = fd.as_raw_fd();
        if let Some(id) = identity(n) {
            // A number given away keeps its hint until the library's close of it.
            if map.insert(n, id).is_none() && !given.as_ref().is_some_and(|g| g.contains(&n)) {
                hint(n, true);
            }
        }
    }
}

fn forget(map: &mut BTreeMap<i32, (u64, u64)>, fd: i32) {
    if map.remove(&fd).is_some() && !soon(&GIVEN).is_some_and(|g| g.contains(&fd)) {
        hint(fd, false);
    }
}

/// The application's `dup2` is about to put a file of its own on `fd`, a number the library
/// placed something at and cannot let go of first (another thread still uses it): the number is
/// the application's from now on, and the library's own later close of it closes nothing
/// (see [`closing`]).
pub fn give_away(fd: i32) {
    let Some(mut map) = record() else { return };
    if map.remove(&fd).is_none() {
        return;
    }
    // The hint stays (the library's close must come to `closing`).
    if let Some(mut g) = soon(&GIVEN) {
        if !g.contains(&fd) {
            g.push(fd);
        }
    } else {
        hint(fd, false);
    }
}

/// How many numbers the record holds (some may have been closed past it: see [`live`]).
pub fn held() -> usize {
    record().map_or(0, |map| map.len())
}

/// How many of the record's numbers are still open on what was placed there; the others are
/// forgotten.
pub fn live() -> usize {
    in_range(0, i32::MAX as u32).len()
}

/// The library is about to close `fd` itself: it is no longer one of its placed descriptors.
/// Returns whether to close it: not if the application took the number ([`give_away`]), whose
/// file it is now.
pub fn closing(fd: i32) -> bool {
    if !maybe(fd) {
        return true;
    }
    let Some(mut map) = record() else { return true };
    let taken = soon(&GIVEN).is_some_and(|mut g| {
        let at = g.iter().position(|&f| f == fd);
        at.map(|i| g.swap_remove(i)).is_some()
    });
    if !taken {
        forget(&mut map, fd);
        return true;
    }
    if !map.contains_key(&fd) {
        hint(fd, false);
    }
    false
}

/// Whether the application's `close(fd)` must fail with `EBADF` and leave `fd` open: it is one
/// of the library's placed descriptors, still open on what was placed there. A number whose file
/// changed (closed past the library, and taken by something else) is forgotten.
pub fn refused(fd: i32) -> bool {
    !in_range(fd as u32, fd as u32).is_empty()
}

/// The library's descriptors from `first` to `last`, in order: those still open on what was
/// placed there. A number whose file changed is forgotten. An anonymous inode is one for all
/// eventfds, so an eventfd of the application's that took the number of one of the library's
/// eventfds closed past the library counts as the library's.
pub fn in_range(first: u32, last: u32) -> Vec<i32> {
    let lo = i32::try_from(first).unwrap_or(i32::MAX);
    let hi = i32::try_from(last).unwrap_or(i32::MAX);
    if lo > hi {
        return Vec::new();
    }
    let Some(mut map) = record() else { return Vec::new() };
    let mut keep = Vec::new();
    let mut gone = Vec::new();
    for (&fd, &id) in map.range(lo..=hi) {
        if identity(fd) == Some(id) {
            keep.push(fd);
        } else {
            gone.push(fd);
        }
    }
    for fd in gone {
        forget(&mut map, fd);
    }
    keep
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_placed_number_is_hinted_until_the_library_closes_it() {
        let fd = crate::preload::move_above(rustix::pipe::pipe().unwrap().0, 5000).unwrap();
        let n = fd.as_raw_fd();
        assert!(maybe(n) && refused(n), "placed and open: the application's close is refused");
        assert!(!maybe(n + 1) && !refused(n + 1), "a neighbour is not the library's");
        closing(n);
        drop(fd);
        assert!(!maybe(n) && !refused(n), "closed by the library: forgotten");
    }

    #[test]
    fn a_number_given_away_is_the_applications_and_the_library_closes_nothing_there() {
        let fd = crate::preload::move_above(rustix::pipe::pipe().unwrap().0, 7000).unwrap();
        let n = fd.as_raw_fd();
        give_away(n);
        assert!(!refused(n), "the application's number: its close is not refused");
        assert!(maybe(n), "still hinted: the library's own close comes to `closing`");
        assert!(!closing(n), "the library's own close of it closes nothing");
        assert!(!maybe(n) && closing(n), "once: forgotten after that");
        drop(fd);
    }

    #[test]
    fn a_number_closed_past_the_record_and_taken_again_is_the_new_owners() {
        let fd = crate::preload::move_above(rustix::pipe::pipe().unwrap().0, 6000).unwrap();
        let n = fd.as_raw_fd();
        // Closed without telling the record, and the number given to another file.
        drop(fd);
        let other = std::fs::File::open("/proc/self/stat").unwrap();
        // SAFETY: `n` is free (closed just above); dup2 makes it a copy of `other`.
        assert_eq!(unsafe { libc::dup2(other.as_raw_fd(), n) }, n);
        assert!(!refused(n), "another file on the number: not the library's");
        assert!(!maybe(n), "... and forgotten");
        // SAFETY: the copy made above, ours.
        unsafe { libc::close(n) };
    }
}
