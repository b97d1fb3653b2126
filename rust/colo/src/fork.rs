//! `fork(2)` in a threaded process copies only the forking thread: a lock another thread held at
//! that instant would stay locked forever in the child. So around every fork the forking thread
//! takes all of colo's process-wide locks (`pthread_atfork`) and releases them on both sides.
//! Order matters: a thread may hold one of the first while it waits for a later one (the caches
//! hand segments to the reaper), never the reverse.

use std::any::Any;
use std::cell::RefCell;

thread_local! {
    /// The guards the forking thread holds between `prepare` and `parent`/`child`.
    static HELD: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

extern "C" fn prepare() {
    let mut guards = crate::handshake::fork_guards();
    guards.extend(crate::recycle::fork_guards());
    guards.push(crate::reaper::fork_guard());
    guards.push(crate::hangup::fork_guard());
    HELD.with(|h| *h.borrow_mut() = guards);
}

extern "C" fn release() {
    // Dropped in reverse order of taking.
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        while let Some(g) = h.pop() {
            drop(g);
        }
    });
}

extern "C" fn child() {
    // This handler may run before the one that makes the pid cache forget.
    colo_sys::host::forget_pid();
    release();
    crate::hangup::forked();
}

/// Registers the handlers (once per process; a child inherits them). A flag, not a `Once`: a
/// child forked while another thread was inside a `Once` would wait on it forever. A thread that
/// finds the flag set while the first is still registering goes on without waiting: the handlers
/// guard against forks from then on, as they would have a moment later.
pub(crate) fn protect() {
    // Relaxed: it orders nothing but this registration, which `pthread_atfork` serialises.
    static REGISTERED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !REGISTERED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        colo_sys::host::at_fork(prepare, release, child);
    }
}
