//! Doorbells, wake-up eventfds and the readiness fd (spec/WIRE.md section 6).
//!
//! A connection's doorbells are the two ends of one `AF_UNIX`, `SOCK_STREAM` socket pair, one
//! end held by each side and by nobody else: a side waits until its end is readable and rings
//! the peer by sending one byte on it. The peer shares no open file description with us, and
//! every call here passes `MSG_DONTWAIT`, so whatever the peer does to its own end (clear
//! `O_NONBLOCK`, fill the buffer, stop reading, shut it down, send descriptors) no call here
//! blocks: ringing a full buffer fails with `EAGAIN`, and a full buffer is readable already.
//!
//! A side's own threads wake each other through a *self bell*, an eventfd of this process that
//! is never passed to a peer (a side cannot make its own end of the pair readable), and a
//! thread's wake-up eventfds are eventfds of this process too: [`create`], [`ring`] and
//! [`drain`] are for those only.
//!
//! The readiness fd is one epoll instance holding a side's doorbell, its self bell and its
//! control socket, so one fd tells "the peer made progress" and "the peer hung up", and can sit
//! in any poll loop.

use rustix::event::{epoll, eventfd, EventfdFlags, Timespec};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};
use std::io;
use std::time::Duration;

/// Creates a non-blocking, close-on-exec eventfd (a self bell or a wake-up eventfd: never one
/// a peer holds).
pub fn create() -> io::Result<OwnedFd> {
    Ok(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?)
}

/// Rings an eventfd of [`create`] (adds 1 to its counter).
pub fn ring(fd: impl AsFd) {
    // An eventfd write only fails if the counter would overflow (it is then readable anyway);
    // nobody else holds the eventfd, so its description stays non-blocking.
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

/// Empties an eventfd of [`create`] without blocking; returns whether it had rung.
pub fn drain(fd: impl AsFd) -> bool {
    let mut buf = [0u8; 8];
    matches!(rustix::io::read(fd, &mut buf), Ok(8)) && u64::from_ne_bytes(buf) > 0
}

/// A connection's doorbell pair: `(client's end, server's end)`, close-on-exec.
/// Both ends refuse descriptors (`gift::refuse_rights`, where the kernel knows it): nothing but
/// one-byte rings travels on a doorbell, and a peer's descriptor could make a drain wait.
pub fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let (a, b) = rustix::net::socketpair(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC | SocketFlags::NONBLOCK, None)?;
    crate::gift::refuse_rights(&a);
    crate::gift::refuse_rights(&b);
    Ok((a, b))
}

/// Rings the peer: sends one byte on our end of the pair. Never blocks, whatever the flags of
/// the description (`MSG_DONTWAIT`), and never raises `SIGPIPE` (`MSG_NOSIGNAL`). Errors are
/// ignored: `EAGAIN` means the peer's end holds unread rings (it is readable already), `EPIPE`
/// or `ECONNRESET` that the peer's end is gone (its control socket tells the rest).
pub fn ring_peer(own: impl AsFd) {
    let _ = rustix::net::send(own, &[1u8], SendFlags::DONTWAIT | SendFlags::NOSIGNAL);
}

/// What [`drain_rings`] found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Rings {
    /// The peer had rung (at least one byte was read).
    pub rung: bool,
    /// The peer's end is shut down or closed (end of stream or an error): the doorbell would
    /// stay readable for good, so this counts as the peer's hang-up.
    pub hung_up: bool,
}

/// How many bytes one `recv` of [`drain_rings`] takes.
const DRAIN_CHUNK: usize = 256;
/// How many `recv` calls one [`drain_rings`] makes at most (a peer that keeps ringing cannot
/// keep us here; what is left keeps the doorbell readable for the next drain).
const DRAIN_CALLS: usize = 4;

