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
/// a stream over an accelerated socket is a `fopencookie` stream whose functions are the shim's
/// read/write/close; its `_fileno` is set to `fd` so that `fileno(3)` still answers.
pub unsafe fn fdopen(fd: c_int, mode: *const libc::c_char) -> *mut libc::FILE {
    if mode.is_null() {
        // SAFETY: the application's arguments, as fdopen(3) takes them.
        return unsafe { real::fdopen(fd, mode) };
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

/// A `fopencookie` stream over the accelerated socket `fd`.
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
