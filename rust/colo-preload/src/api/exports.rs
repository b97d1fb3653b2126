//! The exported symbols: each a thin wrapper over the call's logic in the modules beside it
//! (`data`, `fds`, `copy`, `fdopen`, `epoll`, `ppoll`, `sockopt`), or over libc (`real`) when the
//! arguments show the call is not the shim's. A non-colo fd costs one atomic load before libc.

use crate::api::{behind, confine, copy, data, dumpable, epoll, fdopen, fds, forget, names, nofile, ppoll, repeat, route, sockopt, std_streams};
use crate::base::guard::Guard;
use crate::base::uring::refused;
use crate::conn::state::Conn;
use crate::conn::table;
use crate::real;
use crate::service::server;
use libc::{c_int, c_uint, c_ulong, c_void, iovec, msghdr, nfds_t, off_t, size_t, sockaddr, socklen_t, ssize_t};
use libc::{epoll_event, fd_set, pollfd, sigset_t, timespec, timeval};
use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::{Duration, Instant};

// ---- syscall --------------------------------------------------------------------------------

/// `syscall(2)`: `io_uring_setup` is refused (`base::uring`), and a `prctl` as `prctl` is
/// (`dumpable`); closes and duplicates of the
/// shim's descriptors take the shim's paths (`behind`); `execve` and `execveat` are prepared for
/// as libc's (`before_exec`); a raw `fork`, or a `clone` that asks for nothing more than one, is
/// made by `fork`, and a `clone` made as a fork with more flags runs the fork work and handlers
/// (`clone_as_fork`); every other call goes to libc unchanged.
/// (`syscall` is variadic; on x86-64 and arm64 its integer arguments arrive where these
/// parameters are read.)
#[no_mangle]
pub unsafe extern "C" fn syscall(n: libc::c_long, a: libc::c_long, b: libc::c_long, c: libc::c_long, d: libc::c_long, e: libc::c_long, f: libc::c_long) -> libc::c_long {
    if refused(n) {
        return -1;
    }
    if n == libc::SYS_seccomp && confine::seccomp_confines(a) {
        confine::leave_process();
    }
    if n == libc::SYS_prctl && dumpable::refused(a as c_int, b as c_ulong) {
        return -1;
    }
    if n == libc::SYS_execve || n == libc::SYS_execveat {
        before_exec();
    }
    if is_sys_fork(n) || n == libc::SYS_clone && a == libc::c_long::from(libc::SIGCHLD) && b == 0 {
        // Exactly what `fork` makes: made by it, so that libc's own fork handlers run too (its
        // allocator's among them: a child made while a thread was inside `malloc`, as the shim's
        // work on that thread's calls may be, would wait forever at its first allocation).
        // SAFETY: `fork` takes no arguments; the child returns through it as from the system call.
        return libc::c_long::from(unsafe { fork() });
    }
    if n == libc::SYS_clone && clone_is_fork(a, b) {
        // SAFETY: the application's arguments, as the system call takes them.
        return unsafe { clone_as_fork(n, a, b, c, d, e, f) };
    }
    if n == libc::SYS_epoll_pwait2 && (e == 0 || f == 8) {
        // Made through `syscall` by programs built before libc had a wrapper; the sigset size is
        // the kernel's (8 bytes), looked at only with a mask, as the kernel does (else EINVAL,
        // from the kernel).
        // SAFETY: the application's arguments, as the system call (and libc's wrapper) takes them.
        return libc::c_long::from(unsafe { epoll_pwait2(a as c_int, b as *mut epoll_event, c as c_int, d as *const timespec, e as *const sigset_t) });
    }
    if n == libc::SYS_close_range {
        // SAFETY: the application's arguments, as the system call takes them.
        return unsafe { close_range(a as c_uint, b as c_uint, c as c_int) } as libc::c_long;
    }
    // Closes and duplicates of the shim's descriptors take the shim's paths (libuv closes so).
    // SAFETY: `behind::syscall` requires what libc's `syscall` does of these arguments, which the
    // application's call met.
    if let Some(r) = unsafe { behind::syscall(n, a, b, c) } {
        return r;
    }
    // SAFETY: `real::syscall` is libc's `syscall`, given the application's arguments unchanged: the
    // contract the caller met.
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
        forget::closing_range(first, last);
    }
    // SAFETY: the application's arguments, as the system call takes them.
    let r = unsafe { forget::close_range_around_own(first, last, flags) };
    if r == 0 && flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
        repeat::forget_range(first, last);
    }
    r as c_int
}

/// `closefrom(3)`, as `close_range(lowfd, ~0U, 0)`: glibc's own closes through its internal
/// `close_range` system call, out of the shim's sight, and the table must not go on naming
/// connections on numbers the application's next files take.
#[no_mangle]
pub unsafe extern "C" fn closefrom(lowfd: c_int) {
    if lowfd < 0 {
        return;
    }
    // SAFETY: the arguments closefrom(3) stands for.
    unsafe { close_range(lowfd as c_uint, c_uint::MAX, 0) };
}

// ---- fork -----------------------------------------------------------------------------------

