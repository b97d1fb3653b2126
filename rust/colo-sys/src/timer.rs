//! One-shot timers as descriptors (`timerfd`), for event loops that must wake at a deadline
//! without a thread of their own: a listener's set of watched descriptors holds one, so that
//! half-open handshakes expire even when no connection arrives (and whoever polls the listener
//! wakes for it).

use rustix::fd::{AsFd, OwnedFd};
use rustix::time::{timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags};
use rustix::time::Timespec;
use std::io;
use std::time::Duration;

/// A disarmed monotonic timer, non-blocking and close-on-exec; readable once it expires, until
/// [`drain`]ed.
pub fn create() -> io::Result<OwnedFd> {
    Ok(timerfd_create(TimerfdClockId::Monotonic, TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC)?)
}

/// Arms `timer` to expire once, `after` from now (at least a nanosecond: zero would disarm it);
/// `None` disarms it. Replaces any earlier setting.
pub fn arm(timer: impl AsFd, after: Option<Duration>) -> io::Result<()> {
    let zero = Timespec { tv_sec: 0, tv_nsec: 0 };
    let value = match after {
        Some(d) => {
            let d = d.max(Duration::from_nanos(1));
            Timespec { tv_sec: d.as_secs().min(i64::MAX as u64) as i64, tv_nsec: d.subsec_nanos() as _ }
        }
        None => zero,
    };
    timerfd_settime(timer, TimerfdTimerFlags::empty(), &Itimerspec { it_interval: zero, it_value: value })?;
    Ok(())
}

/// Consumes an expiry, so that the timer is no longer readable.
pub fn drain(timer: impl AsFd) {
    let mut b = [0u8; 8];
    let _ = rustix::io::read(timer, &mut b);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(fd: &OwnedFd) -> bool {
        let mut p = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
        rustix::event::poll(&mut p, Some(&Timespec { tv_sec: 0, tv_nsec: 0 })).unwrap() == 1
    }

    #[test]
    fn fires_once_then_drains() {
        let t = create().unwrap();
        assert!(!readable(&t));
        arm(&t, Some(Duration::from_millis(5))).unwrap();
        std::thread::sleep(Duration::from_millis(30));
        assert!(readable(&t));
        drain(&t);
        assert!(!readable(&t));
        arm(&t, Some(Duration::from_millis(5))).unwrap();
        arm(&t, None).unwrap();
        std::thread::sleep(Duration::from_millis(30));
        assert!(!readable(&t), "disarmed");
    }
}
