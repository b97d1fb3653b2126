//! Segments are unmapped on a background thread: unmapping a shared mapping is the slowest step
//! of a close (TLB shoot-downs), and nothing refers to a retired segment any more.

use crate::fork;
use crate::segment::Segment;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Mutex;
use std::time::Duration;

/// The reaper ends after this long without work (the next retirement starts another): a
/// server whose accelerated connections are gone (its clients' connections turned out
/// short-lived, and went plain TCP) is single-threaded again, and the kernel looks up its
/// descriptors without the reference counting a second thread costs every system call.
const IDLE: Duration = Duration::from_millis(250);

/// The reaper's queue and the pid that started it (a forked child starts its own).
static REAPER: Mutex<Option<(u32, Sender<Segment>)>> = Mutex::new(None);

static LOCKS: fork::Locks = fork::Locks { take: fork_guard, in_child: None };

/// The reaper's lock, taken around a fork (see `fork`).
fn fork_guard() -> Vec<Box<dyn std::any::Any>> {
    vec![Box::new(REAPER.lock().unwrap_or_else(|e| e.into_inner()))]
}

/// The reaper's queue, locked (registered with `fork` before its first use).
fn lock() -> std::sync::MutexGuard<'static, Option<(u32, Sender<Segment>)>> {
    fork::protect(fork::Rank::Reaper, &LOCKS);
    REAPER.lock().unwrap_or_else(|e| e.into_inner())
}

/// Drops `seg` on the reaper thread (inline if that thread cannot be started).
pub(crate) fn retire(seg: Segment) {
    let me = colo_sys::host::pid();
    let mut r = lock();
    if r.as_ref().is_none_or(|(pid, _)| *pid != me) {
        *r = None;
        let (tx, rx) = channel::<Segment>();
        let spawn = || std::thread::Builder::new().name("colo-reaper".into()).spawn(move || run(me, rx));
        if colo_sys::host::with_signals_blocked(spawn).is_ok() {
            *r = Some((me, tx));
        }
    }
    match r.as_ref() {
        Some((_, tx)) => {
            if let Err(e) = tx.send(seg) {
                drop(e.0);
            }
        }
        None => drop(seg),
    }
}

fn run(me: u32, rx: Receiver<Segment>) {
    loop {
        match rx.recv_timeout(IDLE) {
            Ok(seg) => drop(seg),
            Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {
                let mut r = lock();
                // Retirements are sent under this lock: with none queued, none is coming
                // to this thread once its queue is taken away.
                match rx.try_recv() {
                    Ok(seg) => {
                        drop(r);
                        drop(seg);
                    }
                    Err(_) => {
                        if r.as_ref().is_some_and(|(pid, _)| *pid == me) {
                            *r = None;
                        }
                        return;
                    }
                }
            }
        }
    }
}
