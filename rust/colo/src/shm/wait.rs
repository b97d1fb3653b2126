//! Blocking waits (spec/WIRE.md section 6): spin, announce, re-check, sleep. One thread of a
//! side at a time sleeps in the futex or the doorbell (the leader); the others wait on a condvar
//! for it to wake.

use super::wakers::{Drainer, UNPASSED_SLEEP};
use super::tcp::{continues_blocking_call, interrupted_ends_wait, stops_end_wait};
use super::{from_nanos, libc_errno, lock, Shm, AWAITING_WELCOME, PEER_GONE};
use colo_ring::notify;
use colo_ring::spin::{SpinMode, Spinner};
use colo_ring::sync::Ordering;
use colo_sys::doorbell;
use std::io;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

/// How long a blocking wait sleeps on the futex before it moves to the doorbell.
const FUTEX_BUDGET: Duration = Duration::from_millis(2);

/// [`FUTEX_BUDGET`] of a wait that a job-control stop must end (`stops_end_wait`): the kernel
/// restarts a futex wait after a stop unseen, so a stop within it is not seen; after it, each
/// sleep builds an epoll set (`doorbell::wait_stoppable`, ten system calls or more), which a
/// longer budget spares the waits that end within it.
const STOPPABLE_FUTEX_BUDGET: Duration = Duration::from_millis(20);

/// This thread's wake-up eventfd registered with a side for one blocking wait
/// (`Shm::add_waker`), from its first doorbell announcement until the wait ends.
pub(super) struct Registered<'a> {
    shm: &'a Shm,
    pub(super) fd: std::cell::Cell<Option<colo_sys::RawFd>>,
}

impl<'a> Registered<'a> {
    pub(super) fn new(shm: &'a Shm) -> Self {
        Registered { shm, fd: std::cell::Cell::new(None) }
    }

    /// Registers the thread's wake-up eventfd if it is not yet (and a place is free).
    pub(super) fn register(&self) {
        if self.fd.get().is_none() {
            if let Some(fd) = crate::wake::own_fd().filter(|&fd| self.shm.add_waker(fd)) {
                self.fd.set(Some(fd));
            }
        }
    }

    /// The application closed the eventfd (a `poll` found it invalid): unregister it and let
    /// the thread take another at its next registration.
    fn invalid(&self) {
        if let Some(fd) = self.fd.take() {
            self.shm.remove_waker(fd);
            crate::wake::forget_own();
        }
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        if let Some(fd) = self.fd.get() {
            self.shm.remove_waker(fd);
        }
    }
}

impl Shm {
    /// Announces that a thread of this side is about to sleep the way `bit` says (spec section
    /// 6). If the announcement finds the word woken (`notify::Announced::fresh`: the peer's
    /// wake-up took every bit since the last announcement), that wake-up may have been meant for
    /// another thread of this side that had announced and re-checked but was not asleep yet: it
    /// woke nobody. That thread would then wait behind whichever thread sleeps next, for a
    /// wake-up that may never come (a writer waiting for space the peer already made, behind a
    /// reader waiting for an echo of bytes not yet written). So a fresh announcement moves the
    /// waiters' epoch, whatever the caller's re-check then finds: every thread that announced
    /// before it looks at its condition again (`block`). `seen` is the caller's own epoch, read
    /// before it announced; it moves along when nobody else moved the epoch meanwhile, so the
    /// caller does not send itself round again.
    pub(crate) fn announce(&self, bit: u32, seen: Option<&std::cell::Cell<u64>>) -> notify::Announced {
        let announced = notify::announce_sleep(self.own_waiting(), bit);
        self.release_space_waiter();
        if announced.fresh {
            let mut w = lock(&self.waiters);
            let ours = seen.is_some_and(|s| s.get() == w.epoch);
            w.epoch = w.epoch.wrapping_add(1);
            if let (true, Some(s)) = (ours, seen) {
                s.set(w.epoch);
            }
            if w.followers > 0 {
                self.woken.notify_all();
            }
        }
        announced
    }

