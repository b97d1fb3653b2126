//! Wake-up eventfds: one per thread that sleeps on a side's doorbell (and one per epoll set the
//! LD_PRELOAD shim sleeps on), registered with the side while it sleeps (`Shm::add_waker`) so
//! that another thread's drain of the doorbell, which takes the ring it waited for, rings it
//! instead (`Shm::drain_doorbell`).
//!
//! They are never closed: a drain may ring one just after its sleeper removed it, and a closed
//! number could by then be another file of the application's. A thread's goes back to a pool of
//! this process's when the thread exits, for the next thread to take. Each is remembered with
//! the pid that made it: a forked child makes its own (the copies it inherits are its parent's
//! eventfds, and are left alone).

use colo_sys::RawFd;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Wake-up eventfds nobody uses now, `(pid that made it, fd)`.
static POOL: Mutex<Vec<(u32, RawFd)>> = Mutex::new(Vec::new());

/// Numbers of wake-up eventfds the application took (`give_up`), each with the count of
/// `give_up`s made before it: a thread that took its eventfd before then holds a number that is
/// the application's now.
static GIVEN_UP: Mutex<Vec<(RawFd, u64)>> = Mutex::new(Vec::new());

/// How many `give_up`s there have been: while none, a sleep's look at its own costs one load.
static GIVE_UPS: AtomicU64 = AtomicU64::new(0);

/// A thread's wake-up eventfd with the count of `give_up`s when it was taken, given back to
/// `POOL` when the thread exits (unless given up since).
struct Own(Cell<Option<((u32, RawFd), u64)>>);

impl Drop for Own {
    fn drop(&mut self) {
        if let Some((w, since)) = self.0.get() {
            if !given_up(w.1, since) {
                give_back(w);
            }
        }
    }
}

/// Whether the number `fd`, a wake-up eventfd taken when `since` give-ups had been made, was
/// given up to the application since.
fn given_up(fd: RawFd, since: u64) -> bool {
    // Relaxed: `GIVEN_UP`'s lock orders what it holds; a give-up this load misses is one made
    // while the caller's thread was already past its look (see `give_up`).
    GIVE_UPS.load(Ordering::Relaxed) > since && GIVEN_UP.lock().unwrap_or_else(|e| e.into_inner()).iter().any(|&(f, at)| f == fd && at >= since)
}

/// The application is about to put a file of its own on `fd`, a number of the library's (its
/// `dup2` onto the number): if that is a wake-up eventfd of this process's, no sleep takes it
/// from now on (a thread that holds it takes another at its next sleep; one asleep on it now
/// may still have it rung once). Returns whether it was this thread's or a spare one (another
/// thread's is given up all the same).
pub fn give_up(fd: RawFd) -> bool {
    let pid = colo_sys::host::pid();
    let pooled = {
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        let before = pool.len();
        pool.retain(|&w| w != (pid, fd));
        pool.len() != before
    };
    let mine = OWN.try_with(|own| own.0.get().is_some_and(|((p, f), _)| p == pid && f == fd)).unwrap_or(false);
    let mut list = GIVEN_UP.lock().unwrap_or_else(|e| e.into_inner());
    let at = GIVE_UPS.load(Ordering::Relaxed);
    list.retain(|&(f, _)| f != fd);
    list.push((fd, at));
    GIVE_UPS.store(at + 1, Ordering::Relaxed);
    drop(list);
    pooled || mine
}

thread_local! {
    static OWN: Own = const { Own(Cell::new(None)) };
}

/// A wake-up eventfd of this process's from the pool, or a new one: `(pid, fd)`. `None` if none
/// can be made (the sleep then does without one).
pub fn take() -> Option<(u32, RawFd)> {
    let pid = colo_sys::host::pid();
    let spare = {
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        pool.iter().position(|&(p, _)| p == pid).map(|i| pool.swap_remove(i).1)
    };
    let fd = match spare {
        Some(fd) => fd,
        // Above the floor the shim keeps its descriptors at, as the connections' are: away from
        // the low numbers an application's close sweep or its next `open` would hit.
        None => colo_sys::IntoRawFd::into_raw_fd(
            colo_sys::preload::move_above(colo_sys::doorbell::create().ok()?, crate::floor::fd_floor()).ok()?,
        ),
    };
    Some((pid, fd))
}

/// Gives a wake-up eventfd from `take` back to the pool, emptied.
pub fn give_back(w: (u32, RawFd)) {
    if w.0 == colo_sys::host::pid() {
        // SAFETY: one of our wake-up eventfds, never closed.
        colo_sys::doorbell::drain(unsafe { colo_sys::BorrowedFd::borrow_raw(w.1) });
    }
    POOL.lock().unwrap_or_else(|e| e.into_inner()).push(w);
}

/// This thread's wake-up eventfd, taken at its first sleep and kept until the thread exits.
pub fn own_fd() -> Option<RawFd> {
    let pid = colo_sys::host::pid();
    OWN.try_with(|own| {
        if let Some(((made_by, fd), since)) = own.0.get() {
            if made_by == pid && !given_up(fd, since) {
                return Some(fd);
            }
        }
        let since = GIVE_UPS.load(Ordering::Relaxed);
        let w = take()?;
        own.0.set(Some((w, since)));
        Some(w.1)
    })
    .ok()
    .flatten()
}

/// Forgets this thread's wake-up eventfd: the application closed it (a `poll` reported it
/// invalid), so the number is no longer ours. The next sleep takes another.
pub fn forget_own() {
    let _ = OWN.try_with(|own| own.0.set(None));
}
