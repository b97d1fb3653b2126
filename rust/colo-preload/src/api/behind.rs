//! Descriptors closed or replaced past libc's wrappers, and numbers the kernel hands out again.
//!
//! libuv (Node.js, uvloop) closes every descriptor with `syscall(SYS_close, fd)`, never through
//! `close`. The shim must see those closes as it sees `close`: otherwise the connection's entry
//! stays in the table after the kernel has closed the socket, its segment, control socket and
//! self bell stay open and its peer never sees the end, and the next descriptor the kernel gives
//! that number (a plain TCP connection accepted later) is served from the dead connection's
//! rings (an end of file at once, which the program answers by closing, resetting its client).
//!
//! So `syscall(SYS_close | SYS_dup | SYS_dup2 | SYS_dup3)` take the shim's own paths,
//! `close_range` lets go of the connections in its range before it closes them, and a
//! number the kernel has just returned from `accept` or `socket` drops whatever the table still
//! held for it (something closed it in a way no wrapper saw: a raw system call made elsewhere,
//! `fclose` on a `fdopen`ed socket): the kernel's word that the number is new is final.
//!
//! Not between `vfork` and `exec`: such a child shares this process's memory (and so the table)
//! but not its descriptors, and a close it makes must not end the parent's connections. It is
//! recognised by its process id, which differs from the one the shim cached in the parent.

use crate::api::fds;
use crate::api::forget::known;
use crate::base::vm::borrowed_memory;
use libc::{c_int, c_long};

/// `syscall(n, a, b, c, ...)` for the calls this module takes over; `None` for the others.
///
/// # Safety
/// The application's arguments, as the system call takes them.
pub unsafe fn syscall(n: c_long, a: c_long, b: c_long, c: c_long) -> Option<c_long> {
    let (fd, new) = (a as c_int, b as c_int);
    let mine = match n {
        libc::SYS_close | libc::SYS_dup => known(fd),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_dup2 => known(fd) || known(new),
        libc::SYS_dup3 => known(fd) || known(new),
        _ => return None,
    };
    if !mine || borrowed_memory() {
        return None;
    }
    // SAFETY: the application's arguments (the shim's wrappers keep libc's conventions: -1 and
    // errno on failure, as `syscall` does).
    let r = unsafe {
        match n {
            libc::SYS_close => fds::close(fd, true),
            libc::SYS_dup => fds::dup(fd),
            #[cfg(target_arch = "x86_64")]
            libc::SYS_dup2 => fds::dup3(fd, new, 0, true),
            _ => fds::dup3(fd, new, c as c_int, false),
        }
    };
    Some(r as c_long)
}
