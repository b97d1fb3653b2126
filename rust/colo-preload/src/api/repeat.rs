//! An `EPOLL_CTL_MOD` that changes nothing is answered without the kernel.
//!
//! Event loops in the style of redis's `ae` (redis, redis-benchmark, wrk) modify a registration
//! to what it already is, some of them on every request. For a level-triggered registration
//! without `EPOLLONESHOT` the kernel's answer is success and nothing else: `ep_modify` queues
//! the item if it is ready and not queued, and a ready level-triggered item is queued already
//! (by its wake-up, or again after each report). So the shim remembers each plain descriptor's last such registration and
//! answers a repeat itself. Edge-triggered and one-shot registrations are not remembered: for
//! them a repeat re-arms, and the kernel must see it.
//!
//! What is remembered must be what the kernel holds, so it is trusted only where the shim sees
//! every change:
//! - in an epoll set this process image created with `epoll_create` since its last fork (a forked
//!   child shares the set) and never duplicated (a change through the other number is not the
//!   set's, to the shim);
//! - changed so far by one thread alone, and not now being changed by it (a signal handler that
//!   interrupts the change): a second change would pass by the first one's memory. A set another
//!   change reaches is shared for good;
//! - for a registration whose `data` is its own fd number, as `ae` makes them: one word then
//!   holds set, events and fd, and no reader sees half of an update.
//!
//! A set is named by its incarnation, not its number: one closed and made again at the same
//! number has none of the old one's registrations. Closing a descriptor (also `close_range` and
//! `syscall(SYS_close)`), `dup2` onto it, or making it (a socket, an accepted connection, a
//! duplicate) forgets it.
//!
//! Not seen, and so not covered: a descriptor closed inside libc (`fclose`, `pclose`,
//! `closedir`, `closefrom`), whose number a non-socket then takes and the program modifies without adding it
//! (the kernel's ENOENT becomes success); a set shared with another process other than by
//! `fork` (inherited without `FD_CLOEXEC` by a `posix_spawn`, `vfork` or `clone` child, passed
//! over a Unix socket, taken with `pidfd_getfd`) whose other holder changes this process's
//! registrations; a driver whose readiness changes without a wake-up, which a program kicks with
//! a repeated MOD. `COLO_DISABLE=1` turns it off with the rest of the shim.

use crate::base::env::disabled;
use crate::conn::table::MAX_FD;
use libc::{c_int, epoll_event};
use std::sync::atomic::{AtomicU64, Ordering};

/// Per fd: its last remembered registration (`remembered`), 0 if none.
static LAST: [AtomicU64; MAX_FD] = [const { AtomicU64::new(0) }; MAX_FD];
/// Per epoll set: the `generation()` when this image created it (0: not created here, or no
/// longer trusted).
static BORN: [AtomicU64; MAX_FD] = [const { AtomicU64::new(0) }; MAX_FD];
/// Per epoll set: its incarnation, a number no other set of this image had (31 bits of it are
/// remembered: a stale memory could pass for a set made 2^31 sets later).
static INCARNATION: [AtomicU64; MAX_FD] = [const { AtomicU64::new(0) }; MAX_FD];
static INCARNATIONS: AtomicU64 = AtomicU64::new(1);
/// Per epoll set: the thread (`pthread_self`) that alone has changed it, with `IN_FLIGHT` while
/// it is changing it; 0 before any change, `SHARED` once another change reached it.
static OWNER: [AtomicU64; MAX_FD] = [const { AtomicU64::new(0) }; MAX_FD];
const SHARED: u64 = u64::MAX;
/// A `pthread_t` is the address of an aligned thread descriptor: its low bit is free.
const IN_FLIGHT: u64 = 1;

/// Moves on before and after each fork (in the parent and in the child): a set born before it
/// may be changed by another process from then on. Never 0.
fn generation() -> u64 {
    colo_sys::host::forks() + 1
}

/// Flags under which a repeated registration does something (re-arms an edge or a one-shot),
/// that the kernel refuses to modify (`EPOLLEXCLUSIVE`), or that it may drop (`EPOLLWAKEUP`,
/// without `CAP_BLOCK_SUSPEND`).
const NOT_REMEMBERED: u32 = (libc::EPOLLET | libc::EPOLLONESHOT | libc::EPOLLEXCLUSIVE | libc::EPOLLWAKEUP) as u32;

fn index(fd: c_int) -> Option<usize> {
    usize::try_from(fd).ok().filter(|&i| i < MAX_FD)
}

fn me() -> u64 {
    // SAFETY: no preconditions.
    unsafe { libc::pthread_self() as u64 }
}

/// The remembered form of registering `fd` in `set` with `ev`, if it can be remembered.
fn remembered(set: usize, fd: c_int, ev: &epoll_event) -> Option<u64> {
    let incarnation = INCARNATION[set].load(Ordering::Relaxed) & 0x7fff_ffff;
    (ev.events & NOT_REMEMBERED == 0 && ev.u64 == fd as u64).then_some(1 << 63 | incarnation << 32 | u64::from(ev.events))
}

