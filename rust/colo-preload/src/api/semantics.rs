//! Calls whose answers must match kernel TCP in their edge cases (tests/diff shows each): the
//! socket error a reset leaves (`SO_ERROR`, reported once), the reset a close sends
//! (`SO_LINGER {1, 0}`, or bytes left unread), zero-length and discarding (`MSG_TRUNC`) reads,
//! and `recvmmsg` on a stream.

use crate::conn::state::{Conn, IN};
use crate::api::shim::{conn_for_io, conn_recv, plain};
use crate::conn::table::{self, NONE};
use crate::base::guard::Guard;
use crate::real;
use libc::{c_int, c_void, socklen_t};
use std::io;

/// `getsockopt`: `SO_ERROR` of an accelerated connection reports (and clears) the reset its peer
/// sent, as the kernel reports the error a RST left; everything else is the kernel socket's.
pub unsafe fn getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int {
    if table::kind(fd) == NONE || Guard::busy() {
        // SAFETY: the application's arguments.
        return unsafe { real::getsockopt(fd, level, name, val, len) };
    }
    if level == libc::IPPROTO_TCP && name == libc::TCP_INFO {
        // SAFETY: the application's arguments.
        return unsafe { tcp_info(fd, val, len) };
    }
    if level != libc::SOL_SOCKET || name != libc::SO_ERROR {
        // SAFETY: the application's arguments.
        return unsafe { real::getsockopt(fd, level, name, val, len) };
    }
    // SAFETY: the application's arguments.
    let r = unsafe { real::getsockopt(fd, level, name, val, len) };
    if r != 0 || val.is_null() || len.is_null() {
        return r;
    }
    // SAFETY: the application's length, which the kernel just accepted.
    if (unsafe { *len } as usize) < std::mem::size_of::<c_int>() {
        return r;
    }
    let g = Guard::enter();
    if let Some(c) = table::conn(fd) {
        // SAFETY: an int the kernel just wrote (its own error: 0 for a socket colo carries).
        if unsafe { *(val as *const c_int) } == 0 && c.take_reset_error() {
            // SAFETY: as above.
            unsafe { *(val as *mut c_int) = libc::ECONNRESET };
        }
    }
    g.ok(0) as c_int
}

/// Offsets in the kernel's `struct tcp_info` (<linux/tcp.h>; glibc's copy is older).
const TCPI_STATE: usize = 0;
const TCPI_BYTES_ACKED: usize = 120;
const TCPI_BYTES_RECEIVED: usize = 128;

/// `TCP_INFO` of an accelerated connection: the kernel socket's, with the state and the byte
/// counts of the rings (the kernel socket carried only the handshake, so its counts stay at 1).
unsafe fn tcp_info(fd: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int {
    // SAFETY: the application's arguments.
    let r = unsafe { real::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_INFO, val, len) };
    if r != 0 || val.is_null() || len.is_null() {
        return r;
    }
    let g = Guard::enter();
    // SAFETY: the length the kernel just wrote.
    let filled = unsafe { *len } as usize;
    if let Some(c) = table::conn(fd) {
        let (state, sent, got) = c.tcp_info();
        let p = val as *mut u8;
        // SAFETY: the kernel filled `filled` bytes at `val`; each write is within them.
        unsafe {
            if filled > TCPI_STATE && *p.add(TCPI_STATE) == crate::conn::state::TCP_ESTABLISHED {
                *p.add(TCPI_STATE) = state;
            }
            for (at, add) in [(TCPI_BYTES_ACKED, sent), (TCPI_BYTES_RECEIVED, got)] {
                if filled >= at + 8 {
                    let q = p.add(at) as *mut u64;
                    q.write_unaligned(q.read_unaligned().wrapping_add(add));
                }
            }
        }
    }
    g.ok(0) as c_int
}