/// `fork(2)`: connections still waiting for their server's answer are decided first
/// (`client::decide_before_fork`), and the parent records the child as a holder of every
/// connection at once, before it can close its own copy (the child's own record, in
/// `atfork_child`, may come too late for that, and would let the parent's close end the
/// connection for both). The child returns through this function only: kept with the code the
/// child runs in its fork handlers (`colo_fork_text`), and the work on either side of the fork
/// in functions of their own (each page of code a fork child runs costs it a page fault).
#[no_mangle]
#[link_section = "colo_fork_text"]
pub unsafe extern "C" fn fork() -> libc::pid_t {
    let lent = before_fork();
    // SAFETY: libc's fork.
    let pid = unsafe { real::fork() };
    if pid != 0 || !lent.is_empty() {
        after_fork(pid, lent);
    }
    pid
}

/// Whether `syscall(SYS_clone, flags, stack, ...)` makes a child as `fork` does: a copy of this
/// process's memory and descriptor table, on a copy of the caller's stack (vsftpd's
/// `clone(CLONE_NEWIPC | SIGCHLD)` and the like), in this pid and user namespace (the pids and
/// uids colo records mean the same in the child).
fn clone_is_fork(flags: libc::c_long, stack: libc::c_long) -> bool {
    let shared = libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_THREAD | libc::CLONE_SIGHAND | libc::CLONE_FILES | libc::CLONE_SETTLS;
    let elsewhere = libc::CLONE_NEWPID | libc::CLONE_NEWUSER | libc::CLONE_PARENT;
    stack == 0 && (flags as libc::c_int) & (shared | elsewhere) == 0
}

/// Whether system call `n` is `fork` itself (x86-64 has one; arm64 only `clone`), which copies
/// the process as `clone(SIGCHLD)` does.
fn is_sys_fork(n: libc::c_long) -> bool {
    #[cfg(target_arch = "x86_64")]
    return n == libc::SYS_fork;
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

/// System call `n`, a raw `clone` that makes a fork child ([`clone_is_fork`]) with flags `fork`
/// cannot give (`CLONE_NEWIPC`, `CLONE_PARENT_SETTID`, ...), made as [`fork`] is: with the
/// shim's work around it and colo's fork handlers (`colo_sys::host::run_fork_handlers`), which
/// libc runs only around its own `fork`. Without them the child kept its parent's pid cache and
/// state: it took the parent's offer service for its own (that service's thread does not run
/// in the child), so nobody answered a client of a listener the child made, and its close of an
/// inherited listener waited for that thread. libc's own fork handlers are still not run, as
/// without the shim: such a child of a process whose other thread was inside `malloc` at that
/// moment can wait forever at its first allocation, with the shim or without.
///
/// # Safety
/// The application's arguments, as the system call takes them.
unsafe fn clone_as_fork(n: libc::c_long, a: libc::c_long, b: libc::c_long, c: libc::c_long, d: libc::c_long, e: libc::c_long, f: libc::c_long) -> libc::c_long {
    use colo_sys::host::{run_fork_handlers, ForkStage};
    let lent = before_fork();
    run_fork_handlers(ForkStage::Prepare);
    // SAFETY: libc's `syscall`, given the application's arguments unchanged.
    let r = unsafe { real::syscall(n, a, b, c, d, e, f) };
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    run_fork_handlers(if r == 0 { ForkStage::Child } else { ForkStage::Parent });
    if r != 0 || !lent.is_empty() {
        after_fork(r as libc::pid_t, lent);
    }
    if r < 0 {
        // SAFETY: errno is this thread's; the failed clone's value goes back to the caller.
        unsafe { *libc::__errno_location() = errno };
    }
    r
}

/// What [`fork`] does before libc's, if there is anything to do: nothing is written (the
/// guard's thread-local flag is on a page the next fork shares) in a process with neither
/// connections nor pending ones, nor a service of another process's to look after.
#[inline(never)]
fn before_fork() -> ManuallyDrop<Vec<(Arc<Conn>, [bool; 2])>> {
    let wanted = table::fds_of_kind(table::PENDING).next().is_some() || table::fds_of_kind(table::CONN).next().is_some() || server::serving_elsewhere();
    if !wanted || Guard::busy() {
        return ManuallyDrop::new(Vec::new());
    }
    let _g = Guard::enter();
    crate::service::client::decide_before_fork();
    server::before_fork();
    ManuallyDrop::new(lend_turns())
}

/// What [`fork`] does after libc's: in the parent (`pid` > 0) records the child as a holder and
/// gives the lent turns back as the calls end; in the child, or if the fork failed, lets go of
/// them.
#[inline(never)]
fn after_fork(pid: libc::pid_t, lent: ManuallyDrop<Vec<(Arc<Conn>, [bool; 2])>>) {
    let lent = ManuallyDrop::into_inner(lent);
    if pid > 0 {
        for fd in table::fds_of_kind(table::CONN) {
            // Looked at in its slot, not cloned: a count written on the connection's page would
            // cost this process a copy of it.
            if let Some(mut slot) = table::lock(fd as i32) {
                if let table::Entry::Conn(c) = slot.entry() {
                    c.add_holder(pid as u32);
                }
            }
        }
    }
    if pid != 0 && !lent.is_empty() {
        give_back_when_done(lent);
    }
}

/// Before `fork`: every connection marked shared, and the turn of each direction a call is under
/// way in without one taken on its behalf (`Conn::lend_turns`), so that the child waits for it.
fn lend_turns() -> Vec<(Arc<Conn>, [bool; 2])> {
    table::fds_of_kind(table::CONN)
        .filter_map(|fd| table::conn(fd as i32))
        .map(|c| {
            let lent = c.lend_turns();
            (c, lent)
        })
        .filter(|(_, lent)| lent.iter().any(|&l| l))
        .collect()
}

/// In the parent after `fork`: a thread gives the lent turns back as the calls end (one that
/// waits for bytes or room may take long; the fork returns now). If no thread can be made, at
/// once.
fn give_back_when_done(lent: Vec<(Arc<Conn>, [bool; 2])>) {
    // Shared with the thread, so that a thread not made (its closure dropped) leaves them here.
    let lent = Arc::new(lent);
    let theirs = Arc::clone(&lent);
    let spawned = colo_sys::host::spawn("colo-turns", move || {
        for (c, l) in theirs.iter() {
            c.give_back_turns(*l, true);
        }
    });
    if spawned.is_err() {
        for (c, l) in lent.iter() {
            c.give_back_turns(*l, false);
        }
    }
}

/// `vfork(2)`: connections still waiting for their server's answer are decided first, in the
/// parent, as at `fork` (a `vfork` child that execs, as CPython's `subprocess` does, would pass
/// the new image the bare socket of one, which carries nothing once the server took the offer;
/// the child shares the parent's memory, so nothing can be decided in it). `vfork` cannot be
/// called from a wrapper that returns (the child would return through the wrapper's frame,
/// which the parent then returns through too): this one calls `before_vfork` and jumps to
/// libc's `vfork`, which returns to the application.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn vfork() -> libc::pid_t {
    // At entry the stack is 8 bytes off 16-byte alignment (the return address): the push
    // aligns it for the call and the pop undoes it, leaving the stack as the caller made it.
    std::arch::naked_asm!("push rax", "call {before}", "pop rcx", "jmp rax", before = sym before_vfork)
}