/// Whether `set` is trusted and this thread alone has changed it, none of its changes under way.
// Relaxed loads and stores throughout: a change by another thread (or a signal handler) that the
// application ordered before this call (the only kind a repeat could be told apart from)
// happens-before it, and with it that change's `SHARED` mark, made before its system call.
fn owned(set: usize) -> bool {
    BORN[set].load(Ordering::Relaxed) == generation() && OWNER[set].load(Ordering::Relaxed) == me()
}

/// Before this thread changes `set`: whether the set is trusted and this thread alone has changed
/// it (claiming it if nobody has), now marked as changing. Anything else makes it shared.
fn enter(set: usize) -> bool {
    if BORN[set].load(Ordering::Relaxed) != generation() {
        return false;
    }
    let me = me();
    let o = OWNER[set].load(Ordering::Relaxed);
    if (o == me || o == 0) && OWNER[set].compare_exchange(o, me | IN_FLIGHT, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
        return true;
    }
    // Another thread's, this thread's own change under way (a signal handler interrupted it), or
    // taken meanwhile. (A shared set is not written again: threads sharing it keep its line.)
    if o != SHARED {
        OWNER[set].store(SHARED, Ordering::Relaxed);
    }
    false
}

/// After this thread's change of `set` (`enter` said yes): whether no other change came meanwhile.
fn leave(set: usize) -> bool {
    let me = me();
    OWNER[set].compare_exchange(me | IN_FLIGHT, me, Ordering::Relaxed, Ordering::Relaxed).is_ok()
}

fn remember(i: usize, word: u64) {
    // Only a change is written: a descriptor registered in several threads' sets keeps its line
    // shared.
    if LAST[i].load(Ordering::Relaxed) != word {
        LAST[i].store(word, Ordering::Relaxed);
    }
}

/// `epoll_ctl` on a plain descriptor.
pub unsafe fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int {
    let (Some(set), Some(i)) = (index(epfd), index(fd)) else {
        // SAFETY: `crate::real::epoll_ctl` requires what libc's `epoll_ctl` does of these
        // arguments, which the application's call met.
        return unsafe { crate::real::epoll_ctl(epfd, op, fd, ev) };
    };
    let last = LAST[i].load(Ordering::Relaxed);
    // The application's event is read only for a descriptor with a memory in a set of this
    // thread's (a bad pointer is the kernel's EFAULT otherwise).
    if op == libc::EPOLL_CTL_MOD && last != 0 && !ev.is_null() && owned(set) {
        // SAFETY: the application's event.
        if remembered(set, fd, unsafe { &*ev }) == Some(last) {
            return 0;
        }
    }
    let mine = enter(set);
    // SAFETY: `crate::real::epoll_ctl` requires what libc's `epoll_ctl` does of these arguments,
    // which the application's call met.
    let r = unsafe { crate::real::epoll_ctl(epfd, op, fd, ev) };
    let word = if r == 0 && mine && op != libc::EPOLL_CTL_DEL && !ev.is_null() {
        // SAFETY: the application's event, which the kernel just read.
        remembered(set, fd, unsafe { &*ev }).unwrap_or(0)
    } else {
        0
    };
    // Written before `leave`: a change that interrupts this thread between the two finds the set
    // in flight, and this memory is taken back.
    remember(i, word);
    if mine && !leave(set) {
        remember(i, 0);
    }
    r
}

/// A change to `epfd` that is not a plain descriptor's (`poll::epoll_ctl_slow`), before its
/// system call: another thread's makes the set shared.
pub fn touch(epfd: c_int) {
    if let Some(set) = index(epfd) {
        if enter(set) {
            leave(set);
        }
    }
}

/// After `epoll_create` returned `fd`; `forks` is `before_create()`'s answer.
pub fn created(fd: c_int, forks: u64) {
    let Some(i) = index(fd) else { return };
    LAST[i].store(0, Ordering::Relaxed);
    OWNER[i].store(0, Ordering::Relaxed);
    INCARNATION[i].store(INCARNATIONS.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
    BORN[i].store(if disabled() { 0 } else { forks }, Ordering::Relaxed);
}

/// Read before the set is created: a fork between this and the creation leaves the set
/// untrusted (the child may have it), never the other way round.
pub fn before_create() -> u64 {
    generation()
}

/// `fd` was closed, replaced or newly made: nothing of it is remembered, and as a set it is not
/// trusted.
#[inline]
pub fn forget(fd: c_int) {
    if let Some(i) = index(fd) {
        remember(i, 0);
        untrust(i);
    }
}

/// `close_range(first, last)` or `closefrom(first)`.
pub fn forget_range(first: u32, last: u32) {
    for fd in first..=last.min(MAX_FD as u32 - 1) {
        forget(fd as c_int);
    }
}

/// `fd` was duplicated as `new`: `new` is a new descriptor, and a change through it is not `fd`'s
/// set's to the shim.
#[inline]
pub fn duplicated(fd: c_int, new: c_int) {
    if let Some(i) = index(fd) {
        untrust(i);
    }
    forget(new);
}

fn untrust(i: usize) {
    if BORN[i].load(Ordering::Relaxed) != 0 {
        BORN[i].store(0, Ordering::Relaxed);
    }
}
