//! Turns between the processes that write to one connection (fork copies): each ring has one
//! producer, and each process's writing half is locked only within that process, so two
//! processes writing at once would both move the ring's head. A write takes a turn from a word
//! in the connection's shared holders page (`Conn::write_turn`) for the whole call, so each call's
//! bytes stay contiguous, as one TCP send below the socket's buffer does. The word holds the
//! turn-taker's pid (0: free); a taker that died holding it is found by `kill(pid, 0)` and its
//! turn taken over. (The writing half re-reads the ring's head when another holder wrote:
//! `Shm::adopt_tx`.)

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// How long a waiter sleeps before it checks that the turn's holder still lives.
const CHECK_EVERY: Duration = Duration::from_millis(5);

/// A turn held; released when dropped.
pub struct Turn<'a> {
    word: &'a AtomicU32,
    waiters: &'a AtomicU32,
    me: u32,
}

/// Takes the turn in `word` (`waiters`: how many wait for it, so a release without waiters
/// makes no system call).
pub fn take<'a>(word: &'a AtomicU32, waiters: &'a AtomicU32) -> Turn<'a> {
    let me = colo_sys::host::pid();
    loop {
        // SYNC POINT: Acquire pairs with the Release store of `Turn::drop` in the previous
        // holder: its writes to the ring and its writing state are visible to us.
        match word.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => return Turn { word, waiters, me },
            Err(owner) => {
                // (Our own pid: another thread of ours holds it; it lives.)
                if owner != me && !alive(owner) {
                    // SYNC POINT: as above (the dead holder's last writes are what they are; the
                    // writing half re-reads the head from the ring).
                    let _ = word.compare_exchange(owner, 0, Ordering::Acquire, Ordering::Relaxed);
                    continue;
                }
                // SYNC POINT: SeqCst, with the SeqCst release and load of `Turn::drop`: either
                // the releaser sees us counted and wakes us, or our futex wait sees the word
                // changed and returns at once. (The wait is bounded as well.)
                waiters.fetch_add(1, Ordering::SeqCst);
                colo_sys::futex::wait(word, owner, Some(CHECK_EVERY));
                waiters.fetch_sub(1, Ordering::Relaxed);
            }
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
            Ok(_) => return Some(Turn { word, waiters, me }),
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
        // SYNC POINT: Release (SeqCst) pairs with the Acquire of the next `take`; SeqCst with
        // the waiters' count in `take`.
        let _ = self.word.compare_exchange(self.me, 0, Ordering::SeqCst, Ordering::Relaxed);
        if self.waiters.load(Ordering::SeqCst) > 0 {
            colo_sys::futex::wake_all(self.word);
        }
    }
}
