//! Doorbells (eventfds) and the readiness fd: one epoll instance holding a side's own doorbell and
//! its control socket, so one fd tells "the peer made progress" and "the peer hung up", and can sit
//! in any poll loop (spec/WIRE.md section 6).

use rustix::event::{epoll, eventfd, EventfdFlags, Timespec};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use std::io;
use std::time::Duration;

/// Creates a non-blocking, close-on-exec eventfd.
pub fn create() -> io::Result<OwnedFd> {
    Ok(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?)
}

/// Rings a doorbell (adds 1 to the eventfd counter).
pub fn ring(fd: impl AsFd) {
    // An eventfd write only fails if the counter would overflow (it is then readable anyway) or
    // the descriptor is not an eventfd, which a validated handshake excludes.
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

/// Empties a doorbell without blocking; returns whether it had rung.
pub fn drain(fd: impl AsFd) -> bool {
    let mut buf = [0u8; 8];
    matches!(rustix::io::read(fd, &mut buf), Ok(8)) && u64::from_ne_bytes(buf) > 0
}

const DOORBELL: u64 = 0;
const CONTROL: u64 = 1;

/// What woke a [`Readiness::wait`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Woken {
    /// The doorbell rang.
    pub doorbell: bool,
    /// The control socket is readable or hung up.
    pub control: bool,
    /// The sleeper's own wake-up eventfd rang: another thread emptied the doorbell (see
    /// `colo::shm::Shm::drain_doorbell`).
    pub passed: bool,
    /// The sleeper's wake-up eventfd is not open (the application closed it).
    pub wake_invalid: bool,
    /// A signal handler interrupted the wait (`EINTR`; poll and epoll_wait are never restarted).
    pub interrupted: bool,
}

/// Blocks until `doorbell` or `control` is readable (or `control` hangs up), `wake` (the
/// sleeping thread's own wake-up eventfd, if it has one) is readable, or `timeout` passes: one
/// `poll(2)`, no set-up. An interrupted wait returns only `interrupted`.
pub fn wait(doorbell: impl AsFd, control: impl AsFd, wake: Option<BorrowedFd<'_>>, timeout: Option<Duration>) -> io::Result<Woken> {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut fds = [PollFd::new(&doorbell, PollFlags::IN), PollFd::new(&control, PollFlags::IN | PollFlags::RDHUP)];
    let mut with_wake;
    let fds: &mut [PollFd<'_>] = match &wake {
        Some(w) => {
            let [d, c] = fds;
            with_wake = [d, c, PollFd::new(w, PollFlags::IN)];
            &mut with_wake
        }
        None => &mut fds,
    };
    let ts = timeout.map(|d| Timespec { tv_sec: d.as_secs() as i64, tv_nsec: d.subsec_nanos() as i64 });
    match poll(fds, ts.as_ref()) {
        Ok(_) => Ok(Woken {
            doorbell: !fds[0].revents().is_empty(),
            control: !fds[1].revents().is_empty(),
            passed: fds.get(2).is_some_and(|w| w.revents().contains(PollFlags::IN)),
            wake_invalid: fds.get(2).is_some_and(|w| w.revents().contains(PollFlags::NVAL)),
            interrupted: false,
        }),
        Err(rustix::io::Errno::INTR) => Ok(Woken { interrupted: true, ..Woken::default() }),
        Err(e) => Err(e.into()),
    }
}

/// The readiness fd of one side of a connection.
#[derive(Debug)]
pub struct Readiness {
    epoll: OwnedFd,
}

impl Readiness {
    /// An epoll instance watching `doorbell` for input and `control` for input and hang-up, at a
    /// descriptor number at or above `floor` if one is free there (see `preload::move_above`; 0:
    /// anywhere), else where it was made (a readiness fd that cannot show a hang-up would be
    /// worse than one descriptor of the application's).
    pub fn new(doorbell: impl AsFd, control: impl AsFd, floor: i32) -> io::Result<Readiness> {
        let mut ep = [epoll::create(epoll::CreateFlags::CLOEXEC)?];
        let _ = crate::preload::move_all_above(&mut ep, floor);
        let [ep] = ep;
        epoll::add(&ep, doorbell, epoll::EventData::new_u64(DOORBELL), epoll::EventFlags::IN)?;
        epoll::add(
            &ep,
            control,
            epoll::EventData::new_u64(CONTROL),
            epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
        )?;
        Ok(Readiness { epoll: ep })
    }