/// What [`vfork`] does before libc's: what [`before_exec`] does, as the child may exec; returns
/// libc's `vfork`.
#[cfg(target_arch = "x86_64")]
extern "C" fn before_vfork() -> usize {
    before_exec();
    real::vfork_address()
}

/// Before `exec`: connections still waiting for their server's answer are decided first, as at
/// `fork` (`client::decide_before_fork`), so that an accelerated one reaches the new image
/// through the handover file; the new image would otherwise get the bare socket, which carries
/// nothing once the server took the offer (ucspi's `tcpclient` connects and execs its program).
/// Then connections born close-on-exec that the program made inheritable since are relayed
/// (`handover::relay_inheritable`): the new image could not map their segment. Not in a child
/// that shares its parent's memory (`vfork`): the decision's descriptors would be the child's,
/// its table the parent's (such a child relays a connection when it makes it inheritable, and
/// every inheritable one if it changed its uid: `handover::relay_inheritable_in_child`).
/// `posix_spawn`, `system` and `popen` act in the parent, before their child (which shares the
/// parent's memory) execs, and `vfork` before the child exists. On x86-64 the variadic `execl`,
/// `execle` and `execlp` come here too (`exec_variadic`); elsewhere they are out of sight, and
/// so is an `exec` made by a system call instruction of the program's own (`execveat` and
/// `syscall(2)`'s `execve` and `execveat` come here).
fn before_exec() {
    if Guard::busy() {
        return;
    }
    if crate::base::vm::shares_memory() {
        // Only a child that became another user since needs anything done here.
        let _g = Guard::enter();
        crate::service::handover::relay_inheritable_in_child();
        return;
    }
    let _g = Guard::enter();
    if table::fds_of_kind(table::PENDING).next().is_some() {
        crate::service::client::decide_before_fork();
    }
    crate::service::handover::relay_inheritable();
}

/// An exported variadic member of the `execl` family: its arguments stay in the registers and
/// on the stack where the caller put them while [`before_exec`] runs, then it jumps to libc's.
macro_rules! exec_variadic {
    ($name:ident, $before:ident, $sym:literal) => {
        /// See [`before_exec`]; then libc's function of this name, with the caller's arguments.
        #[cfg(target_arch = "x86_64")]
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name() -> c_int {
            // At entry the stack is 8 bytes off 16-byte alignment (the return address): seven
            // pushes (the six argument registers and rax, a variadic call's count of vector
            // registers) align it for the call; the pops restore every one of them.
            std::arch::naked_asm!(
                "push rdi", "push rsi", "push rdx", "push rcx", "push r8", "push r9", "push rax",
                "call {before}",
                "mov r11, rax",
                "pop rax", "pop r9", "pop r8", "pop rcx", "pop rdx", "pop rsi", "pop rdi",
                "jmp r11",
                before = sym $before
            )
        }

        /// What the wrapper does before libc's function; returns its address.
        #[cfg(target_arch = "x86_64")]
        extern "C" fn $before() -> usize {
            static ADDR: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            before_exec();
            real::jump_address(&ADDR, $sym)
        }
    };
}
exec_variadic!(execl, before_execl, "execl\0");
exec_variadic!(execle, before_execle, "execle\0");
exec_variadic!(execlp, before_execlp, "execlp\0");

