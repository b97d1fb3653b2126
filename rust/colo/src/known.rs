//! What the listeners a client dialed answered (rendezvous name and server pid): later dials
//! to a listener that welcomed a DIRECT HELLO do not wait for its answer, and those to one that
//! asked for CARRIER dial CARRIER at once.

use crate::fork;
use std::sync::{Mutex, MutexGuard};

/// What a listener (rendezvous name and server pid) answered to a DIRECT HELLO before.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Known {
    /// WELCOME: later dials do not wait for the answer (one cross-process wake-up less per
    /// connection, which is what short-lived connections pay for); a late REJECT resets.
    Direct,
    /// REJECT(NEED_CARRIER): an unmodified program under `colo run`; dial CARRIER at once.
    Carrier,
}

// Locked at every fork: kept with what the fork handlers write (see `colo_sys::host`).
#[link_section = "colo_fork"]
static KNOWN: Mutex<Vec<(String, u32, Known)>> = Mutex::new(Vec::new());

/// The pid of the listener `name` if it answered a DIRECT HELLO before.
pub(crate) fn known_direct(name: &str) -> Option<u32> {
    lock().iter().find(|(n, _, k)| n == name && *k == Known::Direct).map(|e| e.1)
}

pub(crate) fn known(name: &str, pid: u32) -> Option<Known> {
    lock().iter().find(|(n, p, _)| n == name && *p == pid).map(|e| e.2)
}

/// Records a listener that answered a pending connection's HELLO with WELCOME.
pub(crate) fn remember_direct(name: String, pid: u32) {
    remember(name, pid, Known::Direct);
}

pub(crate) fn remember(name: String, pid: u32, kind: Known) {
    let mut known = lock();
    known.retain(|(n, _, _)| *n != name);
    if known.len() >= 256 {
        known.remove(0);
    }
    known.push((name, pid, kind));
}

/// Forgets what the listener `name` answered.
pub(crate) fn forget(name: &str) {
    lock().retain(|(n, _, _)| n != name);
}

static LOCKS: fork::Locks = fork::Locks { take: fork_guards, in_child: None };

/// The lock of this module, taken around a fork (see `fork`).
fn fork_guards(held: &mut fork::Held) {
    held.hold(KNOWN.lock().unwrap_or_else(|e| e.into_inner()));
}

/// The answers, locked (registered with `fork` before its first use).
fn lock() -> MutexGuard<'static, Vec<(String, u32, Known)>> {
    fork::protect(fork::Rank::Known, &LOCKS);
    KNOWN.lock().unwrap_or_else(|e| e.into_inner())
}
