//! Connections: connect, byte-stream reads and writes, shutdown, close, descriptor, mode,
//! timeouts and addresses.

use crate::*;

/// Connects to `addr` ("ip:port", or "host:port"): over shared memory when a colo listener
/// serves it on this host, else over plain TCP (remote hosts, non-colo servers). `opts` (may be
/// NULL) sets ring and pool sizes. On success stores a new handle in `*out`; the caller owns it
/// (`colo_close`).
///
/// Returns 0, or -EINVAL (NULL `addr`/`out`, bad text, a host name that does not resolve, bad
/// `opts`), -ECONNREFUSED (nobody listens), -ETIMEDOUT, -ENETUNREACH or another errno from
/// `connect(2)`.
#[no_mangle]
pub extern "C" fn colo_connect(addr: *const c_char, opts: *const colo_options, out: *mut *mut colo_conn) -> c_int {
    guard_int(|| {
        if out.is_null() {
            return Err(EINVAL);
        }
        let a = parse_addr(addr)?;
        let o = options(opts)?;
        let s = Stream::connect_with(&a[..], &o).map_err(|e| err(&e))?;
        let h = with_cx(|cx| insert(cx, CONN, || Obj::Conn(s)))?;
        // SAFETY: `out` is not NULL and points to writable storage for one pointer.
        unsafe { *out = h as *mut colo_conn };
        Ok(0)
    })
}

fn checked_buf(buf: *const c_void, len: usize) -> Result<(), isize> {
    if len > isize::MAX as usize || (buf.is_null() && len > 0) {
        return Err(EINVAL);
    }
    Ok(())
}

/// Runs `op` on the connection and the caller's `len` writable bytes at `buf` (a read); a zero
/// length returns 0 without calling it.
fn with_out_buf(
    c: *const colo_conn,
    buf: *mut c_void,
    len: usize,
    op: impl FnOnce(&Stream, &mut [u8]) -> std::io::Result<usize>,
) -> Result<isize, isize> {
    with_cx(|cx| {
        let s = conn_in(cx, c)?;
        checked_buf(buf, len)?;
        if len == 0 {
            return Ok(0);
        }
        // SAFETY: `buf` is not NULL and the caller provides `len` writable bytes.
        let b = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
        let r = op(&s, b);
        cx.put(s.0);
        r.map(|n| n as isize).map_err(|e| err(&e))
    })
}

/// Runs `op` on the connection and the caller's `len` readable bytes at `buf` (a write); a zero
/// length returns 0 without calling it.
fn with_in_buf(
    c: *const colo_conn,
    buf: *const c_void,
    len: usize,
    op: impl FnOnce(&Stream, &[u8]) -> std::io::Result<usize>,
) -> Result<isize, isize> {
    with_cx(|cx| {
        let s = conn_in(cx, c)?;
        checked_buf(buf, len)?;
        if len == 0 {
            return Ok(0);
        }
        // SAFETY: `buf` is not NULL and the caller provides `len` readable bytes.
        let b = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) };
        let r = op(&s, b);
        cx.put(s.0);
        r.map(|n| n as isize).map_err(|e| err(&e))
    })
}

/// Reads up to `len` bytes into `buf`, waiting until at least one byte is there (unless
/// non-blocking or a read timeout expires).
///
/// Returns the number of bytes read, 0 at end of stream (the peer shut down writing or closed;
/// also after `colo_shutdown(COLO_SHUT_RD)`, and when `len` is 0), or -EBADF (bad handle),
/// -EINVAL (NULL `buf` with `len` > 0), -EAGAIN (non-blocking and nothing to read, or the read
/// timeout expired), -ECONNRESET (the peer reset or died), -EPROTO (the peer corrupted the
/// shared memory).
#[no_mangle]
pub extern "C" fn colo_read(c: *const colo_conn, buf: *mut c_void, len: usize) -> ssize_t {
    guard(|| with_out_buf(c, buf, len, |s, b| (&*s).read(b)))
}

/// Like `colo_read` but leaves the bytes to be read again (`MSG_PEEK`). Same returns.
#[no_mangle]
pub extern "C" fn colo_peek(c: *const colo_conn, buf: *mut c_void, len: usize) -> ssize_t {
    guard(|| with_out_buf(c, buf, len, |s, b| s.peek(b)))
}

/// Writes up to `len` bytes from `buf`, waiting only while no byte can be written.
///
/// Returns the number of bytes written (at least 1 if `len` > 0), or -EBADF, -EINVAL (NULL `buf`
/// with `len` > 0), -EAGAIN (non-blocking and no space, or the write timeout expired), -EPIPE
/// (we shut down writing, or the peer stopped reading, closed or died), -ECONNRESET, -EPROTO.
/// No signal is raised.
#[no_mangle]
pub extern "C" fn colo_write(c: *const colo_conn, buf: *const c_void, len: usize) -> ssize_t {
    guard(|| with_in_buf(c, buf, len, |s, b| (&*s).write(b)))
}

/// Writes all `len` bytes, waiting for space as needed.
///
/// Returns 0, or the errors of `colo_write` (after an error some bytes may have been written).
#[no_mangle]
pub extern "C" fn colo_write_all(c: *const colo_conn, buf: *const c_void, len: usize) -> c_int {
    guard_int(|| with_in_buf(c, buf, len, |s, b| (&*s).write_all(b).map(|()| 0)))
}

