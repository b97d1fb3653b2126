//! Socket options an accelerated connection honours from its kernel socket: those set before it
//! was accelerated, and `SO_LINGER {1, 0}` at close.

use crate::conn::state::Conn;
use crate::real;
use libc::{c_int, c_void, socklen_t};

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