/// Empties our end of the pair without blocking (`MSG_DONTWAIT`, whatever the description's
/// flags): at most [`DRAIN_CALLS`] reads of [`DRAIN_CHUNK`] bytes, stopping at the first that
/// does not fill its buffer (so an end of stream behind rings is found by the next drain: the
/// doorbell stays readable until then). Descriptors a peer sends along are received (room for
/// all one message carries: the kernel would otherwise drop them here, and a dropped lingering
/// socket's close waits in this thread) and closed disarmed (`gift`), never kept.
pub fn drain_rings(own: impl AsFd) -> Rings {
    let own = own.as_fd();
    let mut buf = [0u8; DRAIN_CHUNK];
    let mut found = Rings::default();
    for _ in 0..DRAIN_CALLS {
        match recv_ring(own, &mut buf) {
            Ok(0) => {
                found.hung_up = true;
                break;
            }
            Ok(n) => {
                found.rung = true;
                if n < DRAIN_CHUNK {
                    break;
                }
            }
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => break,
            Err(_) => {
                // ECONNRESET (the peer closed with our rings unread) and the like: its end is
                // gone.
                found.hung_up = true;
                break;
            }
        }
    }
    found
}

/// One `recv(MSG_DONTWAIT)` of rings into `buf`; descriptors that came with them are closed
/// disarmed ([`crate::gift::discard`]).
fn recv_ring(own: BorrowedFd<'_>, buf: &mut [u8]) -> rustix::io::Result<usize> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage};
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(crate::gift::MAX_RIGHTS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let r = rustix::net::recvmsg(own, &mut [std::io::IoSliceMut::new(buf)], &mut control, RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC)?;
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = m {
            rights.for_each(crate::gift::discard);
        }
    }
    Ok(r.bytes)
}

/// Takes every ring and descriptor queued on our end before it is closed (at most `MAX_EMPTY`
/// receives): a socket closed with a passed descriptor still queued releases it in the closing
/// thread, undisarmed. Without `SO_PASSRIGHTS` (`gift::refuse_rights`) a peer can queue more
/// after this; with it, only what was queued before the handshake remains, which this takes,
/// unless the peer turned it back on through a copy of our end (then it is shut down and taken
/// again).
pub fn empty_before_close(own: impl AsFd) {
    const MAX_EMPTY: usize = 1024;
    let own = own.as_fd();
    let mut buf = [0u8; DRAIN_CHUNK];
    let empty = |buf: &mut [u8]| {
        for _ in 0..MAX_EMPTY {
            if !matches!(recv_ring(own, buf), Ok(n) if n > 0) {
                break;
            }
        }
    };
    empty(&mut buf);
    // A server's end is a socket its client made: a client that kept a copy of it can turn
    // descriptors back on (`gift`) and queue one after this look. Found on, the end is shut down
    // (nothing more can be queued, whoever holds it: the peer broke the protocol, and the
    // connection ends for every process sharing it) and taken again, for good.
    if crate::gift::rights_on(own) {
        let _ = rustix::net::shutdown(own, rustix::net::Shutdown::Both);
        empty(&mut buf);
    }
}

/// Empties a side's bells: `own`, its end of the pair, and, if the peer had not rung,
/// `self_bell`, its eventfd. A report of the readiness fd is almost always the peer's ring (one
/// system call then); a self ring left behind by a drain that found the peer's keeps the bells
/// readable, so a level-triggered poller wakes once more and the next drain takes it. (No
/// in-memory flag says whether the self bell rang: a forked child shares the eventfd and not our
/// memory, and a flag it cannot set would leave its ring unread for good.) If the peer's end is
/// gone, `control` (the side's control socket) is shut down, so that everything watching it sees
/// the hang-up (spec section 8).
pub fn drain_side(own: impl AsFd, self_bell: impl AsFd, control: impl AsFd) -> Rings {
    let mut found = drain_rings(own);
    if found.hung_up {
        let _ = rustix::net::shutdown(control, rustix::net::Shutdown::Both);
    }
    if !found.rung {
        found.rung = drain(self_bell);
    }
    found
}

/// Whether `fd` can be a doorbell: an `AF_UNIX`, `SOCK_STREAM` socket (the server's check of
/// the descriptors a HELLO carries; [`ring_peer`] and [`drain_rings`] then never block).
pub fn is_doorbell(fd: impl AsFd) -> bool {
    let fd = fd.as_fd();
    matches!(rustix::net::sockopt::socket_domain(fd), Ok(AddressFamily::UNIX))
        && matches!(rustix::net::sockopt::socket_type(fd), Ok(SocketType::STREAM))
}

