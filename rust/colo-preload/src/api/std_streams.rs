//! An accelerated connection on descriptor 0, 1 or 2 within one image (`dup2(conn, 1)`, or an
//! `accept` that returns 0): glibc's `stdin`, `stdout` and `stderr` read and write their
//! descriptor through calls internal to libc that no preloaded library sees, so their bytes
//! would go to the carrier TCP socket, which carries no payload after the claim (spec/WIRE.md
//! section 3), and be lost. The first time a connection lands on one of those numbers, the
//! matching stream variable is pointed at a `fopencookie` stream over the same number whose
//! reads and writes come through the shim (glibc documents the three as ordinary variables a
//! program may assign). The new stream keeps the old one's buffering mode; bytes the old one had
//! buffered for writing are written first, and bytes it had read ahead are read first, so
//! nothing is lost or reordered. The cookie stream follows the number, whatever it refers to
//! later, so the swap is never undone. A `FILE *` the program copied from the variable before
//! the swap still writes to the carrier (an `exec` instead hands such a connection to a relay:
//! `service::stdio`).

use crate::api::fdopen::{cookie_close, cookie_read, cookie_seek, cookie_write, fopencookie, CookieIo, IoFileHead};
use crate::conn::table;
use libc::{c_int, c_void, size_t, ssize_t};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

extern "C" {
    static mut stdin: *mut libc::FILE;
    static mut stdout: *mut libc::FILE;
    static mut stderr: *mut libc::FILE;
    fn __fpurge(f: *mut libc::FILE);
    fn flockfile(f: *mut libc::FILE);
    fn funlockfile(f: *mut libc::FILE);
}

/// glibc's `_IO_UNBUFFERED` and `_IO_LINE_BUF` bits of `_flags` (`libio.h`).
const IO_UNBUFFERED: c_int = 0x0002;
const IO_LINE_BUF: c_int = 0x0200;
/// Indices of `_IO_read_ptr`, `_IO_read_end`, `_IO_write_base` and `_IO_write_ptr` in
/// `IoFileHead::pointers`.
const READ_PTR: usize = 0;
const READ_END: usize = 1;
const WRITE_BASE: usize = 3;
const WRITE_PTR: usize = 4;

/// Whether stream 0, 1 or 2 was already swapped in this image (a forked child inherits the swap
/// with the variables).
static SWAPPED: [AtomicBool; 3] = [const { AtomicBool::new(false) }; 3];
/// Bytes the old `stdin` had read ahead from descriptor 0 and not yet given out.
static STDIN_AHEAD: Mutex<Vec<u8>> = Mutex::new(Vec::new());

/// After a call that gave the application descriptor `fd`: if `fd` is 0, 1 or 2 and an
/// accelerated connection, swaps its standard stream (see the module's comment). Call it with no
/// `Guard` held: the old stream's buffered bytes are written through the shim.
#[inline]
pub fn adopt(fd: c_int) {
    if (0..=2).contains(&fd) && table::kind(fd) == table::CONN && !SWAPPED[fd as usize].load(Ordering::Relaxed) {
        swap(fd);
    }
}

#[cold]
fn swap(fd: c_int) {
    if SWAPPED[fd as usize].swap(true, Ordering::Relaxed) {
        return;
    }
    // The addresses of glibc's three stream variables (taking one reads nothing).
    let var: *mut *mut libc::FILE = {
        match fd {
            0 => &raw mut stdin,
            1 => &raw mut stdout,
            _ => &raw mut stderr,
        }
    };
    // SAFETY: `var` is valid (above); programs assign the variables only from their own threads,
    // as here.
    let old = unsafe { *var };
    // A stream the program pointed the variable at (a log file of its own), or one it closed
    // (descriptor -1), is not descriptor `fd`'s: stdio would not write it to the connection, so
    // it stays as it is (and is looked at again if a connection lands on `fd` later).
    // SAFETY: `old`, if not null, is the program's stream: a glibc FILE, which begins with
    // `IoFileHead`'s fields (`_fileno` is set once, at its open or close).
    if !old.is_null() && unsafe { (*(old as *const IoFileHead)).fileno } != fd {
        SWAPPED[fd as usize].store(false, Ordering::Relaxed);
        return;
    }
    let io = CookieIo {
        read: Some(if fd == 0 { stdin_read } else { cookie_read }),
        write: Some(cookie_write),
        seek: Some(cookie_seek),
        close: Some(cookie_close),
    };
    let mode = if fd == 0 { c"r" } else { c"w" };
    // SAFETY: a valid mode and functions; the cookie is the descriptor number.
    let new = unsafe { fopencookie(fd as usize as *mut c_void, mode.as_ptr(), io) };
    if new.is_null() {
        SWAPPED[fd as usize].store(false, Ordering::Relaxed);
        return;
    }
    // SAFETY: `new` is a glibc cookie FILE, which begins with `IoFileHead`'s fields.
    unsafe { (*(new as *mut IoFileHead)).fileno = fd };
    if old.is_null() {
        // SAFETY: as above.
        unsafe { *var = new };
        return;
    }
    // SAFETY: `old` is the program's stream: a glibc FILE, which begins with `IoFileHead`'s
    // fields. Its lock is held while its buffer is read and emptied, so no other thread of the
    // program moves those pointers meanwhile.
    unsafe {
        flockfile(old);
        let head = old as *mut IoFileHead;
        let flags = (*head).flags;
        let mode = if flags & IO_UNBUFFERED != 0 {
            libc::_IONBF
        } else if flags & IO_LINE_BUF != 0 {
            libc::_IOLBF
        } else {
            libc::_IOFBF
        };
        libc::setvbuf(new, std::ptr::null_mut(), mode, libc::BUFSIZ as size_t);
        let p = &(*head).pointers;
        if fd == 0 {
            let (from, to) = (p[READ_PTR] as *const u8, p[READ_END] as *const u8);
            if !from.is_null() && to > from {
                let ahead = std::slice::from_raw_parts(from, to.offset_from(from) as usize);
                STDIN_AHEAD.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(ahead);
            }
        } else {
            let (from, to) = (p[WRITE_BASE] as *const u8, p[WRITE_PTR] as *const u8);
            if !from.is_null() && to > from {
                libc::fwrite(from.cast(), 1, to.offset_from(from) as usize, new);
            }
        }
        __fpurge(old);
        *var = new;
        funlockfile(old);
    }
}

/// `stdin`'s read function: the bytes the old stream had read ahead, then the descriptor's.
unsafe extern "C" fn stdin_read(cookie: *mut c_void, buf: *mut libc::c_char, n: size_t) -> ssize_t {
    {
        let mut ahead = STDIN_AHEAD.lock().unwrap_or_else(|e| e.into_inner());
        if !ahead.is_empty() {
            let k = n.min(ahead.len());
            // SAFETY: stdio's buffer of `n >= k` bytes.
            unsafe { std::ptr::copy_nonoverlapping(ahead.as_ptr(), buf.cast(), k) };
            ahead.drain(..k);
            return k as ssize_t;
        }
    }
    // SAFETY: stdio's buffer of `n` bytes.
    unsafe { cookie_read(cookie, buf, n) }
}
