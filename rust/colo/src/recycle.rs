//! Recycling segments between the same two processes (spec/WIRE.md section 3, "Recycling").
//!
//! Creating, passing, mapping and unmapping a segment is most of what a short-lived connection
//! costs (memfd and self bell creation, page faults, TLB shoot-downs on unmap). So a side that closes
//! a clean DIRECT connection *parks* the segment and its self bell instead of dropping them, and sets
//! its bit in the header's `parked` word. The next dial from the same client process to the same
//! listener takes a segment both sides parked (a compare-and-swap of `parked` from both bits to 0),
//! resets it and sends a descriptor-less HELLO naming the server's ticket.
//!
//! Parked segments are bounded (a few per client process, per listener) and held at most [`IDLE`]:
//! a background thread, which ends when nothing is left parked, drops the rest.

use crate::fork;
use crate::segment::Segment;
use colo_ring::layout::{Geometry, CLIENT_PARKED, SERVER_PARKED};
use colo_ring::sync::Ordering;
use colo_sys::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// How long a side keeps a parked segment.
const IDLE: Duration = Duration::from_secs(1);
/// Parked segments a client process keeps.
const CLIENT_MAX: usize = 4;
/// Parked segments a listener keeps.
const SERVER_MAX: usize = 8;
/// A server entry its client took back is kept this long for the HELLO that names it.
const RESERVED_MAX: Duration = Duration::from_secs(10);

/// What one side keeps of a closed connection.
pub(crate) struct Parked {
    pub seg: Segment,
    pub self_bell: OwnedFd,
    since: Instant,
}

impl Parked {
    pub(crate) fn new(seg: Segment, self_bell: OwnedFd) -> Parked {
        Parked { seg, self_bell, since: Instant::now() }
    }

