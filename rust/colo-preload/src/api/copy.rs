//! Calls that move bytes between a descriptor and an accelerated socket: `sendfile` from a file
//! (or from the socket to a pipe), `splice` to or from a pipe. The kernel would move them past
//! the ring: a file's bytes are read straight into the ring, a pipe's go through a buffer of
//! ours.

use crate::api::route::{conn_for_io, epipe_signal, plain, result, with_conn};
use crate::base::guard::Guard;
use crate::conn::io::{after_read, conn_recv, conn_send, conn_send_from, Source};
use crate::conn::state::Conn;
use crate::real;
use colo::internal::shm::Shm;
use libc::{c_int, off_t, size_t, ssize_t};
use std::cell::Cell;
use std::io;
use std::time::Instant;

/// `sendfile(2)` (and `sendfile64`: `off_t` is 64 bits on the 64-bit targets this shim
/// supports) to an accelerated socket: the file's bytes are read into the ring (`FileBytes`).
pub unsafe fn sendfile(out: c_int, inp: c_int, off: *mut off_t, count: size_t) -> ssize_t {
    if !plain(inp) && plain(out) && is_pipe(out) && conn_for_io(inp).is_some() {
        // A connection read into a pipe: the kernel's sendfile reads the socket as splice does
        // (the pipe's O_NONBLOCK as SPLICE_F_NONBLOCK); it has no offset to read at (ESPIPE).
        // Into anything else the kernel wants a seekable input: EINVAL, as the carrier answers.
        if !off.is_null() {
            return Guard::enter().err(libc::ESPIPE);
        }
        let flags = if nonblocking_fd(out) { libc::SPLICE_F_NONBLOCK } else { 0 };
        // SAFETY: the application's descriptors; no offsets.
        return unsafe { splice(inp, std::ptr::null_mut(), out, std::ptr::null_mut(), count, flags) };
    }
    with_conn!(
        out,
        // SAFETY: the application's arguments, as sendfile(2) takes them.
        unsafe { real::sendfile(out, inp, off, count) },
        // SAFETY: sendfile(2)'s contract: a null `off`, or the application's writable offset.
        |g, c| unsafe { send_file(&g, &c, out, inp, off.cast(), count) }
    )
}

/// `len` bytes of the file `fd` from offset `pos`, which the kernel reads straight into the
/// ring (a `pread` to the ring's mapping): the one copy a write of a buffer makes, and no
/// buffer of ours to fill first.
struct FileBytes {
    fd: c_int,
    pos: i64,
    len: usize,
    /// The bytes stored in the ring so far.
    stored: Cell<usize>,
    /// The file ended before `len`, or a read of it failed (`err`).
    ended: Cell<bool>,
    err: Cell<Option<io::Error>>,
}

impl Source for FileBytes {
    fn len(&self) -> usize {
        self.len
    }
    fn put(&self, shm: &Shm, from: usize, max: usize, since: Option<Instant>) -> io::Result<usize> {
        let mut at = self.pos + from as i64;
        let fill = |dst: *mut u8, n: usize| {
            let mut got = 0;
            while got < n {
                // SAFETY: `dst..dst + n` is the ring's, given to us to store into
                // (`Shm::write_with_since`); the read stores nothing past `n - got` bytes on.
                let r = unsafe { libc::pread64(self.fd, dst.add(got).cast(), n - got, at) };
                if r > 0 {
                    got += r as usize;
                    at += r as i64;
                    continue;
                }
                let e = io::Error::last_os_error();
                if r < 0 && e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                if r < 0 {
                    self.err.set(Some(e));
                }
                self.ended.set(true);
                break;
            }
            self.stored.set(self.stored.get() + got);
            got
        };
        // SAFETY: `fill` stores only through `pread` into the range it is given.
        unsafe { shm.write_with_since(max.min(self.len - from), since, fill) }
    }
    fn ended(&self) -> bool {
        self.ended.get()
    }
}

