//! How an interposed call on a descriptor picks its path: a plain descriptor (or the shim's own
//! call) goes to libc, an accelerated connection to the rings. `with_conn!` is the one way that
//! choice is written; `plain_first!` puts the plain test of the busiest calls inline in the
//! exported symbol.

use crate::base::guard::Guard;
use crate::conn::state::Conn;
use crate::conn::table::{self, CONN, NONE, PENDING};
use crate::service::client;
use colo::errno_of;
use libc::{c_int, ssize_t};
use std::io;
use std::sync::Arc;

/// The connection behind `fd` for a data operation (resolving a pending connect first), or
/// `None` for plain TCP.
#[inline]
pub fn conn_for_io(fd: c_int) -> Option<Arc<Conn>> {
    match table::kind(fd) {
        CONN => table::conn(fd),
        PENDING => {
            client::resolve_fd(fd);
            table::conn(fd)
        }
        _ => None,
    }
}

/// Before a read of `fd` with `flags`: a connection to another namespace whose PROPOSAL's
/// answer is owed has the answer taken off the stream first (`service::elsewhere`). `Some`: the
/// read's return value (-1, errno set: the answer has not come and the read would not wait).
#[inline]
pub fn owed_first(fd: c_int, flags: c_int) -> Option<ssize_t> {
    if table::kind(fd) != PENDING || Guard::busy() {
        return None;
    }
    let g = Guard::enter();
    let e = crate::service::elsewhere::owed_before_read(fd, flags)?;
    Some(g.err(e))
}

#[inline]
pub fn plain(fd: c_int) -> bool {
    table::kind(fd) == NONE || Guard::busy()
}

#[inline]
pub fn result(g: &Guard, r: io::Result<usize>) -> ssize_t {
    match r {
        Ok(n) => g.ok(n as ssize_t),
        Err(e) => g.err(errno_of(&e)),
    }
}

#[inline]
pub fn epipe_signal(r: &io::Result<usize>, flags: c_int) {
    if let Err(e) = r {
        if errno_of(e) == libc::EPIPE && flags & libc::MSG_NOSIGNAL == 0 {
            // SAFETY: raise(3) takes a signal number only; SIGPIPE is what the kernel sends for a
            // write on a broken pipe without MSG_NOSIGNAL.
            unsafe { libc::raise(libc::SIGPIPE) };
        }
    }
}

/// "Plain descriptor, else the accelerated path", the prologue of every call on one descriptor
/// that the rings may serve. `$plain` (libc's call, an expression that returns the call's value)
/// serves a descriptor the table does not know, a call made inside the shim (`Guard::busy`),
/// and a known descriptor that is no connection after all (a pending connect answered "plain
/// TCP", a listener); the guard is released before it runs. Otherwise `$accel` runs with `$g`,
/// the guard (errno saved), and `$c`, the connection. It expands inside the calling function:
/// its value is the call's, and `$plain` may `return`.
macro_rules! with_conn {
    ($fd:expr, $plain:expr, |$g:ident, $c:pat_param| $accel:expr) => {{
        if $crate::api::route::plain($fd) {
            return $plain;
        }
        let $g = $crate::base::guard::Guard::enter();
        match $crate::api::route::conn_for_io($fd) {
            Some($c) => $accel,
            None => {
                drop($g);
                $plain
            }
        }
    }};
}
pub(crate) use with_conn;

/// The busiest calls: a descriptor whose table kind is `NONE` goes to libc from a few
/// instructions inlined into the exported symbol; any other to `$slow` (not inlined), which
/// starts with `with_conn!`. The shim's code is cold between an application's system calls, so
/// the common case touches as few cache lines as it can (docs/ARCHITECTURE.md).
macro_rules! plain_first {
    ($($name:ident => $slow:ident ($fd:ident $(, $arg:ident: $t:ty)*) -> $ret:ty;)*) => {$(
        #[inline(always)]
        pub unsafe fn $name($fd: libc::c_int $(, $arg: $t)*) -> $ret {
            if $crate::conn::table::kind($fd) == $crate::conn::table::NONE {
                // SAFETY: `real::$name` is libc's `$name`, given the application's arguments
                // unchanged: the contract the caller met.
                return unsafe { $crate::real::$name($fd $(, $arg)*) };
            }
            // SAFETY: `$slow` requires what libc's `$name` does of these arguments, which the
            // application's call met.
            unsafe { $slow($fd $(, $arg)*) }
        }
    )*};
}
pub(crate) use plain_first;

/// Whether `fd` is an accelerated connection or a connect awaiting its answer.
pub fn is_colo_or_pending(fd: c_int) -> bool {
    matches!(table::kind(fd), CONN | PENDING)
}