    fn idle(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.since)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Drops a parked segment off the caller's path (unmapping is the slow part).
fn retire(p: Parked) {
    crate::reaper::retire(p.seg);
}

// ---- the client's side ----------------------------------------------------------------------

struct ClientEntry {
    /// The process that parked it (a forked child never uses its parent's).
    pid: u32,
    /// The listener: rendezvous name and server pid.
    name: String,
    server_pid: u32,
    parked: Parked,
}

// Locked at every fork: kept with what the fork handlers write (see `colo_sys::host`).
#[link_section = "colo_fork"]
static CLIENT: Mutex<Vec<ClientEntry>> = Mutex::new(Vec::new());

/// Parks the client's side of a connection that closed cleanly.
pub(crate) fn park_client(name: String, server_pid: u32, parked: Parked) {
    // SYNC POINT (Release) with the client's compare-and-swap in `take_client` (a later dial of
    // ours, possibly on another thread): our last uses of the segment happen before its reset.
    parked.seg.parked().fetch_or(CLIENT_PARKED, Ordering::AcqRel);
    let me = colo_sys::host::pid();
    drop_parked_at_exit();
    let mut cache = lock_global(&CLIENT);
    cache.retain(|e| e.pid == me);
    cache.push(ClientEntry { pid: me, name, server_pid, parked });
    while cache.len() > CLIENT_MAX {
        retire(cache.remove(0).parked);
    }
    drop(cache);
    sweeper::kick();
}

/// Takes a segment that both sides parked for the listener `name` (server `server_pid`) with
/// this geometry: reset, owned by us, with the server's ticket.
pub(crate) fn take_client(name: &str, server_pid: u32, geometry: Geometry) -> Option<(Parked, u32)> {
    let me = colo_sys::host::pid();
    let mut cache = lock_global(&CLIENT);
    let i = cache.iter().position(|e| {
        e.pid == me
            && e.server_pid == server_pid
            && e.parked.seg.layout().geometry == geometry
            && e.name == name
            // SYNC POINT (Acquire) with both sides' parking RMWs (`park_client`, `Table::park`):
            // every use of the segment by either side happens before our reset. Exactly one of this
            // CAS and the server's eviction (`fetch_and` in `Table::sweep`) wins.
            && e.parked.seg.parked().compare_exchange(CLIENT_PARKED | SERVER_PARKED, 0, Ordering::AcqRel, Ordering::Relaxed).is_ok()
    })?;
    let entry = cache.swap_remove(i);
    drop(cache);
    let ticket = entry.parked.seg.ticket().load(Ordering::Relaxed);
    entry.parked.seg.reset_for_reuse();
    Some((entry.parked, ticket))
}

/// Makes the process's `exit` drop the client's parked segments (`at_exit`); called before the
/// first is parked.
fn drop_parked_at_exit() {
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    // SAFETY: `at_exit` is an `extern "C" fn()` of this library, which glibc runs before it
    // unloads the library (`__cxa_atexit` with the library's handle) or at exit.
    AT_EXIT.call_once(|| unsafe {
        libc::atexit(at_exit);
    });
}

/// At the process's `exit`: the client's parked segments are dropped now, not left to the
/// sweeper, which would not get to them, so that a segment's give-back of the pages it read
/// (`Segment::give_back_incoming`) is not lost with the process (see `reaper::at_exit`). Not
/// if another thread holds the cache.
extern "C" fn at_exit() {
    let me = colo_sys::host::pid();
    let Ok(mut cache) = CLIENT.try_lock() else { return };
    let (mine, parents): (Vec<ClientEntry>, Vec<ClientEntry>) = std::mem::take(&mut *cache).into_iter().partition(|e| e.pid == me);
    drop(cache);
    // A fork child's copies of its parent's entries: the parent's to drop, not ours.
    std::mem::forget(parents);
    drop(mine);
}

static LOCKS: fork::Locks = fork::Locks { take: fork_guards, in_child: None };

/// The process-wide locks of this module, taken around a fork (see `fork`).
fn fork_guards(held: &mut fork::Held) {
    held.hold(lock(&sweeper::STATE));
    held.hold(lock(&CLIENT));
}

/// This module's process-wide `m`, locked (registered with `fork` before the first use).
fn lock_global<T>(m: &'static Mutex<T>) -> MutexGuard<'static, T> {
    fork::protect(fork::Rank::Recycle, &LOCKS);
    lock(m)
}

// ---- the server's side ----------------------------------------------------------------------

struct ServerEntry {
    ticket: u32,
    client_pid: u32,
    parked: Parked,
}

/// A listener's parked segments.
pub(crate) struct Table {
    entries: Mutex<Vec<ServerEntry>>,
    next_ticket: std::sync::atomic::AtomicU32,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table").field("parked", &lock(&self.entries).len()).finish()
    }
}

impl Table {
    pub(crate) fn new() -> Arc<Table> {
        let t = Arc::new(Table { entries: Mutex::new(Vec::new()), next_ticket: std::sync::atomic::AtomicU32::new(1) });
        sweeper::register(Arc::downgrade(&t));
        t
    }

    /// Parks the server's side of a connection that closed cleanly.
    pub(crate) fn park(&self, client_pid: u32, parked: Parked) {
        let ticket = self.next_ticket.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        parked.seg.ticket().store(ticket, Ordering::Relaxed);
        // SYNC POINT (Release) with the client's compare-and-swap in `take_client`: the ticket
        // and our last uses of the segment happen before it resets and reuses the segment.
        parked.seg.parked().fetch_or(SERVER_PARKED, Ordering::AcqRel);
        let mut entries = lock(&self.entries);
        entries.push(ServerEntry { ticket, client_pid, parked });
        if entries.len() > SERVER_MAX {
            // Evict the oldest the client has not taken back.
            if let Some(i) = entries.iter().position(|e| evict(&e.parked)) {
                retire(entries.remove(i).parked);
            }
        }
        drop(entries);
        sweeper::kick();
    }