/// `popen(3)` (glibc's spawns its shell through an internal `posix_spawn`): see [`before_exec`].
#[no_mangle]
pub unsafe extern "C" fn popen(command: *const libc::c_char, mode: *const libc::c_char) -> *mut libc::FILE {
    before_exec();
    // SAFETY: libc's popen with the application's arguments.
    unsafe { real::popen(command, mode) }
}

/// `execve(2)`: see [`before_exec`].
#[no_mangle]
pub unsafe extern "C" fn execve(path: *const libc::c_char, argv: *const *const libc::c_char, envp: *const *const libc::c_char) -> c_int {
    before_exec();
    // SAFETY: libc's execve with the application's arguments.
    unsafe { real::execve(path, argv, envp) }
}

/// `execv(3)`: see [`before_exec`].
#[no_mangle]
pub unsafe extern "C" fn execv(path: *const libc::c_char, argv: *const *const libc::c_char) -> c_int {
    before_exec();
    // SAFETY: libc's execv with the application's arguments.
    unsafe { real::execv(path, argv) }
}

/// `execvp(3)`: see [`before_exec`].
#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const libc::c_char, argv: *const *const libc::c_char) -> c_int {
    before_exec();
    // SAFETY: libc's execvp with the application's arguments.
    unsafe { real::execvp(file, argv) }
}

/// `execvpe(3)`: see [`before_exec`].
#[no_mangle]
pub unsafe extern "C" fn execvpe(file: *const libc::c_char, argv: *const *const libc::c_char, envp: *const *const libc::c_char) -> c_int {
    before_exec();
    // SAFETY: libc's execvpe with the application's arguments.
    unsafe { real::execvpe(file, argv, envp) }
}

/// `fexecve(3)`: see [`before_exec`].
#[no_mangle]
pub unsafe extern "C" fn fexecve(fd: c_int, argv: *const *const libc::c_char, envp: *const *const libc::c_char) -> c_int {
    before_exec();
    // SAFETY: libc's fexecve with the application's arguments.
    unsafe { real::fexecve(fd, argv, envp) }
}

/// `execveat(2)` (glibc's wrapper): see [`before_exec`].
#[no_mangle]
pub unsafe extern "C" fn execveat(dirfd: c_int, path: *const libc::c_char, argv: *const *const libc::c_char, envp: *const *const libc::c_char, flags: c_int) -> c_int {
    before_exec();
    // SAFETY: libc's execveat with the application's arguments.
    unsafe { real::execveat(dirfd, path, argv, envp, flags) }
}

/// `posix_spawn(3)`: see [`before_exec`].
#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const libc::c_char,
    acts: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut libc::c_char,
    envp: *const *mut libc::c_char,
) -> c_int {
    before_exec();
    // SAFETY: libc's posix_spawn with the application's arguments.
    unsafe { real::posix_spawn(pid, path, acts, attr, argv, envp) }
}

/// `posix_spawnp(3)`: see [`before_exec`].
#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const libc::c_char,
    acts: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut libc::c_char,
    envp: *const *mut libc::c_char,
) -> c_int {
    before_exec();
    // SAFETY: libc's posix_spawnp with the application's arguments.
    unsafe { real::posix_spawnp(pid, file, acts, attr, argv, envp) }
}

/// `system(3)`: see [`before_exec`].
#[no_mangle]
pub unsafe extern "C" fn system(command: *const libc::c_char) -> c_int {
    before_exec();
    // SAFETY: libc's system with the application's argument.
    unsafe { real::system(command) }
}

/// The wait a `timespec` timeout names (`None`: no timeout); `Err(EINVAL)` for one the kernel
/// refuses (a negative second, nanoseconds outside a second).
fn timeout_of(ts: *const timespec) -> Result<Option<Duration>, c_int> {
    if ts.is_null() {
        return Ok(None);
    }
    // SAFETY: the application's timespec.
    let t = unsafe { *ts };
    if t.tv_sec < 0 || !(0..1_000_000_000).contains(&t.tv_nsec) {
        return Err(libc::EINVAL);
    }
    Ok(Some(Duration::new(t.tv_sec as u64, t.tv_nsec as u32)))
}

/// `-1` with errno `e`, as libc's wrappers fail.
fn fail(e: c_int) -> c_int {
    crate::base::guard::set_errno(e);
    -1
}

fn timeout_ms(ms: c_int) -> Option<Duration> {
    (ms >= 0).then(|| Duration::from_millis(ms as u64))
}