/// `setsockopt` on a descriptor the shim knows: the kernel's, and what the rings must honour
/// of it (timeouts, `SO_RCVLOWAT`).
#[inline(never)]
pub unsafe fn setsockopt_slow(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int {
    // SAFETY: the application's arguments.
    let r = unsafe { real::setsockopt(fd, level, name, val, len) };
    if r == 0 && level == libc::SOL_SOCKET && (name == libc::SO_RCVLOWAT || name == libc::SO_SNDBUF) && !plain(fd) {
        // SAFETY: the application's arguments, which the kernel just accepted.
        unsafe { set_int_option(fd, name, val, len) };
        return r;
    }
    if r != 0 || plain(fd) || level != libc::SOL_SOCKET || (name != libc::SO_RCVTIMEO && name != libc::SO_SNDTIMEO) {
        return r;
    }
    let g = Guard::enter();
    if let Some(c) = conn_for_io(fd) {
        if !val.is_null() && len as usize >= std::mem::size_of::<libc::timeval>() {
            // SAFETY: a timeval, as the kernel just accepted.
            let tv = unsafe { *(val as *const libc::timeval) };
            let d = std::time::Duration::new(tv.tv_sec.max(0) as u64, (tv.tv_usec.max(0) as u32) * 1000);
            let t = (!d.is_zero()).then_some(d);
            if name == libc::SO_RCVTIMEO {
                c.shm().set_read_timeout(t);
            } else {
                c.shm().set_write_timeout(t);
            }
        }
    }
    g.ok(0) as c_int
}

/// A connection the shim just accelerated on `fd` (connected, accepted, or taken back after
/// `exec`) takes the options its socket already has: set before `connect`, inherited from the
/// listener, or set by an earlier image. Three `getsockopt`s per set-up.
pub fn adopt_options(fd: c_int, c: &Conn) {
    let get = |name: c_int, val: *mut c_void, size: usize| {
        let mut len = size as socklen_t;
        // SAFETY: `val` points to `size` writable bytes of ours.
        unsafe { real::getsockopt(fd, libc::SOL_SOCKET, name, val, &mut len) == 0 && len as usize == size }
    };
    for name in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        let mut tv = libc::timeval { tv_sec: 0, tv_usec: 0 };
        if get(name, (&mut tv as *mut libc::timeval).cast(), std::mem::size_of::<libc::timeval>()) {
            let d = std::time::Duration::new(tv.tv_sec.max(0) as u64, (tv.tv_usec.max(0) as u32) * 1000);
            if !d.is_zero() {
                if name == libc::SO_RCVTIMEO {
                    c.shm().set_read_timeout(Some(d));
                } else {
                    c.shm().set_write_timeout(Some(d));
                }
            }
        }
    }
    let mut low: c_int = 1;
    if get(libc::SO_RCVLOWAT, (&mut low as *mut c_int).cast(), std::mem::size_of::<c_int>()) && low > 1 {
        c.set_lowat(low as u32);
    }
}

/// `setsockopt(SO_RCVLOWAT or SO_SNDBUF)` on an accelerated connection, which the kernel accepted.
unsafe fn set_int_option(fd: c_int, name: c_int, val: *const c_void, len: socklen_t) {
    if val.is_null() || (len as usize) < std::mem::size_of::<c_int>() {
        return;
    }
    let g = Guard::enter();
    if let Some(c) = table::conn(fd) {
        // SAFETY: an int, as the kernel just accepted.
        let v = unsafe { *(val as *const c_int) }.max(1);
        if name == libc::SO_RCVLOWAT {
            c.set_lowat(v as u32);
        } else {
            c.set_send_limit(v as usize);
        }
    }
    drop(g);
}