/// Whether `a` and `b` are descriptors of the same open file (same device and inode: for
/// sockets, the same socket).
pub fn same_file(a: impl AsFd, b: impl AsFd) -> bool {
    match (rustix::fs::fstat(a), rustix::fs::fstat(b)) {
        (Ok(x), Ok(y)) => x.st_dev == y.st_dev && x.st_ino == y.st_ino,
        _ => false,
    }
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

/// Blocks until `doorbell` (a side's end of the pair), `self_bell` (its eventfd) or `control`
/// is readable (or `control` hangs up), `wake` (the sleeping thread's own wake-up eventfd, if it
/// has one) is readable, or `timeout` passes: one `poll(2)`, no set-up. An interrupted wait
/// returns only `interrupted`.
pub fn wait(
    doorbell: impl AsFd,
    self_bell: impl AsFd,
    control: impl AsFd,
    wake: Option<BorrowedFd<'_>>,
    timeout: Option<Duration>,
) -> io::Result<Woken> {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut fds = [
        PollFd::new(&doorbell, PollFlags::IN),
        PollFd::new(&self_bell, PollFlags::IN),
        PollFd::new(&control, PollFlags::IN | PollFlags::RDHUP),
    ];
    let mut with_wake;
    let fds: &mut [PollFd<'_>] = match &wake {
        Some(w) => {
            let [d, s, c] = fds;
            with_wake = [d, s, c, PollFd::new(w, PollFlags::IN)];
            &mut with_wake
        }
        None => &mut fds,
    };
    let ts = timeout.map(|d| Timespec { tv_sec: d.as_secs() as i64, tv_nsec: d.subsec_nanos() as i64 });
    match poll(fds, ts.as_ref()) {
        Ok(_) => Ok(Woken {
            doorbell: !fds[0].revents().is_empty() || !fds[1].revents().is_empty(),
            control: !fds[2].revents().is_empty(),
            passed: fds.get(3).is_some_and(|w| w.revents().contains(PollFlags::IN)),
            wake_invalid: fds.get(3).is_some_and(|w| w.revents().contains(PollFlags::NVAL)),
            interrupted: false,
        }),
        Err(rustix::io::Errno::INTR) => Ok(Woken { interrupted: true, ..Woken::default() }),
        Err(rustix::io::Errno::INVAL) => match open_files_limit() {
            Some(limit) if limit < fds.len() => over_the_limit(&mut fds[..limit], timeout),
            _ => Err(rustix::io::Errno::INVAL.into()),
        },
        Err(e) => Err(e.into()),
    }
}

/// The longest a [`wait`] sleeps at a time where `poll` cannot watch its whole set.
const OVER_THE_LIMIT_SLICE: Duration = Duration::from_millis(10);

/// The process's soft `RLIMIT_NOFILE`, if it has one below `usize::MAX`.
fn open_files_limit() -> Option<usize> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current.and_then(|n| usize::try_from(n).ok())
}