// ---- the socket calls -----------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    // SAFETY: `fds::socket` requires what libc's `socket` does of these arguments, which the
    // application's call met.
    unsafe { fds::socket(domain, ty, protocol) }
}
#[no_mangle]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: `fds::connect` requires what libc's `connect` does of these arguments, which the
    // application's call met.
    let r = unsafe { fds::connect(fd, addr, len) };
    std_streams::adopt(fd);
    r
}
#[no_mangle]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    // SAFETY: `fds::listen` requires what libc's `listen` does of these arguments, which the
    // application's call met.
    unsafe { fds::listen(fd, backlog) }
}
#[no_mangle]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: `fds::accept4` requires what libc's `accept` does of these arguments, which the
    // application's call met.
    let r = unsafe { fds::accept4(fd, addr, len, 0) };
    std_streams::adopt(r);
    r
}
#[no_mangle]
pub unsafe extern "C" fn accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int {
    // SAFETY: `fds::accept4` requires what libc's `accept4` does of these arguments, which the
    // application's call met.
    let r = unsafe { fds::accept4(fd, addr, len, flags) };
    std_streams::adopt(r);
    r
}
/// `close(2)`. The shim's own closes come here too (its descriptors dropped anywhere in its
/// code go through libc's symbol, which is this one): the caller's return address, passed on
/// as a second argument, tells them from the application's (`close_from`).
#[no_mangle]
#[unsafe(naked)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    #[cfg(target_arch = "x86_64")]
    core::arch::naked_asm!("mov rsi, [rsp]", "jmp {}", sym close_from);
    #[cfg(target_arch = "aarch64")]
    core::arch::naked_asm!("mov x1, x30", "b {}", sym close_from);
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("the `close` trampoline is written for x86_64 and aarch64");

