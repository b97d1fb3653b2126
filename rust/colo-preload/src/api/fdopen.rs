//! `fdopen(3)` on an accelerated socket: a stdio stream whose reads and writes come back through
//! the shim.

use crate::api::data::{read, write};
use crate::api::fds::{close, fcntl};
use crate::api::route::with_conn;
use crate::base::guard::Guard;
use crate::real;
use libc::{c_int, c_ulong, c_void, size_t, ssize_t};
use std::io;

/// `cookie_io_functions_t` of `fopencookie(3)`.
#[repr(C)]
pub(crate) struct CookieIo {
    pub(crate) read: Option<unsafe extern "C" fn(*mut c_void, *mut libc::c_char, size_t) -> ssize_t>,
    pub(crate) write: Option<unsafe extern "C" fn(*mut c_void, *const libc::c_char, size_t) -> ssize_t>,
    pub(crate) seek: Option<unsafe extern "C" fn(*mut c_void, *mut i64, c_int) -> c_int>,
    pub(crate) close: Option<unsafe extern "C" fn(*mut c_void) -> c_int>,
}

extern "C" {
    pub(crate) fn fopencookie(cookie: *mut c_void, mode: *const libc::c_char, io: CookieIo) -> *mut libc::FILE;
}

/// The start of glibc's `struct _IO_FILE` (public ABI, `bits/types/struct_FILE.h`), up to
/// `_fileno`: `_flags`, eleven buffer pointers, `_markers`, `_chain`.
#[repr(C)]
pub(crate) struct IoFileHead {
    pub(crate) flags: c_int,
    pub(crate) pointers: [*mut c_void; 13],
    pub(crate) fileno: c_int,
}

fn cookie_fd(cookie: *mut c_void) -> c_int {
    cookie as usize as c_int
}

pub(crate) unsafe extern "C" fn cookie_read(cookie: *mut c_void, buf: *mut libc::c_char, n: size_t) -> ssize_t {
    // SAFETY: stdio's buffer of `n` bytes.
    unsafe { read(cookie_fd(cookie), buf.cast(), n) }
}

pub(crate) unsafe extern "C" fn cookie_write(cookie: *mut c_void, buf: *const libc::c_char, n: size_t) -> ssize_t {
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

pub(crate) unsafe extern "C" fn cookie_seek(_cookie: *mut c_void, _pos: *mut i64, _whence: c_int) -> c_int {
    // A socket does not seek (lseek(2) says ESPIPE).
    // SAFETY: writing this thread's errno.
    unsafe { *libc::__errno_location() = libc::ESPIPE };
    -1
}

pub(crate) unsafe extern "C" fn cookie_close(cookie: *mut c_void) -> c_int {
    // SAFETY: closing the descriptor the stream owns (the application's: its `fclose`).
    unsafe { close(cookie_fd(cookie), true) }
}

/// `fdopen(3)`: stdio reads and writes through glibc-internal calls that no interposer sees, so
/// a stream over an accelerated socket, or over a TCP socket not connected yet (a `connect`
/// after the stream is made may accelerate it), is a `fopencookie` stream whose functions are
/// the shim's read/write/close; its `_fileno` is set to `fd` so that `fileno(3)` still answers.
pub unsafe fn fdopen(fd: c_int, mode: *const libc::c_char) -> *mut libc::FILE {
    if mode.is_null() {
        // SAFETY: the application's arguments, as fdopen(3) takes them.
        return unsafe { real::fdopen(fd, mode) };
    }
    // A TCP socket not connected yet: a `connect` after this may put it on shared memory, where
    // a stream of libc's would write to the carrier socket and read nothing. Its stream goes
    // through the shim's calls, which serve it plainly until then.
    if crate::conn::table::kind(fd) == crate::conn::table::NONE && !Guard::busy() {
        let g = Guard::enter();
        let later = unconnected_tcp(fd);
        g.ok(0);
        if later {
            // SAFETY: fdopen(3)'s contract: `mode` is a NUL-terminated string.
            return unsafe { cookie_stream(&g, fd, mode) };
        }
    }
    // A socket whose cross-namespace answer is owed: its stream reads through the shim's `read`,
    // which takes the answer off first.
    if !Guard::busy() && crate::service::elsewhere::owed(fd) {
        let g = Guard::enter();
        // SAFETY: fdopen(3)'s contract: `mode` is a NUL-terminated string.
        return unsafe { cookie_stream(&g, fd, mode) };
    }
    with_conn!(
        fd,
        // SAFETY: the application's arguments, as fdopen(3) takes them.
        unsafe { real::fdopen(fd, mode) },
        // SAFETY: fdopen(3)'s contract: `mode` is a NUL-terminated string.
        |g, _| unsafe { cookie_stream(&g, fd, mode) }
    )
}

/// Whether `fd` is an IPv4 or IPv6 stream socket neither listening nor connected (connecting at
/// most): one the application may still connect.
fn unconnected_tcp(fd: c_int) -> bool {
    let opt = |name: c_int| {
        let mut v: c_int = 0;
        let mut len = std::mem::size_of::<c_int>() as libc::socklen_t;
        // SAFETY: an int-sized option into `v`, its size in `len`.
        let r = unsafe { real::getsockopt(fd, libc::SOL_SOCKET, name, (&mut v as *mut c_int).cast(), &mut len) };
        (r == 0).then_some(v)
    };
    if !matches!(opt(libc::SO_DOMAIN), Some(libc::AF_INET | libc::AF_INET6)) || opt(libc::SO_TYPE) != Some(libc::SOCK_STREAM) || opt(libc::SO_ACCEPTCONN) != Some(0) {
        return false;
    }
    // SAFETY: an all-zero sockaddr_storage is a valid value.
    let mut peer: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: a buffer of `len` bytes for the peer's address.
    let r = unsafe { real::getpeername(fd, (&mut peer as *mut libc::sockaddr_storage).cast(), &mut len) };
    r < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOTCONN)
}

/// A `fopencookie` stream over the accelerated socket `fd` (or one that may become so).
///
/// # Safety
/// `mode` is a non-null, NUL-terminated string.
unsafe fn cookie_stream(g: &Guard, fd: c_int, mode: *const libc::c_char) -> *mut libc::FILE {
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
