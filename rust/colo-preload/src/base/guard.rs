//! The thread-local guard that sends the shim's own calls straight to libc, and the
//! application's errno, which the shim's work leaves as it found it on success.

use libc::{c_int, ssize_t};
use std::cell::Cell;

thread_local! {
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

/// This thread's errno.
pub fn errno_loc() -> *mut c_int {
    // SAFETY: `__errno_location` takes no arguments and returns this thread's errno slot, valid
    // for as long as the thread runs.
    unsafe { libc::__errno_location() }
}

/// Sets this thread's errno.
pub fn set_errno(e: c_int) {
    // SAFETY: `errno_loc` is this thread's errno slot, written by this thread only.
    unsafe { *errno_loc() = e };
}

/// Marks the current thread as inside the shim; saves errno.
pub struct Guard {
    saved: c_int,
    outer: bool,
    /// This thread's `BUSY` (null while thread-locals are being destroyed).
    flag: *const Cell<bool>,
}

/// This thread's `BUSY`, or null while thread-locals are being destroyed. (Looked up once per
/// guard: each lookup is a call into the dynamic loader, in a preloaded library.)
fn busy_flag() -> *const Cell<bool> {
    BUSY.try_with(|b| b as *const Cell<bool>).unwrap_or(std::ptr::null())
}

impl Guard {
    /// (Not inlined: the compiler would look the thread-local up ahead of the cheap test that
    /// usually makes it unnecessary, as in `plain(fd)`.)
    #[inline(never)]
    pub fn busy() -> bool {
        let f = busy_flag();
        // SAFETY: a non-null `f` is this thread's `BUSY`, which outlives this call (thread-locals
        // are destroyed only after the thread stops running the application's code).
        f.is_null() || unsafe { (*f).get() }
    }
    pub fn enter() -> Guard {
        let flag = busy_flag();
        // SAFETY: as in `busy`: a non-null `flag` is this thread's live `BUSY`.
        let outer = flag.is_null() || unsafe { (*flag).replace(true) };
        // SAFETY: `errno_loc` is this thread's errno slot.
        Guard { saved: unsafe { *errno_loc() }, outer, flag }
    }
    /// `enter`, unless the thread is already inside the shim.
    pub fn try_enter() -> Option<Guard> {
        let g = Guard::enter();
        if g.outer {
            std::mem::forget(g);
            return None;
        }
        Some(g)
    }
    /// Success: restore the application's errno.
    pub fn ok(&self, v: ssize_t) -> ssize_t {
        set_errno(self.saved);
        v
    }
    /// Failure: set errno.
    pub fn err(&self, e: c_int) -> ssize_t {
        set_errno(e);
        -1
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.flag.is_null() {
            // SAFETY: the flag of this thread, on which the guard was made and is dropped
            // (a guard never leaves the call that made it).
            unsafe { (*self.flag).set(self.outer) };
        }
    }
}