/// [`close`], called from `caller`.
unsafe extern "C" fn close_from(fd: c_int, caller: usize) -> c_int {
    // SAFETY: `fds::close` requires what libc's `close` does of these arguments, which the
    // caller's call met.
    unsafe { fds::close(fd, !crate::base::own_code::contains(caller)) }
}
#[no_mangle]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    // SAFETY: `fds::shutdown` requires what libc's `shutdown` does of these arguments, which the
    // application's call met.
    unsafe { fds::shutdown(fd, how) }
}
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    // SAFETY: `data::read` requires what libc's `read` does of these arguments, which the
    // application's call met.
    unsafe { data::read(fd, buf, n) }
}
#[no_mangle]
pub unsafe extern "C" fn __read_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t) -> ssize_t {
    if n > buflen || !route::is_colo_or_pending(fd) {
        // SAFETY: libc's `__read_chk` checks the length against the buffer's (aborting past it),
        // then makes the call, under the contract the application's call met.
        return unsafe { real::__read_chk(fd, buf, n, buflen) };
    }
    // SAFETY: `data::read` requires what libc's `__read_chk` does of these arguments, which the
    // application's call met.
    unsafe { data::read(fd, buf, n) }
}
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    // SAFETY: `data::write` requires what libc's `write` does of these arguments, which the
    // application's call met.
    unsafe { data::write(fd, buf, n) }
}
#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    // SAFETY: `data::readv` requires what libc's `readv` does of these arguments, which the
    // application's call met.
    unsafe { data::readv(fd, iov, cnt) }
}
#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    // SAFETY: `data::writev` requires what libc's `writev` does of these arguments, which the
    // application's call met.
    unsafe { data::writev(fd, iov, cnt) }
}
#[no_mangle]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    // SAFETY: `data::recvfrom` requires what libc's `recv` does of these arguments, which the
    // application's call met.
    unsafe { data::recvfrom(fd, buf, n, flags, std::ptr::null_mut(), std::ptr::null_mut()) }
}
#[no_mangle]
pub unsafe extern "C" fn __recv_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t, flags: c_int) -> ssize_t {
    if n > buflen || !route::is_colo_or_pending(fd) {
        // SAFETY: libc's `__recv_chk` checks the length against the buffer's (aborting past it),
        // then makes the call, under the contract the application's call met.
        return unsafe { real::__recv_chk(fd, buf, n, buflen, flags) };
    }
    // SAFETY: `data::recvfrom` requires what libc's `__recv_chk` does of these arguments, which the
    // application's call met.
    unsafe { data::recvfrom(fd, buf, n, flags, std::ptr::null_mut(), std::ptr::null_mut()) }
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
    // SAFETY: `data::recvfrom` requires what libc's `recvfrom` does of these arguments, which the
    // application's call met.
    unsafe { data::recvfrom(fd, buf, n, flags, addr, len) }
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
    if n > buflen || !route::is_colo_or_pending(fd) {
        // SAFETY: libc's `__recvfrom_chk` checks the length against the buffer's (aborting past
        // it), then makes the call, under the contract the application's call met.
        return unsafe { real::__recvfrom_chk(fd, buf, n, buflen, flags, addr, len) };
    }
    // SAFETY: `data::recvfrom` requires what libc's `__recvfrom_chk` does of these arguments, which
    // the application's call met.
    unsafe { data::recvfrom(fd, buf, n, flags, addr, len) }
}
#[no_mangle]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    // SAFETY: `data::sendto` requires what libc's `send` does of these arguments, which the
    // application's call met.
    unsafe { data::sendto(fd, buf, n, flags, std::ptr::null(), 0) }
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
    // SAFETY: `data::sendto` requires what libc's `sendto` does of these arguments, which the
    // application's call met.
    unsafe { data::sendto(fd, buf, n, flags, addr, len) }
}
#[no_mangle]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    // SAFETY: `data::recvmsg` requires what libc's `recvmsg` does of these arguments, which the
    // application's call met.
    unsafe { data::recvmsg(fd, msg, flags) }
}
#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    // SAFETY: `data::sendmsg` requires what libc's `sendmsg` does of these arguments, which the
    // application's call met.
    unsafe { data::sendmsg(fd, msg, flags) }
}
#[no_mangle]
pub unsafe extern "C" fn recvmmsg(fd: c_int, v: *mut libc::mmsghdr, n: c_uint, flags: c_int, t: *mut timespec) -> c_int {
    // SAFETY: `data::recvmmsg` requires what libc's `recvmmsg` does of these arguments, which the
    // application's call met.
    unsafe { data::recvmmsg(fd, v, n, flags, t) }
}
#[no_mangle]
pub unsafe extern "C" fn sendmmsg(fd: c_int, v: *mut libc::mmsghdr, n: c_uint, flags: c_int) -> c_int {
    // SAFETY: `data::sendmmsg` requires what libc's `sendmmsg` does of these arguments, which the
    // application's call met.
    unsafe { data::sendmmsg(fd, v, n, flags) }
}
#[no_mangle]
pub unsafe extern "C" fn sendfile(out: c_int, inp: c_int, off: *mut off_t, n: size_t) -> ssize_t {
    // SAFETY: `copy::sendfile` requires what libc's `sendfile` does of these arguments, which the
    // application's call met.
    unsafe { copy::sendfile(out, inp, off, n) }
}
#[no_mangle]
pub unsafe extern "C" fn sendfile64(out: c_int, inp: c_int, off: *mut i64, n: size_t) -> ssize_t {
    // SAFETY: `copy::sendfile` requires what libc's `sendfile64` does of these arguments, which the
    // application's call met.
    unsafe { copy::sendfile(out, inp, off.cast(), n) }
}
#[no_mangle]
pub unsafe extern "C" fn splice(inp: c_int, off_in: *mut i64, out: c_int, off_out: *mut i64, n: size_t, flags: c_uint) -> ssize_t {
    // SAFETY: `copy::splice` requires what libc's `splice` does of these arguments, which the
    // application's call met.
    unsafe { copy::splice(inp, off_in, out, off_out, n, flags) }
}
#[no_mangle]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const libc::c_char) -> *mut libc::FILE {
    // SAFETY: `fdopen::fdopen` requires what libc's `fdopen` does of these arguments, which the
    // application's call met.
    unsafe { fdopen::fdopen(fd, mode) }
}
#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: `fds::fcntl` requires what libc's `fcntl` does of these arguments (the variadic
    // argument is one word, as on the targets the shim builds for), which the application's call
    // met.
    let r = unsafe { fds::fcntl(fd, cmd, arg, false) };
    if cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC {
        std_streams::adopt(r);
    }
    r
}
#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: `fds::fcntl` requires what libc's `fcntl64` does of these arguments (the variadic
    // argument is one word, as on the targets the shim builds for), which the application's call
    // met.
    let r = unsafe { fds::fcntl(fd, cmd, arg, true) };
    if cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC {
        std_streams::adopt(r);
    }
    r
}
#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: c_ulong) -> c_int {
    // SAFETY: `fds::ioctl` requires what libc's `ioctl` does of these arguments (the variadic
    // argument is one word, as on the targets the shim builds for), which the application's call
    // met.
    unsafe { fds::ioctl(fd, req, arg) }
}
#[no_mangle]
pub unsafe extern "C" fn setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int {
    // SAFETY: `sockopt::set_option` requires what libc's `setsockopt` does of these arguments,
    // which the application's call met.
    unsafe { sockopt::set_option(fd, level, name, val, len) }
}
#[no_mangle]
pub unsafe extern "C" fn getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int {
    if level == libc::IPPROTO_TCP && name == libc::TCP_DEFER_ACCEPT {
        // SAFETY: the application's arguments, as `getsockopt` takes them.
        if let Some(r) = unsafe { sockopt::get_defer_accept(fd, val, len) } {
            return r;
        }
    }
    // SAFETY: `sockopt::getsockopt` requires what libc's `getsockopt` does of these arguments,
    // which the application's call met.
    unsafe { sockopt::getsockopt(fd, level, name, val, len) }
}
#[no_mangle]
pub unsafe extern "C" fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: `names::name` requires what libc's `getsockname` does of these arguments, which the
    // application's call met.
    unsafe { names::name(fd, addr, len, false) }
}
#[no_mangle]
pub unsafe extern "C" fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: `names::name` requires what libc's `getpeername` does of these arguments, which the
    // application's call met.
    unsafe { names::name(fd, addr, len, true) }
}
#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: `fds::dup` requires what libc's `dup` does of these arguments, which the
    // application's call met.
    let r = unsafe { fds::dup(fd) };
    std_streams::adopt(r);
    r
}
#[no_mangle]
pub unsafe extern "C" fn dup2(fd: c_int, new: c_int) -> c_int {
    // SAFETY: `fds::dup3` requires what libc's `dup2` does of these arguments, which the
    // application's call met.
    let r = unsafe { fds::dup3(fd, new, 0, true) };
    std_streams::adopt(r);
    r
}
#[no_mangle]
pub unsafe extern "C" fn dup3(fd: c_int, new: c_int, flags: c_int) -> c_int {
    // SAFETY: `fds::dup3` requires what libc's `dup3` does of these arguments, which the
    // application's call met.
    let r = unsafe { fds::dup3(fd, new, flags, false) };
    std_streams::adopt(r);
    r
}
#[no_mangle]
pub unsafe extern "C" fn poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int {
    if !ppoll::has_colo(fds, n) {
        // SAFETY: `real::poll` is libc's `poll`, given the application's arguments unchanged: the
        // contract the caller met.
        return unsafe { real::poll(fds, n, timeout) };
    }
    // SAFETY: `ppoll::ppoll_impl` requires what libc's `poll` does of these arguments, which the
    // application's call met.
    unsafe { ppoll::ppoll_impl(fds, n, timeout_ms(timeout), std::ptr::null()) }
}
#[no_mangle]
pub unsafe extern "C" fn __poll_chk(fds: *mut pollfd, n: nfds_t, timeout: c_int, fdslen: size_t) -> c_int {
    if !ppoll::has_colo(fds, n) || (n as usize) > fdslen / std::mem::size_of::<pollfd>() {
        // SAFETY: libc's `__poll_chk` checks the length against the buffer's (aborting past it),
        // then makes the call, under the contract the application's call met.
        return unsafe { real::__poll_chk(fds, n, timeout, fdslen) };
    }
    // SAFETY: `ppoll::ppoll_impl` requires what libc's `__poll_chk` does of these arguments, which
    // the application's call met.
    unsafe { ppoll::ppoll_impl(fds, n, timeout_ms(timeout), std::ptr::null()) }
}
#[no_mangle]
pub unsafe extern "C" fn ppoll(fds: *mut pollfd, n: nfds_t, t: *const timespec, mask: *const sigset_t) -> c_int {
    if !ppoll::has_colo(fds, n) {
        // SAFETY: `real::ppoll` is libc's `ppoll`, given the application's arguments unchanged: the
        // contract the caller met.
        return unsafe { real::ppoll(fds, n, t, mask) };
    }
    let to = match timeout_of(t) {
        Ok(to) => to,
        Err(e) => return fail(e),
    };
    // SAFETY: `ppoll::ppoll_impl` requires what libc's `ppoll` does of these arguments, which the
    // application's call met.
    unsafe { ppoll::ppoll_impl(fds, n, to, mask) }
}
#[no_mangle]
pub unsafe extern "C" fn __ppoll_chk(
    fds: *mut pollfd,
    n: nfds_t,
    t: *const timespec,
    mask: *const sigset_t,
    fdslen: size_t,
) -> c_int {
    if !ppoll::has_colo(fds, n) || (n as usize) > fdslen / std::mem::size_of::<pollfd>() {
        // SAFETY: libc's `__ppoll_chk` checks the length against the buffer's (aborting past it),
        // then makes the call, under the contract the application's call met.
        return unsafe { real::__ppoll_chk(fds, n, t, mask, fdslen) };
    }
    let to = match timeout_of(t) {
        Ok(to) => to,
        Err(e) => return fail(e),
    };
    // SAFETY: `ppoll::ppoll_impl` requires what libc's `__ppoll_chk` does of these arguments, which
    // the application's call met.
    unsafe { ppoll::ppoll_impl(fds, n, to, mask) }
}
#[no_mangle]
/// As Linux's: a negative timeval fails (`EINVAL`), microseconds past a second carry into the
/// seconds, and the time not slept is written back into the timeval.
pub unsafe extern "C" fn select(n: c_int, r: *mut fd_set, w: *mut fd_set, e: *mut fd_set, t: *mut timeval) -> c_int {
    let start = Instant::now();
    let to = if t.is_null() {
        None
    } else {
        // SAFETY: the application's timeval.
        let tv = unsafe { *t };
        if tv.tv_sec < 0 || tv.tv_usec < 0 {
            return fail(libc::EINVAL);
        }
        Some(Duration::from_secs(tv.tv_sec as u64) + Duration::from_micros(tv.tv_usec as u64))
    };
    // SAFETY: `ppoll::select_impl` requires what libc's `select` does of these arguments, which the
    // application's call met.
    match unsafe { ppoll::select_impl(n, r, w, e, to, std::ptr::null()) } {
        Some(rc) => {
            if let Some(to) = to {
                let left = to.saturating_sub(start.elapsed());
                // SAFETY: the application's timeval, which select(2) writes.
                unsafe { *t = timeval { tv_sec: left.as_secs() as libc::time_t, tv_usec: left.subsec_micros() as libc::suseconds_t } };
            }
            rc
        }
        // SAFETY: `real::select` is libc's `select`, given the application's arguments unchanged:
        // the contract the caller met.
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
    let to = match timeout_of(t) {
        Ok(to) => to,
        Err(err) => return fail(err),
    };
    // SAFETY: `ppoll::select_impl` requires what libc's `pselect` does of these arguments, which the
    // application's call met.
    match unsafe { ppoll::select_impl(n, r, w, e, to, mask) } {
        Some(rc) => rc,
        // SAFETY: `real::pselect` is libc's `pselect`, given the application's arguments unchanged:
        // the contract the caller met.
        None => unsafe { real::pselect(n, r, w, e, t, mask) },
    }
}
#[no_mangle]
pub unsafe extern "C" fn epoll_ctl(ep: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int {
    // SAFETY: `epoll::epoll_ctl` requires what libc's `epoll_ctl` does of these arguments, which the
    // application's call met.
    unsafe { epoll::epoll_ctl(ep, op, fd, ev) }
}
#[no_mangle]
pub unsafe extern "C" fn epoll_create(size: c_int) -> c_int {
    let forks = repeat::before_create();
    // SAFETY: `real::epoll_create` is libc's `epoll_create`, given the application's arguments
    // unchanged: the contract the caller met.
    let fd = unsafe { real::epoll_create(size) };
    epoll::created(fd, forks)
}
#[no_mangle]
pub unsafe extern "C" fn epoll_create1(flags: c_int) -> c_int {
    let forks = repeat::before_create();
    // SAFETY: `real::epoll_create1` is libc's `epoll_create1`, given the application's arguments
    // unchanged: the contract the caller met.
    let fd = unsafe { real::epoll_create1(flags) };
    epoll::created(fd, forks)
}
#[no_mangle]
pub unsafe extern "C" fn epoll_wait(ep: c_int, evs: *mut epoll_event, max: c_int, timeout: c_int) -> c_int {
    // SAFETY: `epoll::epoll_wait_with` requires what libc's `epoll_wait` does of these arguments,
    // which the application's call met.
    unsafe { epoll::epoll_wait_with(ep, evs, max, timeout, |b, m, t| real::epoll_wait(ep, b, m, t)) }
}
#[no_mangle]
pub unsafe extern "C" fn epoll_pwait(
    ep: c_int,
    evs: *mut epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const sigset_t,
) -> c_int {
    // SAFETY: `epoll::epoll_wait_with` requires what libc's `epoll_pwait` does of these arguments,
    // which the application's call met.
    unsafe { epoll::epoll_wait_with(ep, evs, max, timeout, |b, m, t| real::epoll_pwait(ep, b, m, t, mask)) }
}
#[no_mangle]
pub unsafe extern "C" fn epoll_pwait2(
    ep: c_int,
    evs: *mut epoll_event,
    max: c_int,
    t: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    let ms = match timeout_of(t) {
        Ok(to) => to.map_or(-1, |d| d.as_nanos().div_ceil(1_000_000).min(c_int::MAX as u128) as c_int),
        Err(e) => return fail(e),
    };
    // SAFETY: `epoll::epoll_wait_with` requires what libc's `epoll_pwait2` does of `ep`, `evs` and
    // `max`, which the application's call met; the kernel's wait is given `t` itself, or a
    // timespec of ours that outlives the call, and the application's `mask`.
    unsafe {
        epoll::epoll_wait_with(ep, evs, max, ms, |b, m, ms| {
            let ts = timespec { tv_sec: (ms / 1000) as i64, tv_nsec: ((ms % 1000) as i64) * 1_000_000 };
            let tp = if ms < 0 { std::ptr::null() } else { &ts as *const timespec };
            real::epoll_pwait2(ep, b, m, if ms == c_int::MAX { t } else { tp }, mask)
        })
    }
}

// ---- limits ---------------------------------------------------------------------------------
// The application's own hard limit of open files (`nofile`); every other resource and process
// goes to libc unchanged. (On 64-bit glibc the `64` names are the same functions.)

#[no_mangle]
pub unsafe extern "C" fn getrlimit(resource: c_int, out: *mut libc::rlimit) -> c_int {
    // SAFETY: `out` is the application's, as `nofile::get` and libc's `getrlimit` require.
    unsafe { nofile::get(resource, out).unwrap_or_else(|| real::getrlimit(resource, out)) }
}
#[no_mangle]
pub unsafe extern "C" fn getrlimit64(resource: c_int, out: *mut libc::rlimit) -> c_int {
    // SAFETY: as `getrlimit`.
    unsafe { getrlimit(resource, out) }
}
#[no_mangle]
pub unsafe extern "C" fn setrlimit(resource: c_int, new: *const libc::rlimit) -> c_int {
    // SAFETY: `new` is the application's, as `nofile::set_own` and libc's `setrlimit` require.
    unsafe { nofile::set_own(resource, new).unwrap_or_else(|| real::setrlimit(resource, new)) }
}
#[no_mangle]
pub unsafe extern "C" fn setrlimit64(resource: c_int, new: *const libc::rlimit) -> c_int {
    // SAFETY: as `setrlimit`.
    unsafe { setrlimit(resource, new) }
}
#[no_mangle]
pub unsafe extern "C" fn prlimit(pid: libc::pid_t, resource: c_int, new: *const libc::rlimit, old: *mut libc::rlimit) -> c_int {
    // SAFETY: `new` and `old` are the application's, as `nofile::prlimit` and libc's `prlimit`
    // require.
    unsafe { nofile::prlimit(pid, resource, new, old).unwrap_or_else(|| real::prlimit(pid, resource, new, old)) }
}
#[no_mangle]
pub unsafe extern "C" fn prlimit64(pid: libc::pid_t, resource: c_int, new: *const libc::rlimit, old: *mut libc::rlimit) -> c_int {
    // SAFETY: as `prlimit`.
    unsafe { prlimit(pid, resource, new, old) }
}