/// A [`wait`] whose set `poll` refuses: it takes no more descriptors in one call than the soft
/// `RLIMIT_NOFILE`, however many are open, and a program may lower that limit to what it holds
/// or to nothing (vsftpd's pre-login process). `fds` is the part of the set the limit allows,
/// the doorbell first; it is watched for at most `OVER_THE_LIMIT_SLICE`, and everything is
/// reported ready: the caller drains and reads what is there, then looks at its rings, the
/// peer's hang-up and its deadline again, so what the set left out is seen within a slice.
fn over_the_limit(fds: &mut [rustix::event::PollFd<'_>], timeout: Option<Duration>) -> io::Result<Woken> {
    let slice = timeout.map_or(OVER_THE_LIMIT_SLICE, |t| t.min(OVER_THE_LIMIT_SLICE));
    let ts = Timespec { tv_sec: slice.as_secs() as i64, tv_nsec: slice.subsec_nanos() as i64 };
    match rustix::event::poll(fds, Some(&ts)) {
        Ok(_) => Ok(Woken { doorbell: true, control: true, ..Woken::default() }),
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
    /// An epoll instance watching `doorbell` and `self_bell` for input and `control` for input
    /// and hang-up, at a descriptor number at or above `floor` if one is free there (see
    /// `preload::move_above`; 0: anywhere), else where it was made (a readiness fd that cannot
    /// show a hang-up would be worse than one descriptor of the application's).
    pub fn new(doorbell: impl AsFd, self_bell: impl AsFd, control: impl AsFd, floor: i32) -> io::Result<Readiness> {
        let mut ep = [epoll::create(epoll::CreateFlags::CLOEXEC)?];
        let _ = crate::preload::move_all_above(&mut ep, floor);
        let [ep] = ep;
        epoll::add(&ep, doorbell, epoll::EventData::new_u64(DOORBELL), epoll::EventFlags::IN)?;
        epoll::add(&ep, self_bell, epoll::EventData::new_u64(DOORBELL), epoll::EventFlags::IN)?;
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
        let mut events = Vec::with_capacity(3);
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

    /// Whether an [`Poller::add`] registration of `fd` under `token` is reported (`on`) or
    /// stays in the set unreported (`!on`), level-triggered as added.
    pub fn set_reported(&self, fd: impl AsFd, token: u64, on: bool) -> io::Result<()> {
        let flags = if on { epoll::EventFlags::IN } else { epoll::EventFlags::empty() };
        Ok(epoll::modify(&self.epoll, fd, epoll::EventData::new_u64(token), flags)?)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer's lingering socket queued on a doorbell (before the handshake, or on a kernel
    /// without SO_PASSRIGHTS) never holds a drain, or the close of the doorbell, in our thread.
    #[test]
    fn a_lingering_gift_never_holds_a_drain_or_a_close() {
        use crate::gift::tests::{closes, lingering};
        let (a, b) = rustix::net::socketpair(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC | SocketFlags::NONBLOCK, None).unwrap();
        let gift = |a: &OwnedFd| {
            let (t, peer, l) = lingering(600);
            crate::seqpacket::send(a, &[1], &[t.as_fd()]).unwrap();
            // Our copy is not the last one (the queued message holds one): no wait here.
            drop(t);
            (peer, l)
        };
        let _kept = (gift(&a), gift(&a), gift(&a));
        let b = std::sync::Arc::new(b);
        let drained = b.clone();
        assert!(closes(move || assert!(drain_rings(&*drained).rung)), "a drain waited for a gift's close");
        assert!(
            closes(move || {
                let b = std::sync::Arc::try_unwrap(b).unwrap();
                empty_before_close(&b);
                drop(b);
            }),
            "closing the doorbell waited for a gift's close"
        );
    }

    /// A peer that kept a copy of our end turns descriptors back on after we turned them off:
    /// our last look before the close finds them on and shuts the end down, so nothing the peer
    /// sends after that look is queued.
    #[test]
    fn an_end_taking_descriptors_again_is_shut_down_before_its_close() {
        let (a, b) = rustix::net::socketpair(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC | SocketFlags::NONBLOCK, None).unwrap();
        if !crate::gift::refuse_rights(&b) {
            return; // a kernel before 6.16
        }
        use rustix::fd::AsRawFd;
        let copy = rustix::io::fcntl_dupfd_cloexec(&b, 0).unwrap();
        let on: libc::c_int = 1;
        // SAFETY: setsockopt reads an int we own; `copy` is open.
        assert_eq!(unsafe { libc::setsockopt(copy.as_raw_fd(), libc::SOL_SOCKET, 83, &on as *const libc::c_int as *const libc::c_void, 4) }, 0);
        empty_before_close(&b);
        let e = crate::seqpacket::send(&a, &[1], &[a.as_fd()]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPIPE), "the end still took descriptors");
    }
    use std::sync::mpsc::channel;

    /// Runs `f` on a thread; fails if it has not returned within 10 s (a blocked call).
    fn within_10s<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (done, returned) = channel();
        std::thread::spawn(move || {
            let _ = done.send(f());
        });
        returned.recv_timeout(Duration::from_secs(10)).unwrap_or_else(|_| panic!("{what} blocked"))
    }

    /// The peer's worst to a description it shares with us, had it one: O_NONBLOCK cleared.
    fn blocking(fd: &OwnedFd) {
        let fl = rustix::fs::fcntl_getfl(fd).unwrap();
        rustix::fs::fcntl_setfl(fd, fl - rustix::fs::OFlags::NONBLOCK).unwrap();
    }

    #[test]
    fn ringing_a_full_blocking_pair_never_blocks() {
        let (a, b) = pair().unwrap();
        blocking(&a);
        blocking(&b);
        let b = within_10s("ringing", move || {
            // Far more rings than the socket buffers hold: the sends past them fail (EAGAIN).
            for _ in 0..200_000 {
                ring_peer(&a);
            }
            (a, b)
        });
        let (a, b) = b;
        within_10s("draining", move || {
            // A full buffer: each drain takes a bounded part and never waits for more.
            let mut drains = 0;
            while drain_rings(&b).rung {
                drains += 1;
                assert!(drains < 100_000, "the drain never emptied the buffer");
            }
            assert_eq!(drain_rings(&b), Rings::default(), "an empty blocking doorbell: nothing, at once");
            ring_peer(&a);
            assert_eq!(drain_rings(&b), Rings { rung: true, hung_up: false });
        });
    }

    #[test]
    fn a_peer_that_shuts_down_or_closes_its_end_hangs_up() {
        let (a, b) = pair().unwrap();
        blocking(&b);
        ring_peer(&a);
        rustix::net::shutdown(&a, rustix::net::Shutdown::Write).unwrap();
        let found = within_10s("draining", move || [drain_rings(&b), drain_rings(&b)]);
        // The ring first; the end at the next drain (the doorbell is still readable).
        assert_eq!(found, [Rings { rung: true, hung_up: false }, Rings { rung: false, hung_up: true }]);
        // Closed with our rings unread (the kernel then reports ECONNRESET once).
        let (a, b) = pair().unwrap();
        ring_peer(&b);
        drop(a);
        assert!(drain_rings(&b).hung_up);
        assert!(drain_rings(&b).hung_up);
        // Ringing a peer that is gone raises no SIGPIPE (the test process would die of it).
        ring_peer(&b);
    }

    #[test]
    fn descriptors_a_peer_sends_are_never_kept() {
        // Gifts this test alone makes (memfds of their own name), so that the look at our
        // descriptors below is not confused by other tests opening and closing theirs meanwhile.
        const GIFT: &str = "colo-doorbell-test-gift";
        let gifts_open = || {
            std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|l| l.to_string_lossy().contains(GIFT))
                .count()
        };
        let gifts: Vec<OwnedFd> =
            (0..8).map(|_| rustix::fs::memfd_create(GIFT, rustix::fs::MemfdFlags::CLOEXEC).unwrap()).collect();
        // A pair refuses them where the kernel can (SO_PASSRIGHTS); queued anyway (before a
        // server could refuse them, or on an older kernel), a drain closes them.
        let (a, b) = pair().unwrap();
        if crate::gift::refuse_rights(&b) {
            assert!(crate::seqpacket::send(&a, &[1], &[gifts[0].as_fd()]).is_err());
        }
        let (a, b) = rustix::net::socketpair(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC | SocketFlags::NONBLOCK, None).unwrap();
        for g in &gifts {
            crate::seqpacket::send(&a, &[1], &[g.as_fd()]).unwrap();
        }
        drop(gifts);
        assert_eq!(gifts_open(), 0);
        let mut rounds = 0;
        while drain_rings(&b).rung {
            rounds += 1;
            assert!(rounds < 100);
        }
        assert_eq!(gifts_open(), 0, "a drain installed descriptors");
    }

    #[test]
    fn only_a_unix_stream_socket_is_a_doorbell() {
        let (a, b) = pair().unwrap();
        assert!(is_doorbell(&a) && is_doorbell(&b));
        assert!(!is_doorbell(create().unwrap()));
        let (d, _) = std::os::unix::net::UnixDatagram::pair().unwrap();
        assert!(!is_doorbell(&d));
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(!is_doorbell(&tcp));
        let dup = rustix::io::dup(&b).unwrap();
        assert!(same_file(&b, &dup));
        assert!(!same_file(&a, &b));
    }

    #[test]
    fn a_side_drains_its_self_bell_when_the_peer_had_not_rung() {
        let (a, b) = pair().unwrap();
        let own = create().unwrap();
        ring(&own);
        ring_peer(&a);
        let (ctl, peer_ctl) = pair().unwrap();
        assert!(drain_side(&b, &own, &ctl).rung);
        // The self ring is left for the next drain (the bells stay readable until then).
        assert!(drain_side(&b, &own, &ctl).rung);
        assert!(!drain_side(&b, &own, &ctl).rung);
        // The peer's end gone: the control socket is shut down, both ways.
        drop(a);
        assert!(drain_side(&b, &own, &ctl).hung_up);
        assert_eq!(drain_rings(&peer_ctl), Rings { rung: false, hung_up: true });
    }
}
