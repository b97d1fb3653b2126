//! The io_uring refusal. `io_uring_setup` is refused with ENOSYS, so that a program that would
//! register its sockets through io_uring (libuv 1.45 and later: uvloop, recent Node) falls back
//! to epoll, which the shim sees; through io_uring an accelerated socket's readiness is the TCP
//! socket's and its reader waits forever.

use crate::base::env::disabled;
use crate::base::guard::set_errno;
use crate::base::log::log_debug;

/// Whether `syscall(n, ...)` is refused; if so errno is ENOSYS and the call returns -1.
pub fn refused(n: libc::c_long) -> bool {
    if n == libc::SYS_io_uring_setup && !disabled() {
        log_debug(format_args!("io_uring_setup refused (ENOSYS): the program falls back to epoll"));
        set_errno(libc::ENOSYS);
        return true;
    }
    false
}

/// liburing's set-up functions, which make the `io_uring_setup` system call themselves (an
/// instruction of their own, not libc's `syscall`): refused as that call is, each with liburing's
/// `-ENOSYS` (and errno ENOSYS), so that a program linked to liburing as a shared library falls
/// back as it does on a kernel without io_uring. Otherwise liburing's own, found after the shim.
/// A program linked with liburing statically is out of the shim's sight.
macro_rules! liburing_setup {
    ($name:ident, $($arg:ident: $ty:ty),*) => {
        /// See the macro: refused, or liburing's.
        ///
        /// # Safety
        /// The application's arguments, as liburing takes them.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> libc::c_int {
            if refused(libc::SYS_io_uring_setup) {
                return -libc::ENOSYS;
            }
            type F = unsafe extern "C" fn($($ty),*) -> libc::c_int;
            // SAFETY: a NUL-terminated name; dlsym is thread-safe.
            let next = unsafe { libc::dlsym(libc::RTLD_NEXT, concat!(stringify!($name), "\0").as_ptr().cast()) };
            if next.is_null() {
                return -libc::ENOSYS;
            }
            // SAFETY: the symbol liburing exports under this name has this signature (liburing.h).
            let next: F = unsafe { std::mem::transmute::<*mut libc::c_void, F>(next) };
            // SAFETY: the application's arguments, unchanged.
            unsafe { next($($arg),*) }
        }
    };
}

liburing_setup!(io_uring_queue_init, entries: libc::c_uint, ring: *mut libc::c_void, flags: libc::c_uint);
liburing_setup!(io_uring_queue_init_params, entries: libc::c_uint, ring: *mut libc::c_void, p: *mut libc::c_void);
liburing_setup!(io_uring_queue_init_mem, entries: libc::c_uint, ring: *mut libc::c_void, p: *mut libc::c_void, buf: *mut libc::c_void, size: libc::size_t);
liburing_setup!(io_uring_setup, entries: libc::c_uint, p: *mut libc::c_void);
