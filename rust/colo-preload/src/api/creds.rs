//! The calls that change a process's credentials. glibc makes each of them in every thread of
//! the process (its `SIGSETXID` broadcast) and aborts the process when they do not all succeed
//! alike; capabilities and `PR_SET_KEEPCAPS` are per thread, and an application that adjusts
//! its own thread's with `capset` (libcap goes around libc for it: proftpd after a login, which
//! then switches its effective user back and forth) leaves the shim's hang-up watcher, started
//! earlier, unable to follow. So the watcher's thread ends before each such call
//! (`colo::internal::hangup::retire`) and starts again right after it, from the caller's thread
//! with the credentials of that time (`resume`), watching what the ended one watched
//! (`tests/apps/c/creds_threads.c`, `creds_sleeper.c`).

use crate::real;
use libc::{c_char, c_int, gid_t, size_t, uid_t};

/// Ends the hang-up watcher's thread, makes the call, and starts the thread again. Not in a
/// child that shares its parent's memory (`vfork`): the watcher's thread is the parent's, which
/// the child's change does not reach (and a thread started in the child would die at its
/// `exec`); asked before the call, which may make the child another user, whom the kernel no
/// longer tells whether it shares its parent's memory (`base::vm::shares_memory` remembers).
fn retired<T>(call: impl FnOnce() -> T) -> T {
    if crate::base::vm::borrowed_memory() && crate::base::vm::shares_memory() {
        return call();
    }
    colo::internal::hangup::retire();
    let r = call();
    colo::internal::hangup::resume();
    r
}

#[no_mangle]
pub unsafe extern "C" fn setuid(uid: uid_t) -> c_int {
    // SAFETY: the application's argument, to libc's function of the same signature.
    retired(|| unsafe { real::setuid(uid) })
}

#[no_mangle]
pub unsafe extern "C" fn setgid(gid: gid_t) -> c_int {
    // SAFETY: as in `setuid`.
    retired(|| unsafe { real::setgid(gid) })
}

#[no_mangle]
pub unsafe extern "C" fn seteuid(uid: uid_t) -> c_int {
    // SAFETY: as in `setuid`.
    retired(|| unsafe { real::seteuid(uid) })
}

#[no_mangle]
pub unsafe extern "C" fn setegid(gid: gid_t) -> c_int {
    // SAFETY: as in `setuid`.
    retired(|| unsafe { real::setegid(gid) })
}

#[no_mangle]
pub unsafe extern "C" fn setreuid(r: uid_t, e: uid_t) -> c_int {
    // SAFETY: as in `setuid`.
    retired(|| unsafe { real::setreuid(r, e) })
}

#[no_mangle]
pub unsafe extern "C" fn setregid(r: gid_t, e: gid_t) -> c_int {
    // SAFETY: as in `setuid`.
    retired(|| unsafe { real::setregid(r, e) })
}

#[no_mangle]
pub unsafe extern "C" fn setresuid(r: uid_t, e: uid_t, s: uid_t) -> c_int {
    // SAFETY: as in `setuid`.
    retired(|| unsafe { real::setresuid(r, e, s) })
}

#[no_mangle]
pub unsafe extern "C" fn setresgid(r: gid_t, e: gid_t, s: gid_t) -> c_int {
    // SAFETY: as in `setuid`.
    retired(|| unsafe { real::setresgid(r, e, s) })
}

#[no_mangle]
pub unsafe extern "C" fn setgroups(n: size_t, list: *const gid_t) -> c_int {
    // SAFETY: the application's list and its length, passed on unread.
    retired(|| unsafe { real::setgroups(n, list) })
}

/// `initgroups(3)`: calls glibc's `setgroups` inside libc, out of the shim's sight.
#[no_mangle]
pub unsafe extern "C" fn initgroups(user: *const c_char, group: gid_t) -> c_int {
    // SAFETY: the application's name and group, passed on unread.
    retired(|| unsafe { real::initgroups(user, group) })
}
