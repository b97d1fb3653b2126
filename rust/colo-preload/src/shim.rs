//! Tier 2: the shim logic of each interposed call. Every function starts with the one look-up
//! that sends a non-colo fd (or a call made by the shim itself) straight to libc.

use crate::conn::{Conn, IN, OUT};
use crate::table::{self, Entry, CONN, LISTEN, NONE, PENDING};
use crate::semantics::setsockopt_slow;
use crate::{client, poll, real, server, Guard};
use colo::errno_of;
use colo::internal::shm::Drainer;
use libc::{c_int, c_ulong, c_void, iovec, msghdr, off_t, size_t, sockaddr, socklen_t, ssize_t};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

/// The connection behind `fd` for a data operation (resolving a pending connect first), or
/// `None` for plain TCP.
pub(crate) fn conn_for_io(fd: c_int) -> Option<Arc<Conn>> {
    match table::kind(fd) {
        CONN => table::conn(fd),
        PENDING => {
            client::resolve_fd(fd);
            table::conn(fd)
        }
        _ => None,
    }
}

#[inline]
pub(crate) fn plain(fd: c_int) -> bool {
    table::kind(fd) == NONE || Guard::busy()
}

fn result(g: &Guard, r: io::Result<usize>) -> ssize_t {
    match r {
        Ok(n) => g.ok(n as ssize_t),
        Err(e) => g.err(errno_of(&e)),
    }
}

fn epipe_signal(r: &io::Result<usize>, flags: c_int) {
    if let Err(e) = r {
        if errno_of(e) == libc::EPIPE && flags & libc::MSG_NOSIGNAL == 0 {
            // SAFETY: raising a signal is what the kernel would do for a write on a broken pipe.
            unsafe { libc::raise(libc::SIGPIPE) };
        }
    }
}

// ---- reading --------------------------------------------------------------------------------

fn would_block() -> io::Error {
    io::Error::from_raw_os_error(libc::EAGAIN)
}

/// Reads with recv(2) flags (MSG_PEEK, MSG_DONTWAIT, MSG_WAITALL).
pub(crate) fn conn_recv(c: &Conn, buf: &mut [u8], flags: c_int) -> io::Result<usize> {
    match conn_recv_inner(c, buf, flags) {
        // The peer exited without closing (no FIN in the ring) after reading all we sent: its
        // kernel would have closed the TCP socket gracefully, so this is end of stream. A reset
        // is reported once, as the kernel's socket error; then reads see end of stream.
        Err(e) if errno_of(&e) == libc::ECONNRESET && (c.peer_exited_cleanly() || !c.report_reset()) => Ok(0),
        r => r,
    }
}

fn conn_recv_inner(c: &Conn, buf: &mut [u8], flags: c_int) -> io::Result<usize> {
    if buf.is_empty() {
        return crate::semantics::recv_nothing(c, flags);
    }
    if flags & libc::MSG_DONTWAIT != 0 && !c.nonblocking() && c.ready(true) & IN == 0 && c.arm(Drainer::Awake, true) & IN == 0 {
        return Err(would_block());
    }
    if flags & libc::MSG_PEEK != 0 {
        return c.shm().peek(buf);
    }
    let mut n = c.shm().read(buf)?;
    // MSG_WAITALL waits for all; a blocking read otherwise for SO_RCVLOWAT bytes (1 by default).
    let all = flags & libc::MSG_WAITALL != 0;
    let target = if all { buf.len() } else { c.lowat().min(buf.len()) };
    if n < target && !c.nonblocking() && (all || flags & libc::MSG_DONTWAIT == 0) {
        while n < target {
            match c.shm().read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(_) if n > 0 => break,
                Err(e) => return Err(e),
            }
        }
    }
    after_read(c, n, buf.len());
    Ok(n)
}

/// Keeps the readiness fd honest for level-triggered pollers: if the buffer was filled, more
/// may be waiting, so make sure the doorbell stays rung. (A short read needs nothing: every
/// drain of the doorbell announces a wait, so either the doorbell holds a count or the peer's
/// next progress rings it; and `epoll_wait`/`poll` read the rings before sleeping.)
fn after_read(c: &Conn, n: usize, len: usize) {
    if n > 0 {
        c.got_reply();
    }
    if n == len && n > 0 && c.shm().readable().unwrap_or(0) > 0 {
        c.poke();
    }
}

fn conn_readv(c: &Conn, iov: &[iovec], flags: c_int) -> io::Result<usize> {
    let mut total = 0;
    for (i, v) in iov.iter().enumerate() {
        if v.iov_len == 0 {
            continue;
        }
        // SAFETY: the application gave us this buffer for writing.
        let buf = unsafe { std::slice::from_raw_parts_mut(v.iov_base as *mut u8, v.iov_len) };
        if i > 0 && total > 0 && c.shm().readable().unwrap_or(0) == 0 {
            break;
        }
        let r = if total == 0 { conn_recv(c, buf, flags) } else { c.shm().read(buf) };
        match r {
            Ok(0) => break,
            Ok(n) => {
                total += n;
                if n < buf.len() {
                    break;
                }
            }
            Err(_) if total > 0 => break,
            Err(e) => return Err(e),
        }
    }
    Ok(total)
}

