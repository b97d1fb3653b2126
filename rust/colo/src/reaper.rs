//! Segments are unmapped on a background thread: unmapping a shared mapping is the slowest step
//! of a close (TLB shoot-downs), and nothing refers to a retired segment any more.

use crate::fork;
use crate::segment::Segment;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The reaper ends after this long without work (the next retirement starts another): a
/// server whose accelerated connections are gone (its clients' connections turned out
/// short-lived, and went plain TCP) is single-threaded again, and the kernel looks up its
/// descriptors without the reference counting a second thread costs every system call.
const IDLE: Duration = Duration::from_millis(250);

/// The reaper takes what was retired this often, not at each retirement: waking it for every
/// closed connection cost a futex wake and two context switches a connection (on a host whose
/// CPUs the two ends keep busy, a preemption of one of them), when a connection per request
/// retires thousands of segments a second. Only their address space and the few pages they
/// touched wait meanwhile.
const BATCH: Duration = Duration::from_millis(10);

/// Beyond this many waiting, a retirement wakes the reaper at once.
const WAKE_AT: usize = 64;

/// What waits to be dropped, the pid whose reaper takes it (a forked child starts its own),
/// whether that reaper runs, and whether this pid retired a segment yet.
struct Queue {
    pid: u32,
    segs: Vec<Segment>,
    running: bool,
    retired: bool,
}

// Locked at every fork: kept with what the fork handlers write (see `colo_sys::host`).
#[link_section = "colo_fork"]
static REAPER: Mutex<Queue> = Mutex::new(Queue { pid: 0, segs: Vec::new(), running: false, retired: false });
/// Wakes the reaper before its `BATCH` is up (`WAKE_AT`).
static FULL: Condvar = Condvar::new();

static LOCKS: fork::Locks = fork::Locks { take: fork_guard, in_child: None };

/// The reaper's lock, taken around a fork (see `fork`).
fn fork_guard(held: &mut fork::Held) {
    held.hold(REAPER.lock().unwrap_or_else(|e| e.into_inner()));
}

/// The reaper's queue, locked (registered with `fork` before its first use).
fn lock() -> std::sync::MutexGuard<'static, Queue> {
    fork::protect(fork::Rank::Reaper, &LOCKS);
    REAPER.lock().unwrap_or_else(|e| e.into_inner())
}

/// Drops `seg` on the reaper thread within `BATCH` (inline if that thread cannot be started).
/// A process's first segment (since its start, or its fork) is dropped inline: a thread costs
/// more to start than one unmapping, and a fork child that served one connection exits next.
/// The reaper starts at the second.
pub(crate) fn retire(seg: Segment) {
    let me = colo_sys::host::pid();
    let mut q = lock();
    if q.pid != me {
        // A fork child's copy of its parent's queue: those segments are the parent's to drop
        // (their descriptors and mappings here are copies nobody uses; they go with this
        // process), and the parent's reaper does not run here.
        std::mem::forget(std::mem::take(&mut q.segs));
        q.pid = me;
        q.running = false;
        q.retired = false;
    }
    if !std::mem::replace(&mut q.retired, true) {
        drop(q);
        drop(seg);
        return;
    }
    if !q.running {
        drop_at_exit();
        if colo_sys::host::spawn("colo-reaper", move || run(me)).is_err() {
            drop(q);
            drop(seg);
            return;
        }
        q.running = true;
    }
    q.segs.push(seg);
    if q.segs.len() >= WAKE_AT {
        FULL.notify_one();
    }
}

/// Makes the process's `exit` drop the segments still waiting here (`at_exit`); called before
/// the first is queued.
fn drop_at_exit() {
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    // SAFETY: `at_exit` is an `extern "C" fn()` of this library, which glibc runs before it
    // unloads the library (`__cxa_atexit` with the library's handle) or at exit.
    AT_EXIT.call_once(|| unsafe {
        libc::atexit(at_exit);
    });
}

/// At the process's `exit`: what still waits is dropped in the exiting thread (as the client's
/// parked segments are by `recycle`'s), so that what a segment does when dropped (a last close's give-back
/// of the pages it read, `Segment::give_back_incoming`) is not lost with the process: a client
/// that closes and exits at once would otherwise leave the pages a hostile server made it
/// allocate charged to it. Not if another thread holds the queue (the reaper has what it took,
/// and the process may end under it), nor in a fork child whose queue is its parent's.
extern "C" fn at_exit() {
    let Ok(mut q) = REAPER.try_lock() else { return };
    if q.pid != colo_sys::host::pid() {
        return;
    }
    let segs = std::mem::take(&mut q.segs);
    drop(q);
    drop(segs);
}

fn run(me: u32) {
    let mut last_work = Instant::now();
    let mut q = lock();
    loop {
        if q.pid != me {
            return;
        }
        if !q.segs.is_empty() {
            let segs = std::mem::take(&mut q.segs);
            drop(q);
            drop(segs);
            last_work = Instant::now();
            q = lock();
            continue;
        }
        if last_work.elapsed() >= IDLE {
            // Retirements are queued under this lock: with none queued, none is coming to this
            // thread once it is marked stopped.
            q.running = false;
            return;
        }
        q = FULL.wait_timeout(q, BATCH).map_or_else(|e| e.into_inner().0, |r| r.0);
    }
}
