//! Socket options an accelerated connection honours from its kernel socket: those set before it
//! was accelerated, and `SO_LINGER {1, 0}` at close.

use crate::conn::state::Conn;
use crate::real;
use crate::conn::table;
use libc::{c_int, c_void, socklen_t};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

/// A connection the shim just accelerated on `fd` (connected, accepted, or taken back after
/// `exec`) takes the options its socket already has: set before `connect`, inherited from the
/// listener, or set by an earlier image. Three `getsockopt`s per set-up; `SO_SNDBUF`, which the
/// kernel does not tell from its default, as the program set it ([`note_sndbuf`]).
pub fn adopt_options(fd: c_int, c: &Conn) {
    let get = |name: c_int, val: *mut c_void, size: usize| {
        let mut len = size as socklen_t;
        // SAFETY: `val` points to `size` writable bytes of ours.
        unsafe { real::getsockopt(fd, libc::SOL_SOCKET, name, val, &mut len) == 0 && len as usize == size }
    };
    for name in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        let mut tv = libc::timeval { tv_sec: 0, tv_usec: 0 };
        if get(name, (&mut tv as *mut libc::timeval).cast(), std::mem::size_of::<libc::timeval>()) {
            let d = Duration::new(tv.tv_sec.max(0) as u64, (tv.tv_usec.max(0) as u32) * 1000);
            if !d.is_zero() {
                set_timeout(c, name == libc::SO_SNDTIMEO, Some(d));
            }
        }
    }
    let mut low: c_int = 1;
    if get(libc::SO_RCVLOWAT, (&mut low as *mut c_int).cast(), std::mem::size_of::<c_int>()) && low > 1 {
        c.set_lowat(low as u32);
    }
    if let Some(n) = sndbuf_asked(fd) {
        c.set_send_limit(n);
    }
}

/// A connection taken back after `exec` on `fd` takes its socket's `TCP_INQ`, which an earlier
/// image may have set (this image's own settings reach `Conn::inq` as they are made).
pub fn adopt_inq(fd: c_int, c: &Conn) {
    if kernel_inq(fd) {
        c.set_inq(true);
    }
}

/// Whether the kernel's socket `fd` has `TCP_INQ` on.
pub fn kernel_inq(fd: c_int) -> bool {
    let (mut v, mut len): (c_int, socklen_t) = (0, std::mem::size_of::<c_int>() as socklen_t);
    // SAFETY: an int of ours and its length.
    let r = unsafe { real::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_INQ, (&raw mut v).cast(), &mut len) };
    r == 0 && v != 0
}

/// `SO_RCVTIMEO` (or, `write`, `SO_SNDTIMEO`) set on `c`: this copy's, and the socket's in the
/// holders page, for the other processes holding it (`Conn::adopt_shared`).
pub fn set_timeout(c: &Conn, write: bool, t: Option<Duration>) {
    c.holders().set_timeout(write, t);
    if write {
        c.shm().set_write_timeout(t);
    } else {
        c.shm().set_read_timeout(t);
    }
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

/// The `SO_SNDBUF` each socket was given, plus one (0: none), by descriptor number: the kernel
/// does not tell a value set from its default, and one set before `connect` (or on a listener,
/// which its accepted sockets inherit) must bound the connection's ring once accelerated.
static SNDBUF_ASKED: [AtomicI32; table::MAX_FD] = [const { AtomicI32::new(0) }; table::MAX_FD];

fn sndbuf_slot(fd: c_int) -> Option<&'static AtomicI32> {
    SNDBUF_ASKED.get(usize::try_from(fd).ok()?)
}

/// The program gave `fd` an `SO_SNDBUF` of `n` bytes, which the kernel accepted.
pub fn note_sndbuf(fd: c_int, n: c_int) {
    if let Some(a) = sndbuf_slot(fd) {
        a.store(n.max(1).saturating_add(1), Ordering::Relaxed);
    }
}

/// `accepted`, just accepted from `listener`, inherits the `SO_SNDBUF` the program gave it.
#[inline]
pub fn inherit_sndbuf(listener: c_int, accepted: c_int) {
    let (Some(from), Some(to)) = (sndbuf_slot(listener), sndbuf_slot(accepted)) else { return };
    let v = from.load(Ordering::Relaxed);
    if v != 0 {
        to.store(v, Ordering::Relaxed);
    }
}

/// A new descriptor took number `fd`: the `SO_SNDBUF` an earlier socket of it had is forgotten.
#[inline]
pub fn forget_sndbuf(fd: c_int) {
    if let Some(a) = sndbuf_slot(fd) {
        if a.load(Ordering::Relaxed) != 0 {
            a.store(0, Ordering::Relaxed);
        }
    }
}

/// The `SO_SNDBUF` the program gave `fd` (or the listener it was accepted from), if any.
fn sndbuf_asked(fd: c_int) -> Option<usize> {
    let v = sndbuf_slot(fd)?.load(Ordering::Relaxed);
    (v > 0).then(|| (v - 1) as usize)
}
