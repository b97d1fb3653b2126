//! Turns between the processes that write to one connection (fork copies): each ring has one
//! producer, and each process's writing half is locked only within that process, so two
//! processes writing at once would both move the ring's head. A write takes a turn from a word
//! in the connection's shared holders page (`Conn::write_turn`) for the whole call, so each call's
//! bytes stay contiguous, as one TCP send below the socket's buffer does. The word holds the
//! turn-taker's pid (0: free); a taker that died holding it is found by `kill(pid, 0)` and its
//! turn taken over. (The writing half re-reads the ring's head when another holder wrote:
//! `Shm::adopt_tx`.) Reads take a turn of their own (`Conn::read_turn`). An application's
//! blocking call waits for its turn as the kernel's waits for the socket: within the socket's
//! timeout, which the wait for bytes or room after it shares, and until a signal that ends the
//! call (`take_for_call`).

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How long a waiter sleeps before it checks that the turn's holder still lives.
const CHECK_EVERY: Duration = Duration::from_millis(5);

/// A turn held, or a call alone on its connection; released when dropped.
pub struct Turn<'a> {
    kind: Kind<'a>,
    since: Option<Instant>,
}

enum Kind<'a> {
    /// The turn word (holding our pid) and its waiters' count.
    Held { word: &'a AtomicU32, waiters: &'a AtomicU32, me: u32 },
    /// A call of a connection no other process has held, counted in this process's calls of it
    /// under way without a turn (see [`alone`]).
    Alone(&'a AtomicU32),
}

impl Turn<'_> {
    /// When the call that took this turn under a timeout began to wait for it (`None`: it took
    /// it at once, or waits without bound): the call's wait for bytes or room counts its
    /// timeout from here (`Shm::read_since`), as the kernel's one timeout covers a whole call.
    pub fn since(&self) -> Option<Instant> {
        self.since
    }
}

/// Takes the turn in `word` (`waiters`: how many wait for it, so a release without waiters
/// makes no system call), for the shim's own ends (a close's decision, a relay): waits however
/// long it takes, through signals.
pub fn take<'a>(word: &'a AtomicU32, waiters: &'a AtomicU32) -> Turn<'a> {
    loop {
        if let Ok(turn) = take_within(word, waiters, None, false) {
            return turn;
        }
    }
}

/// Takes the turn in `word` for a blocking read or write of the application's, which waits for
/// it as the kernel's call waits for the socket: at most `timeout` (the socket's `SO_RCVTIMEO`
/// or `SO_SNDTIMEO`; `None`: without bound), then `EAGAIN`; and a signal handler that
/// interrupts the wait ends it with `EINTR` when the shim's policy says the call ends
/// (`interrupted_ends_wait`: no `SA_RESTART`, or a timeout set), as its blocking waits for
/// bytes do. A turn taken after a wait carries its start (`Turn::since`).
pub fn take_for_call<'a>(word: &'a AtomicU32, waiters: &'a AtomicU32, timeout: Option<Duration>) -> io::Result<Turn<'a>> {
    take_within(word, waiters, timeout, true)
}

fn take_within<'a>(word: &'a AtomicU32, waiters: &'a AtomicU32, timeout: Option<Duration>, interruptible: bool) -> io::Result<Turn<'a>> {
    let me = colo_sys::host::pid();
    // Set at the first wait (a turn had at once costs no clock read).
    let mut since = None;
    loop {
        // SYNC POINT: Acquire pairs with the Release store of `Turn::drop` in the previous
        // holder: its writes to the ring and its writing state are visible to us.
        let owner = match word.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => return Ok(Turn { kind: Kind::Held { word, waiters, me }, since: since.filter(|_| timeout.is_some()) }),
            // (Our own pid: another thread of ours holds it; it lives.)
            Err(owner) if owner != me && !alive(owner) => {
                // SYNC POINT: as above (the dead holder's last writes are what they are; the
                // writing half re-reads the head from the ring).
                let _ = word.compare_exchange(owner, 0, Ordering::Acquire, Ordering::Relaxed);
                continue;
            }
            Err(owner) => owner,
        };
        let start = *since.get_or_insert_with(Instant::now);
        let mut sleep = CHECK_EVERY;
        if let Some(t) = timeout {
            match t.checked_sub(start.elapsed()).filter(|left| !left.is_zero()) {
                Some(left) => sleep = sleep.min(left),
                None => return Err(io::Error::from_raw_os_error(libc::EAGAIN)),
            }
        }
        // SYNC POINT: SeqCst, with the SeqCst release and load of `Turn::drop`: either
        // the releaser sees us counted and wakes us, or our futex wait sees the word
        // changed and returns at once. (The wait is bounded as well.)
        waiters.fetch_add(1, Ordering::SeqCst);
        let interrupted = colo_sys::futex::wait(word, owner, Some(sleep));
        waiters.fetch_sub(1, Ordering::Relaxed);
        if interrupted && interruptible && colo::internal::shm::interrupted_ends_wait(timeout.is_some()) {
            return Err(io::Error::from_raw_os_error(libc::EINTR));
        }
    }
}

