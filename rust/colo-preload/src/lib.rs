//! `libcolo_preload.so`: an LD_PRELOAD shim that moves the payload of an unmodified program's
//! loopback TCP connections into colo shared memory (spec/WIRE.md section 3, CARRIER mode).
//!
//! Three tiers per symbol: `real::*` (libc's function, resolved lazily with `dlsym(RTLD_NEXT)`),
//! `shim::*` / `poll::*` (the logic; a non-colo fd costs one atomic load, and `epoll_ctl` on a
//! TCP socket not yet connected also a record of the registration in an uncontended per-fd
//! slot), and the exported one-line wrappers below. A thread-local guard sends the shim's own
//! calls straight to libc; errno is preserved across the shim's work.
//!
//! The application's fd stays the real kernel TCP socket: listening sockets stay pure kernel,
//! `getsockname`/`getpeername`/`fstat` keep their meaning, and anything the shim does not carry
//! (a destination without a colo listener, a server not under colo, a timeout) is plain TCP.
//!
//! Environment (`colo run` warns about values it would not understand): `COLO_LOG=info|debug`
//! (info: accelerated connections and one-time decisions; debug: also every connection left on
//! plain TCP, and why), `COLO_DISABLE=1`, `COLO_CARRIER_TIMEOUT_MS` (default 500:
//! how long a client's first operation waits for the server to claim its offer),
//! `COLO_RING_KB` (default 256), `COLO_SPIN_US`.

#![allow(clippy::missing_safety_doc)]

mod adapt;
mod behind;
mod client;
mod conn;
mod handover;
mod lineage;
mod marker;
mod offer_key;
mod poll;
mod real;
mod repeat;
mod semantics;
mod server;
mod shim;
mod stdio;
mod table;
mod turns;

use libc::{c_int, c_uint, c_ulong, c_void, iovec, msghdr, nfds_t, off_t, size_t, sockaddr, socklen_t, ssize_t};
use libc::{epoll_event, fd_set, pollfd, sigset_t, timespec, timeval};
use std::cell::Cell;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

// ---- guard, errno, logging ------------------------------------------------------------------

