//! `libcolo_preload.so`: an LD_PRELOAD shim that moves the payload of an unmodified program's
//! loopback TCP connections into colo shared memory (spec/WIRE.md section 3, CARRIER mode).
//!
//! Three tiers per symbol: libc's function (`real`), the call's logic (`api::data`, `api::fds`,
//! `api::epoll`, ...: a non-colo fd costs one atomic load, and `epoll_ctl` on a TCP socket not
//! yet connected also a record of the registration in an uncontended per-fd slot), and the
//! exported one-line wrapper (`api::exports`). A thread-local guard sends the shim's own calls
//! straight to libc; errno is preserved across the shim's work.
//!
//! The application's fd stays the real kernel TCP socket: listening sockets stay pure kernel,
//! `getsockname`/`getpeername`/`fstat` keep their meaning, and anything the shim does not carry
//! (a destination without a colo listener, a server not under colo, a timeout) is plain TCP.
//!
//! Environment (`colo run` warns about values it would not understand): `COLO_LOG=info|debug`
//! (info: accelerated connections and one-time decisions; debug: also every connection left on
//! plain TCP, and why), `COLO_DISABLE=1`, `COLO_CARRIER_TIMEOUT_MS` (default 500:
//! how long a client's first operation waits for the server to claim its offer; a client that
//! holds another accelerated connection stops waiting early when the server's accept queue does
//! not move),
//! `COLO_RING_KB` (the largest a ring grows to; default `colo::default_ring()`), `COLO_SPIN_US`.
//!
//! The layers, bottom up (each imports only those below it):
//! - `real`: libc's functions, resolved lazily with `dlsym(RTLD_NEXT)`;
//! - `base`: the guard, errno, logging, environment flags, slices, socket addresses, the
//!   io_uring refusal;
//! - `record`: process-wide records the table's entries and the services share (how connections
//!   to each destination lived, the listeners' short-lived markers, a serving process's lineage,
//!   the handover file);
//! - `conn`: the descriptor table and each accelerated connection's state, reads and writes,
//!   options and epoll registrations;
//! - `service`: offers (dialing, the offer service and accepting), the hand-over across `exec`,
//!   the standard-I/O relay;
//! - `api`: the exported symbols and the logic of each interposed call.
//!
//! This file declares the modules and holds the constructor and the fork handlers.

#![allow(clippy::missing_safety_doc)]

mod api;
mod base;
mod conn;
mod real;
mod record;
mod service;

use crate::base::log::log_level;
use crate::conn::table;
use crate::service::{handover, server};
use libc::sigset_t;

// The handlers write as little as they can: each page a process writes after a fork costs it a
// copy-on-write fault, in the parent as in the child, and a server that forks per connection
// pays those per connection. The fork count the modules compare against (`repeat`, the
// listeners, the markers) is `colo_sys::host::forks()`, which shares its line with the pid
// cache; nothing is written where the value would not change.

extern "C" fn atfork_prepare() {
    real::resolve_all_once();
    server::marker_prepare();
    record::handover_file::fork_prepare();
}

extern "C" fn atfork_parent() {
    record::handover_file::fork_parent();
    server::marker_parent();
}

#[link_section = "colo_fork_text"]
extern "C" fn atfork_child() {
    // The pid cache's own handler (`colo_sys::host`), registered before these, has run: the
    // child's own pid is cached, and the fork count moved on.
    table::forked();
    record::handover_file::fork_child();
    server::atfork_child();
    server::marker_child();
    let me = colo_sys::host::pid();
    for fd in table::fds_of_kind(table::CONN) {
        if let Some(g) = table::try_lock(fd) {
            if let table::Entry::Conn(c) = &*g {
                c.add_holder(me);
                // SAFETY: the child has one thread yet, and no reference into the halves.
                unsafe { c.shm().forked_child() };
            }
        }
    }
}

/// The shim's locks that a fork child must find unlocked (see `colo::internal::fork`), in the
/// order taken: the listeners' table slots, the held sets of connections from other namespaces,
/// the epoll registrations that follow those sets, the connections' epoll registrations, and
/// the table of destinations a client dialed (`adapt`). A thread holding one of them takes none
/// before it in this order.
static FORK_LOCKS: colo::internal::fork::Locks = colo::internal::fork::Locks { take: fork_guards, in_child: Some(forked) };