    /// The segment parked under `ticket`, which the client `client_pid` has taken back.
    pub(crate) fn take(&self, ticket: u32, client_pid: u32) -> Result<Parked, &'static str> {
        let mut entries = lock(&self.entries);
        let i = entries.iter().position(|e| e.ticket == ticket).ok_or("no segment parked under that ticket")?;
        if entries[i].client_pid != client_pid {
            return Err("ticket of another client process");
        }
        // SYNC POINT (Acquire) with the client's compare-and-swap to 0 (its reset happened before
        // the HELLO that brought us here; this load orders our reads after its CAS as well). The
        // client may have written, closed and parked its side since (CLIENT_PARKED): its bytes
        // and FIN are delivered as for any connection.
        if entries[i].parked.seg.parked().load(Ordering::Acquire) & SERVER_PARKED != 0 {
            return Err("the client did not take the segment back");
        }
        Ok(entries.swap_remove(i).parked)
    }

    /// Drops what was parked longer than [`IDLE`]; true if anything is still parked.
    fn sweep(&self, now: Instant) -> bool {
        let mut entries = lock(&self.entries);
        let mut i = 0;
        while i < entries.len() {
            let p = &entries[i].parked;
            if p.idle(now) >= IDLE && (evict(p) || p.idle(now) >= RESERVED_MAX) {
                retire(entries.swap_remove(i).parked);
            } else {
                i += 1;
            }
        }
        !entries.is_empty()
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        for e in lock(&self.entries).drain(..) {
            evict(&e.parked);
            retire(e.parked);
        }
    }
}

/// Withdraws the server's offer to reuse `p`; false if the client already took it back (its
/// HELLO is on the way and the entry must stay).
fn evict(p: &Parked) -> bool {
    // SYNC POINT (AcqRel) with the client's compare-and-swap in `take_client`: exactly one wins.
    p.seg.parked().fetch_and(!SERVER_PARKED, Ordering::AcqRel) & SERVER_PARKED != 0
}

// ---- dropping what stays parked too long ------------------------------------------------------

mod sweeper {
    use super::*;

    pub(super) struct State {
        /// The pid whose sweeper thread runs (0: none; a forked child starts its own).
        running: u32,
        tables: Vec<Weak<Table>>,
        /// Parks so far, so a park during a sweep that found nothing is not missed.
        kicks: u64,
    }

    // Locked at every fork: kept with what the fork handlers write (see `colo_sys::host`).
    #[link_section = "colo_fork"]
    pub(super) static STATE: Mutex<State> = Mutex::new(State { running: 0, tables: Vec::new(), kicks: 0 });

    pub(super) fn register(t: Weak<Table>) {
        let mut s = lock_global(&STATE);
        s.tables.retain(|t| t.strong_count() > 0);
        s.tables.push(t);
    }

    /// Something was parked: make sure the sweeper runs.
    pub(super) fn kick() {
        let me = colo_sys::host::pid();
        let mut s = lock_global(&STATE);
        if s.running != me
            && colo_sys::host::spawn("colo-sweeper", run).is_ok()
        {
            s.running = me;
        }
        s.kicks += 1;
    }

    fn sweep_all(now: Instant) -> bool {
        let me = colo_sys::host::pid();
        let mut left = false;
        {
            let mut cache = lock_global(&CLIENT);
            let mut i = 0;
            while i < cache.len() {
                if cache[i].pid != me || cache[i].parked.idle(now) >= IDLE {
                    retire(cache.swap_remove(i).parked);
                } else {
                    i += 1;
                }
            }
            left |= !cache.is_empty();
        }
        let tables: Vec<Arc<Table>> = lock_global(&STATE).tables.iter().filter_map(Weak::upgrade).collect();
        for t in tables {
            left |= t.sweep(now);
        }
        left
    }

    /// Sweeps until nothing is parked, then ends (the next park starts another sweeper), so that
    /// a process whose connections are gone is single-threaded again.
    fn run() {
        loop {
            let kicks = lock_global(&STATE).kicks;
            std::thread::sleep(IDLE / 4);
            if !sweep_all(Instant::now()) {
                let mut s = lock_global(&STATE);
                // Unless something was parked since `kicks` was read (during the sleep or the
                // sweep): its `kick` saw this thread run.
                if s.kicks == kicks {
                    s.running = 0;
                    return;
                }
            }
        }
    }
}
