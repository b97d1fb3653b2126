//! The short-lived marker (spec/WIRE.md section 2; the rule is in `crate::record::marker`): the
//! sockets a service raises for a program whose connections to a listener do not pay for their
//! set-up, lowered when that stops, and closed in every fork child.

use crate::base::log::{log_debug, log_info};
use crate::base::mem::try_lock;
use crate::conn::entry::Listen;
use crate::record::adapt;
use crate::record::lineage::Shared;
use crate::record::marker;
use colo::wire;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Held while a marker socket is made or closed, and across `fork` (the atfork handlers): a
/// child must know every marker descriptor it inherits, to close it. One it kept open would
/// hold the name up after the service lowered it, for as long as the child lives.
// Locked at every fork: kept with what the fork handlers write (see `colo_sys::host`).
#[link_section = "colo_fork"]
static MARKER_LOCK: marker::ForkLock = marker::ForkLock::new();

/// Whether this process ever raised a marker (under `MARKER_LOCK`): until then a fork child
/// has none to close and leaves `RAISED` unread (each page a fork child touches costs it a
/// fault). Read at every fork: kept with what the fork handlers write.
#[link_section = "colo_fork"]
static EVER_RAISED: AtomicBool = AtomicBool::new(false);

/// A raised marker: the listener it speaks for (`Listen::id`), the program tag, the socket.
struct Raised {
    listen: AtomicU64,
    tag: AtomicU64,
    fd: AtomicI32,
}

/// The markers this process holds (fd -1: a free entry); a fork child closes them all. Only the
/// service thread raises and lowers them.
static RAISED: [Raised; 64] = [const { Raised { listen: AtomicU64::new(0), tag: AtomicU64::new(0), fd: AtomicI32::new(-1) } }; 64];

/// The tag (spec/WIRE.md section 2) of the program of the client process `pid` (its control
/// connection's `SO_PEERCRED`, as the claim read it), its command line read once per process.
pub(super) fn client_tag(pid: u32) -> Option<u64> {
    static TAGS: Mutex<Vec<(u32, u64)>> = Mutex::new(Vec::new());
    if !adapt::enabled() {
        return None;
    }
    if let Some(&(_, t)) = try_lock(&TAGS)?.iter().find(|(p, _)| *p == pid) {
        return Some(t);
    }
    let tag = wire::program_tag(&colo_sys::host::cmdline_head(Some(pid), wire::TAG_BYTES).ok()?);
    let mut tags = try_lock(&TAGS)?;
    if tags.len() >= 64 {
        tags.remove(0);
    }
    tags.push((pid, tag));
    Some(tag)
}

/// Raises or lowers each listener's markers as its port's endings say, and lowers those of
/// listeners gone; returns how long the service may sleep before the next change is due (ms).
/// `shared` is the service's lineage's; `listens` gives the listeners it serves (asked only when a
/// marker is wanted or raised).
pub(super) fn tend_markers(shared: &Shared, listens: impl FnOnce() -> Vec<Arc<Listen>>) -> u64 {
    let now = marker::now_ms();
    let any_marked = shared.ends.iter().any(|e| e.marked_until(now).is_some());
    if !any_marked && RAISED.iter().all(|r| r.fd.load(Ordering::Relaxed) < 0) {
        return u64::MAX;
    }
    let listens = listens();
    let mut next = u64::MAX;
    let mut wanted = Vec::new();
    for l in &listens {
        for e in shared.ends.iter().filter(|e| e.port() == l.addr.port()) {
            if let Some(t) = e.marked_until(now) {
                next = next.min(t - now);
                wanted.push((l.id, e.tag()));
            }
        }
    }
    for r in &RAISED {
        let (fd, key) = (r.fd.load(Ordering::Relaxed), (r.listen.load(Ordering::Relaxed), r.tag.load(Ordering::Relaxed)));
        if fd >= 0 && !wanted.contains(&key) {
            lower_marker(r);
        }
    }
    for l in &listens {
        for &(_, tag) in wanted.iter().filter(|(id, _)| *id == l.id) {
            raise_marker(l, tag);
        }
    }
    next
}

