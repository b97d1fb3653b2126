//! Gives back the memory of byte rings that grew and went quiet (spec/WIRE.md section 5, "Growing
//! and shrinking"), as TCP frees the buffers of a connection with nothing in flight. One thread
//! per process, started when a ring this process writes first grows, looks every
//! [`QUIET`] at the rings that grew: one that is empty and was not written since the last look
//! (so quiet for at most a second) shrinks back to its first size and its pages go back to the system. A process whose rings
//! never grow runs no thread.

use std::sync::{Mutex, MutexGuard, Weak};
use std::time::Duration;

/// How often the rings are looked at: one empty and unwritten for two looks in a row (between
/// one and two of these) shrinks.
pub(crate) const QUIET: Duration = Duration::from_millis(500);

/// What a look at a ring decided.
pub(crate) enum Look {
    /// Still large: look again next time.
    Again,
    /// Small again, or gone: stop looking (a ring registers anew when it grows again).
    Done,
}

/// A ring this process writes that may be shrunk.
pub(crate) trait Shrink: Send + Sync {
    /// Looks at the ring without waiting for its writer (a ring being written is not quiet).
    fn look(&self) -> Look;
}

struct Watched {
    rings: Vec<Weak<dyn Shrink>>,
    /// The process whose thread looks at them (a forked child starts its own).
    looker: Option<u32>,
}

// Locked at every fork: kept with what the fork handlers write (see `colo_sys::host`).
#[link_section = "colo_fork"]
static WATCHED: Mutex<Watched> = Mutex::new(Watched { rings: Vec::new(), looker: None });

fn lock() -> MutexGuard<'static, Watched> {
    WATCHED.lock().unwrap_or_else(|e| e.into_inner())
}

static LOCKS: crate::fork::Locks = crate::fork::Locks { take: fork_guard, in_child: Some(forked) };

/// Makes sure a fork from now on is counted (`crate::fork::forks`): called for every connection
/// when it is made, since one shared with another process by a fork must never shrink.
pub(crate) fn count_forks() {
    crate::fork::protect(crate::fork::Rank::Shrink, &LOCKS);
}

/// Looks at `ring` every [`QUIET`] until it is small again or gone.
pub(crate) fn watch(ring: Weak<dyn Shrink>) {
    count_forks();
    let mut w = lock();
    w.rings.push(ring);
    let me = colo_sys::host::pid();
    if w.looker != Some(me) {
        let spawned = colo_sys::host::spawn("colo-shrink", run);
        // Without the thread the rings keep their memory, which costs nothing else.
        if spawned.is_ok() {
            w.looker = Some(me);
        }
    }
}

fn run() {
    loop {
        std::thread::sleep(QUIET);
        // Looked at under the registry's lock, which a fork takes (`fork_guard`): a fork never
        // copies a ring's writing lock held by a look. A look only tries that lock, so a writer
        // that registers (taking the registry's lock while it holds its own) cannot deadlock
        // with it.
        let mut w = lock();
        let rings = std::mem::take(&mut w.rings);
        w.rings = rings.into_iter().filter(|r| r.upgrade().is_some_and(|ring| matches!(ring.look(), Look::Again))).collect();
        if w.rings.is_empty() {
            // Nothing left to look at: the next growth starts a thread again.
            w.looker = None;
            return;
        }
    }
}

/// Held around a fork (see `crate::fork`), so that a child never inherits the registry locked,
/// nor a ring's writing lock held by a look (looks happen under it).
fn fork_guard(held: &mut crate::fork::Held) {
    held.hold(lock());
}

/// In a forked child: the parent's rings are the parent's to shrink (the child's copies of their
/// writers share the rings with it and resume at the shared size before they write).
fn forked() {
    let mut w = lock();
    w.rings.clear();
    w.looker = None;
}