thread_local! {
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

fn errno_loc() -> *mut c_int {
    // SAFETY: glibc's per-thread errno location.
    unsafe { libc::__errno_location() }
}

/// Marks the current thread as inside the shim; saves errno.
pub(crate) struct Guard {
    saved: c_int,
    outer: bool,
    /// This thread's `BUSY` (null while thread-locals are being destroyed).
    flag: *const Cell<bool>,
}

/// This thread's `BUSY`, or null while thread-locals are being destroyed. (Looked up once per
/// guard: each lookup is a call into the dynamic loader, in a preloaded library.)
fn busy_flag() -> *const Cell<bool> {
    BUSY.try_with(|b| b as *const Cell<bool>).unwrap_or(std::ptr::null())
}

impl Guard {
    /// (Not inlined: the compiler would look the thread-local up ahead of the cheap test that
    /// usually makes it unnecessary, as in `plain(fd)`.)
    #[inline(never)]
    pub(crate) fn busy() -> bool {
        let f = busy_flag();
        // SAFETY: this thread's flag, alive while the thread runs this call.
        f.is_null() || unsafe { (*f).get() }
    }
    pub(crate) fn enter() -> Guard {
        let flag = busy_flag();
        // SAFETY: as in `busy`.
        let outer = flag.is_null() || unsafe { (*flag).replace(true) };
        // SAFETY: reading this thread's errno.
        Guard { saved: unsafe { *errno_loc() }, outer, flag }
    }
    /// `enter`, unless the thread is already inside the shim.
    pub(crate) fn try_enter() -> Option<Guard> {
        let g = Guard::enter();
        if g.outer {
            std::mem::forget(g);
            return None;
        }
        Some(g)
    }
    /// Success: restore the application's errno.
    pub(crate) fn ok(&self, v: ssize_t) -> ssize_t {
        // SAFETY: writing this thread's errno.
        unsafe { *errno_loc() = self.saved };
        v
    }
    /// Failure: set errno.
    pub(crate) fn err(&self, e: c_int) -> ssize_t {
        // SAFETY: writing this thread's errno.
        unsafe { *errno_loc() = e };
        -1
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.flag.is_null() {
            // SAFETY: the flag of this thread, on which the guard was made and is dropped
            // (a guard never leaves the call that made it).
            unsafe { (*self.flag).set(self.outer) };
        }
    }
}

pub(crate) fn log_level() -> u8 {
    static L: OnceLock<u8> = OnceLock::new();
    *L.get_or_init(|| match std::env::var("COLO_LOG").map(|v| v.to_ascii_lowercase()).as_deref() {
        Ok("debug") => 2,
        Ok("info") => 1,
        _ => 0,
    })
}

pub(crate) fn log_info(args: std::fmt::Arguments<'_>) {
    if log_level() >= 1 {
        let line = format!("colo[{}]: {args}\n", colo_sys::host::pid());
        // SAFETY: a raw write of our buffer to stderr (no libc, no recursion).
        unsafe { libc::syscall(libc::SYS_write, 2, line.as_ptr(), line.len()) };
    }
}

pub(crate) fn log_debug(args: std::fmt::Arguments<'_>) {
    if log_level() >= 2 {
        log_info(args);
    }
}

/// A lock that is not waited for: a fork child inherits the locks other threads of its parent
/// held, and must not hang on them. The shim's small tables take it and, when it is busy, carry
/// on as if they were empty.
pub(crate) fn try_lock<T>(m: &std::sync::Mutex<T>) -> Option<std::sync::MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

pub(crate) fn disabled() -> bool {
    static D: OnceLock<bool> = OnceLock::new();
    *D.get_or_init(|| std::env::var("COLO_DISABLE").is_ok_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes")))
}

pub(crate) fn spin() -> colo::SpinMode {
    static S: OnceLock<colo::SpinMode> = OnceLock::new();
    *S.get_or_init(|| colo::Options::new().spin_mode())
}

// ---- small helpers --------------------------------------------------------------------------

pub(crate) unsafe fn slice<'a, T>(p: *const T, n: usize) -> &'a [T] {
    if n == 0 || p.is_null() {
        return &[];
    }
    // SAFETY: the caller vouches for `n` elements at `p`.
    unsafe { std::slice::from_raw_parts(p, n) }
}

pub(crate) unsafe fn slice_mut<'a, T>(p: *mut T, n: usize) -> &'a mut [T] {
    if n == 0 || p.is_null() {
        return &mut [];
    }
    // SAFETY: the caller vouches for `n` writable elements at `p`.
    unsafe { std::slice::from_raw_parts_mut(p.cast(), n) }
}

pub(crate) fn sockaddr_of(a: &rustix::net::SocketAddrAny) -> Option<SocketAddr> {
    match a.address_family() {
        rustix::net::AddressFamily::INET => rustix::net::SocketAddrV4::try_from(a.clone()).ok().map(SocketAddr::V4),
        rustix::net::AddressFamily::INET6 => rustix::net::SocketAddrV6::try_from(a.clone()).ok().map(SocketAddr::V6),
        _ => None,
    }
}

pub(crate) unsafe fn parse_sockaddr(addr: *const sockaddr, len: socklen_t) -> Option<SocketAddr> {
    // SAFETY: at least a family field, as connect(2) requires.
    let family = unsafe { (*addr).sa_family } as c_int;
    if family == libc::AF_INET && len as usize >= std::mem::size_of::<libc::sockaddr_in>() {
        // SAFETY: family and length say sockaddr_in.
        let a = unsafe { &*(addr as *const libc::sockaddr_in) };
        Some(SocketAddr::new(u32::from_be(a.sin_addr.s_addr).to_be_bytes().into(), u16::from_be(a.sin_port)))
    } else if family == libc::AF_INET6 && len as usize >= std::mem::size_of::<libc::sockaddr_in6>() {
        // SAFETY: family and length say sockaddr_in6.
        let a = unsafe { &*(addr as *const libc::sockaddr_in6) };
        Some(SocketAddr::new(a.sin6_addr.s6_addr.into(), u16::from_be(a.sin6_port)))
    } else {
        None
    }
}

pub(crate) fn is_tcp_stream(fd: colo_sys::BorrowedFd<'_>) -> bool {
    use rustix::net::sockopt;
    matches!(sockopt::socket_type(fd), Ok(rustix::net::SocketType::STREAM))
        && matches!(
            sockopt::socket_domain(fd),
            Ok(rustix::net::AddressFamily::INET) | Ok(rustix::net::AddressFamily::INET6)
        )
}

// ---- io_uring -------------------------------------------------------------------------------

/// `syscall(2)`: `io_uring_setup` is refused with ENOSYS, so that a program that would register
/// its sockets through io_uring (libuv 1.45 and later: uvloop, recent Node) falls back to epoll,
/// which the shim sees; through io_uring an accelerated socket's readiness is the TCP socket's
/// and its reader waits forever. Every other call goes to libc unchanged. (`syscall` is
/// variadic; on x86-64 and arm64 its integer arguments arrive where these parameters are read.)
#[no_mangle]
pub unsafe extern "C" fn syscall(n: libc::c_long, a: libc::c_long, b: libc::c_long, c: libc::c_long, d: libc::c_long, e: libc::c_long, f: libc::c_long) -> libc::c_long {
    if n == libc::SYS_io_uring_setup && !disabled() {
        log_debug(format_args!("io_uring_setup refused (ENOSYS): the program falls back to epoll"));
        // SAFETY: this thread's errno.
        unsafe { *errno_loc() = libc::ENOSYS };
        return -1;
    }
    // Closes and duplicates of the shim's descriptors take the shim's paths (libuv closes so).
    // SAFETY: the application's arguments.
    if let Some(r) = unsafe { behind::syscall(n, a, b, c) } {
        return r;
    }
    // SAFETY: the application's arguments, passed on as they came.
    let r = unsafe { real::syscall(n, a, b, c, d, e, f) };
    // Descriptors closed or replaced past libc's wrappers (see `repeat`).
    if r >= 0 {
        match n {
            libc::SYS_close => repeat::forget(a as c_int),
            libc::SYS_close_range if c & libc::CLOSE_RANGE_CLOEXEC as libc::c_long == 0 => repeat::forget_range(a as u32, b as u32),
            libc::SYS_dup3 => repeat::duplicated(a as c_int, b as c_int),
            _ => {}
        }
    }
    r
}

/// `close_range(2)` (glibc 2.34), made as the system call itself: a child between `vfork` and
/// `exec` (Python's subprocess) calls it, where a first look-up of libc's could wait on the
/// loader's lock.
#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
        behind::closing_range(first, last);
    }
    // SAFETY: the application's arguments, as the system call takes them.
    let r = unsafe { real::syscall(libc::SYS_close_range, first as libc::c_long, last as libc::c_long, flags as libc::c_long, 0, 0, 0) };
    if r == 0 && flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
        repeat::forget_range(first, last);
    }
    r as c_int
}