fn fork_guards(held: &mut colo::internal::fork::Held) {
    table::listen_fork_guards(held);
    server::held::fork_guards(held);
    api::lregs::fork_guards(held);
    conn::regs::fork_guards(held);
    record::adapt::fork_guards(held);
}

/// In a fork child, after colo's fork handlers released every lock.
#[link_section = "colo_fork_text"]
fn forked() {
    api::lregs::forked();
    server::held::forked();
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

extern "C" fn init() {
    // The shim's own code told from the application's by the callers of `close`.
    base::own_code::init();
    // The shim's own descriptors stay out of the application's way (see the constant).
    colo::internal::set_fd_floor(colo_sys::preload::OUT_OF_THE_WAY);
    // A connection handed over across `exec` is mapped again from its memfd.
    colo::internal::segment::keep_memfds(true);
    // Cache the pid now, in the parent of any `vfork` child the program will make; and so the
    // pid cache's fork handlers before the shim's: in the parent and the child they run first,
    // and the fork count has moved on when `atfork_parent` releases the marker lock.
    colo_sys::host::pid();
    // Registering handlers: the child's only takes uncontended locks with try_lock; the marker
    // lock is held by the service thread only while it makes or closes one socket. Kept too for
    // a raw `clone` made as a fork (`api::exports::syscall`).
    colo_sys::host::at_fork(atfork_prepare, atfork_parent, atfork_child);
    // Registered before any thread can take these locks, and so colo's handlers with them:
    // registered after the shim's, colo's take their locks first and release them last.
    colo::internal::fork::protect(colo::internal::fork::Rank::Shim, &FORK_LOCKS);
    // Read COLO_LOG now (it allocates), not first in a connect made from a signal handler or in
    // a fork child.
    log_level();
    // Resolve libc's `syscall` now: the shim's own raw calls go through our wrapper, and a first
    // `dlsym` in a fork child or a signal handler could wait on a lock nobody will release.
    // SAFETY: getpid takes no arguments; the rest are ignored.
    unsafe { real::syscall(libc::SYS_getpid, 0, 0, 0, 0, 0, 0) };
    // Connections the program image before an `exec` handed over.
    handover::take_back();
    colo::internal::shm::set_interrupt_policy(eintr_wanted);
}

/// Whether a blocking read or write that a signal handler interrupted fails with `EINTR`, as the
/// kernel's would when that handler lacks `SA_RESTART`. The wait does not know which signal
/// arrived (EINTR from poll or a futex only says that some handler ran), so it asks which
/// signals could have: those this thread does not block whose handler is the program's own (not
/// the synchronous fault signals, which only a faulting instruction raises; runtimes install
/// handlers for them without SA_RESTART). If any of them lacks `SA_RESTART`, the call fails with
/// `EINTR` (a program that installs such a handler expects EINTR); if all restart, the wait goes
/// on. A few dozen system calls, and only after a signal.
pub(crate) fn eintr_wanted() -> bool {
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

#[cfg(test)]
mod tests {
    extern "C" {
        static __start_colo_fork: u8;
        static __stop_colo_fork: u8;
        static __start_colo_fork_text: u8;
        static __stop_colo_fork_text: u8;
    }

    /// What the fork handlers write, and the code a fork child runs in them, each fit a page:
    /// the shim's build script starts each section on a page of its own (see `colo_sys::host`).
    #[test]
    fn fork_state_and_code_fit_a_page_each() {
        // Symbols the linker defines at the bounds of each section: only their addresses are
        // taken.
        let bounds = [
            (std::ptr::addr_of!(__start_colo_fork) as usize, std::ptr::addr_of!(__stop_colo_fork) as usize),
            (std::ptr::addr_of!(__start_colo_fork_text) as usize, std::ptr::addr_of!(__stop_colo_fork_text) as usize),
        ];
        for (start, stop) in bounds {
            assert!(stop > start && stop - start <= 4096, "a section of {} bytes", stop - start);
        }
    }
}