/// Takes the turn in `word` without waiting for a holder that cannot be done soon: waits for
/// it only while `moving` says its holder is getting on (checked before each wait of 1 ms), and
/// at most `within`. `None`: not had.
pub fn take_while<'a>(word: &'a AtomicU32, waiters: &'a AtomicU32, within: Duration, moving: impl Fn() -> bool) -> Option<Turn<'a>> {
    let me = colo_sys::host::pid();
    let until = std::time::Instant::now() + within;
    loop {
        // SYNC POINT: Acquire, as in `take`.
        let owner = match word.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => return Some(Turn { kind: Kind::Held { word, waiters, me }, since: None }),
            Err(owner) if owner != me && !alive(owner) => {
                // SYNC POINT: as in `take`.
                let _ = word.compare_exchange(owner, 0, Ordering::Acquire, Ordering::Relaxed);
                continue;
            }
            Err(owner) => owner,
        };
        if !moving() || std::time::Instant::now() >= until {
            return None;
        }
        // SYNC POINT: SeqCst, as in `take`.
        waiters.fetch_add(1, Ordering::SeqCst);
        colo_sys::futex::wait(word, owner, Some(Duration::from_millis(1)));
        waiters.fetch_sub(1, Ordering::Relaxed);
    }
}

fn alive(pid: u32) -> bool {
    rustix::process::Pid::from_raw(pid as i32)
        .is_some_and(|p| matches!(rustix::process::test_kill_process(p), Ok(()) | Err(rustix::io::Errno::PERM)))
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        match self.kind {
            Kind::Held { word, waiters, me } => give_back(word, waiters, me),
            // Relaxed: `lend`'s giver only waits for the count to reach zero, and the turn it
            // then gives back orders what this call did for the next taker (it is this process's
            // own turn: the call's writes precede the giver's look in this process).
            Kind::Alone(calls) => {
                calls.fetch_sub(1, Ordering::Release);
            }
        }
    }
}

/// A call of a connection no other process has held takes no turn: it counts itself in `calls`
/// (this process's calls of that direction under way without a turn), so that a `fork` takes
/// the turn on its behalf before the child can (`Conn::lend_turns`). `None`: the connection was
/// marked shared meanwhile (`shared`, its word): take the turn.
pub fn alone<'a>(calls: &'a AtomicU32, shared: &AtomicU32) -> Option<Turn<'a>> {
    // SYNC POINT: SeqCst, with the SeqCst store of `Page::mark_shared` and the SeqCst load of
    // `calls` after it in `Conn::lend_turns`: either this call sees the connection shared, or
    // the lender sees the call counted.
    calls.fetch_add(1, Ordering::SeqCst);
    if shared.load(Ordering::SeqCst) != 0 {
        calls.fetch_sub(1, Ordering::Relaxed);
        return None;
    }
    Some(Turn { kind: Kind::Alone(calls), since: None })
}

/// Takes the turn in `word` if it is free, for a call of this process already under way without
/// one (see `Conn::lend_turns`); `give_back` releases it. Whether it was taken.
pub fn lend(word: &AtomicU32) -> bool {
    // SYNC POINT: Acquire, as in `take`.
    word.compare_exchange(0, colo_sys::host::pid(), Ordering::Acquire, Ordering::Relaxed).is_ok()
}

/// Releases the turn in `word` if `me` holds it, waking its waiters.
pub fn give_back(word: &AtomicU32, waiters: &AtomicU32, me: u32) {
    // SYNC POINT: Release (SeqCst) pairs with the Acquire of the next `take`; SeqCst with the
    // waiters' count in `take`.
    let _ = word.compare_exchange(me, 0, Ordering::SeqCst, Ordering::Relaxed);
    if waiters.load(Ordering::SeqCst) > 0 {
        colo_sys::futex::wake_all(word);
    }
}