    /// Blocks until something is ready or `timeout` passes (`None`: forever). An interrupted wait
    /// returns only `interrupted`, so callers re-check their condition and deadline.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<Woken> {
        let ts = timeout.map(|d| Timespec { tv_sec: d.as_secs() as i64, tv_nsec: d.subsec_nanos() as i64 });
        let mut events = Vec::with_capacity(2);
        match epoll::wait(&self.epoll, rustix::buffer::spare_capacity(&mut events), ts.as_ref()) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => return Ok(Woken { interrupted: true, ..Woken::default() }),
            Err(e) => return Err(e.into()),
        }
        let mut w = Woken::default();
        for ev in &events {
            match ev.data.u64() {
                DOORBELL => w.doorbell = true,
                _ => w.control = true,
            }
        }
        Ok(w)
    }

    /// The epoll fd, for registration in another poller.
    pub fn fd(&self) -> &OwnedFd {
        &self.epoll
    }
}

const ONCE: epoll::EventFlags =
    epoll::EventFlags::IN.union(epoll::EventFlags::RDHUP).union(epoll::EventFlags::ONESHOT);

/// A small epoll set (listeners, hang-up watching): tokens in, ready tokens out.
#[derive(Debug)]
pub struct Poller {
    epoll: OwnedFd,
}

impl Poller {
    /// An empty set.
    pub fn new() -> io::Result<Poller> {
        Poller::new_above(0)
    }

    /// An empty set whose descriptor is at or above `floor` if one is free there (see
    /// `preload::move_all_above`; 0: anywhere).
    pub fn new_above(floor: i32) -> io::Result<Poller> {
        let mut ep = [epoll::create(epoll::CreateFlags::CLOEXEC)?];
        let _ = crate::preload::move_all_above(&mut ep, floor);
        let [epoll] = ep;
        Ok(Poller { epoll })
    }

    /// Watches `fd` for input under `token` (level-triggered).
    pub fn add(&self, fd: impl AsFd, token: u64) -> io::Result<()> {
        Ok(epoll::add(&self.epoll, fd, epoll::EventData::new_u64(token), epoll::EventFlags::IN)?)
    }

    /// Watches `fd` for input or hang-up under `token`, once: after it is reported, nothing more
    /// until [`Poller::rearm_once`] (`EPOLLONESHOT`).
    pub fn add_once(&self, fd: impl AsFd, token: u64) -> io::Result<()> {
        Ok(epoll::add(&self.epoll, fd, epoll::EventData::new_u64(token), ONCE)?)
    }

    /// Watches a reported [`Poller::add_once`] registration again.
    pub fn rearm_once(&self, fd: impl AsFd, token: u64) -> io::Result<()> {
        Ok(epoll::modify(&self.epoll, fd, epoll::EventData::new_u64(token), ONCE)?)
    }

    /// Stops watching `fd`.
    pub fn delete(&self, fd: impl AsFd) -> io::Result<()> {
        Ok(epoll::delete(&self.epoll, fd)?)
    }

    /// Most events one [`Poller::wait`] returns (the rest wait for the next call).
    pub const MAX_EVENTS: usize = 16;

    /// Waits for readiness; returns the ready tokens (empty on timeout or signal).
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<Vec<u64>> {
        let ts = timeout.map(|d| Timespec { tv_sec: d.as_secs() as i64, tv_nsec: d.subsec_nanos() as i64 });
        let mut events = Vec::with_capacity(Self::MAX_EVENTS);
        match epoll::wait(&self.epoll, rustix::buffer::spare_capacity(&mut events), ts.as_ref()) {
            Ok(_) => Ok(events.iter().map(|e| e.data.u64()).collect()),
            Err(rustix::io::Errno::INTR) => Ok(Vec::new()),
            Err(e) => Err(e.into()),
        }
    }

    /// The epoll fd (readable when any watched fd is).
    pub fn fd(&self) -> &OwnedFd {
        &self.epoll
    }
}
