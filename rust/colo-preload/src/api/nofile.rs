//! The application's own hard limit of open files, kept apart from the process's.
//!
//! Servers that size themselves by a connection limit set both limits of `RLIMIT_NOFILE` to it
//! (memcached to its `-c`, 1024 by default). With the hard limit at the soft one, the shim's
//! descriptors (`colo_sys::preload::OUT_OF_THE_WAY`) have no room above the application's
//! numbers and must share a sixteenth of them: a few dozen connections accelerated, the rest
//! plain TCP. So when the application lowers its hard limit, the process keeps a higher one
//! (room for the shim's descriptors of as many connections as the application may open), and
//! the calls that read or set the limit answer as the kernel would for the application's own:
//! `getrlimit` reports the hard limit it asked for, and asking for more than that fails as the
//! kernel would fail it. The soft limit, the one the kernel enforces on the application's own
//! descriptors, is always exactly the application's. A program image this one `exec`s sees the
//! application's limits too (`record::app_nofile`); a raw `prlimit64` system call, and a program
//! exec'd without the shim, see the process's hard limit (docs/LIMITS.md).

use libc::{c_int, rlimit};
use rustix::process::{Resource, Rlimit};
use crate::record::app_nofile::{self, app_hard};

/// The hard limit the process keeps for an application hard limit `app`: room for the shim's
/// descriptors of `app` connections (one established connection holds five in the shim,
/// docs/ARCHITECTURE.md) and a few of its own, within what the process had.
fn kept_for(app: u64, had: u64) -> u64 {
    app.saturating_mul(6).saturating_add(64).min(had).max(app)
}

/// The limit to report for `actual`, the process's.
fn as_app_sees(actual: Rlimit) -> Rlimit {
    match (app_hard(), actual.maximum) {
        (Some(app), Some(max)) if app < max => Rlimit { current: actual.current, maximum: Some(app) },
        (Some(app), None) => Rlimit { current: actual.current, maximum: Some(app) },
        _ => actual,
    }
}

fn to_rustix(l: &rlimit) -> Rlimit {
    let v = |x: u64| (x != libc::RLIM_INFINITY).then_some(x);
    Rlimit { current: v(l.rlim_cur), maximum: v(l.rlim_max) }
}

fn to_libc(l: Rlimit) -> rlimit {
    rlimit { rlim_cur: l.current.unwrap_or(libc::RLIM_INFINITY), rlim_max: l.maximum.unwrap_or(libc::RLIM_INFINITY) }
}

/// Whether this process may raise a hard limit (`CAP_SYS_RESOURCE`).
fn may_raise() -> bool {
    rustix::thread::capabilities(None).is_ok_and(|c| c.effective.contains(rustix::thread::CapabilitySet::SYS_RESOURCE))
}

/// Sets the application's limit `new`, and returns the one it had (as it saw it).
fn set(new: &rlimit) -> Result<Rlimit, rustix::io::Errno> {
    let wanted = to_rustix(new);
    let inf = |v: Option<u64>| v.unwrap_or(u64::MAX);
    if inf(wanted.current) > inf(wanted.maximum) {
        return Err(rustix::io::Errno::INVAL);
    }
    let actual = rustix::process::getrlimit(Resource::Nofile);
    let before = as_app_sees(actual);
    // Above the application's own hard limit needs the capability, as in the kernel (which
    // checks only against the process's, which may be higher).
    if inf(wanted.maximum) > inf(before.maximum) && !may_raise() {
        return Err(rustix::io::Errno::PERM);
    }
    let keep = match (wanted.maximum, actual.maximum) {
        (Some(app), had) if app < inf(had) => Some(kept_for(app, inf(had))),
        _ => wanted.maximum,
    };
    let changed = rustix::process::setrlimit(Resource::Nofile, Rlimit { current: wanted.current, maximum: keep });
    colo_sys::preload::nofile_changed();
    changed?;
    app_nofile::set(match (wanted.maximum, keep) {
        (Some(app), Some(kept)) if app < kept => Some(app),
        _ => None,
    });
    Ok(before)
}

fn fail(e: rustix::io::Errno) -> c_int {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = e.raw_os_error() };
    -1
}

/// `getrlimit(RLIMIT_NOFILE, out)` as the application sees it; `None` for another resource.
///
/// # Safety
/// `out` is what the caller passed to `getrlimit`.
pub unsafe fn get(resource: c_int, out: *mut rlimit) -> Option<c_int> {
    if resource != libc::RLIMIT_NOFILE as c_int || app_hard().is_none() {
        return None;
    }
    if out.is_null() {
        return Some(fail(rustix::io::Errno::FAULT));
    }
    let seen = to_libc(as_app_sees(rustix::process::getrlimit(Resource::Nofile)));
    // SAFETY: the caller passed `out` for one `rlimit`, checked non-null.
    unsafe { out.write(seen) };
    Some(0)
}

/// `setrlimit(RLIMIT_NOFILE, new)` (see the module); `None` for another resource.
///
/// # Safety
/// `new` is what the caller passed to `setrlimit`.
pub unsafe fn set_own(resource: c_int, new: *const rlimit) -> Option<c_int> {
    if resource != libc::RLIMIT_NOFILE as c_int {
        return None;
    }
    if new.is_null() {
        return Some(fail(rustix::io::Errno::FAULT));
    }
    // SAFETY: the caller passed `new` for one `rlimit`, checked non-null.
    let new = unsafe { new.read() };
    Some(match set(&new) {
        Ok(_) => 0,
        Err(e) => fail(e),
    })
}

/// `prlimit(pid, RLIMIT_NOFILE, new, old)` on this process (see the module); `None` for another
/// resource or process.
///
/// # Safety
/// `new` and `old` are what the caller passed to `prlimit`.
pub unsafe fn prlimit(pid: libc::pid_t, resource: c_int, new: *const rlimit, old: *mut rlimit) -> Option<c_int> {
    if resource != libc::RLIMIT_NOFILE as c_int || (pid != 0 && pid as u32 != colo_sys::host::pid()) {
        return None;
    }
    if new.is_null() {
        // SAFETY: as the caller's `old`; a null `old` with a null `new` only reads.
        return if old.is_null() { Some(0) } else { unsafe { get(resource, old) } };
    }
    // SAFETY: the caller passed `new` for one `rlimit`, checked non-null.
    let new = unsafe { new.read() };
    Some(match set(&new) {
        Ok(before) => {
            if !old.is_null() {
                // SAFETY: the caller passed `old` for one `rlimit`, checked non-null.
                unsafe { old.write(to_libc(before)) };
            }
            0
        }
        Err(e) => fail(e),
    })
}

#[cfg(test)]
mod tests {
    use super::kept_for;

    #[test]
    fn the_kept_limit_leaves_room_within_what_the_process_had() {
        assert_eq!(kept_for(1024, 1 << 20), 1024 * 6 + 64);
        assert_eq!(kept_for(1024, 2000), 2000);
        assert_eq!(kept_for(1024, 1024), 1024);
        assert_eq!(kept_for(u64::MAX - 1, u64::MAX), u64::MAX);
    }
}
