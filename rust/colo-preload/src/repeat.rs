//! An `EPOLL_CTL_MOD` that changes nothing is answered without the kernel.
//!
//! Event loops in the style of redis's `ae` (redis, redis-benchmark, wrk) modify a registration
//! to what it already is: wrk does so twice a request, two of its six `epoll_ctl`s, and
//! redis-benchmark once a connection. For a level-triggered registration without `EPOLLONESHOT`
//! the kernel's answer is success and nothing else: `ep_modify` queues the item if it is ready
//! and not queued, and a ready level-triggered item is queued already (by its wake-up, or again
//! after each report). So the shim remembers each descriptor's last such registration and
//! answers a repeat itself. Edge-triggered and one-shot registrations are not remembered: for
//! them a repeat re-arms, and the kernel must see it.
//!
//! What is remembered must be what the kernel holds, so it is trusted only where the shim sees
//! every change: in an epoll set this process image created with `epoll_create` since its last
//! fork (a forked child shares the set), changed so far by one thread alone (a second thread's
//! change would pass by the first thread's memory; the set is then shared for good), for a
//! registration whose `data` is its own fd number (as `ae` does; then one word holds set, events
//! and fd, and no reader sees half of an update). Any other change to a descriptor's
//! registrations, and its closing or replacement, forgets its memory. A set is named by its
//! incarnation, not its number: a set closed and made again at the same number (libev does so
//! in a forked child, and then modifies each fd, adding it on `ENOENT`) has none of the old
//! one's registrations.

use crate::table::MAX_FD;
use libc::{c_int, epoll_event};
use std::sync::atomic::{AtomicU64, Ordering};

/// Per fd: its last remembered registration (`remembered`), 0 if none.
static LAST: [AtomicU64; MAX_FD] = [const { AtomicU64::new(0) }; MAX_FD];
/// Per epoll set: the `FORKS` value when this image created it (0: not created here).
static BORN: [AtomicU64; MAX_FD] = [const { AtomicU64::new(0) }; MAX_FD];
/// Per epoll set: its incarnation, a number no other set of this image had.
static INCARNATION: [AtomicU64; MAX_FD] = [const { AtomicU64::new(0) }; MAX_FD];
static INCARNATIONS: AtomicU64 = AtomicU64::new(1);
/// Per epoll set: the thread (`pthread_self`) that alone has changed it, 0 before any change,
/// `SHARED` once a second thread did.
static OWNER: [AtomicU64; MAX_FD] = [const { AtomicU64::new(0) }; MAX_FD];
const SHARED: u64 = u64::MAX;

/// Bumped before and after each fork (in the parent and in the child): a set born before it may
/// be changed by another process from then on.
static FORKS: AtomicU64 = AtomicU64::new(1);

/// Flags under which a repeated registration does something (re-arms an edge or a one-shot), or
/// that the kernel refuses to modify.
const NOT_REMEMBERED: u32 = (libc::EPOLLET | libc::EPOLLONESHOT | libc::EPOLLEXCLUSIVE | libc::EPOLLWAKEUP) as u32;

fn index(fd: c_int) -> Option<usize> {
    usize::try_from(fd).ok().filter(|&i| i < MAX_FD)
}

/// The remembered form of registering `fd` in `set` with `ev`, if it can be remembered.
fn remembered(set: usize, fd: c_int, ev: &epoll_event) -> Option<u64> {
    let incarnation = INCARNATION[set].load(Ordering::Relaxed) & 0x7fff_ffff;
    (ev.events & NOT_REMEMBERED == 0 && ev.u64 == fd as u64).then_some(1 << 63 | incarnation << 32 | u64::from(ev.events))
}

/// Whether this thread alone has changed `epfd`, a set this image created since its last fork;
/// claims a set nobody has changed yet, and marks one another thread changed as shared.
fn mine(set: usize) -> bool {
    if BORN[set].load(Ordering::Relaxed) != FORKS.load(Ordering::Relaxed) {
        return false;
    }
    // SAFETY: no preconditions.
    let me = unsafe { libc::pthread_self() } as u64;
    // Relaxed throughout: a change by another thread that the application ordered before this
    // call (the only kind a repeat could be told apart from) happens-before it, and with it that
    // thread's `SHARED` store, made before its system call.
    match OWNER[set].load(Ordering::Relaxed) {
        o if o == me => true,
        0 => OWNER[set].compare_exchange(0, me, Ordering::Relaxed, Ordering::Relaxed).is_ok(),
        SHARED => false,
        _ => {
            OWNER[set].store(SHARED, Ordering::Relaxed);
            false
        }
    }
}

/// `epoll_ctl` on a descriptor that is not a colo connection.
pub unsafe fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int {
    let (Some(set), Some(i)) = (index(epfd), index(fd)) else {
        // SAFETY: the application's arguments.
        return unsafe { crate::real::epoll_ctl(epfd, op, fd, ev) };
    };
    // SAFETY: the application's event, if any.
    let word = unsafe { ev.as_ref() }.filter(|_| op != libc::EPOLL_CTL_DEL).and_then(|e| remembered(set, fd, e));
    // Before the system call: a second thread marks the set shared before it changes it.
    let mine = mine(set);
    if mine && op == libc::EPOLL_CTL_MOD && word.is_some() && LAST[i].load(Ordering::Relaxed) == word.unwrap_or(0) {
        return 0;
    }
    // SAFETY: the application's arguments.
    let r = unsafe { crate::real::epoll_ctl(epfd, op, fd, ev) };
    let keep = if r == 0 && mine { word.unwrap_or(0) } else { 0 };
    LAST[i].store(keep, Ordering::Relaxed);
    r
}

/// After `epoll_create` returned `fd`; `forks` is `before_create()`'s answer.
pub fn created(fd: c_int, forks: u64) {
    if let Some(i) = index(fd) {
        LAST[i].store(0, Ordering::Relaxed);
        OWNER[i].store(0, Ordering::Relaxed);
        INCARNATION[i].store(INCARNATIONS.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
        BORN[i].store(forks, Ordering::Relaxed);
    }
}

/// Read before the set is created: a fork between this and the creation leaves the set
/// untrusted (the child may have it), never the other way round.
pub fn before_create() -> u64 {
    FORKS.load(Ordering::Relaxed)
}

/// `fd` was closed, replaced (`dup2` onto it) or newly made (a socket, an accepted connection,
/// a duplicate: its number may have been closed behind the shim's back): nothing of it is
/// remembered, and as a set it is not trusted.
#[inline]
pub fn forget(fd: c_int) {
    if let Some(i) = index(fd) {
        LAST[i].store(0, Ordering::Relaxed);
        if BORN[i].load(Ordering::Relaxed) != 0 {
            BORN[i].store(0, Ordering::Relaxed);
        }
    }
}

/// Around each fork, in the parent before and after it and in the child: every set existing now
/// is shared with the child.
pub fn forking() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}
