//! The application's own hard limit of open files where the process keeps a higher one
//! (`api::nofile`), and its carrying across `exec`: the next program image must see the limit
//! the application set (a wrapper script's `ulimit -n`, then `exec server`), not the process's.
//!
//! While the two differ, this process holds an inheritable memfd named `colo-nofile` with the
//! application's limit (8 bytes, little-endian), read by the next image's constructor
//! (`service::handover::take_back`), which keeps it for the image after. The next image gets a
//! read-only descriptor of a file only this uid may open for writing (`super::inheritable_memfd`),
//! so a program exec'd without the shim under another uid cannot change what later images
//! read; still, a value the process's hard limit does not exceed is ignored, and no value can
//! raise a limit.
//!
//! No lock (a fork may come at any moment): the file is an atomic descriptor number, and each
//! change makes a new file, so that a forked child's value never reaches its parent's `exec`.

use colo_sys::OwnedFd;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

pub const FILE_NAME: &str = "colo-nofile";

/// The application's hard limit plus one where it is below the process's (0: they are equal).
static APP_HARD: AtomicU64 = AtomicU64::new(0);
/// The inheritable (read-only) `colo-nofile` descriptor (-1: none).
static FILE: AtomicI32 = AtomicI32::new(-1);

/// The application's hard limit, where it is below the process's.
pub fn app_hard() -> Option<u64> {
    APP_HARD.load(Ordering::Relaxed).checked_sub(1)
}

/// Records the application's hard limit (`None`: the process's is the application's), and
/// writes it where the next image will find it.
pub fn set(app: Option<u64>) {
    APP_HARD.store(app.map_or(0, |v| v.saturating_add(1)), Ordering::Relaxed);
    let fd = FILE.load(Ordering::Relaxed);
    if app.is_none() {
        // Nothing for the next image: the file is let go (a forked child's copy of its
        // parent's, too: its parent's file says nothing about this process).
        if fd >= 0 && FILE.compare_exchange(fd, -1, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            // SAFETY: the number this module stored, taken out of `FILE` by the exchange, so closed
            // once.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        return;
    }
    let bytes = app.unwrap_or(0).to_le_bytes();
    let Some(new) = make(&bytes) else { return };
    let new = new.into_raw_fd();
    match FILE.compare_exchange(fd, new, Ordering::Relaxed, Ordering::Relaxed) {
        // SAFETY: an older file (or a parent's copy), taken out of `FILE` by the exchange.
        Ok(old) if old >= 0 => drop(unsafe { OwnedFd::from_raw_fd(old) }),
        Ok(_) => {}
        // Another thread changed it meanwhile: its file stands.
        // SAFETY: the file made above, never published.
        Err(_) => drop(unsafe { OwnedFd::from_raw_fd(new) }),
    }
}

/// A new inheritable `colo-nofile` file holding `bytes`: its read-only descriptor.
fn make(bytes: &[u8]) -> Option<OwnedFd> {
    let (w, r) = super::inheritable_memfd(FILE_NAME)?;
    (rustix::io::pwrite(&w, bytes, 0).ok()? == bytes.len()).then_some(())?;
    // Inheritable only once complete: the point of the file is to survive exec.
    super::let_inherit(&r).then_some(r)
}

/// In the constructor: an inherited `colo-nofile` file. Its limit stands if the process's hard
/// limit is above it, and the file is kept for the next image; otherwise it is closed.
pub fn inherit(f: OwnedFd) {
    let mut b = [0u8; 8];
    let value = match rustix::io::pread(&f, &mut b, 0) {
        Ok(8) => u64::from_le_bytes(b),
        _ => return,
    };
    let had = rustix::process::getrlimit(rustix::process::Resource::Nofile).maximum.unwrap_or(u64::MAX);
    if value >= had || FILE.load(Ordering::Relaxed) >= 0 {
        return;
    }
    APP_HARD.store(value + 1, Ordering::Relaxed);
    // Kept for the next image as it is; a change here makes a file of its own (`set`).
    FILE.store(f.as_raw_fd(), Ordering::Relaxed);
    std::mem::forget(f);
}