/// `sendfile` from `inp` at `*off` (or its file position, for a null `off`) into `c`, whose
/// descriptor is `out`.
///
/// # Safety
/// `off` is null or points to the application's writable offset.
unsafe fn send_file(g: &Guard, c: &Conn, out: c_int, inp: c_int, off: *mut i64, count: size_t) -> ssize_t {
    if count == 0 {
        // The kernel checks its descriptors and the offset, then moves nothing: the same call to
        // the connection's socket gives its answers, and sends nothing.
        // SAFETY: the application's arguments, as sendfile(2) takes them; a count of 0.
        return unsafe { real::sendfile(out, inp, off, 0) };
    }
    // At most what the kernel's sendfile moves in one call (`MAX_RW_COUNT`).
    let count = count.min(0x7fff_f000);
    let pos: i64 = if off.is_null() {
        // SAFETY: lseek on the application's file.
        unsafe { libc::lseek64(inp, 0, libc::SEEK_CUR) }
    } else {
        // SAFETY: the application's offset.
        unsafe { *off }
    };
    // The input's answers come before the socket's (a full ring's EAGAIN, a wait for room, a
    // closed peer's EPIPE), as the kernel reads the file before it writes to the socket: an
    // input that cannot be read at an offset (a pipe, a socket) is ESPIPE given an offset and
    // EINVAL without one; one that cannot be read at all EBADF; one the kernel cannot splice
    // from (a directory, /dev/null) EINVAL; and one at its end 0, however full the socket.
    let unreadable = |e: i32| g.err(unreadable_errno(e, off.is_null()));
    let last = || io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL);
    if pos < 0 && off.is_null() {
        return unreadable(last());
    }
    if pos < 0 {
        // A negative offset is EINVAL, after an input that cannot be read at an offset (ESPIPE)
        // or at all (EBADF), as the kernel checks them.
        // SAFETY: lseek on the application's file, which changes nothing.
        let seekable = unsafe { libc::lseek64(inp, 0, libc::SEEK_CUR) } >= 0;
        return g.err(if seekable { libc::EINVAL } else { last() });
    }
    // The common case asks nothing first: the file is read into the ring, and a read that fails
    // or finds the end (nothing stored) asks then. A connection with no room now asks first, as
    // its write would fail (EAGAIN) or wait before the file is read.
    let first = c.space() == 0;
    if first {
        if let Some(r) = input_answer(inp, pos, off.is_null()) {
            return r.map_or_else(|e| g.err(e), |n| g.ok(n));
        }
    }
    let src = FileBytes { fd: inp, pos, len: count, stored: Cell::new(0), ended: Cell::new(false), err: Cell::new(None) };
    let r = conn_send_from(c, &src, 0);
    if src.stored.get() == 0 && !first {
        if let Some(r) = input_answer(inp, pos, off.is_null()) {
            return r.map_or_else(|e| g.err(e), |n| g.ok(n));
        }
    }
    let r = match r {
        // A failure to read is reported when nothing was sent.
        Ok(0) => src.err.take().map_or(Ok(0), Err),
        // A write the connection takes unsent (the first after the peer closed, as kernel TCP
        // takes it) counts the file's bytes, not more than it has.
        Ok(n) if n > src.stored.get() => Ok(n.min(file_left(inp, pos).max(src.stored.get()))),
        r => r,
    };
    let sent = *r.as_ref().unwrap_or(&0);
    if off.is_null() {
        // SAFETY: moving the application's file position past what was sent.
        unsafe { libc::lseek64(inp, pos + sent as i64, libc::SEEK_SET) };
    } else {
        // SAFETY: the application's offset.
        unsafe { *off = pos + sent as i64 };
    }
    epipe_signal(&r, 0);
    result(g, r)
}

/// The kernel's sendfile answer for an input whose read failed with `e`: one that cannot be
/// read at an offset (a pipe, a socket) is ESPIPE given an offset and EINVAL without one
/// (`no_offset`); a directory EINVAL (the kernel cannot splice from it).
fn unreadable_errno(e: c_int, no_offset: bool) -> c_int {
    match e {
        libc::ESPIPE if no_offset => libc::EINVAL,
        libc::EISDIR => libc::EINVAL,
        e => e,
    }
}

/// What the kernel's sendfile answers of the input `fd` at `pos` (`no_offset`: the file
/// position's) before it writes to the socket, if that is the call's answer: a read error's
/// errno (`unreadable_errno`), EINVAL for an input the kernel cannot splice from, 0 at the end
/// of the file. `None`: there are bytes to send. A read of one byte, and for what is not a
/// regular file with bytes, `splices`.
fn input_answer(fd: c_int, pos: i64, no_offset: bool) -> Option<Result<ssize_t, c_int>> {
    let mut one = 0u8;
    // A signal's interruption is retried, as `FileBytes::put`'s reads are.
    let r = loop {
        // SAFETY: a read of at most one byte into `one`.
        let r = unsafe { libc::pread64(fd, (&raw mut one).cast(), 1, pos) };
        if r >= 0 {
            break r;
        }
        let e = io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL);
        if e != libc::EINTR {
            return Some(Err(unreadable_errno(e, no_offset)));
        }
    };
    // SAFETY: only asks the kernel about the number.
    let st = rustix::fs::fstat(unsafe { colo_sys::BorrowedFd::borrow_raw(fd) }).ok()?;
    let regular = rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile && st.st_size > 0;
    if !regular {
        if let Err(e) = splices(fd, pos) {
            return Some(Err(e));
        }
    }
    (r == 0).then_some(Ok(0))
}

/// Whether the kernel's sendfile reads `fd` (a file it can read at `pos`): the kernel's own
/// sendfile of one byte from `pos` to /dev/null answers it, and moves nothing of `fd` (the offset
/// is ours). `Err` is that sendfile's errno (EINVAL for what the kernel cannot splice from);
/// without /dev/null to ask, the file is taken as one it reads.
fn splices(fd: c_int, pos: i64) -> Result<(), c_int> {
    use rustix::fs::{open, Mode, OFlags};
    let Ok(null) = open("/dev/null", OFlags::WRONLY | OFlags::CLOEXEC, Mode::empty()) else { return Ok(()) };
    let mut at = pos;
    // SAFETY: our /dev/null; the application's readable `fd`; `at` is ours.
    let r = unsafe { real::sendfile(std::os::fd::AsRawFd::as_raw_fd(&null), fd, &mut at, 1) };
    if r < 0 {
        return Err(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL));
    }
    Ok(())
}

/// The bytes of the file `fd` from `pos` to its end (0 for what is not a regular file).
fn file_left(fd: c_int, pos: i64) -> usize {
    // SAFETY: only asks the kernel about the number.
    let b = unsafe { colo_sys::BorrowedFd::borrow_raw(fd) };
    rustix::fs::fstat(b).map_or(0, |st| (st.st_size - pos).max(0) as usize)
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