// ---- fork -----------------------------------------------------------------------------------

/// `fork(2)`: the parent records the child as a holder of every connection at once, before it
/// can close its own copy (the child's own record, in `atfork_child`, may come too late for
/// that, and would let the parent's close end the connection for both).
#[no_mangle]
pub unsafe extern "C" fn fork() -> libc::pid_t {
    if !Guard::busy() {
        let _g = Guard::enter();
        server::before_fork();
    }
    // SAFETY: libc's fork.
    let pid = unsafe { real::fork() };
    if pid > 0 {
        for fd in table::fds_of_kind(table::CONN) {
            if let Some(c) = table::conn(fd as i32) {
                c.add_holder(pid as u32);
            }
        }
    }
    pid
}

extern "C" fn atfork_prepare() {
    repeat::forking();
    server::marker_prepare();
}

extern "C" fn atfork_parent() {
    repeat::forking();
    server::marker_parent();
}

extern "C" fn atfork_child() {
    // Registered before the pid cache's own handler, so it runs first.
    colo_sys::host::forget_pid();
    repeat::forking();
    handover::atfork_child();
    server::atfork_child();
    server::marker_child();
    let me = colo_sys::host::pid();
    for fd in table::fds_of_kind(table::CONN) {
        if let Some(g) = table::try_lock(fd) {
            if let table::Entry::Conn(c) = &*g {
                c.add_holder(me);
            }
        }
    }
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

extern "C" fn init() {
    // The shim's own descriptors stay out of the application's way (see the constant).
    colo::carrier::set_fd_floor(colo_sys::preload::OUT_OF_THE_WAY);
    // A connection handed over across `exec` is mapped again from its memfd.
    colo::segment::keep_memfds(true);
    // SAFETY: registering handlers: the child's only takes uncontended locks with try_lock; the
    // marker lock is held by the service thread only while it makes or closes one socket.
    unsafe { libc::pthread_atfork(Some(atfork_prepare), Some(atfork_parent), Some(atfork_child)) };
    // Cache the pid now, in the parent of any `vfork` child the program will make.
    colo_sys::host::pid();
    // Read COLO_LOG now (it allocates), not first in a connect made from a signal handler or in
    // a fork child.
    log_level();
    // Resolve libc's `syscall` now: the shim's own raw calls go through our wrapper, and a first
    // `dlsym` in a fork child or a signal handler could wait on a lock nobody will release.
    // SAFETY: getpid takes no arguments; the rest are ignored.
    unsafe { real::syscall(libc::SYS_getpid, 0, 0, 0, 0, 0, 0) };
    // Connections the program image before an `exec` handed over.
    handover::take_back();
    colo::shm::set_interrupt_policy(eintr_wanted);
}

/// Whether a blocking read or write that a signal handler interrupted fails with `EINTR`, as the
/// kernel's would when that handler lacks `SA_RESTART`. The wait does not know which signal
/// arrived (EINTR from poll or a futex only says that some handler ran), so it asks which
/// signals could have: those this thread does not block whose handler is the program's own (not
/// the synchronous fault signals, which only a faulting instruction raises; runtimes install
/// handlers for them without SA_RESTART). If any of them lacks `SA_RESTART`, the call fails with
/// `EINTR` (a program that installs such a handler expects EINTR); if all restart, the wait goes
/// on. A few dozen system calls, and only after a signal.
fn eintr_wanted() -> bool {
    // SAFETY: plain queries of this thread's mask and of the dispositions, into zeroed structs.
    unsafe {
        let mut mask: sigset_t = std::mem::zeroed();
        if libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut mask) != 0 {
            return false;
        }
        for sig in 1..=libc::SIGRTMAX() {
            let fault = [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGTRAP, libc::SIGSYS];
            if sig == libc::SIGKILL || sig == libc::SIGSTOP || fault.contains(&sig) || libc::sigismember(&mask, sig) == 1 {
                continue;
            }
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
                continue;
            }
            if old.sa_sigaction == libc::SIG_DFL || old.sa_sigaction == libc::SIG_IGN {
                continue;
            }
            if old.sa_flags & libc::SA_RESTART == 0 {
                return true;
            }
        }
    }
    false
}

