//! `getsockname` and `getpeername`: a socket that stands in for a connection relayed as standard
//! I/O answers the connection's addresses (`record::relayed`); every other call goes to libc.

use crate::base::guard::Guard;
use crate::real;
use crate::record::relayed;
use libc::{c_int, sockaddr, socklen_t};

/// `getsockname` (`peer` false) or `getpeername`.
///
/// # Safety
/// As libc's `getsockname`/`getpeername`: `addr` has `*len` writable bytes.
pub unsafe fn name(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, peer: bool) -> c_int {
    if !Guard::busy() && !addr.is_null() && !len.is_null() {
        if let Some(raw) = relayed::lookup(fd, peer) {
            // SAFETY: the application's non-null arguments, with libc's contract.
            unsafe { relayed::write(&raw, addr, len) };
            return 0;
        }
    }
    if peer {
        // SAFETY: the application's arguments, unchanged.
        unsafe { real::getpeername(fd, addr, len) }
    } else {
        // SAFETY: the application's arguments, unchanged.
        unsafe { real::getsockname(fd, addr, len) }
    }
}