// ---- writing --------------------------------------------------------------------------------

fn conn_send(c: &Conn, buf: &[u8], flags: c_int) -> io::Result<usize> {
    match conn_send_inner(c, buf, flags) {
        // Kernel TCP takes the first write after the peer closed (see `takes_write_after_close`).
        Err(e) if errno_of(&e) == libc::EPIPE && c.takes_write_after_close() => Ok(buf.len()),
        // A reset is reported once (the kernel's socket error); later writes fail as after it.
        Err(e) if errno_of(&e) == libc::ECONNRESET && !c.report_reset() => Err(io::Error::from_raw_os_error(libc::EPIPE)),
        r => r,
    }
}

fn conn_send_inner(c: &Conn, buf: &[u8], flags: c_int) -> io::Result<usize> {
    if buf.is_empty() {
        return Ok(0);
    }
    // Each call's bytes stay contiguous when processes share the connection (`turns`).
    let _turn = c.write_turn();
    let nb = c.nonblocking() || flags & libc::MSG_DONTWAIT != 0;
    if nb {
        if !c.nonblocking() && c.ready(false) & OUT == 0 && c.arm(Drainer::Awake, true) & OUT == 0 {
            return Err(would_block());
        }
        if c.send_limited() {
            return crate::semantics::send_bounded(c, buf);
        }
        let n = c.shm().write(buf)?;
        return Ok(n);
    }
    // Blocking sockets write everything (or fail).
    let mut done = 0;
    while done < buf.len() {
        match c.shm().write(&buf[done..]) {
            Ok(n) => done += n,
            Err(_) if done > 0 => break,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

thread_local! {
    static GATHER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

const GATHER_MAX: usize = 256 * 1024;

fn conn_writev(c: &Conn, iov: &[iovec], flags: c_int) -> io::Result<usize> {
    let nonempty: Vec<&iovec> = iov.iter().filter(|v| v.iov_len > 0).collect();
    if nonempty.len() == 1 {
        // SAFETY: the application's buffer, valid for reading.
        let b = unsafe { std::slice::from_raw_parts(nonempty[0].iov_base as *const u8, nonempty[0].iov_len) };
        return conn_send(c, b, flags);
    }
    // A blocking socket writes every iovec (as the kernel does), in gathers of at most
    // GATHER_MAX bytes; a non-blocking one writes what one gather takes.
    let blocking = !c.nonblocking() && flags & libc::MSG_DONTWAIT == 0;
    GATHER.with(|g| {
        let mut g = g.borrow_mut();
        let (mut i, mut off, mut done) = (0, 0, 0);
        while i < nonempty.len() {
            g.clear();
            while i < nonempty.len() && g.len() < GATHER_MAX {
                let v = nonempty[i];
                let take = (v.iov_len - off).min(GATHER_MAX - g.len());
                // SAFETY: the application's buffer, valid for reading; `off + take <= iov_len`.
                let b = unsafe { std::slice::from_raw_parts((v.iov_base as *const u8).add(off), take) };
                g.extend_from_slice(b);
                off += take;
                if off == v.iov_len {
                    i += 1;
                    off = 0;
                }
            }
            match conn_send(c, &g, flags) {
                Ok(n) => {
                    done += n;
                    if n < g.len() || !blocking {
                        break;
                    }
                }
                Err(_) if done > 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    })
}

// ---- the calls ------------------------------------------------------------------------------

/// A call on an fd that is not colo's goes to libc from a few instructions inlined into the
/// exported symbol; any other to `$slow` (not inlined). The shim's code is cold between an
/// application's system calls: in wrk, about 1,100 instructions a request of the shim's cost
/// some 1 us of user time (perf), so the common case must touch as few lines as it can.
macro_rules! plain_first {
    ($($name:ident => $slow:ident ($fd:ident $(, $arg:ident: $t:ty)*) -> $ret:ty;)*) => {$(
        #[inline(always)]
        pub unsafe fn $name($fd: c_int $(, $arg: $t)*) -> $ret {
            if table::kind($fd) == NONE {
                // SAFETY: the application's arguments.
                return unsafe { real::$name($fd $(, $arg)*) };
            }
            // SAFETY: the application's arguments.
            unsafe { $slow($fd $(, $arg)*) }
        }
    )*};
}

plain_first! {
    read => read_slow(fd, buf: *mut c_void, n: size_t) -> ssize_t;
    readv => readv_slow(fd, iov: *const iovec, cnt: c_int) -> ssize_t;
    write => write_slow(fd, buf: *const c_void, n: size_t) -> ssize_t;
    writev => writev_slow(fd, iov: *const iovec, cnt: c_int) -> ssize_t;
    recvfrom => recvfrom_slow(fd, buf: *mut c_void, n: size_t, flags: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> ssize_t;
    sendto => sendto_slow(fd, buf: *const c_void, n: size_t, flags: c_int, addr: *const sockaddr, len: socklen_t) -> ssize_t;
    setsockopt => setsockopt_slow(fd, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int;
}

#[inline(never)]
unsafe fn read_slow(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    if plain(fd) {
        // SAFETY: the application's arguments.
        return unsafe { real::read(fd, buf, n) };
    }
    let g = Guard::enter();
    let Some(c) = conn_for_io(fd) else {
        drop(g);
        // SAFETY: the application's arguments.
        return unsafe { real::read(fd, buf, n) };
    };
    if n == 0 {
        // As read(2) on a socket: nothing asked, nothing waited for.
        return g.ok(0);
    }
    // SAFETY: the application gave us `n` writable bytes at `buf`.
    let b = unsafe { crate::slice_mut(buf as *mut u8, n) };
    let r = conn_recv(&c, b, 0);
    result(&g, r)
}

#[inline(never)]
unsafe fn recvfrom_slow(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    if plain(fd) {
        // SAFETY: the application's arguments.
        return unsafe { real::recvfrom(fd, buf, n, flags, addr, len) };
    }
    let g = Guard::enter();
    let Some(c) = conn_for_io(fd) else {
        drop(g);
        // SAFETY: the application's arguments.
        return unsafe { real::recvfrom(fd, buf, n, flags, addr, len) };
    };
    if flags & libc::MSG_OOB != 0 {
        return g.err(libc::EINVAL);
    }
    let r = if flags & libc::MSG_TRUNC != 0 {
        crate::semantics::recv_discard(&c, n, flags)
    } else {
        // SAFETY: the application gave us `n` writable bytes at `buf`.
        conn_recv(&c, unsafe { crate::slice_mut(buf as *mut u8, n) }, flags)
    };
    if r.is_ok() && !addr.is_null() && !len.is_null() {
        // A connected stream socket reports no source address (the kernel sets the length to 0).
        // SAFETY: the application's address length.
        unsafe { *len = 0 };
    }
    result(&g, r)
}

#[inline(never)]
unsafe fn readv_slow(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    if plain(fd) {
        // SAFETY: the application's arguments.
        return unsafe { real::readv(fd, iov, cnt) };
    }
    let g = Guard::enter();
    let Some(c) = conn_for_io(fd) else {
        drop(g);
        // SAFETY: the application's arguments.
        return unsafe { real::readv(fd, iov, cnt) };
    };
    if !(0..=1024).contains(&cnt) {
        return g.err(libc::EINVAL);
    }
    // SAFETY: `cnt` iovecs at `iov`.
    let v = unsafe { crate::slice(iov, cnt as usize) };
    let r = conn_readv(&c, v, 0);
    result(&g, r)
}

pub unsafe fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    if plain(fd) {
        // SAFETY: the application's arguments.
        return unsafe { real::recvmsg(fd, msg, flags) };
    }
    let g = Guard::enter();
    let Some(c) = conn_for_io(fd) else {
        drop(g);
        // SAFETY: the application's arguments.
        return unsafe { real::recvmsg(fd, msg, flags) };
    };
    // SAFETY: the application's msghdr.
    let m = unsafe { &mut *msg };
    // SAFETY: the iovecs it describes.
    let v = unsafe { crate::slice(m.msg_iov, m.msg_iovlen) };
    let r = conn_readv(&c, v, flags);
    if r.is_ok() {
        // A connected stream socket reports no source address (the kernel sets the length to 0).
        m.msg_namelen = 0;
        m.msg_controllen = 0;
        m.msg_flags = 0;
    }
    result(&g, r)
}

#[inline(never)]
unsafe fn write_slow(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    if plain(fd) {
        // SAFETY: the application's arguments.
        return unsafe { real::write(fd, buf, n) };
    }
    let g = Guard::enter();
    let Some(c) = conn_for_io(fd) else {
        drop(g);
        // SAFETY: the application's arguments.
        return unsafe { real::write(fd, buf, n) };
    };
    // SAFETY: `n` readable bytes at `buf`.
    let b = unsafe { crate::slice(buf as *const u8, n) };
    let r = conn_send(&c, b, 0);
    epipe_signal(&r, 0);
    result(&g, r)
}

#[inline(never)]
unsafe fn sendto_slow(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
    addr: *const sockaddr,
    len: socklen_t,
) -> ssize_t {
    if plain(fd) {
        // SAFETY: the application's arguments.
        return unsafe { real::sendto(fd, buf, n, flags, addr, len) };
    }
    let g = Guard::enter();
    let Some(c) = conn_for_io(fd) else {
        drop(g);
        // SAFETY: the application's arguments.
        return unsafe { real::sendto(fd, buf, n, flags, addr, len) };
    };
    if flags & libc::MSG_OOB != 0 {
        return g.err(libc::EOPNOTSUPP);
    }
    // SAFETY: `n` readable bytes at `buf`.
    let b = unsafe { crate::slice(buf as *const u8, n) };
    let r = conn_send(&c, b, flags);
    epipe_signal(&r, flags);
    result(&g, r)
}

#[inline(never)]
unsafe fn writev_slow(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    if plain(fd) {
        // SAFETY: the application's arguments.
        return unsafe { real::writev(fd, iov, cnt) };
    }
    let g = Guard::enter();
    let Some(c) = conn_for_io(fd) else {
        drop(g);
        // SAFETY: the application's arguments.
        return unsafe { real::writev(fd, iov, cnt) };
    };
    if !(0..=1024).contains(&cnt) {
        return g.err(libc::EINVAL);
    }
    // SAFETY: `cnt` iovecs at `iov`.
    let v = unsafe { crate::slice(iov, cnt as usize) };
    let r = conn_writev(&c, v, 0);
    epipe_signal(&r, 0);
    result(&g, r)
}

pub unsafe fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    if plain(fd) {
        // SAFETY: the application's arguments.
        return unsafe { real::sendmsg(fd, msg, flags) };
    }
    let g = Guard::enter();
    let Some(c) = conn_for_io(fd) else {
        drop(g);
        // SAFETY: the application's arguments.
        return unsafe { real::sendmsg(fd, msg, flags) };
    };
    // SAFETY: the application's msghdr and its iovecs.
    let v = unsafe { crate::slice((*msg).msg_iov, (*msg).msg_iovlen) };
    let r = conn_writev(&c, v, flags);
    epipe_signal(&r, flags);
    result(&g, r)
}

pub unsafe fn recvmmsg(fd: c_int, v: *mut libc::mmsghdr, n: libc::c_uint, flags: c_int, t: *mut libc::timespec) -> c_int {
    if plain(fd) || table::kind(fd) != CONN {
        // SAFETY: the application's arguments.
        return unsafe { real::recvmmsg(fd, v, n, flags, t) };
    }
    // SAFETY: the application's arguments.
    unsafe { crate::semantics::recvmmsg(fd, v, n, flags) }
}

pub unsafe fn sendmmsg(fd: c_int, v: *mut libc::mmsghdr, n: libc::c_uint, flags: c_int) -> c_int {
    if plain(fd) || table::kind(fd) != CONN {
        // SAFETY: the application's arguments.
        return unsafe { real::sendmmsg(fd, v, n, flags) };
    }
    let mut done = 0;
    for i in 0..n as usize {
        // SAFETY: `n` mmsghdrs at `v`.
        let m = unsafe { &mut *v.add(i) };
        // SAFETY: as above.
        let r = unsafe { sendmsg(fd, &m.msg_hdr, flags) };
        if r < 0 {
            return if done > 0 { done } else { -1 };
        }
        m.msg_len = r as u32;
        done += 1;
    }
    done
}

pub unsafe fn sendfile(out: c_int, inp: c_int, off: *mut i64, count: size_t) -> ssize_t {
    let g = Guard::enter();
    let Some(c) = conn_for_io(out) else {
        drop(g);
        // SAFETY: the application's arguments.
        return unsafe { real::sendfile64(out, inp, off, count) };
    };
    let mut pos: i64 = if off.is_null() {
        // SAFETY: lseek on the application's file.
        unsafe { libc::lseek64(inp, 0, libc::SEEK_CUR) }
    } else {
        // SAFETY: the application's offset.
        unsafe { *off }
    };
    if pos < 0 {
        return g.err(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL));
    }
    let mut buf = vec![0u8; count.min(64 * 1024)];
    let mut total = 0usize;
    let mut err = None;
    while total < count {
        let want = (count - total).min(buf.len());
        // SAFETY: reading into our buffer.
        let r = unsafe { libc::pread64(inp, buf.as_mut_ptr().cast(), want, pos) };
        if r <= 0 {
            if r < 0 {
                let e = io::Error::last_os_error();
                // The kernel's sendfile refuses an input it cannot read at an offset (a pipe or
                // a socket) with EINVAL.
                err = Some(if e.raw_os_error() == Some(libc::ESPIPE) { io::Error::from_raw_os_error(libc::EINVAL) } else { e });
            }
            break;
        }
        let r = r as usize;
        if total > 0 && c.ready(false) & OUT == 0 {
            break;
        }
        match conn_send(&c, &buf[..r], if total > 0 { libc::MSG_DONTWAIT } else { 0 }) {
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
            result(&g, r)
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
    if (plain(inp) && plain(out)) || Guard::busy() {
        // SAFETY: the application's arguments.
        return unsafe { real::splice(inp, off_in, out, off_out, len, flags) };
    }
    let g = Guard::enter();
    let (cin, cout) = (conn_for_io(inp), conn_for_io(out));
    let nonblock_pipe = flags & libc::SPLICE_F_NONBLOCK != 0;
    let r = match (cin, cout) {
        (None, None) => {
            drop(g);
            // SAFETY: the application's arguments.
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

/// `socket(2)`: a TCP socket is marked fresh (`table::is_fresh`), as only those may be
/// accelerated by `connect`.
pub unsafe fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    // SAFETY: the application's arguments.
    let fd = unsafe { real::socket(domain, ty, protocol) };
    crate::repeat::forget(fd);
    let tcp = matches!(domain, libc::AF_INET | libc::AF_INET6)
        && ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) == libc::SOCK_STREAM
        && matches!(protocol, 0 | libc::IPPROTO_TCP);
    crate::behind::new_number(fd, tcp);
    fd
}

pub unsafe fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    if !table::is_fresh(fd) || addr.is_null() {
        // SAFETY: the application's arguments.
        return unsafe { real::connect(fd, addr, len) };
    }
    // SAFETY: `len` bytes of address at `addr`.
    let peer = unsafe { crate::parse_sockaddr(addr, len) };
    let r = match peer {
        // Not an IPv4 or IPv6 address (or too short for one): the kernel's answer.
        // SAFETY: the application's arguments.
        None => unsafe { real::connect(fd, addr, len) },
        // Plain TCP there for now (a plain period of a client that connects per request, or no
        // colo listener a moment ago): nothing to decide, so neither the guard's thread-local
        // nor the client's other tests (about a fifth of the shim's cost per request). So also
        // from inside the shim, which dials no TCP through libc.
        // SAFETY: the application's arguments.
        Some(p) if client::known_plain(p) => unsafe { real::connect(fd, addr, len) },
        Some(p) => match Guard::try_enter() {
            // SAFETY: the application's arguments.
            Some(g) => unsafe { connect_fresh(g, fd, p, addr, len) },
            // SAFETY: the application's arguments.
            None => return unsafe { real::connect(fd, addr, len) },
        },
    };
    // Connected or on its way: no longer fresh (a refused socket may be connected again).
    // SAFETY: reading this thread's errno.
    if r == 0 || matches!(unsafe { *crate::errno_loc() }, libc::EINPROGRESS | libc::EALREADY | libc::EISCONN | libc::EINTR) {
        table::set_fresh(fd, false);
    }
    r
}

/// `connect` of a fresh TCP socket to `peer`: offered shared memory if its destination may take
/// it.
unsafe fn connect_fresh(g: Guard, fd: c_int, peer: SocketAddr, addr: *const sockaddr, len: socklen_t) -> c_int {
    match client::prepare(fd, peer) {
        client::Prepared::Plain => {
            drop(g);
            // SAFETY: the application's arguments.
            unsafe { real::connect(fd, addr, len) }
        }
        client::Prepared::NoListener(target) => {
            // SAFETY: the application's arguments.
            let r = unsafe { real::connect(fd, addr, len) };
            let e = io::Error::last_os_error().raw_os_error().unwrap_or(0);
            client::note_no_listener(fd, target, r, e);
            if r == 0 {
                g.ok(0) as c_int
            } else {
                g.err(e) as c_int
            }
        }
        client::Prepared::Connected { pending, errno } => {
            if let Some(p) = pending {
                client::record(fd, p);
                if poll::has_plain(fd) {
                    client::resolve_fd(fd);
                }
            }
            if errno == 0 {
                g.ok(0) as c_int
            } else {
                g.err(errno) as c_int
            }
        }
        client::Prepared::Offered(p) => {
            // SAFETY: the application's arguments.
            let r = unsafe { real::connect(fd, addr, len) };
            let e = io::Error::last_os_error().raw_os_error().unwrap_or(0);
            if r == 0 || e == libc::EINPROGRESS {
                client::record(fd, p);
                // Registered in epoll before `connect` (nginx's upstreams): decide now, so that
                // the registrations watch the ring from the start. Otherwise a server that speaks
                // first (a banner) would never be reported: nothing else resolves the fd.
                if poll::has_plain(fd) {
                    client::resolve_fd(fd);
                }
            } else {
                client::withdraw(p);
            }
            if r == 0 {
                g.ok(0) as c_int
            } else {
                g.err(e) as c_int
            }
        }
    }
}

pub unsafe fn listen(fd: c_int, backlog: c_int) -> c_int {
    // SAFETY: the application's arguments.
    let r = unsafe { real::listen(fd, backlog) };
    if r != 0 || Guard::busy() {
        return r;
    }
    let g = Guard::enter();
    server::on_listen(fd);
    g.ok(0) as c_int
}

pub unsafe fn accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int {
    // The size of the application's buffer (the kernel writes back the address's full size).
    // SAFETY: `len`, if not null, points to the application's length.
    let room = if addr.is_null() || len.is_null() { 0 } else { unsafe { *len } };
    // SAFETY: the application's arguments.
    let nfd = unsafe { real::accept4(fd, addr, len, flags) };
    crate::behind::new_number(nfd, false);
    crate::repeat::forget(nfd);
    if nfd < 0 || table::kind(fd) != LISTEN {
        return nfd;
    }
    // A CARRIER client's port is odd (spec/WIRE.md section 3): from an even one, no offer can
    // come, and the connection is plain without a look at the rendezvous (a system call), or at
    // the guard's thread-local.
    // From another network namespace, a proposal may come whatever the port (spec/WIRE.md
    // section 11).
    let plain = |p: std::net::SocketAddr| {
        p.port().is_multiple_of(2) && !(colo::internal::netns::server_configured() && colo::internal::netns::from_elsewhere(p))
    };
    // SAFETY: the kernel wrote the peer's address at `addr`, `*len` bytes of it within `room`.
    if room > 0 && unsafe { crate::parse_sockaddr(addr, room.min(*len)) }.is_some_and(plain) {
        return nfd;
    }
    let Some(g) = Guard::try_enter() else { return nfd };
    let listen = table::lock(fd).and_then(|mut s| match s.entry() {
        Entry::Listen(l) => Some(l.clone()),
        _ => None,
    });
    if let Some(l) = listen {
        server::on_accept(&l, nfd, flags & libc::SOCK_NONBLOCK != 0);
    }
    g.ok(nfd as ssize_t) as c_int
}

/// Forgets what the table knows about `fd` (it is being closed or replaced).
pub(crate) fn forget(fd: c_int) {
    if table::is_epoll(fd) {
        poll::forget_epoll(fd);
        table::set_epoll(fd, false);
    }
    if table::kind(fd) == NONE {
        return;
    }
    let old = match table::lock(fd) {
        Some(mut s) => s.take(),
        None => return,
    };
    poll::forget_fd(fd);
    match old {
        Entry::Conn(c) => crate::semantics::closing(fd, &c),
        Entry::Listen(l) => server::on_close_listen(&l),
        Entry::Pending(p) => client::close_pending(p),
        _ => {}
    }
}

#[inline(always)]
pub unsafe fn close(fd: c_int) -> c_int {
    let r = if table::kind(fd) == NONE && !table::is_epoll(fd) {
        // SAFETY: the application's argument.
        unsafe { real::close(fd) }
    } else {
        // SAFETY: the application's argument.
        unsafe { close_slow(fd) }
    };
    // After the call: a change racing with the close cannot leave a memory of the closed number.
    crate::repeat::forget(fd);
    r
}

#[inline(never)]
unsafe fn close_slow(fd: c_int) -> c_int {
    if plain(fd) && !table::is_epoll(fd) {
        // SAFETY: the application's argument.
        return unsafe { real::close(fd) };
    }
    let g = Guard::enter();
    forget(fd);
    drop(g);
    // SAFETY: the application's argument.
    unsafe { real::close(fd) }
}

pub unsafe fn shutdown(fd: c_int, how: c_int) -> c_int {
    if plain(fd) {
        // SAFETY: the application's arguments.
        return unsafe { real::shutdown(fd, how) };
    }
    let g = Guard::enter();
    let Some(c) = conn_for_io(fd) else {
        drop(g);
        // SAFETY: the application's arguments.
        return unsafe { real::shutdown(fd, how) };
    };
    let (rd, wr) = match how {
        libc::SHUT_RD => (true, false),
        libc::SHUT_WR => (false, true),
        libc::SHUT_RDWR => (true, true),
        _ => return g.err(libc::EINVAL) as c_int,
    };
    if rd {
        c.shut_read();
    }
    c.shm().shutdown_as_tcp(rd, wr);
    g.ok(0) as c_int
}

/// Copies the table entry of `fd` to `nfd` after a successful dup.
fn copy_entry(fd: c_int, nfd: c_int) {
    crate::repeat::duplicated(fd, nfd);
    client::resolve_fd(fd);
    let e = match table::lock(fd) {
        Some(mut s) => match s.entry() {
            Entry::Conn(c) => Entry::Conn(c.clone()),
            Entry::Listen(l) => Entry::Listen(l.clone()),
            _ => return,
        },
        None => return,
    };
    let conn = match &e {
        Entry::Conn(c) => Some(c.clone()),
        _ => None,
    };
    if let Some(mut s) = table::lock(nfd) {
        s.set(e);
    }
    // A duplicate may be inheritable where the original was not (see `handover`).
    if let Some(c) = conn {
        crate::handover::update(nfd, &c);
    }
}

pub unsafe fn dup(fd: c_int) -> c_int {
    if plain(fd) {
        // SAFETY: the application's argument.
        let n = unsafe { real::dup(fd) };
        if n >= 0 {
            crate::repeat::duplicated(fd, n);
        }
        return n;
    }
    let g = Guard::enter();
    client::resolve_fd(fd);
    // SAFETY: the application's argument.
    let n = unsafe { real::dup(fd) };
    if n < 0 {
        return g.err(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EBADF)) as c_int;
    }
    copy_entry(fd, n);
    g.ok(n as ssize_t) as c_int
}

pub unsafe fn dup3(fd: c_int, nfd: c_int, flags: c_int, two: bool) -> c_int {
    let call = |fd, nfd, flags| {
        if two {
            // SAFETY: the application's arguments.
            unsafe { real::dup2(fd, nfd) }
        } else {
            // SAFETY: the application's arguments.
            unsafe { real::dup3(fd, nfd, flags) }
        }
    };
    if Guard::busy() || (table::kind(fd) == NONE && table::kind(nfd) == NONE && !table::is_epoll(nfd)) {
        let n = call(fd, nfd, flags);
        if n >= 0 && fd != nfd {
            crate::repeat::duplicated(fd, nfd);
        }
        return n;
    }
    let g = Guard::enter();
    client::resolve_fd(fd);
    if fd == nfd {
        drop(g);
        return call(fd, nfd, flags);
    }
    forget(nfd);
    let n = call(fd, nfd, flags);
    if n < 0 {
        return g.err(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EBADF)) as c_int;
    }
    copy_entry(fd, n);
    g.ok(n as ssize_t) as c_int
}

#[inline(always)]
pub unsafe fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong, is64: bool) -> c_int {
    if table::kind(fd) == NONE {
        // SAFETY: the application's arguments.
        let r = unsafe { real_fcntl(fd, cmd, arg, is64) };
        if r >= 0 && (cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC) {
            crate::repeat::duplicated(fd, r);
        }
        return r;
    }
    // SAFETY: the application's arguments.
    unsafe { fcntl_slow(fd, cmd, arg, is64) }
}

/// libc's `fcntl64` or `fcntl`, as the application called.
#[inline(always)]
unsafe fn real_fcntl(fd: c_int, cmd: c_int, arg: c_ulong, is64: bool) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { if is64 { real::fcntl64(fd, cmd, arg) } else { real::fcntl(fd, cmd, arg) } }
}

#[inline(never)]
unsafe fn fcntl_slow(fd: c_int, cmd: c_int, arg: c_ulong, is64: bool) -> c_int {
    // SAFETY: the application's arguments.
    let call = || unsafe { real_fcntl(fd, cmd, arg, is64) };
    if plain(fd) {
        return call();
    }
    let g = Guard::enter();
    if cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC {
        client::resolve_fd(fd);
    }
    let r = call();
    if r < 0 {
        return g.err(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EBADF)) as c_int;
    }
    match cmd {
        libc::F_SETFL => {
            if let Some(c) = table::conn(fd) {
                c.set_nonblocking(arg as c_int & libc::O_NONBLOCK != 0);
            }
        }
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => copy_entry(fd, r),
        libc::F_SETFD => {
            if let Some(c) = table::conn(fd) {
                crate::handover::update(fd, &c);
            }
        }
        _ => {}
    }
    g.ok(r as ssize_t) as c_int
}

pub unsafe fn ioctl(fd: c_int, req: c_ulong, arg: c_ulong) -> c_int {
    if plain(fd) || (req != libc::FIONBIO && req != libc::FIONREAD) {
        // SAFETY: the application's arguments.
        return unsafe { real::ioctl(fd, req, arg) };
    }
    let g = Guard::enter();
    let Some(c) = conn_for_io(fd) else {
        drop(g);
        // SAFETY: the application's arguments.
        return unsafe { real::ioctl(fd, req, arg) };
    };
    if arg == 0 {
        return g.err(libc::EFAULT) as c_int;
    }
    if req == libc::FIONBIO {
        // SAFETY: the application's arguments.
        let r = unsafe { real::ioctl(fd, req, arg) };
        if r == 0 {
            // SAFETY: FIONBIO takes a pointer to an int.
            c.set_nonblocking(unsafe { *(arg as *const c_int) } != 0);
        }
        return r;
    }
    // From the ring counters, without the reading half's lock: a thread blocked in read holds it.
    match c.available() {
        Ok(n) => {
            // SAFETY: FIONREAD takes a pointer to an int.
            unsafe { *(arg as *mut c_int) = n.min(c_int::MAX as usize) as c_int };
            g.ok(0) as c_int
        }
        Err(e) => g.err(errno_of(&e)) as c_int,
    }
}

pub fn is_colo_or_pending(fd: c_int) -> bool {
    matches!(table::kind(fd), CONN | PENDING)
}

pub unsafe fn sendfile32(out: c_int, inp: c_int, off: *mut off_t, n: size_t) -> ssize_t {
    if plain(out) {
        // SAFETY: the application's arguments.
        return unsafe { real::sendfile(out, inp, off, n) };
    }
    // off_t is 64 bits on the 64-bit targets this shim supports.
    // SAFETY: the application's arguments.
    unsafe { sendfile(out, inp, off.cast(), n) }
}

// ---- stdio ----------------------------------------------------------------------------------

/// `cookie_io_functions_t` of `fopencookie(3)`.
#[repr(C)]
struct CookieIo {
    read: Option<unsafe extern "C" fn(*mut c_void, *mut libc::c_char, size_t) -> ssize_t>,
    write: Option<unsafe extern "C" fn(*mut c_void, *const libc::c_char, size_t) -> ssize_t>,
    seek: Option<unsafe extern "C" fn(*mut c_void, *mut i64, c_int) -> c_int>,
    close: Option<unsafe extern "C" fn(*mut c_void) -> c_int>,
}

extern "C" {
    fn fopencookie(cookie: *mut c_void, mode: *const libc::c_char, io: CookieIo) -> *mut libc::FILE;
}

/// The start of glibc's `struct _IO_FILE` (public ABI, `bits/types/struct_FILE.h`), up to
/// `_fileno`: `_flags`, eleven buffer pointers, `_markers`, `_chain`.
#[repr(C)]
struct IoFileHead {
    flags: c_int,
    pointers: [*mut c_void; 13],
    fileno: c_int,
}

fn cookie_fd(cookie: *mut c_void) -> c_int {
    cookie as usize as c_int
}

unsafe extern "C" fn cookie_read(cookie: *mut c_void, buf: *mut libc::c_char, n: size_t) -> ssize_t {
    // SAFETY: stdio's buffer of `n` bytes.
    unsafe { read(cookie_fd(cookie), buf.cast(), n) }
}

unsafe extern "C" fn cookie_write(cookie: *mut c_void, buf: *const libc::c_char, n: size_t) -> ssize_t {
    // stdio treats a short count as an error: write everything (as its own file ops loop).
    let mut done = 0;
    while done < n {
        // SAFETY: stdio's buffer of `n` bytes; `done < n`.
        let r = unsafe { write(cookie_fd(cookie), buf.add(done).cast(), n - done) };
        if r < 0 {
            // SAFETY: reading this thread's errno.
            if unsafe { *libc::__errno_location() } == libc::EINTR {
                continue;
            }
            return if done > 0 { done as ssize_t } else { -1 };
        }
        done += r as usize;
    }
    done as ssize_t
}

unsafe extern "C" fn cookie_seek(_cookie: *mut c_void, _pos: *mut i64, _whence: c_int) -> c_int {
    // A socket does not seek (lseek(2) says ESPIPE).
    // SAFETY: writing this thread's errno.
    unsafe { *libc::__errno_location() = libc::ESPIPE };
    -1
}

unsafe extern "C" fn cookie_close(cookie: *mut c_void) -> c_int {
    // SAFETY: closing the descriptor the stream owns.
    unsafe { close(cookie_fd(cookie)) }
}

/// `fdopen(3)`: stdio reads and writes through glibc-internal calls that no interposer sees, so
/// a stream over an accelerated socket is a `fopencookie` stream whose functions are the shim's
/// read/write/close; its `_fileno` is set to `fd` so that `fileno(3)` still answers.
pub unsafe fn fdopen(fd: c_int, mode: *const libc::c_char) -> *mut libc::FILE {
    if plain(fd) || mode.is_null() {
        // SAFETY: the application's arguments.
        return unsafe { real::fdopen(fd, mode) };
    }
    let g = Guard::enter();
    if conn_for_io(fd).is_none() {
        drop(g);
        // SAFETY: the application's arguments.
        return unsafe { real::fdopen(fd, mode) };
    }
    // SAFETY: the application's NUL-terminated mode string.
    let m = unsafe { std::ffi::CStr::from_ptr(mode) }.to_bytes();
    if !matches!(m.first(), Some(b'r' | b'w' | b'a')) {
        g.err(libc::EINVAL);
        return std::ptr::null_mut();
    }
    if m.contains(&b'e') {
        // SAFETY: the application's descriptor; through the shim, so the handover follows.
        unsafe { fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC as c_ulong, false) };
    }
    let io = CookieIo { read: Some(cookie_read), write: Some(cookie_write), seek: Some(cookie_seek), close: Some(cookie_close) };
    // SAFETY: a valid mode and functions; the cookie is the descriptor number.
    let f = unsafe { fopencookie(fd as usize as *mut c_void, mode, io) };
    if f.is_null() {
        g.err(io::Error::last_os_error().raw_os_error().unwrap_or(libc::ENOMEM));
        return std::ptr::null_mut();
    }
    // glibc marks a cookie stream with `_fileno == -2`; only then is the layout the one we know.
    let head = f as *mut IoFileHead;
    // SAFETY: `f` is a glibc FILE, which begins with `IoFileHead`'s fields.
    unsafe {
        if (*head).fileno == -2 {
            (*head).fileno = fd;
        }
    }
    g.ok(0);
    f
}
