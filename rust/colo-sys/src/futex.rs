//! Shared (cross-process) futexes on a word of a segment: the short sleep of spec/WIRE.md
//! section 6 (one syscall to sleep, one to wake, no descriptor).

use rustix::event::Timespec;
use rustix::thread::futex;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Sleeps while `*word == expected`, at most `timeout` (`None`: until woken). Returns on a wake, a
/// timeout, a signal, or at once if the word differs: callers re-check their condition in every
/// case. True if a signal handler interrupted the sleep (`EINTR`: a timed sleep reports every
/// handler, `SA_RESTART` or not; an untimed one is restarted by the kernel after an
/// `SA_RESTART` handler): the caller decides whether its call ends.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) -> bool {
    let ts = timeout.map(|t| Timespec { tv_sec: t.as_secs() as i64, tv_nsec: t.subsec_nanos() as i64 });
    // Not FUTEX_PRIVATE: the word is shared with another process.
    matches!(futex::wait(word, futex::Flags::empty(), expected, ts.as_ref()), Err(rustix::io::Errno::INTR))
}

/// Wakes every sleeper on `word`.
pub fn wake_all(word: &AtomicU32) {
    let _ = futex::wake(word, futex::Flags::empty(), i32::MAX as u32);
}