/// Shuts down reading (`COLO_SHUT_RD`), writing (`COLO_SHUT_WR`: the peer reads end of stream
/// after our last byte) or both (`COLO_SHUT_RDWR`), with TCP's meaning. The handle stays valid.
///
/// Returns 0, or -EBADF, -EINVAL (bad `how`), -ENOTCONN (TCP: already gone).
#[no_mangle]
pub extern "C" fn colo_shutdown(c: *const colo_conn, how: c_int) -> c_int {
    guard_int(|| {
        let s = conn(c)?;
        let how = match how {
            COLO_SHUT_RD => Shutdown::Read,
            COLO_SHUT_WR => Shutdown::Write,
            COLO_SHUT_RDWR => Shutdown::Both,
            _ => return Err(EINVAL),
        };
        s.shutdown(how).map(|()| 0).map_err(|e| err(&e))
    })
}

/// Closes the connection and frees the handle: the peer reads our remaining bytes, then end of
/// stream. Messages and loans of this connection stay valid (and keep its shared memory mapped)
/// until released, sent or cancelled. Another thread blocked on the connection finishes its call
/// first (over shared memory it may wait for the peer). Another thread that used the connection
/// may keep its memory and descriptors until that thread's next call on a connection (or its
/// exit); the peer sees the close at once.
///
/// Returns 0, or -EBADF (NULL, already closed, or not a connection).
#[no_mangle]
pub extern "C" fn colo_close(c: *mut colo_conn) -> c_int {
    guard_int(|| {
        let (owner, shared) = TABLE.close(c as usize, CONN).ok_or(EBADF)?;
        let s = ConnRef(owner);
        if shared {
            // Someone still holds it (a message, a loan, a blocked call): make the close visible now.
            let _ = s.shutdown(Shutdown::Both);
        }
        // The stream is dropped with the last reference: here, or when the last message or loan is
        // released or a blocked call returns.
        drop(s);
        Ok(0)
    })
}

/// The connection's pollable readiness fd, for poll/epoll/select *for reading*: it becomes
/// readable when the peer made progress (data, space, a message, a release, a close) or died.
/// Over TCP it is the socket itself. Readiness is a hint: retry the non-blocking call, which may
/// still return -EAGAIN. Owned by the connection: do not close or read it.
///
/// Returns the fd, or -EBADF.
#[no_mangle]
pub extern "C" fn colo_fileno(c: *const colo_conn) -> c_int {
    guard_int(|| Ok(conn(c)?.as_raw_fd() as isize))
}

/// Non-blocking mode (`on` != 0): calls that would wait return -EAGAIN instead.
///
/// Returns 0, or -EBADF.
#[no_mangle]
pub extern "C" fn colo_set_nonblocking(c: *const colo_conn, on: c_int) -> c_int {
    guard_int(|| conn(c)?.set_nonblocking(on != 0).map(|()| 0).map_err(|e| err(&e)))
}

fn timeout(us: u64) -> Option<Duration> {
    (us > 0).then(|| Duration::from_micros(us))
}

/// Read timeout in microseconds (0: wait forever): a read, peek or `colo_recv_message` waiting
/// longer returns -EAGAIN.
///
/// Returns 0, or -EBADF.
#[no_mangle]
pub extern "C" fn colo_set_read_timeout(c: *const colo_conn, timeout_us: u64) -> c_int {
    guard_int(|| conn(c)?.set_read_timeout(timeout(timeout_us)).map(|()| 0).map_err(|e| err(&e)))
}

/// Write timeout in microseconds (0: wait forever): a write or `colo_loan` waiting longer returns
/// -EAGAIN.
///
/// Returns 0, or -EBADF.
#[no_mangle]
pub extern "C" fn colo_set_write_timeout(c: *const colo_conn, timeout_us: u64) -> c_int {
    guard_int(|| conn(c)?.set_write_timeout(timeout(timeout_us)).map(|()| 0).map_err(|e| err(&e)))
}

/// How the connection moves bytes.
///
/// Returns `COLO_TRANSPORT_SHM`, `COLO_TRANSPORT_TCP`, or -EBADF.
#[no_mangle]
pub extern "C" fn colo_transport(c: *const colo_conn) -> c_int {
    guard_int(|| {
        Ok(match conn(c)?.transport() {
            Transport::SharedMemory => COLO_TRANSPORT_SHM,
            Transport::Tcp => COLO_TRANSPORT_TCP,
        } as isize)
    })
}

/// Writes the peer's address ("ip:port") into `buf` (`len` bytes including the NUL;
/// `COLO_ADDRSTRLEN` suffices). Over shared memory a client's port is 0 (it has no TCP port).
///
/// Returns the text length, or -EBADF, -EINVAL (NULL `buf`), -ENOSPC (too small), -ENOTCONN.
#[no_mangle]
pub extern "C" fn colo_peer_addr(c: *const colo_conn, buf: *mut c_char, len: usize) -> c_int {
    guard_int(|| write_addr(conn(c)?.peer_addr(), buf, len))
}

/// Writes our address ("ip:port") into `buf`; as `colo_peer_addr`.
#[no_mangle]
pub extern "C" fn colo_local_addr(c: *const colo_conn, buf: *mut c_char, len: usize) -> c_int {
    guard_int(|| write_addr(conn(c)?.local_addr(), buf, len))
}

/// The largest zero-copy message this connection carries: the slot size over shared memory (0
/// if it has no pool), 2^32 - 1 over TCP.
///
/// Returns the size, or -EBADF.
#[no_mangle]
pub extern "C" fn colo_max_message_size(c: *const colo_conn) -> ssize_t {
    guard(|| Ok(conn(c)?.max_message_size() as isize))
}
