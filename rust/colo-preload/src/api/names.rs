//! `getsockname` and `getpeername`: a socket that stands in for a connection relayed as standard
//! I/O answers the connection's addresses (`record::relayed`); every other call goes to libc,
//! but for `getpeername` of an accelerated connection, which answers as kernel TCP would from
//! the rings: whose carrier its client reset at close (`Conn`'s drop), as after a FIN; `ENOTCONN`
//! once the connection is closed (`Conn::closed_as_tcp`) though its carrier is not.

use crate::base::addr::write_sockaddr;
use crate::base::guard::{set_errno, Guard};
use crate::conn::table;
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
        let r = unsafe { real::getpeername(fd, addr, len) };
        if r == 0 && !Guard::busy() && table::kind(fd) == table::CONN && closed(fd) {
            set_errno(libc::ENOTCONN);
            return -1;
        }
        if r != 0 && !Guard::busy() && table::kind(fd) == table::CONN && errno() == libc::ENOTCONN {
            // SAFETY: the application's arguments, unchanged.
            return unsafe { peer_of_conn(fd, addr, len) }.unwrap_or_else(|| {
                set_errno(libc::ENOTCONN);
                r
            });
        }
        r
    } else {
        // SAFETY: the application's arguments, unchanged.
        unsafe { real::getsockname(fd, addr, len) }
    }
}

/// Whether the accelerated connection `fd` is closed as kernel TCP's socket would be
/// (`Conn::closed_as_tcp`), which its carrier, still connected, does not say.
fn closed(fd: c_int) -> bool {
    let _g = Guard::enter();
    table::conn(fd).is_some_and(|c| c.closed_as_tcp())
}

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The peer's address of the accelerated connection `fd`, in its socket's family (an IPv4 peer of
/// an `AF_INET6` socket as IPv4-mapped, as the kernel reports it); `None`: not one, or one its
/// peer reset.
///
/// # Safety
/// As libc's `getpeername`: `addr` has `*len` writable bytes (or either is null).
unsafe fn peer_of_conn(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> Option<c_int> {
    if addr.is_null() || len.is_null() {
        return None;
    }
    let g = Guard::enter();
    let c = table::conn(fd)?;
    if c.closed_as_tcp() {
        // As kernel TCP after a reset (the peer's, or its answer to a write after it closed),
        // or both FINs: not connected.
        return None;
    }
    let mut peer = c.shm().peer_addr();
    // SAFETY: the application's socket, open for the duration of this call.
    let b = unsafe { colo_sys::BorrowedFd::borrow_raw(fd) };
    let v6 = matches!(rustix::net::sockopt::socket_domain(b), Ok(rustix::net::AddressFamily::INET6));
    if let (true, std::net::SocketAddr::V4(a)) = (v6, peer) {
        peer = std::net::SocketAddr::new(a.ip().to_ipv6_mapped().into(), a.port());
    }
    // SAFETY: the caller's contract on `addr` and `len`, both non-null.
    unsafe { write_sockaddr(peer, addr, len) };
    Some(g.ok(0) as c_int)
}
