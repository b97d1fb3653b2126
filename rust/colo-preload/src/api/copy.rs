//! Calls that move bytes between a descriptor and an accelerated socket: `sendfile` from a file,
//! `splice` to or from a pipe. The kernel would move them past the ring, so they go through a
//! buffer of ours.

use crate::api::route::{conn_for_io, epipe_signal, plain, result, with_conn};
use crate::base::guard::Guard;
use crate::conn::io::{after_read, conn_recv, conn_send};
use crate::conn::state::{Conn, OUT};
use crate::real;
use libc::{c_int, off_t, size_t, ssize_t};
use std::io;

/// `sendfile(2)` (and `sendfile64`: `off_t` is 64 bits on the 64-bit targets this shim
/// supports) to an accelerated socket: the file's bytes go through a buffer of ours into the ring.
pub unsafe fn sendfile(out: c_int, inp: c_int, off: *mut off_t, count: size_t) -> ssize_t {
    with_conn!(
        out,
        // SAFETY: the application's arguments, as sendfile(2) takes them.
        unsafe { real::sendfile(out, inp, off, count) },
        // SAFETY: sendfile(2)'s contract: a null `off`, or the application's writable offset.
        |g, c| unsafe { send_file(&g, &c, inp, off.cast(), count) }
    )
}

/// `sendfile` from `inp` at `*off` (or its file position, for a null `off`) into `c`.
///
/// # Safety
/// `off` is null or points to the application's writable offset.
unsafe fn send_file(g: &Guard, c: &Conn, inp: c_int, off: *mut i64, count: size_t) -> ssize_t {
    // SAFETY: lseek on the application's file, which changes nothing.
    let here = unsafe { libc::lseek64(inp, 0, libc::SEEK_CUR) };
    let seek_err = || io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL);
    let mut pos: i64 = if off.is_null() {
        if here < 0 {
            // The kernel's sendfile from its position refuses an input that is no file (a pipe
            // or a socket) with EINVAL.
            let e = seek_err();
            return g.err(if e == libc::ESPIPE { libc::EINVAL } else { e });
        }
        here
    } else {
        // SAFETY: the application's offset.
        let at = unsafe { *off };
        if here < 0 {
            // At an offset, an input that cannot be read at one: ESPIPE, before the offset is
            // looked at.
            return g.err(seek_err());
        }
        if at < 0 {
            return g.err(libc::EINVAL);
        }
        at
    };
    let mut buf = vec![0u8; count.min(64 * 1024)];
    let mut total = 0usize;
    let mut err = None;
    while total < count {
        let want = (count - total).min(buf.len());
        // SAFETY: reading into our buffer.
        let r = unsafe { libc::pread64(inp, buf.as_mut_ptr().cast(), want, pos) };
        if r <= 0 {
            if r < 0 {
                err = Some(io::Error::last_os_error());
            }
            break;
        }
        let r = r as usize;
        if total > 0 && c.ready(false) & OUT == 0 {
            break;
        }
        match conn_send(c, &buf[..r], if total > 0 { libc::MSG_DONTWAIT } else { 0 }) {
            Ok(w) => {
                total += w;
                pos += w as i64;
                if w < r {
                    break;
                }
            }
            Err(e) => {
                if total == 0 {
                    err = Some(e);
                }
                break;
            }
        }
    }
    if off.is_null() {
        // SAFETY: moving the application's file position past what was sent.
        unsafe { libc::lseek64(inp, pos, libc::SEEK_SET) };
    } else {
        // SAFETY: the application's offset.
        unsafe { *off = pos };
    }
    match err {
        Some(e) if total == 0 => {
            let r = Err(e);
            epipe_signal(&r, 0);
            result(g, r)
        }
        _ => g.ok(total as ssize_t),
    }
}

fn is_pipe(fd: c_int) -> bool {
    // SAFETY: only asks the kernel about the number.
    let b = unsafe { colo_sys::BorrowedFd::borrow_raw(fd) };
    rustix::fs::fstat(b).is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Fifo)
}

fn nonblocking_fd(fd: c_int) -> bool {
    // SAFETY: only asks the kernel about the number.
    let b = unsafe { colo_sys::BorrowedFd::borrow_raw(fd) };
    rustix::fs::fcntl_getfl(b).is_ok_and(|f| f.contains(rustix::fs::OFlags::NONBLOCK))
}

/// Whether `fd` polls ready for `events` right now.
fn ready_now(fd: c_int, events: i16) -> bool {
    let mut p = libc::pollfd { fd, events, revents: 0 };
    // SAFETY: one pollfd of ours; a zero timeout.
    unsafe { real::poll(&mut p, 1, 0) == 1 && p.revents != 0 }
}

const SPLICE_CHUNK: usize = 64 * 1024;