/// A non-blocking write on a connection a small `SO_SNDBUF` bounds (`Conn::set_send_limit`):
/// what fits below the bound, or `EAGAIN`.
pub fn send_bounded(c: &Conn, buf: &[u8]) -> io::Result<usize> {
    let room = c.space();
    if room == 0 {
        // Errors (a reset, a closed peer) first, as the kernel reports them before EAGAIN.
        if c.ready(true) & crate::conn::state::ERR != 0 {
            return c.shm().write(buf);
        }
        return Err(io::Error::from_raw_os_error(libc::EAGAIN));
    }
    c.shm().write(&buf[..buf.len().min(room)])
}

/// The application closes `fd`, a descriptor of `c`: with `SO_LINGER {1, 0}` kernel TCP would
/// send RST, so `c` resets when its last descriptor goes (`Conn::abort_on_close`). One
/// `getsockopt` per close of an accelerated connection.
pub fn closing(fd: c_int, c: &Conn) {
    let mut l = libc::linger { l_onoff: 0, l_linger: 0 };
    let mut len = std::mem::size_of::<libc::linger>() as socklen_t;
    // SAFETY: a linger struct and its length, ours.
    let r = unsafe { real::getsockopt(fd, libc::SOL_SOCKET, libc::SO_LINGER, (&mut l as *mut libc::linger).cast(), &mut len) };
    if r == 0 && l.l_onoff != 0 && l.l_linger == 0 {
        c.abort_on_close();
    }
}

/// A read of zero bytes (`recv(fd, buf, 0, flags)`): as kernel TCP, `EAGAIN` when nothing is
/// readable and the call may not wait, 0 once something is (bytes, end of stream, or an error
/// reported by the read that follows); a blocking one waits until then.
pub fn recv_nothing(c: &Conn, flags: c_int) -> io::Result<usize> {
    if c.nonblocking() || flags & libc::MSG_DONTWAIT != 0 {
        if c.ready(true) & IN == 0 {
            return Err(io::Error::from_raw_os_error(libc::EAGAIN));
        }
        return Ok(0);
    }
    let mut b = [0u8; 1];
    c.shm().peek(&mut b).map(|_| 0)
}

/// `recv(fd, _, n, MSG_TRUNC)` on TCP: reads up to `n` bytes as `recv` would and discards them
/// (the buffer is not written; it may be null); returns how many.
pub fn recv_discard(c: &Conn, n: usize, flags: c_int) -> io::Result<usize> {
    let mut scratch = [0u8; 16 * 1024];
    let first = n.min(scratch.len());
    let mut total = conn_recv(c, &mut scratch[..first], flags & !libc::MSG_TRUNC)?;
    if flags & libc::MSG_PEEK != 0 || total < first {
        return Ok(total);
    }
    // More only while bytes are there now (a stream read returns what has arrived).
    while total < n && c.available().unwrap_or(0) > 0 {
        let k = (n - total).min(scratch.len());
        match c.shm().read(&mut scratch[..k]) {
            Ok(0) | Err(_) => break,
            Ok(got) => total += got,
        }
    }
    Ok(total)
}

/// `recvmmsg` on an accelerated stream: as the kernel, each message is one `recvmsg`; after the
/// first, `MSG_WAITFORONE` makes the rest non-blocking, and the call ends at the first that
/// would block or fails (returning the messages filled so far, or the first one's error).
pub unsafe fn recvmmsg(fd: c_int, v: *mut libc::mmsghdr, n: libc::c_uint, flags: c_int) -> c_int {
    let mut flags = flags;
    let mut done: c_int = 0;
    for i in 0..n as usize {
        // SAFETY: `n` mmsghdrs at `v`, as the application promised.
        let m = unsafe { &mut *v.add(i) };
        // SAFETY: the application's message header.
        let r = unsafe { crate::api::shim::recvmsg(fd, &mut m.msg_hdr, flags & !libc::MSG_WAITFORONE) };
        if r < 0 {
            return if done > 0 { done } else { -1 };
        }
        m.msg_len = r as u32;
        done += 1;
        if flags & libc::MSG_WAITFORONE != 0 {
            flags |= libc::MSG_DONTWAIT;
        }
    }
    done
}
