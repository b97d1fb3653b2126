//! Listeners: listen, accept, a listener's address, descriptor and mode, close.

use crate::*;

/// Listens on `addr` ("ip:port" text, e.g. "127.0.0.1:7000"; port 0 picks a free port): a TCP
/// listener for any client, plus a shared-memory rendezvous for colo clients on this host.
/// `opts` (may be NULL) sets the geometry of accepted connections. On success stores a new handle
/// in `*out`, which the caller owns and frees with `colo_listener_close`.
///
/// Returns 0, or -EINVAL (NULL `addr`/`out`, text that is not an address, a host name that does
/// not resolve, bad `opts`), -EADDRINUSE, -EADDRNOTAVAIL, -EACCES, -EMFILE or another errno from
/// socket calls.
#[no_mangle]
pub extern "C" fn colo_listen(addr: *const c_char, opts: *const colo_options, out: *mut *mut colo_listener) -> c_int {
    guard_int(|| {
        if out.is_null() {
            return Err(EINVAL);
        }
        let a = parse_addr(addr)?;
        let o = options(opts)?;
        let l = Listener::bind_with(&a[..], o).map_err(|e| err(&e))?;
        let h = with_cx(|cx| insert(cx, LISTENER, || Obj::Listener(Box::new(l))))?;
        // SAFETY: `out` is not NULL and points to writable storage for one pointer.
        unsafe { *out = h as *mut colo_listener };
        Ok(0)
    })
}

/// Writes the listening address ("ip:port", the actual port) into `buf` (`len` bytes, NUL
/// included; `COLO_ADDRSTRLEN` always suffices).
///
/// Returns the text length (without the NUL), or -EBADF (bad handle), -EINVAL (NULL `buf`),
/// -ENOSPC (`len` too small).
#[no_mangle]
pub extern "C" fn colo_listener_addr(l: *const colo_listener, buf: *mut c_char, len: usize) -> c_int {
    guard_int(|| {
        let l = listener(l)?;
        write_addr(l.local_addr(), buf, len)
    })
}

/// The listener's pollable fd: readable when `colo_accept` may return a connection (use with
/// poll/epoll/select for reading). Owned by the listener: do not close it.
///
/// Returns the fd, or -EBADF.
#[no_mangle]
pub extern "C" fn colo_listener_fileno(l: *const colo_listener) -> c_int {
    guard_int(|| Ok(listener(l)?.as_raw_fd() as isize))
}

/// Non-blocking mode for `colo_accept` (`on` != 0): it returns -EAGAIN instead of waiting.
///
/// Returns 0, or -EBADF.
#[no_mangle]
pub extern "C" fn colo_listener_set_nonblocking(l: *const colo_listener, on: c_int) -> c_int {
    guard_int(|| {
        listener(l)?.set_nonblocking(on != 0).map_err(|e| err(&e))?;
        Ok(0)
    })
}

/// Returns 1 if local clients reach this listener over shared memory, 0 if it serves TCP only
/// (another process holds the rendezvous name), or -EBADF.
#[no_mangle]
pub extern "C" fn colo_listener_is_colo(l: *const colo_listener) -> c_int {
    guard_int(|| Ok(listener(l)?.is_colo() as isize))
}

/// Accepts the next connection (shared memory or TCP), waiting for one unless the listener is
/// non-blocking. `flags`: 0 or `COLO_NONBLOCK` (the new connection starts non-blocking). Stores a
/// new connection handle in `*out` (the caller owns it: `colo_close`). If `peer` is not NULL, the
/// peer's address text is written there (`peer_len` bytes; `COLO_ADDRSTRLEN` suffices; truncated
/// addresses are not written, the connection is still returned).
///
/// Returns 0, or -EBADF (bad listener), -EINVAL (NULL `out`, unknown flags), -EAGAIN
/// (non-blocking and no connection pending), -EMFILE or another errno from socket calls.
#[no_mangle]
pub extern "C" fn colo_accept(
    l: *const colo_listener,
    flags: c_int,
    out: *mut *mut colo_conn,
    peer: *mut c_char,
    peer_len: usize,
) -> c_int {
    guard_int(|| {
        let l = listener(l)?;
        if out.is_null() || flags & !COLO_NONBLOCK != 0 {
            return Err(EINVAL);
        }
        let (s, addr) = l.accept().map_err(|e| err(&e))?;
        if flags & COLO_NONBLOCK != 0 {
            s.set_nonblocking(true).map_err(|e| err(&e))?;
        }
        if !peer.is_null() {
            let _ = write_addr(Ok(addr), peer, peer_len);
        }
        let h = with_cx(|cx| insert(cx, CONN, || Obj::Conn(s)))?;
        // SAFETY: `out` is not NULL and points to writable storage for one pointer.
        unsafe { *out = h as *mut colo_conn };
        Ok(0)
    })
}

/// Stops listening and frees the handle. A thread blocked in `colo_accept` on it finishes that
/// call first. Connections already accepted are not affected.
///
/// Returns 0, or -EBADF (NULL, already closed, or not a listener).
#[no_mangle]
pub extern "C" fn colo_listener_close(l: *mut colo_listener) -> c_int {
    guard_int(|| {
        // The listener is dropped with the last reference: here, or when a blocked `colo_accept`
        // returns.
        let (owner, _) = TABLE.close(l as usize, LISTENER).ok_or(EBADF)?;
        drop(owner);
        Ok(0)
    })
}
