//! Tier 1: the real libc functions, resolved lazily with `dlsym(RTLD_NEXT)` on first use (so calls
//! made before our constructor work) and cached in one atomic per symbol.

use libc::{c_int, c_uint, c_ulong, c_void, iovec, msghdr, nfds_t, off_t, size_t, sockaddr, socklen_t, ssize_t};
use libc::{epoll_event, fd_set, pollfd, sigset_t, timespec, timeval};
use std::sync::atomic::{AtomicUsize, Ordering};

fn resolve(name: &'static str) -> usize {
    // SAFETY: `name` is a NUL-terminated literal; dlsym is thread-safe.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) };
    p as usize
}

macro_rules! real_fns {
    ($( fn $name:ident($($arg:ident : $t:ty),*) -> $ret:ty; )*) => {
        /// One address per symbol (0: not resolved yet).
        #[allow(non_upper_case_globals)]
        mod addr {
            use std::sync::atomic::AtomicUsize;
            $( pub static $name: AtomicUsize = AtomicUsize::new(0); )*
        }
        $(
            /// The next definition of this symbol (libc's).
            #[allow(non_snake_case, clippy::missing_safety_doc)]
            #[inline]
            pub unsafe fn $name($($arg: $t),*) -> $ret {
                let mut a = addr::$name.load(Ordering::Relaxed);
                if a == 0 {
                    a = resolve_into(&addr::$name, concat!(stringify!($name), "\0"));
                }
                // SAFETY: `a` is the address of the libc function of this name and C signature.
                let f: unsafe extern "C" fn($($t),*) -> $ret = unsafe { std::mem::transmute(a) };
                // SAFETY: the caller passes the arguments the application gave us.
                unsafe { f($($arg),*) }
            }
        )*

        /// Resolves every symbol not resolved yet (one missing from libc stays unresolved, and
        /// aborts only where it is called, as before).
        fn resolve_rest() {
            $(
                if addr::$name.load(Ordering::Relaxed) == 0 {
                    let a = resolve(concat!(stringify!($name), "\0"));
                    if a != 0 {
                        addr::$name.store(a, Ordering::Relaxed);
                    }
                }
            )*
        }
    }
}

/// Before a fork: every symbol resolved, once per process image. A child resolving its first
/// call of each function with `dlsym` walked every library's symbol tables, whose pages a fork
/// child faults in again (a file mapping's page tables are not copied): a server forking a
/// process per connection (postgres) paid that in every child. And a `dlsym` in a fork child
/// can wait on the loader's lock another thread of the parent held at the fork.
pub fn resolve_all_once() {
    static DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    // Looked at before it is written: the fork handlers call this at every fork.
    if !DONE.load(Ordering::Relaxed) && !DONE.swap(true, Ordering::Relaxed) {
        resolve_rest();
    }
}

/// The address of libc's `vfork`, for a wrapper that must jump to it rather than call it
/// (`api::exports::vfork`).
pub fn vfork_address() -> usize {
    static ADDR: AtomicUsize = AtomicUsize::new(0);
    jump_address(&ADDR, "vfork\0")
}

/// The address of libc's function `name` (NUL-terminated), cached in `addr`, for a wrapper that
/// must jump to it rather than call it: `vfork`, and the variadic `execl` family, whose
/// arguments a Rust function cannot take (`api::exports`).
pub fn jump_address(addr: &AtomicUsize, name: &'static str) -> usize {
    match addr.load(Ordering::Relaxed) {
        0 => resolve_into(addr, name),
        a => a,
    }
}

/// The first call of a symbol: resolves it into `addr` (out of line, so that the calls after it
/// are a load and a jump).
#[cold]
#[inline(never)]
fn resolve_into(addr: &AtomicUsize, name: &'static str) -> usize {
    let a = resolve(name);
    if a == 0 {
        missing(name.trim_end_matches('\0'));
    }
    addr.store(a, Ordering::Relaxed);
    a
}

#[cold]
fn missing(name: &str) -> ! {
    let msg = format!("colo: libc has no {name}\n");
    // SAFETY: writing a byte buffer to stderr.
    unsafe { libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len()) };
    std::process::abort()
}