/// Only system calls and atomics under `MARKER_LOCK`: an allocator's own fork handler (redis
/// links jemalloc) may run before ours and hold its locks while `fork` waits for this one. So
/// the socket is made (and moved up, which may allocate) before, and given up if a fork came
/// in between: the child would hold a copy, and with it the name once raised.
fn raise_marker(l: &Listen, tag: u64) {
    let have = |r: &Raised| r.fd.load(Ordering::Relaxed) >= 0 && r.listen.load(Ordering::Relaxed) == l.id && r.tag.load(Ordering::Relaxed) == tag;
    if RAISED.iter().any(have) {
        return;
    }
    let name = wire::short_lived_marker(l.addr, tag);
    // A marker socket made before a fork that the lock did not cover may have a copy in the
    // child: `forks()` changes before the fork, and again (`colo_sys::host`'s parent handler,
    // which runs before `marker_parent`) before the lock is released.
    let forks = colo_sys::host::forks();
    let fd = match colo_sys::marker::unraised(colo::internal::fd_floor()) {
        Ok(fd) => fd,
        Err(e) => return log_debug(format_args!("listen {}: marker {name}: {e}", l.addr)),
    };
    let raised = {
        let _g = MARKER_LOCK.hold();
        let Some(entry) = RAISED.iter().find(|r| r.fd.load(Ordering::Relaxed) < 0) else { return };
        if colo_sys::host::forks() != forks {
            // Dropped unraised (a copy in a child names nothing): the next pass tries again.
            return;
        }
        colo_sys::marker::raise(&fd, name.as_bytes()).map(|()| {
            // Relaxed: read by a fork child's handler, under the same lock.
            EVER_RAISED.store(true, Ordering::Relaxed);
            entry.listen.store(l.id, Ordering::Relaxed);
            entry.tag.store(tag, Ordering::Relaxed);
            entry.fd.store(colo_sys::IntoRawFd::into_raw_fd(fd), Ordering::Relaxed);
        })
    };
    match raised {
        Ok(()) => log_info(format_args!("listen {}: a program's connections are short-lived; it is told to dial plain TCP when it starts again ({name})", l.addr)),
        Err(e) => log_debug(format_args!("listen {}: marker {name}: {e}", l.addr)),
    }
}

fn lower_marker(r: &Raised) {
    let fd = {
        let _g = MARKER_LOCK.hold();
        let fd = r.fd.swap(-1, Ordering::Relaxed);
        // (Not a number the application took with `dup2`: `placed::give_away`.)
        if fd >= 0 && colo_sys::placed::closing(fd) {
            // SAFETY: a marker socket this process raised; nothing else refers to the number.
            unsafe { rustix::io::close(fd) };
        }
        fd
    };
    if fd >= 0 {
        log_debug(format_args!("short-lived marker {:012x} lowered", r.tag.load(Ordering::Relaxed)));
    }
}

/// Parts of the `pthread_atfork` handlers: no marker socket is made or closed while a process
/// forks.
pub fn marker_prepare() {
    MARKER_LOCK.acquire();
}

pub fn marker_parent() {
    MARKER_LOCK.release();
}

/// In the child (from its atfork handler): close the inherited marker sockets (their listeners'
/// service is the parent's).
#[link_section = "colo_fork_text"]
pub fn marker_child() {
    // Relaxed: stored under `MARKER_LOCK`, which the fork held.
    let raised = if EVER_RAISED.load(Ordering::Relaxed) { &RAISED[..] } else { &[] };
    for r in raised {
        // Looked at before it is written: a page written in the child costs it a copy.
        if r.fd.load(Ordering::Relaxed) < 0 {
            continue;
        }
        let fd = r.fd.swap(-1, Ordering::Relaxed);
        if fd >= 0 {
            // SAFETY: a marker socket the parent raised; the child's copy, which nothing in the
            // child refers to (the lock kept the parent from closing it during the fork).
            unsafe { rustix::io::close(fd) };
        }
    }
    MARKER_LOCK.release();
}