    /// Announces a doorbell sleep for a caller that sleeps on the readiness fd itself (the
    /// shim's `poll` and `epoll_wait`), as `announce` does for this crate's own waits.
    pub fn announce_doorbell_sleep(&self) {
        self.announce(notify::SLEEP_DOORBELL, None);
    }

    /// Whether our doorbell announcement still stands: the peer has not rung since it was made
    /// (a ring takes the bit, spec/WIRE.md section 6). A stale answer costs at most a sleep that
    /// ends at once (the ring is in the doorbell), never a lost wake-up.
    pub fn doorbell_announced(&self) -> bool {
        self.own_waiting().load(Ordering::Relaxed) & notify::SLEEP_DOORBELL != 0
    }

    /// Sleeps until the doorbell rings, the control socket wakes, or `deadline` passes; with
    /// `futex = Some((value, budget))`, on the futex at our `waiting` word instead, for at most
    /// `budget` (`None`: the hang-up watcher wakes it; else a hang-up is noticed when the sleep
    /// moves on to the doorbell).
    ///
    /// `epoch` is the waiters' epoch read before this thread announced its sleep: if another
    /// thread has woken (and perhaps drained a ring meant for us) since, return at once so the
    /// caller re-checks instead of sleeping on a swallowed wake-up.
    ///
    /// `wake`: this thread's wake-up eventfd, if registered with this side, polled with the
    /// doorbell.
    pub(super) fn block(
        &self,
        deadline: Option<Instant>,
        futex: Option<(u32, Option<Duration>)>,
        epoch: u64,
        wake: &Registered<'_>,
    ) -> io::Result<()> {
        let timeout = match deadline {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                Some(left)
            }
            None => None,
        };
        let mut w = lock(&self.waiters);
        if w.epoch != epoch {
            return Ok(());
        }
        if w.leader {
            w.followers += 1;
            while w.leader && w.epoch == epoch {
                w = match deadline {
                    Some(d) => {
                        let left = d.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            w.followers -= 1;
                            return Err(io::ErrorKind::WouldBlock.into());
                        }
                        self.woken.wait_timeout(w, left).unwrap_or_else(|e| e.into_inner()).0
                    }
                    None => self.woken.wait(w).unwrap_or_else(|e| e.into_inner()),
                };
            }
            w.followers -= 1;
            return Ok(());
        }
        w.leader = true;
        drop(w);
        let r = match futex {
            Some((value, budget)) => {
                let t = match (timeout, budget) {
                    (Some(t), Some(b)) => Some(t.min(b)),
                    (t, b) => t.or(b),
                };
                // The watcher may have marked us before our announcement: no sleep then.
                let fired = self.hangup.take_fired();
                let interrupted = !fired && colo_sys::futex::wait(self.own_waiting(), value, t);
                if fired || self.hangup.take_fired() {
                    self.poll_control();
                    if !self.has(PEER_GONE) {
                        self.hangup.rearm(&self.fds.control);
                    }
                }
                Ok(colo_sys::doorbell::Woken { interrupted, ..Default::default() })
            }
            None => {
                let fd = wake.fd.get();
                // SAFETY: wake-up eventfds are never closed (`crate::wake`).
                let wake_fd = fd.map(|fd| unsafe { colo_sys::BorrowedFd::borrow_raw(fd) });
                // Unregistered, another thread's drain can take our ring without passing it on.
                let timeout = match fd {
                    Some(_) => timeout,
                    None => Some(timeout.map_or(UNPASSED_SLEEP, |t| t.min(UNPASSED_SLEEP))),
                };
                let r = if stops_end_wait(deadline.is_some()) {
                    doorbell::wait_stoppable(&self.fds.control, &self.fds.self_bell, wake_fd, timeout, crate::floor::fd_floor())
                } else {
                    doorbell::wait(&self.fds.control, &self.fds.self_bell, wake_fd, timeout)
                };
                if let (Ok(w), Some(own)) = (&r, wake_fd) {
                    if w.wake_invalid {
                        wake.invalid();
                    } else if w.passed {
                        doorbell::drain(own);
                    }
                }
                r
            }
        };
        let interrupted = r.as_ref().is_ok_and(|w| w.interrupted) && interrupted_ends_wait(deadline.is_some());
        if let Ok(woken) = r {
            if woken.doorbell {
                self.drain_doorbell(wake.fd.get().map_or(Drainer::Awake, Drainer::Waker));
            }
            if woken.control {
                self.poll_control();
            }
        }
        let mut w = lock(&self.waiters);
        w.leader = false;
        w.epoch = w.epoch.wrapping_add(1);
        if w.followers > 0 {
            self.woken.notify_all();
        }
        if interrupted {
            return Err(io::Error::from_raw_os_error(libc_errno::EINTR));
        }
        r.map(drop)
    }

    /// A non-blocking miss learns of the peer's hang-up: a hang-up leaves the readiness fd
    /// readable, so a caller told `EAGAIN` for it would be woken again and again and never told.
    /// While the hang-up watcher watches the control socket and has not seen it hang up, that
    /// costs no system call (`control_silent`); once it has, this look (or the next, after the
    /// self bell the watcher rings) finds the hang-up and reports it. Without a watcher, the
    /// control socket is looked at at every miss.
    fn notice_hangup_nonblocking(&self) {
        if !self.control_silent() {
            self.poll_control();
        }
    }

    /// When a wait under `timeout` gives up: the timeout counted from `since` (the start of the
    /// call, which may have waited for something else first), or from now.
    fn deadline(&self, timeout: &AtomicU64, since: Option<Instant>) -> Option<Instant> {
        from_nanos(timeout.load(Ordering::Relaxed)).map(|t| since.unwrap_or_else(Instant::now) + t)
    }

    /// One look (`check`) and, only if that finds nothing, [`Shm::wait_for`] with the spinner
    /// of `half` (a locked reading or writing half), its `timeout` counted from `since` (`None`:
    /// from the start of the wait). Under load the look is all a call needs, and it then pays
    /// for no spinner copy, deadline or wait set-up.
    pub(super) fn look_then_wait<H, T>(
        &self,
        half: &mut H,
        spinner_of: fn(&mut H) -> &mut Spinner,
        timeout: &AtomicU64,
        since: Option<Instant>,
        mut check: impl FnMut(&mut H) -> io::Result<Option<T>>,
    ) -> io::Result<T> {
        if let Some(v) = check(half)? {
            return Ok(v);
        }
        let mut spinner = spinner_of(half).clone();
        let r = self.wait_for(&mut spinner, timeout, since, || check(half));
        *spinner_of(half) = spinner;
        r
    }

    /// Runs `check` until it yields, by the protocol of spec/WIRE.md section 6; called after the
    /// caller's own `check` found nothing (so the wait starts with the spin or the announcement).
    fn wait_for<T>(
        &self,
        spinner: &mut Spinner,
        timeout: &AtomicU64,
        since: Option<Instant>,
        mut check: impl FnMut() -> io::Result<Option<T>>,
    ) -> io::Result<T> {
        if self.nonblocking.load(Ordering::Relaxed) && !continues_blocking_call() {
            // Our DOORBELL bit still set: nobody rang since it was announced (a ring clears it,
            // section 6), so there is nothing to drain and the announcement stands: a miss costs
            // no system call while the hang-up watcher vouches for the control socket (below).
            if self.own_waiting().load(Ordering::Relaxed) & notify::SLEEP_DOORBELL != 0 {
                if let Some(v) = check()? {
                    return Ok(v);
                }
                // A pause as an announcement is (the announcement stands): what our reads owe a
                // producer waiting for space is its due now.
                self.release_space_waiter();
                self.notice_hangup_nonblocking();
                return check()?.ok_or_else(|| io::ErrorKind::WouldBlock.into());
            }
            let r = notify::poll_after_miss(
                &mut check,
                || {
                    if self.drain_doorbell(Drainer::Awake) {
                        // SYNC POINT with the swap in `take_swallowed`.
                        self.swallowed.store(true, Ordering::Release);
                    }
                },
                || self.announce(notify::SLEEP_DOORBELL, None),
            )?;
            if let Some(v) = r {
                return Ok(v);
            }
            self.notice_hangup_nonblocking();
            return check()?.ok_or_else(|| io::ErrorKind::WouldBlock.into());
        }
        let deadline = self.deadline(timeout, since);
        if spinner.mode() == SpinMode::Always {
            // Busy polling never sleeps, so look at the control socket now and then.
            let mut polls = 0u32;
            return notify::wait_after_miss(
                spinner,
                || {
                    polls = polls.wrapping_add(1);
                    if polls.is_multiple_of(4096) {
                        self.poll_control();
                    }
                    if deadline.is_some_and(|d| polls.is_multiple_of(64) && Instant::now() >= d) {
                        return Err(io::ErrorKind::WouldBlock.into());
                    }
                    check()
                },
                || self.announce(notify::SLEEP_DOORBELL, None),
                |_| Ok(()),
            );
        }
        // With no deadline and the hang-up watcher running, sleep on the futex until woken (one
        // syscall each way, no timer). Otherwise on the futex for up to FUTEX_BUDGET (or
        // STOPPABLE_FUTEX_BUDGET), then on the control socket, which is the doorbell (no CPU
        // while idle; a hang-up wakes it).
        // Whether futex sleeps are untimed; asked at the first sleep itself (in `block`'s closure,
        // after the re-check), as the answer registers the connection with the watcher.
        let untimed = std::cell::Cell::new(None::<bool>);
        // Asked again at every sleep: a watcher that ends (a set*id call after which no thread
        // could be started, `hangup::resume`) wakes its sleepers once, and one that slept
        // untimed again would wait for a hang-up nothing watches.
        // A wait that a stop must end (`stops_end_wait`: a `MSG_WAITALL` read may come under it
        // mid-wait, once it has bytes) is never untimed.
        let sleep_untimed = || {
            let u = untimed.get().unwrap_or_else(|| {
                deadline.is_none() && self.watched()
            }) && self.hangup.watching()
                && !stops_end_wait(false);
            untimed.set(Some(u));
            u
        };
        // An adaptive spinner learns from how long its sleeps last.
        let measure = matches!(spinner.mode(), SpinMode::For(_));
        let asleep_since = std::cell::Cell::new(None::<Instant>);
        let seen_epoch = std::cell::Cell::new(0u64);
        let registered = Registered::new(self);
        let futex_left = || {
            let since = asleep_since.get().unwrap_or_else(Instant::now);
            let budget = if stops_end_wait(deadline.is_some()) { STOPPABLE_FUTEX_BUDGET } else { FUTEX_BUDGET };
            budget.checked_sub(since.elapsed()).filter(|d| !d.is_zero())
        };
        let r = notify::wait_after_miss(
            spinner,
            &mut check,
            || {
                // Read before the announcement: see `block`.
                seen_epoch.set(lock(&self.waiters).epoch);
                let bit = if self.has(AWAITING_WELCOME) {
                    // A pending connection's answer comes on the control socket, before any of
                    // the peer's bytes: the doorbell sleep watches both, so the answer wakes this
                    // thread directly, not the hang-up watcher (which would wake it in turn).
                    notify::SLEEP_DOORBELL
                } else if deadline.is_none() && untimed.get() != Some(false) || futex_left().is_some() {
                    notify::SLEEP_FUTEX
                } else {
                    notify::SLEEP_DOORBELL
                };
                if bit == notify::SLEEP_DOORBELL {
                    registered.register();
                }
                self.announce(bit, Some(&seen_epoch))
            },
            |announced| {
                let (value, bit) = (announced.value, announced.bit);
                let untimed = bit == notify::SLEEP_FUTEX && sleep_untimed();
                if (measure || !untimed) && asleep_since.get().is_none() {
                    asleep_since.set(Some(Instant::now()));
                }
                let futex = match bit {
                    notify::SLEEP_FUTEX if untimed => Some((value, None)),
                    notify::SLEEP_FUTEX => match futex_left() {
                        Some(d) => Some((value, Some(d))),
                        // Announced a futex sleep that cannot be had (no watcher, budget spent):
                        // look again; the next announcement is a doorbell one.
                        None => return Ok(()),
                    },
                    _ => None,
                };
                self.block(deadline, futex, seen_epoch.get(), &registered)
            },
        );
        if let (true, Some(since)) = (measure, asleep_since.get()) {
            spinner.slept(since.elapsed());
        }
        r
    }
}
