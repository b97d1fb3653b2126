//! `getsockopt` and `setsockopt` on an accelerated connection: the kernel socket answers, and
//! what only the rings know is added (`SO_ERROR` after a reset, `TCP_INFO`'s state and byte
//! counts, `SO_PEEK_OFF`); options the rings must honour are passed on to the connection.

use crate::api::route::{conn_for_io, plain, plain_first};
use crate::base::guard::Guard;
use crate::conn::state::{TCP_CLOSE, TCP_ESTABLISHED};
use crate::conn::options;
use crate::conn::table::{self, NONE};
use crate::real;
use libc::{c_int, c_void, socklen_t};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

plain_first! {
    setsockopt => setsockopt_slow(fd, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int;
}

/// `setsockopt(2)` as the shim exports it: the options kept beside the kernel's
/// (`TCP_DEFER_ACCEPT` ignored, `SO_SNDBUF`, `TCP_INQ`) first.
///
/// # Safety
/// The application's arguments, as `setsockopt` takes them.
#[inline(always)]
pub unsafe fn set_option(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int {
    if level == libc::IPPROTO_TCP && name == libc::TCP_DEFER_ACCEPT && crate::base::env::defer_accept_ignored() {
        // SAFETY: the caller's contract, passed on.
        return unsafe { set_defer_accept(fd, val, len) };
    }
    if level == libc::SOL_SOCKET && name == libc::SO_SNDBUF {
        // SAFETY: the caller's contract, passed on.
        return unsafe { set_sndbuf(fd, val, len) };
    }
    if level == libc::IPPROTO_TCP && name == libc::TCP_INQ {
        INQ_ASKED.store(true, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        let r = unsafe { setsockopt(fd, level, name, val, len) };
        if r == 0 && !val.is_null() && len as usize >= std::mem::size_of::<c_int>() {
            let _g = Guard::enter();
            if let Some(c) = table::conn(fd) {
                // SAFETY: an int, as the kernel just accepted.
                c.set_inq(unsafe { (val as *const c_int).read_unaligned() } != 0);
            }
        }
        return r;
    }
    // SAFETY: the caller's contract, passed on.
    unsafe { setsockopt(fd, level, name, val, len) }
}

/// Set once this program image asked any socket for `TCP_INQ`: until then a socket has it only
/// if a holder of its connection set it (`Conn::inq`), and a `recvmsg` of a connection need not
/// ask the kernel (`inq_wanted`). Relaxed: the flag is the whole message, and a socket's option
/// is set by the same thread's later call.
static INQ_ASKED: AtomicBool = AtomicBool::new(false);

/// Whether `fd`, connection `c`, has `TCP_INQ` on: as a process holding it set it or found it
/// (a fork copy, an image before `exec`: `Conn::inq`), or, once this image set it on any socket,
/// as the kernel's socket has it (set before `connect`, or inherited from a listener), asked
/// once and kept with the connection.
pub fn inq_wanted(fd: c_int, c: &crate::conn::state::Conn) -> bool {
    if let Some(on) = c.inq() {
        return on;
    }
    if !INQ_ASKED.load(Ordering::Relaxed) {
        return false;
    }
    let on = crate::conn::options::kernel_inq(fd);
    c.set_inq(on);
    on
}

/// `getsockopt`: `SO_ERROR` of an accelerated connection reports (and clears) the reset its peer
/// sent, as the kernel reports the error a RST left, and `SO_PEEK_OFF` its peeks' offset;
/// everything else is the kernel socket's.
pub unsafe fn getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int {
    if table::kind(fd) == NONE || Guard::busy() {
        // SAFETY: `real::getsockopt` is libc's `getsockopt`, given the application's arguments
        // unchanged: the contract the caller met.
        return unsafe { real::getsockopt(fd, level, name, val, len) };
    }
    if level == libc::IPPROTO_TCP && name == libc::TCP_INFO {
        // SAFETY: `tcp_info` requires what libc's `getsockopt` does of these arguments, which the
        // application's call met.
        return unsafe { tcp_info(fd, val, len) };
    }
    if level == libc::SOL_SOCKET && name == libc::SO_PEEK_OFF {
        // SAFETY: as for `tcp_info`, the application's arguments to `getsockopt`.
        return unsafe { peek_off(fd, val, len) };
    }
    if level != libc::SOL_SOCKET || name != libc::SO_ERROR {
        // SAFETY: `real::getsockopt` is libc's `getsockopt`, given the application's arguments
        // unchanged: the contract the caller met.
        return unsafe { real::getsockopt(fd, level, name, val, len) };
    }
    // SAFETY: `real::getsockopt` is libc's `getsockopt`, given the application's arguments
    // unchanged: the contract the caller met.
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
        // The kernel's error is the carrier's, which carries no byte: a client resets it at its
        // close (`Conn`'s drop). The connection's own error is the rings'.
        // SAFETY: the application's buffer the kernel just wrote an int to.
        unsafe { *(val as *mut c_int) = 0 };
        if c.take_reset_error() {
            let err = if c.peer_reset_after_fin() || c.wrote_after_close() { libc::EPIPE } else { libc::ECONNRESET };
            // SAFETY: the same int, the application's writable buffer of at least its size
            // (checked above).
            unsafe { *(val as *mut c_int) = err };
        }
    }
    g.ok(0) as c_int
}

/// `getsockopt(SO_PEEK_OFF)`: the kernel's answer (its checks), with an accelerated
/// connection's offset, which its peeks move (`Shm::set_peek_off`).
///
/// # Safety
/// As libc's `getsockopt`: `val` has `*len` writable bytes (or either is null).
unsafe fn peek_off(fd: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int {
    // SAFETY: the application's arguments, unchanged.
    let r = unsafe { real::getsockopt(fd, libc::SOL_SOCKET, libc::SO_PEEK_OFF, val, len) };
    // SAFETY: the application's length, which the kernel just accepted.
    if r != 0 || val.is_null() || len.is_null() || (unsafe { *len } as usize) < std::mem::size_of::<c_int>() {
        return r;
    }
    let g = Guard::enter();
    if let Some(c) = table::conn(fd) {
        // SAFETY: the application's buffer, holding at least an int (checked above).
        unsafe { *(val as *mut c_int) = c.shm().peek_off() };
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
    // SAFETY: `real::getsockopt` is libc's `getsockopt`, given the application's arguments
    // unchanged: the contract the caller met.
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
            // The carrier carries no byte: established, it stands for the rings' state. Closed,
            // it may be only because its client reset it at a clean close (`Conn`'s drop), where
            // kernel TCP's server end stays in CLOSE_WAIT: the rings' state then, unless they
            // know of no end (the carrier's own close stands).
            let kernel = if filled > TCPI_STATE { Some(*p.add(TCPI_STATE)) } else { None };
            if kernel == Some(TCP_ESTABLISHED) || kernel == Some(TCP_CLOSE) && state != TCP_ESTABLISHED {
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
unsafe fn setsockopt_slow(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int {
    // SAFETY: `real::setsockopt` is libc's `setsockopt`, given the application's arguments
    // unchanged: the contract the caller met.
    let r = unsafe { real::setsockopt(fd, level, name, val, len) };
    if r == 0 && level == libc::SOL_SOCKET && (name == libc::SO_RCVLOWAT || name == libc::SO_SNDBUF || name == libc::SO_PEEK_OFF) && !plain(fd) {
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
            // A negative `tv_sec` is the kernel's timeout of no wait at all (`sock_set_timeout`
            // stores 0, which `getsockopt` reads as "none"): a blocking call that would wait
            // fails with `EAGAIN` at once, as one whose shortest timeout ran out.
            let t = if tv.tv_sec < 0 { Some(std::time::Duration::from_nanos(1)) } else { (!d.is_zero()).then_some(d) };
            crate::conn::options::set_timeout(&c, name == libc::SO_SNDTIMEO, t);
        }
    }
    g.ok(0) as c_int
}

/// `setsockopt(SO_RCVLOWAT, SO_SNDBUF or SO_PEEK_OFF)` on an accelerated connection, which the
/// kernel accepted.
unsafe fn set_int_option(fd: c_int, name: c_int, val: *const c_void, len: socklen_t) {
    if val.is_null() || (len as usize) < std::mem::size_of::<c_int>() {
        return;
    }
    let g = Guard::enter();
    if let Some(c) = table::conn(fd) {
        // SAFETY: an int, as the kernel just accepted.
        let raw = unsafe { *(val as *const c_int) };
        let v = raw.max(1);
        if name == libc::SO_PEEK_OFF {
            c.shm().set_peek_off(raw);
        } else if name == libc::SO_RCVLOWAT {
            c.set_lowat(v as u32);
        } else {
            c.set_send_limit(sndbuf_granted(fd, v) as usize);
        }
    }
    drop(g);
}

/// The `TCP_DEFER_ACCEPT` each socket asked for while `COLO_DEFER_ACCEPT=ignore`
/// (`base::env::defer_accept_ignored`), plus one (0: none asked), by descriptor number.
static DEFER_ASKED: [AtomicI32; table::MAX_FD] = [const { AtomicI32::new(0) }; table::MAX_FD];

/// `setsockopt(fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, val, len)` under `COLO_DEFER_ACCEPT=ignore`: the
/// kernel is asked for the option (so that a descriptor that is no TCP socket, or a bad length,
/// fails as it would), and the value is kept for `getsockopt` instead of set.
///
/// # Safety
/// The application's arguments, as `setsockopt` takes them.
pub unsafe fn set_defer_accept(fd: c_int, val: *const c_void, len: socklen_t) -> c_int {
    let mut now: c_int = 0;
    let mut now_len = std::mem::size_of::<c_int>() as socklen_t;
    // SAFETY: our own int and its length.
    let r = unsafe { real::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_DEFER_ACCEPT, (&mut now as *mut c_int).cast(), &mut now_len) };
    if r != 0 || fd as usize >= table::MAX_FD {
        // SAFETY: `real::setsockopt` is libc's `setsockopt`, given the application's arguments
        // unchanged: the contract the caller met.
        return unsafe { real::setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_DEFER_ACCEPT, val, len) };
    }
    if val.is_null() || (len as usize) < std::mem::size_of::<c_int>() {
        // SAFETY: errno is this thread's.
        unsafe { *libc::__errno_location() = if val.is_null() { libc::EFAULT } else { libc::EINVAL } };
        return -1;
    }
    // SAFETY: an int of the application's, `len` bytes checked above.
    let asked = unsafe { (val as *const c_int).read_unaligned() }.max(0);
    DEFER_ASKED[fd as usize].store(asked.saturating_add(1), Ordering::Relaxed);
    0
}

/// `getsockopt(fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, val, len)` of a socket whose option was kept
/// (`set_defer_accept`): the value asked; `None` for any other (the kernel answers).
///
/// # Safety
/// The application's arguments, as `getsockopt` takes them.
pub unsafe fn get_defer_accept(fd: c_int, val: *mut c_void, len: *mut socklen_t) -> Option<c_int> {
    let asked = DEFER_ASKED.get(usize::try_from(fd).ok()?)?.load(Ordering::Relaxed);
    if asked == 0 || val.is_null() || len.is_null() {
        return None;
    }
    // SAFETY: the application's length.
    let n = (unsafe { *len } as usize).min(std::mem::size_of::<c_int>());
    let bytes = (asked - 1).to_ne_bytes();
    // SAFETY: at most `*len` bytes into the application's buffer, and the length written back.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), val.cast::<u8>(), n);
        *len = n as socklen_t;
    }
    Some(0)
}

/// A new descriptor took number `fd`: what an earlier socket of that number asked is forgotten.
#[inline]
pub fn forget_asked(fd: c_int) {
    if let Some(a) = usize::try_from(fd).ok().and_then(|i| DEFER_ASKED.get(i)) {
        if a.load(Ordering::Relaxed) != 0 {
            a.store(0, Ordering::Relaxed);
        }
    }
    options::forget_sndbuf(fd);
}

/// `setsockopt(fd, SOL_SOCKET, SO_SNDBUF, val, len)`: the kernel's, and the value kept for the
/// connection `fd` is or becomes (`conn::options::note_sndbuf`).
///
/// # Safety
/// The application's arguments, as `setsockopt` takes them.
pub unsafe fn set_sndbuf(fd: c_int, val: *const c_void, len: socklen_t) -> c_int {
    // SAFETY: the caller's contract.
    let r = unsafe { setsockopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, val, len) };
    if r == 0 && !val.is_null() && len as usize >= std::mem::size_of::<c_int>() {
        // SAFETY: an int, as the kernel just accepted.
        options::note_sndbuf(fd, sndbuf_granted(fd, unsafe { (val as *const c_int).read_unaligned() }));
    }
    r
}

/// The `SO_SNDBUF` an accelerated connection honours for `asked` bytes, which the kernel just
/// accepted on `fd`: at most what the kernel grants (it clamps the value to `net.core.wmem_max`
/// and doubles it, which `getsockopt` reports), so that a program asking for more than the
/// system allows lets a peer that never reads hold no more of its memory than over TCP.
fn sndbuf_granted(fd: c_int, asked: c_int) -> c_int {
    let mut got: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as socklen_t;
    // SAFETY: an int and its length, ours.
    let r = unsafe { real::getsockopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, (&mut got as *mut c_int).cast(), &mut len) };
    if r == 0 && got > 0 { asked.clamp(1, (got / 2).max(1)) } else { asked }
}