fn timeout_of(ts: *const timespec) -> Option<Duration> {
    if ts.is_null() {
        return None;
    }
    // SAFETY: the application's timespec.
    let t = unsafe { *ts };
    Some(Duration::new(t.tv_sec.max(0) as u64, t.tv_nsec.clamp(0, 999_999_999) as u32))
}

fn timeout_ms(ms: c_int) -> Option<Duration> {
    (ms >= 0).then(|| Duration::from_millis(ms as u64))
}

// ---- tier 3: the exported symbols -----------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::socket(domain, ty, protocol) }
}
#[no_mangle]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::connect(fd, addr, len) }
}
#[no_mangle]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::listen(fd, backlog) }
}
#[no_mangle]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::accept4(fd, addr, len, 0) }
}
#[no_mangle]
pub unsafe extern "C" fn accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int {
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::accept4(fd, addr, len, flags) }
}
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::close(fd) }
}
#[no_mangle]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::shutdown(fd, how) }
}
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::read(fd, buf, n) }
}
#[no_mangle]
pub unsafe extern "C" fn __read_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t) -> ssize_t {
    if n > buflen || !shim::is_colo_or_pending(fd) {
        // SAFETY: libc's check (aborts on overflow) and call.
        return unsafe { real::__read_chk(fd, buf, n, buflen) };
    }
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::read(fd, buf, n) }
}
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::write(fd, buf, n) }
}
#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::readv(fd, iov, cnt) }
}
#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::writev(fd, iov, cnt) }
}
#[no_mangle]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::recvfrom(fd, buf, n, flags, std::ptr::null_mut(), std::ptr::null_mut()) }
}
#[no_mangle]
pub unsafe extern "C" fn __recv_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t, flags: c_int) -> ssize_t {
    if n > buflen || !shim::is_colo_or_pending(fd) {
        // SAFETY: libc's check and call.
        return unsafe { real::__recv_chk(fd, buf, n, buflen, flags) };
    }
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::recvfrom(fd, buf, n, flags, std::ptr::null_mut(), std::ptr::null_mut()) }
}
#[no_mangle]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::recvfrom(fd, buf, n, flags, addr, len) }
}
#[no_mangle]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    if n > buflen || !shim::is_colo_or_pending(fd) {
        // SAFETY: libc's check and call.
        return unsafe { real::__recvfrom_chk(fd, buf, n, buflen, flags, addr, len) };
    }
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::recvfrom(fd, buf, n, flags, addr, len) }
}
#[no_mangle]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::sendto(fd, buf, n, flags, std::ptr::null(), 0) }
}
#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
    addr: *const sockaddr,
    len: socklen_t,
) -> ssize_t {
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::sendto(fd, buf, n, flags, addr, len) }
}
#[no_mangle]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::recvmsg(fd, msg, flags) }
}
#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::sendmsg(fd, msg, flags) }
}
#[no_mangle]
pub unsafe extern "C" fn recvmmsg(fd: c_int, v: *mut libc::mmsghdr, n: c_uint, flags: c_int, t: *mut timespec) -> c_int {
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::recvmmsg(fd, v, n, flags, t) }
}
#[no_mangle]
pub unsafe extern "C" fn sendmmsg(fd: c_int, v: *mut libc::mmsghdr, n: c_uint, flags: c_int) -> c_int {
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::sendmmsg(fd, v, n, flags) }
}
#[no_mangle]
pub unsafe extern "C" fn sendfile(out: c_int, inp: c_int, off: *mut off_t, n: size_t) -> ssize_t {
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::sendfile32(out, inp, off, n) }
}
#[no_mangle]
pub unsafe extern "C" fn sendfile64(out: c_int, inp: c_int, off: *mut i64, n: size_t) -> ssize_t {
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::sendfile32(out, inp, off.cast(), n) }
}
#[no_mangle]
pub unsafe extern "C" fn splice(inp: c_int, off_in: *mut i64, out: c_int, off_out: *mut i64, n: size_t, flags: c_uint) -> ssize_t {
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::splice(inp, off_in, out, off_out, n, flags) }
}
#[no_mangle]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const libc::c_char) -> *mut libc::FILE {
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::fdopen(fd, mode) }
}
#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: forwarding the application's arguments (the variadic argument is one word).
    unsafe { shim::fcntl(fd, cmd, arg, false) }
}
#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: forwarding the application's arguments (the variadic argument is one word).
    unsafe { shim::fcntl(fd, cmd, arg, true) }
}
#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: c_ulong) -> c_int {
    // SAFETY: forwarding the application's arguments (the variadic argument is one word).
    unsafe { shim::ioctl(fd, req, arg) }
}
#[no_mangle]
pub unsafe extern "C" fn setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int {
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::setsockopt(fd, level, name, val, len) }
}
#[no_mangle]
pub unsafe extern "C" fn getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int {
    // SAFETY: forwarding the application's arguments.
    unsafe { semantics::getsockopt(fd, level, name, val, len) }
}
#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::dup(fd) }
}
#[no_mangle]
pub unsafe extern "C" fn dup2(fd: c_int, new: c_int) -> c_int {
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::dup3(fd, new, 0, true) }
}
#[no_mangle]
pub unsafe extern "C" fn dup3(fd: c_int, new: c_int, flags: c_int) -> c_int {
    // SAFETY: forwarding the application's arguments.
    unsafe { shim::dup3(fd, new, flags, false) }
}
#[no_mangle]
pub unsafe extern "C" fn poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int {
    if !poll::has_colo(fds, n) {
        // SAFETY: forwarding the application's arguments.
        return unsafe { real::poll(fds, n, timeout) };
    }
    // SAFETY: forwarding the application's arguments.
    unsafe { poll::ppoll_impl(fds, n, timeout_ms(timeout), std::ptr::null()) }
}
#[no_mangle]
pub unsafe extern "C" fn __poll_chk(fds: *mut pollfd, n: nfds_t, timeout: c_int, fdslen: size_t) -> c_int {
    if !poll::has_colo(fds, n) || (n as usize) > fdslen / std::mem::size_of::<pollfd>() {
        // SAFETY: libc's check and call.
        return unsafe { real::__poll_chk(fds, n, timeout, fdslen) };
    }
    // SAFETY: forwarding the application's arguments.
    unsafe { poll::ppoll_impl(fds, n, timeout_ms(timeout), std::ptr::null()) }
}
#[no_mangle]
pub unsafe extern "C" fn ppoll(fds: *mut pollfd, n: nfds_t, t: *const timespec, mask: *const sigset_t) -> c_int {
    if !poll::has_colo(fds, n) {
        // SAFETY: forwarding the application's arguments.
        return unsafe { real::ppoll(fds, n, t, mask) };
    }
    // SAFETY: forwarding the application's arguments.
    unsafe { poll::ppoll_impl(fds, n, timeout_of(t), mask) }
}
#[no_mangle]
pub unsafe extern "C" fn __ppoll_chk(
    fds: *mut pollfd,
    n: nfds_t,
    t: *const timespec,
    mask: *const sigset_t,
    fdslen: size_t,
) -> c_int {
    if !poll::has_colo(fds, n) || (n as usize) > fdslen / std::mem::size_of::<pollfd>() {
        // SAFETY: libc's check and call.
        return unsafe { real::__ppoll_chk(fds, n, t, mask, fdslen) };
    }
    // SAFETY: forwarding the application's arguments.
    unsafe { poll::ppoll_impl(fds, n, timeout_of(t), mask) }
}
#[no_mangle]
pub unsafe extern "C" fn select(n: c_int, r: *mut fd_set, w: *mut fd_set, e: *mut fd_set, t: *mut timeval) -> c_int {
    let to = (!t.is_null()).then(|| {
        // SAFETY: the application's timeval.
        let tv = unsafe { *t };
        Duration::new(tv.tv_sec.max(0) as u64, (tv.tv_usec.clamp(0, 999_999) as u32) * 1000)
    });
    // SAFETY: forwarding the application's arguments.
    match unsafe { poll::select_impl(n, r, w, e, to, std::ptr::null()) } {
        Some(rc) => rc,
        // SAFETY: forwarding the application's arguments.
        None => unsafe { real::select(n, r, w, e, t) },
    }
}
#[no_mangle]
pub unsafe extern "C" fn pselect(
    n: c_int,
    r: *mut fd_set,
    w: *mut fd_set,
    e: *mut fd_set,
    t: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    // SAFETY: forwarding the application's arguments.
    match unsafe { poll::select_impl(n, r, w, e, timeout_of(t), mask) } {
        Some(rc) => rc,
        // SAFETY: forwarding the application's arguments.
        None => unsafe { real::pselect(n, r, w, e, t, mask) },
    }
}
#[no_mangle]
pub unsafe extern "C" fn epoll_ctl(ep: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int {
    // SAFETY: forwarding the application's arguments.
    unsafe { poll::epoll_ctl(ep, op, fd, ev) }
}
#[no_mangle]
pub unsafe extern "C" fn epoll_create(size: c_int) -> c_int {
    let forks = repeat::before_create();
    // SAFETY: forwarding the application's argument.
    let fd = unsafe { real::epoll_create(size) };
    repeat::created(fd, forks);
    fd
}
#[no_mangle]
pub unsafe extern "C" fn epoll_create1(flags: c_int) -> c_int {
    let forks = repeat::before_create();
    // SAFETY: forwarding the application's argument.
    let fd = unsafe { real::epoll_create1(flags) };
    repeat::created(fd, forks);
    fd
}
#[no_mangle]
pub unsafe extern "C" fn epoll_wait(ep: c_int, evs: *mut epoll_event, max: c_int, timeout: c_int) -> c_int {
    // SAFETY: forwarding the application's arguments.
    unsafe { poll::epoll_wait_with(ep, evs, max, timeout, |b, m, t| real::epoll_wait(ep, b, m, t)) }
}
#[no_mangle]
pub unsafe extern "C" fn epoll_pwait(
    ep: c_int,
    evs: *mut epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const sigset_t,
) -> c_int {
    // SAFETY: forwarding the application's arguments.
    unsafe { poll::epoll_wait_with(ep, evs, max, timeout, |b, m, t| real::epoll_pwait(ep, b, m, t, mask)) }
}
#[no_mangle]
pub unsafe extern "C" fn epoll_pwait2(
    ep: c_int,
    evs: *mut epoll_event,
    max: c_int,
    t: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    let ms = timeout_of(t).map_or(-1, |d| d.as_millis().min(c_int::MAX as u128) as c_int);
    // SAFETY: forwarding the application's arguments.
    unsafe {
        poll::epoll_wait_with(ep, evs, max, ms, |b, m, ms| {
            let ts = timespec { tv_sec: (ms / 1000) as i64, tv_nsec: ((ms % 1000) as i64) * 1_000_000 };
            let tp = if ms < 0 { std::ptr::null() } else { &ts as *const timespec };
            real::epoll_pwait2(ep, b, m, if ms == c_int::MAX { t } else { tp }, mask)
        })
    }
}