thread_local! {
    static SPLICE_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `splice(2)` with an accelerated socket on one side: the kernel would move the bytes to or
/// from the bare TCP socket, past the ring. One side must be a pipe (else EINVAL, as the kernel
/// says); the bytes go through a buffer of ours. `SPLICE_F_NONBLOCK` applies to the pipe side,
/// the socket's own O_NONBLOCK to the socket side, as in the kernel. Nothing taken from one side
/// is lost when the other side cannot take it: from a pipe we read at most what the ring takes
/// now (non-blocking socket) or wait for room (blocking); from the socket we peek, write to the
/// pipe, then consume what the pipe took.
pub unsafe fn splice(inp: c_int, off_in: *mut i64, out: c_int, off_out: *mut i64, len: size_t, flags: libc::c_uint) -> ssize_t {
    // A socket whose cross-namespace answer is owed has it taken off first, as a read does.
    if let Some(r) = crate::api::route::owed_first(inp, 0) {
        return r;
    }
    if (plain(inp) && plain(out)) || Guard::busy() {
        // SAFETY: `real::splice` is libc's `splice`, given the application's arguments unchanged:
        // the contract the caller met.
        return unsafe { real::splice(inp, off_in, out, off_out, len, flags) };
    }
    let g = Guard::enter();
    let (cin, cout) = (conn_for_io(inp), conn_for_io(out));
    let nonblock_pipe = flags & libc::SPLICE_F_NONBLOCK != 0;
    let r = match (cin, cout) {
        (None, None) => {
            drop(g);
            // SAFETY: `real::splice` is libc's `splice`, given the application's arguments
            // unchanged: the contract the caller met.
            return unsafe { real::splice(inp, off_in, out, off_out, len, flags) };
        }
        (Some(_), Some(_)) => return g.err(libc::EINVAL),
        (None, Some(c)) => {
            if !is_pipe(inp) {
                return g.err(libc::EINVAL);
            }
            if !off_in.is_null() {
                return g.err(libc::ESPIPE);
            }
            if !off_out.is_null() {
                return g.err(libc::EINVAL);
            }
            if len == 0 {
                return g.ok(0);
            }
            let mut want = len.min(SPLICE_CHUNK);
            if c.nonblocking() {
                want = want.min(c.space());
                if want == 0 {
                    return g.err(libc::EAGAIN);
                }
            }
            if nonblock_pipe && !nonblocking_fd(inp) && !ready_now(inp, libc::POLLIN) {
                return g.err(libc::EAGAIN);
            }
            SPLICE_BUF.with(|b| {
                let mut b = b.borrow_mut();
                b.resize(SPLICE_CHUNK, 0);
                // SAFETY: reading the application's pipe into our buffer of `want` bytes.
                let n = unsafe { real::read(inp, b.as_mut_ptr().cast(), want) };
                if n <= 0 {
                    return if n == 0 { Ok(0) } else { Err(io::Error::last_os_error()) };
                }
                // Blocking: all of it (waiting for room); non-blocking: it fits (`space`).
                let r = conn_send(&c, &b[..n as usize], 0);
                epipe_signal(&r, 0);
                r
            })
        }
        (Some(c), None) => {
            if !is_pipe(out) {
                return g.err(libc::EINVAL);
            }
            if !off_out.is_null() {
                return g.err(libc::ESPIPE);
            }
            if !off_in.is_null() {
                return g.err(libc::EINVAL);
            }
            if len == 0 {
                return g.ok(0);
            }
            let mut want = len.min(SPLICE_CHUNK);
            if nonblock_pipe && !nonblocking_fd(out) {
                // A blocking pipe with room for one more buffer takes PIPE_BUF bytes at once.
                if !ready_now(out, libc::POLLOUT) {
                    return g.err(libc::EAGAIN);
                }
                want = want.min(libc::PIPE_BUF);
            }
            SPLICE_BUF.with(|b| {
                let mut b = b.borrow_mut();
                b.resize(SPLICE_CHUNK, 0);
                // The readers' turn across the look and the take: another process reading
                // between them would make the bytes taken not those handed to the pipe.
                let _turn = c.read_turn(c.nonblocking())?;
                let n = conn_recv(&c, &mut b[..want], libc::MSG_PEEK)?;
                if n == 0 {
                    return Ok(0);
                }
                // SAFETY: writing `n` bytes of our buffer to the application's pipe.
                let w = unsafe { real::write(out, b.as_ptr().cast(), n) };
                if w < 0 {
                    return Err(io::Error::last_os_error());
                }
                // Consume what the pipe took (peeked above, so it is there).
                let w = w as usize;
                let mut done = 0;
                while done < w {
                    match c.shm().read(&mut b[done..w]) {
                        Ok(0) => break,
                        Ok(k) => done += k,
                        Err(e) => return Err(e),
                    }
                }
                after_read(&c, done, want);
                Ok(done)
            })
        }
    };
    result(&g, r)
}