real_fns! {
    fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int;
    fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    fn setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int;
    fn getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int;
    fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    fn listen(fd: c_int, backlog: c_int) -> c_int;
    fn accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int;
    fn close(fd: c_int) -> c_int;
    fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t;
    fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t;
    fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t;
    fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t;
    fn recvfrom(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> ssize_t;
    fn sendto(fd: c_int, buf: *const c_void, n: size_t, flags: c_int, addr: *const sockaddr, len: socklen_t) -> ssize_t;
    fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t;
    fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t;
    fn recvmmsg(fd: c_int, v: *mut libc::mmsghdr, n: c_uint, flags: c_int, t: *mut timespec) -> c_int;
    fn sendmmsg(fd: c_int, v: *mut libc::mmsghdr, n: c_uint, flags: c_int) -> c_int;
    fn shutdown(fd: c_int, how: c_int) -> c_int;
    fn poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int;
    fn ppoll(fds: *mut pollfd, n: nfds_t, t: *const timespec, mask: *const sigset_t) -> c_int;
    fn select(n: c_int, r: *mut fd_set, w: *mut fd_set, e: *mut fd_set, t: *mut timeval) -> c_int;
    fn pselect(n: c_int, r: *mut fd_set, w: *mut fd_set, e: *mut fd_set, t: *const timespec, mask: *const sigset_t) -> c_int;
    fn epoll_create(size: c_int) -> c_int;
    fn epoll_create1(flags: c_int) -> c_int;
    fn epoll_ctl(ep: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int;
    fn epoll_wait(ep: c_int, evs: *mut epoll_event, max: c_int, timeout: c_int) -> c_int;
    fn epoll_pwait(ep: c_int, evs: *mut epoll_event, max: c_int, timeout: c_int, mask: *const sigset_t) -> c_int;
    fn epoll_pwait2(ep: c_int, evs: *mut epoll_event, max: c_int, t: *const timespec, mask: *const sigset_t) -> c_int;
    fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int;
    fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int;
    fn ioctl(fd: c_int, req: c_ulong, arg: c_ulong) -> c_int;
    fn fork() -> libc::pid_t;
    fn execve(path: *const libc::c_char, argv: *const *const libc::c_char, envp: *const *const libc::c_char) -> c_int;
    fn execv(path: *const libc::c_char, argv: *const *const libc::c_char) -> c_int;
    fn execvp(file: *const libc::c_char, argv: *const *const libc::c_char) -> c_int;
    fn execvpe(file: *const libc::c_char, argv: *const *const libc::c_char, envp: *const *const libc::c_char) -> c_int;
    fn fexecve(fd: c_int, argv: *const *const libc::c_char, envp: *const *const libc::c_char) -> c_int;
    fn execveat(dirfd: c_int, path: *const libc::c_char, argv: *const *const libc::c_char, envp: *const *const libc::c_char, flags: c_int) -> c_int;
    fn posix_spawn(pid: *mut libc::pid_t, path: *const libc::c_char, acts: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t, argv: *const *mut libc::c_char, envp: *const *mut libc::c_char) -> c_int;
    fn posix_spawnp(pid: *mut libc::pid_t, file: *const libc::c_char, acts: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t, argv: *const *mut libc::c_char, envp: *const *mut libc::c_char) -> c_int;
    fn system(command: *const libc::c_char) -> c_int;
    fn popen(command: *const libc::c_char, mode: *const libc::c_char) -> *mut libc::FILE;
    fn syscall(n: libc::c_long, a: libc::c_long, b: libc::c_long, c: libc::c_long, d: libc::c_long, e: libc::c_long, f: libc::c_long) -> libc::c_long;
    fn prctl(option: c_int, a2: c_ulong, a3: c_ulong, a4: c_ulong, a5: c_ulong) -> c_int;
    fn dup(fd: c_int) -> c_int;
    fn setuid(uid: libc::uid_t) -> c_int;
    fn setgid(gid: libc::gid_t) -> c_int;
    fn seteuid(uid: libc::uid_t) -> c_int;
    fn setegid(gid: libc::gid_t) -> c_int;
    fn setreuid(r: libc::uid_t, e: libc::uid_t) -> c_int;
    fn setregid(r: libc::gid_t, e: libc::gid_t) -> c_int;
    fn setresuid(r: libc::uid_t, e: libc::uid_t, s: libc::uid_t) -> c_int;
    fn setresgid(r: libc::gid_t, e: libc::gid_t, s: libc::gid_t) -> c_int;
    fn setgroups(n: size_t, list: *const libc::gid_t) -> c_int;
    fn initgroups(user: *const libc::c_char, group: libc::gid_t) -> c_int;
    fn dup2(fd: c_int, new: c_int) -> c_int;
    fn getrlimit(resource: c_int, out: *mut libc::rlimit) -> c_int;
    fn setrlimit(resource: c_int, new: *const libc::rlimit) -> c_int;
    fn prlimit(pid: libc::pid_t, resource: c_int, new: *const libc::rlimit, old: *mut libc::rlimit) -> c_int;
    fn dup3(fd: c_int, new: c_int, flags: c_int) -> c_int;
    fn sendfile(out: c_int, inp: c_int, off: *mut off_t, n: size_t) -> ssize_t;
    fn fdopen(fd: c_int, mode: *const libc::c_char) -> *mut libc::FILE;
    fn vdprintf(fd: c_int, fmt: *const libc::c_char, ap: *mut c_void) -> c_int;
    fn __vdprintf_chk(fd: c_int, flag: c_int, fmt: *const libc::c_char, ap: *mut c_void) -> c_int;
    fn splice(inp: c_int, off_in: *mut i64, out: c_int, off_out: *mut i64, n: size_t, flags: c_uint) -> ssize_t;
    fn __read_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t) -> ssize_t;
    fn __recv_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t, flags: c_int) -> ssize_t;
    fn __recvfrom_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t, flags: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> ssize_t;
    fn __poll_chk(fds: *mut pollfd, n: nfds_t, timeout: c_int, fdslen: size_t) -> c_int;
    fn __ppoll_chk(fds: *mut pollfd, n: nfds_t, t: *const timespec, mask: *const sigset_t, fdslen: size_t) -> c_int;
}
