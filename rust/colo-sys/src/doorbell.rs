//! Doorbells, wake-up eventfds and the readiness fd (spec/WIRE.md section 6).
//!
//! A side's doorbell is its end of the connection's control socket (`SOCK_SEQPACKET`): a side
//! waits until its end is readable and rings the peer by sending a one-byte datagram on it. Each
//! end is its own process's (the client's from `socket`, the server's from `accept`), so the peer
//! shares no open file description with us, and every call here passes `MSG_DONTWAIT`: whatever
//! the peer does to its own end (fill our queue, stop reading, shut it down, send descriptors) no
//! call here blocks; ringing a full queue fails with `EAGAIN`, and a full queue is readable
//! already.
//!
//! A side's own threads wake each other through a *self bell*, an eventfd of this process that
//! is never passed to a peer (a side cannot make its own end of the control socket readable), and
//! a thread's wake-up eventfds are eventfds of this process too: [`create`], [`ring`] and
//! [`drain`] are for those only.
//!
//! The readiness fd is one epoll instance holding a side's control socket and its self bell, so
//! one fd tells "the peer made progress" and "the peer hung up", and can sit in any poll loop.

use rustix::event::{epoll, eventfd, EventfdFlags, Timespec};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::net::{RecvFlags, SendFlags};
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

/// Rings the peer: sends a one-byte datagram on our end of the control socket. Never blocks,
/// whatever the flags of the description (`MSG_DONTWAIT`), and never raises `SIGPIPE`
/// (`MSG_NOSIGNAL`). Errors are ignored: `EAGAIN` means the peer's end holds unread rings (it is
/// readable already), `EPIPE` or `ECONNRESET` that the peer is gone (its hang-up tells the rest).
pub fn ring_peer(control: impl AsFd) {
    let _ = rustix::net::send(control, &[1u8], SendFlags::DONTWAIT | SendFlags::NOSIGNAL);
}

/// One datagram of a control socket after the handshake, as [`take_one`] classifies it
/// (spec section 6, "Ringing and draining").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Datagram {
    /// Nothing queued.
    Nothing,
    /// A ring: one byte, no descriptor.
    Ring,
    /// The peer's hang-up: end of stream (or a zero-length datagram, which `recv` cannot tell
    /// apart), or an error other than `EAGAIN`/`EINTR`.
    HungUp,
    /// A datagram of exactly [`MESSAGE_LEN`] bytes without descriptors: the answer to a HELLO,
    /// if the side awaits one; a protocol error otherwise.
    Message([u8; MESSAGE_LEN]),
    /// Anything else (another length, descriptors): a protocol error.
    Garbage,
}

/// The length of a handshake message (spec section 3).
pub const MESSAGE_LEN: usize = 16;

/// Receives one datagram from our end of a control socket without blocking (`MSG_DONTWAIT`,
/// whatever the description's flags). Descriptors a peer sends along are received (room for all
/// one message carries: the kernel would otherwise drop them here, and a dropped lingering
/// socket's close waits in this thread) and closed disarmed (`gift`), never kept.
pub fn take_one(control: impl AsFd) -> Datagram {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, ReturnFlags};
    let mut buf = [0u8; MESSAGE_LEN + 1];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(crate::gift::MAX_RIGHTS))];
    let mut anc = RecvAncillaryBuffer::new(&mut space);
    let r = rustix::net::recvmsg(
        control,
        &mut [std::io::IoSliceMut::new(&mut buf)],
        &mut anc,
        RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC,
    );
    let mut gifts = Vec::new();
    for m in anc.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = m {
            gifts.extend(rights);
        }
    }
    // A peer's gifts: their last close here never waits (`gift::disarm_peer`).
    let gifts = !gifts.is_empty() && {
        crate::gift::disarm_peer(&mut gifts);
        gifts.into_iter().for_each(crate::gift::discard);
        true
    };
    match r {
        Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => Datagram::Nothing,
        Err(_) => Datagram::HungUp,
        Ok(m) => classify(&buf, m.bytes, m.flags.intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC) || gifts),
    }
}

/// What a received datagram of `len` bytes in `buf` is; `odd`: it was truncated or carried
/// descriptors.
fn classify(buf: &[u8; MESSAGE_LEN + 1], len: usize, odd: bool) -> Datagram {
    match len {
        _ if odd => Datagram::Garbage,
        0 => Datagram::HungUp,
        1 => Datagram::Ring,
        MESSAGE_LEN => Datagram::Message(buf[..MESSAGE_LEN].try_into().expect("16 bytes")),
        _ => Datagram::Garbage,
    }
}

/// How many datagrams one receive takes when a control socket is emptied before its close, in
/// one `recvmmsg` (its buffers, a little over 1 KiB a datagram, live on the stack of whichever
/// thread closes: an application's, in its `close`).
const EMPTY_BATCH: usize = 4;

/// The control message space of one datagram of a batch, in `u64`s (aligned for `cmsghdr`):
/// room for every descriptor one message can carry (the kernel would otherwise drop the rest
/// here, undisarmed).
const RIGHTS_WORDS: usize = rustix::cmsg_space!(ScmRights(crate::gift::MAX_RIGHTS)).div_ceil(8);

/// The buffers of one `recvmmsg` of up to `N` datagrams.
struct Batch<const N: usize> {
    bufs: [[u8; MESSAGE_LEN + 1]; N],
    /// Not initialised: the kernel writes what it returns, and only that (`msg_controllen`) is read.
    spaces: [[std::mem::MaybeUninit<u64>; RIGHTS_WORDS]; N],
    iovs: [libc::iovec; N],
    hdrs: [libc::mmsghdr; N],
}

impl<const N: usize> Batch<N> {
    fn new() -> Self {
        Batch {
            bufs: [[0; MESSAGE_LEN + 1]; N],
            spaces: [[std::mem::MaybeUninit::uninit(); RIGHTS_WORDS]; N],
            // SAFETY: all-zero iovecs and mmsghdrs are valid values (null pointers, zero lengths).
            iovs: unsafe { std::mem::zeroed() },
            // SAFETY: as above.
            hdrs: unsafe { std::mem::zeroed() },
        }
    }
}

/// Receives, without blocking and in one `recvmmsg` into `b`, up to `N` datagrams queued on our
/// end of a control socket; hands each to `on`, in order; returns how many there were (an error
/// other than `EAGAIN`/`EINTR` is handed on as a hang-up and counts as one). Descriptors that
/// came along are closed disarmed, as in [`take_one`].
fn receive<const N: usize>(control: BorrowedFd<'_>, b: &mut Batch<N>, on: &mut dyn FnMut(Datagram)) -> usize {
    use rustix::fd::{AsRawFd, FromRawFd};
    // Pointed at the batch's own buffers at its first use, while it stays where it is; the
    // kernel changes only `msg_controllen` and `msg_flags` of the headers it fills, and those
    // are put back after each use, below.
    if !std::ptr::eq(b.hdrs[0].msg_hdr.msg_iov, &b.iovs[0]) {
        for i in 0..N {
            b.iovs[i] = libc::iovec { iov_base: b.bufs[i].as_mut_ptr().cast(), iov_len: MESSAGE_LEN + 1 };
            let h = &mut b.hdrs[i].msg_hdr;
            h.msg_iov = &mut b.iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = b.spaces[i].as_mut_ptr().cast();
            h.msg_controllen = (RIGHTS_WORDS * 8) as _;
            h.msg_flags = 0;
        }
    }
    // SAFETY: `b.hdrs` holds N headers, each naming one iovec of its own buffer and a control
    // buffer of RIGHTS_WORDS u64s, all alive for the call; no timeout.
    let n = unsafe {
        libc::recvmmsg(control.as_raw_fd(), b.hdrs.as_mut_ptr(), N as libc::c_uint, libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC, std::ptr::null_mut())
    };
    if n < 0 {
        let e = std::io::Error::last_os_error().raw_os_error();
        if matches!(e, Some(libc::EAGAIN | libc::EINTR)) {
            return 0;
        }
        on(Datagram::HungUp);
        return 1;
    }
    let n = (n as usize).min(N);
    for i in 0..n {
        let h = &b.hdrs[i].msg_hdr;
        let mut gifts = false;
        // SAFETY: the kernel filled `h`'s control buffer (msg_controllen bytes) with well-formed
        // control messages; CMSG_FIRSTHDR/NXTHDR stay inside it.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(h);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    gifts = true;
                    let data = libc::CMSG_DATA(c).cast::<libc::c_int>();
                    let count = ((*c).cmsg_len as usize).saturating_sub(data as usize - c as usize) / std::mem::size_of::<libc::c_int>();
                    // SAFETY: each int of an SCM_RIGHTS message is a descriptor the kernel just
                    // installed for us, owned by nobody else.
                    let mut got: Vec<_> = (0..count).map(|k| rustix::fd::OwnedFd::from_raw_fd(data.add(k).read_unaligned())).collect();
                    // A peer's gifts: their last close here never waits (`gift::disarm_peer`).
                    crate::gift::disarm_peer(&mut got);
                    got.into_iter().for_each(crate::gift::discard);
                }
                c = libc::CMSG_NXTHDR(h, c);
            }
        }
        let odd = h.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 || gifts;
        on(classify(&b.bufs[i], b.hdrs[i].msg_len as usize, odd));
        let h = &mut b.hdrs[i].msg_hdr;
        h.msg_controllen = (RIGHTS_WORDS * 8) as _;
        h.msg_flags = 0;
    }
    n
}

/// What [`drain_side`] found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Rings {
    /// The peer had rung, or the self bell had.
    pub rung: bool,
    /// The peer hung up (the control socket is then shut down: see [`drain_side`]).
    pub hung_up: bool,
    /// A datagram that is neither a ring nor a hang-up, for the caller to judge.
    pub other: Option<Datagram>,
}

/// Empties a side's bells: one datagram of `control`, its end of the control socket (a ring is
/// almost always all there is: one `recvmsg`, where a batch's `recvmmsg` costs a second, empty
/// receive in the kernel every time; another ring, or a hang-up behind it, keeps the socket
/// readable for the next drain), and, if the peer had not rung, `self_bell`, its eventfd.
/// A self ring left behind by a drain that found the peer's keeps the bells readable, so a
/// level-triggered poller wakes once more and the next drain takes it. (No in-memory flag says
/// whether the self bell rang: a forked child shares the eventfd and not our memory, and a flag
/// it cannot set would leave its ring unread for good.) If the peer hung up, `control` is shut
/// down both ways, so that everything watching it sees the hang-up for good (a zero-length
/// datagram, taken, would otherwise leave nothing to see; spec section 8).
pub fn drain_side(control: impl AsFd, self_bell: impl AsFd) -> Rings {
    drain_bells(control, self_bell, false)
}

/// [`drain_side`], and the self bell whether or not the peer had rung: for a side that knows a
/// self ring of its own waits there, which would otherwise end the next sleep at once for
/// nothing (one read now against a wake-up, a drain and a sleep again).
pub fn drain_both(control: impl AsFd, self_bell: impl AsFd) -> Rings {
    drain_bells(control, self_bell, true)
}

fn drain_bells(control: impl AsFd, self_bell: impl AsFd, self_too: bool) -> Rings {
    let control = control.as_fd();
    let mut found = Rings::default();
    match take_one(control) {
        Datagram::Nothing => {}
        Datagram::Ring => found.rung = true,
        Datagram::HungUp => found.hung_up = true,
        other => found.other = Some(other),
    }
    if found.hung_up {
        let _ = rustix::net::shutdown(control, rustix::net::Shutdown::Both);
    }
    if !found.rung || self_too {
        found.rung |= drain(self_bell);
    }
    found
}

/// Whether the peer of our end of a control socket has hung up (shut its end down or closed
/// it), without reading: rings queued before the hang-up stay for the drains. One `poll` that
/// never waits.
pub fn hung_up(control: impl AsFd) -> bool {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut fds = [PollFd::new(&control, PollFlags::RDHUP)];
    let zero = Timespec { tv_sec: 0, tv_nsec: 0 };
    match poll(&mut fds, Some(&zero)) {
        Ok(_) => fds[0].revents().intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR | PollFlags::NVAL),
        Err(_) => false,
    }
}

/// Takes every ring and descriptor queued on our end of a control socket before its close (at
/// most `MAX_EMPTY` receives): a socket closed with a passed descriptor still queued releases it
/// in the closing thread, undisarmed. With `SO_PASSRIGHTS` off (`gift::refuse_rights`: the
/// client's from the start, the server's once the HELLO is read) nothing the peer sends later
/// carries one; a socket found taking them again (a copy another process of ours holds turned
/// them back on) is shut down first, so nothing more can be queued, and then emptied.
pub fn empty_before_close(control: impl AsFd) {
    const MAX_EMPTY: usize = 1024;
    let control = control.as_fd();
    if crate::gift::rights_on(control) {
        let _ = rustix::net::shutdown(control, rustix::net::Shutdown::Both);
    }
    // A zero-length datagram reads as the end of the socket, but datagrams may follow it: the
    // end is a batch of nothing else (past it, every receive reads it again).
    let mut batch = Batch::<EMPTY_BATCH>::new();
    for _ in 0..MAX_EMPTY / EMPTY_BATCH {
        let mut ends = 0;
        let n = receive(control, &mut batch, &mut |d| ends += usize::from(d == Datagram::HungUp));
        if n < EMPTY_BATCH || ends == n {
            break;
        }
    }
}

/// What woke a [`Readiness::wait`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Woken {
    /// The control socket or the self bell is readable: drain them.
    pub doorbell: bool,
    /// The control socket hung up.
    pub control: bool,
    /// The sleeper's own wake-up eventfd rang: another thread emptied the doorbell (see
    /// `colo::shm::Shm::drain_doorbell`).
    pub passed: bool,
    /// The sleeper's wake-up eventfd is not open (the application closed it).
    pub wake_invalid: bool,
    /// A signal handler interrupted the wait (`EINTR`; poll and epoll_wait are never restarted).
    pub interrupted: bool,
}

/// Blocks until `control` (a side's end of the control socket) or `self_bell` (its eventfd) is
/// readable (or `control` hangs up), `wake` (the sleeping thread's own wake-up eventfd, if it
/// has one) is readable, or `timeout` passes: one `poll(2)`, no set-up. An interrupted wait
/// returns only `interrupted`.
pub fn wait(control: impl AsFd, self_bell: impl AsFd, wake: Option<BorrowedFd<'_>>, timeout: Option<Duration>) -> io::Result<Woken> {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut fds = [PollFd::new(&control, PollFlags::IN | PollFlags::RDHUP), PollFd::new(&self_bell, PollFlags::IN)];
    let mut with_wake;
    let fds: &mut [PollFd<'_>] = match &wake {
        Some(w) => {
            let [c, s] = fds;
            with_wake = [c, s, PollFd::new(w, PollFlags::IN)];
            &mut with_wake
        }
        None => &mut fds,
    };
    let ts = timeout.map(|d| Timespec { tv_sec: d.as_secs() as i64, tv_nsec: d.subsec_nanos() as i64 });
    match poll(fds, ts.as_ref()) {
        Ok(_) => Ok(Woken {
            doorbell: fds[0].revents().contains(PollFlags::IN) || !fds[1].revents().is_empty(),
            control: fds[0].revents().intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR | PollFlags::NVAL),
            passed: fds.get(2).is_some_and(|w| w.revents().contains(PollFlags::IN)),
            wake_invalid: fds.get(2).is_some_and(|w| w.revents().contains(PollFlags::NVAL)),
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

/// [`wait`] that a job-control stop ends too (`interrupted`): the process stopped and continued
/// makes `epoll_wait` fail with `EINTR`, where the kernel restarts a `poll` unseen (signal(7)).
/// It sleeps in a set made for this one wait, placed at or above `floor` (0: anywhere); where
/// none can be made and placed there, or `wake` cannot be added (the application closed it), or
/// `epoll_wait` fails other than by a signal (a seccomp filter), it is [`wait`].
/// The sleep lasts at most [`STOPPABLE_SLICE`]; the caller then looks again.
pub fn wait_stoppable(
    control: impl AsFd,
    self_bell: impl AsFd,
    wake: Option<BorrowedFd<'_>>,
    timeout: Option<Duration>,
    floor: i32,
) -> io::Result<Woken> {
    let set = epoll::create(epoll::CreateFlags::CLOEXEC).ok().and_then(|ep| {
        let mut ep = [ep];
        // Left where it was made, the application could close the set's number and reuse it,
        // and our close afterwards would close its descriptor: such a set is not used.
        crate::preload::move_all_above(&mut ep, floor).ok()?;
        let [ep] = ep;
        epoll::add(&ep, &control, epoll::EventData::new_u64(CONTROL), epoll::EventFlags::IN | epoll::EventFlags::RDHUP).ok()?;
        epoll::add(&ep, &self_bell, epoll::EventData::new_u64(SELF_BELL), epoll::EventFlags::IN).ok()?;
        if let Some(w) = wake {
            epoll::add(&ep, w, epoll::EventData::new_u64(WAKE), epoll::EventFlags::IN).ok()?;
        }
        Some(ep)
    });
    let Some(ep) = set else {
        return wait(control, self_bell, wake, timeout);
    };
    // At most `STOPPABLE_SLICE`: a longer timeout would need `epoll_pwait2`, which a kernel
    // before 5.11 or a seccomp filter refuses. Waking with nothing rung, the caller looks again
    // and sleeps for what is left of its deadline.
    let slice = timeout.map_or(STOPPABLE_SLICE, |t| t.min(STOPPABLE_SLICE));
    let ts = Timespec { tv_sec: slice.as_secs() as i64, tv_nsec: slice.subsec_nanos() as i64 };
    let mut events = Vec::with_capacity(3);
    match epoll::wait(&ep, rustix::buffer::spare_capacity(&mut events), Some(&ts)) {
        Ok(_) => Ok(woken_of(&events)),
        Err(rustix::io::Errno::INTR) => Ok(Woken { interrupted: true, ..Woken::default() }),
        // Refused (the call filtered):
        // the sleep is a [`wait`], which a stop does not end.
        Err(_) => {
            drop(ep);
            wait(control, self_bell, wake, timeout)
        }
    }
}

/// The longest a [`wait_stoppable`] sleeps in one `epoll_wait`: well inside the milliseconds
/// an `int` holds.
const STOPPABLE_SLICE: Duration = Duration::from_secs(3600);

/// What the events of a set of [`CONTROL`], [`SELF_BELL`] and [`WAKE`] say.
fn woken_of(events: &[epoll::Event]) -> Woken {
    let mut w = Woken::default();
    let hang_up = epoll::EventFlags::RDHUP | epoll::EventFlags::HUP | epoll::EventFlags::ERR;
    for ev in events {
        match ev.data.u64() {
            CONTROL => {
                let flags = ev.flags;
                w.doorbell |= flags.contains(epoll::EventFlags::IN);
                w.control |= flags.intersects(hang_up);
            }
            WAKE => w.passed = true,
            _ => w.doorbell = true,
        }
    }
    w
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

const CONTROL: u64 = 0;
const SELF_BELL: u64 = 1;
/// A sleeper's own wake-up eventfd in [`wait_stoppable`]'s set.
const WAKE: u64 = 2;

/// The readiness fd of one side of a connection.
#[derive(Debug)]
pub struct Readiness {
    epoll: OwnedFd,
}

impl Readiness {
    /// An epoll instance watching `control` for input and hang-up and `self_bell` for input, at
    /// a descriptor number at or above `floor` if one is free there (see `preload::move_above`;
    /// 0: anywhere), else where it was made (a readiness fd that cannot show a hang-up would be
    /// worse than one descriptor of the application's).
    pub fn new(control: impl AsFd, self_bell: impl AsFd, floor: i32) -> io::Result<Readiness> {
        let mut ep = [epoll::create(epoll::CreateFlags::CLOEXEC)?];
        let _ = crate::preload::move_all_above(&mut ep, floor);
        let [ep] = ep;
        epoll::add(&ep, control, epoll::EventData::new_u64(CONTROL), epoll::EventFlags::IN | epoll::EventFlags::RDHUP)?;
        epoll::add(&ep, self_bell, epoll::EventData::new_u64(SELF_BELL), epoll::EventFlags::IN)?;
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
        Ok(woken_of(&events))
    }

    /// The epoll fd, for registration in another poller.
    pub fn fd(&self) -> &OwnedFd {
        &self.epoll
    }
}

const ONCE: epoll::EventFlags =
    epoll::EventFlags::IN.union(epoll::EventFlags::RDHUP).union(epoll::EventFlags::ONESHOT);
const HANG_UP_ONCE: epoll::EventFlags = epoll::EventFlags::RDHUP.union(epoll::EventFlags::ONESHOT);

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

    /// Watches the socket `fd` for its peer's hang-up only (not input: a control socket's rings
    /// are its drains' business) under `token`, once, until [`Poller::rearm_hang_up_once`].
    pub fn add_hang_up_once(&self, fd: impl AsFd, token: u64) -> io::Result<()> {
        Ok(epoll::add(&self.epoll, fd, epoll::EventData::new_u64(token), HANG_UP_ONCE)?)
    }

    /// Watches a reported [`Poller::add_hang_up_once`] registration again.
    pub fn rearm_hang_up_once(&self, fd: impl AsFd, token: u64) -> io::Result<()> {
        Ok(epoll::modify(&self.epoll, fd, epoll::EventData::new_u64(token), HANG_UP_ONCE)?)
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
    use rustix::net::{AddressFamily, SocketFlags, SocketType};

    /// Two connected ends of a control socket, non-blocking, as a connection holds them.
    fn control_pair() -> (OwnedFd, OwnedFd) {
        rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC | SocketFlags::NONBLOCK, None).unwrap()
    }

    /// Closes the peer's end as a process that exits would, shut down first: a test that forks
    /// beside this one gives its child a copy of every descriptor, and a copy would keep the end
    /// open past our close.
    fn close_peer(end: OwnedFd) {
        rustix::net::shutdown(&end, rustix::net::Shutdown::Both).unwrap();
        drop(end);
    }

    /// A peer's lingering socket queued on a control socket (before the handshake, or on a
    /// kernel without SO_PASSRIGHTS) never holds a drain, or the close, in our thread.
    #[test]
    fn a_lingering_gift_never_holds_a_drain_or_a_close() {
        use crate::gift::tests::{closes, lingering};
        let (a, b) = control_pair();
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
        assert!(closes(move || assert_eq!(take_one(&*drained), Datagram::Garbage)), "a drain waited for a gift's close");
        assert!(
            closes(move || {
                let b = std::sync::Arc::try_unwrap(b).unwrap();
                empty_before_close(&b);
                drop(b);
            }),
            "closing the control socket waited for a gift's close"
        );
    }

    /// A control socket found taking descriptors again at its close (another copy turned them
    /// back on) is shut down before it is emptied, so nothing the peer sends after that look is
    /// queued.
    #[test]
    fn an_end_taking_descriptors_again_is_shut_down_before_its_close() {
        let (a, b) = control_pair();
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

    /// O_NONBLOCK cleared: what the application could do to a description it shares with us.
    fn blocking(fd: &OwnedFd) {
        let fl = rustix::fs::fcntl_getfl(fd).unwrap();
        rustix::fs::fcntl_setfl(fd, fl - rustix::fs::OFlags::NONBLOCK).unwrap();
    }

    #[test]
    fn ringing_a_full_blocking_control_socket_never_blocks() {
        let (a, b) = control_pair();
        blocking(&a);
        blocking(&b);
        let b = within_10s("ringing", move || {
            // Far more rings than the queue holds: the sends past it fail (EAGAIN).
            for _ in 0..200_000 {
                ring_peer(&a);
            }
            (a, b)
        });
        let (a, b) = b;
        within_10s("draining", move || {
            let own = create().unwrap();
            // A full queue: each drain takes one ring and never waits for more.
            let mut drains = 0;
            while drain_side(&b, &own).rung {
                drains += 1;
                assert!(drains < 100_000, "the drains never emptied the queue");
            }
            assert_eq!(drain_side(&b, &own), Rings::default(), "an empty blocking doorbell: nothing, at once");
            ring_peer(&a);
            assert_eq!(drain_side(&b, &own), Rings { rung: true, ..Rings::default() });
        });
    }

    #[test]
    fn a_peer_that_shuts_down_or_closes_its_end_hangs_up() {
        let (a, b) = control_pair();
        blocking(&b);
        let own = create().unwrap();
        ring_peer(&a);
        rustix::net::shutdown(&a, rustix::net::Shutdown::Write).unwrap();
        assert!(hung_up(&b), "the hang-up is seen behind a queued ring, without a read");
        let found = within_10s("draining", move || [drain_side(&b, &own), drain_side(&b, &own)]);
        // The ring first; the end at the next drain (the socket is still readable).
        assert_eq!(found, [Rings { rung: true, ..Rings::default() }, Rings { hung_up: true, ..Rings::default() }]);
        // Closed with our rings unread.
        let (a, b) = control_pair();
        ring_peer(&b);
        close_peer(a);
        assert!(hung_up(&b));
        assert_eq!(take_one(&b), Datagram::HungUp);
        // Ringing a peer that is gone raises no SIGPIPE (the test process would die of it).
        ring_peer(&b);
        // A zero-length datagram reads as a hang-up; the drain then shuts our end down, so the
        // hang-up stays visible to everything that watches it.
        let (a, b) = control_pair();
        rustix::net::send(&a, &[], SendFlags::DONTWAIT).unwrap();
        assert!(!hung_up(&b));
        assert!(drain_side(&b, create().unwrap()).hung_up);
        assert!(hung_up(&b));
    }

    #[test]
    fn a_datagram_other_than_a_ring_is_handed_to_the_caller() {
        let (a, b) = control_pair();
        let own = create().unwrap();
        let answer = [7u8; MESSAGE_LEN];
        rustix::net::send(&a, &answer, SendFlags::DONTWAIT).unwrap();
        assert_eq!(drain_side(&b, &own).other, Some(Datagram::Message(answer)));
        for bad in [&[1u8, 2][..], &[0u8; MESSAGE_LEN + 1][..], &[0u8; 300][..]] {
            rustix::net::send(&a, bad, SendFlags::DONTWAIT).unwrap();
            assert_eq!(drain_side(&b, &own).other, Some(Datagram::Garbage), "{} bytes", bad.len());
        }
        let memfd = rustix::fs::memfd_create("colo-doorbell-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        crate::seqpacket::send(&a, &[1], &[memfd.as_fd()]).unwrap();
        assert_eq!(take_one(&b), Datagram::Garbage, "a ring with a descriptor is not a ring");
        assert_eq!(take_one(&b), Datagram::Nothing);
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
        // A control socket refuses them where the kernel can (SO_PASSRIGHTS); queued anyway
        // (before a server could refuse them, or on an older kernel), a drain closes them.
        let (a, b) = control_pair();
        if crate::gift::refuse_rights(&b) {
            assert!(crate::seqpacket::send(&a, &[1], &[gifts[0].as_fd()]).is_err());
        }
        let (a, b) = control_pair();
        for g in &gifts {
            crate::seqpacket::send(&a, &[1], &[g.as_fd()]).unwrap();
        }
        drop(gifts);
        assert_eq!(gifts_open(), 0);
        let mut rounds = 0;
        while take_one(&b) != Datagram::Nothing {
            rounds += 1;
            assert!(rounds < 100);
        }
        assert_eq!(gifts_open(), 0, "a drain installed descriptors");
    }

    #[test]
    fn a_side_drains_its_self_bell_when_the_peer_had_not_rung() {
        let (a, b) = control_pair();
        let own = create().unwrap();
        ring(&own);
        ring_peer(&a);
        assert!(drain_side(&b, &own).rung);
        // The self ring is left for the next drain (the bells stay readable until then).
        assert!(drain_side(&b, &own).rung);
        assert!(!drain_side(&b, &own).rung);
        // Both at once, when asked.
        ring(&own);
        ring_peer(&a);
        assert!(drain_both(&b, &own).rung);
        assert!(!drain_side(&b, &own).rung, "drain_both left a ring");
        // The peer's end gone: our end is shut down, both ways.
        close_peer(a);
        assert!(drain_side(&b, &own).hung_up);
        assert!(hung_up(&b));
    }

    /// Makes `epoll_pwait2` fail with `ENOSYS` in the calling thread (and threads it starts), as
    /// a kernel before 5.11 or a seccomp filter refuses it.
    fn refuse_epoll_pwait2() {
        const LD_NR: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS: the syscall number (offset 0)
        const JEQ: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
        const RET: u16 = 0x06; // BPF_RET | BPF_K
        let code = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
        let mut filter = [
            code(LD_NR, 0, 0, 0),
            code(JEQ, 0, 1, libc::SYS_epoll_pwait2 as u32),
            code(RET, 0, 0, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
            code(RET, 0, 0, libc::SECCOMP_RET_ALLOW),
        ];
        let prog = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_mut_ptr() };
        // SAFETY: prctl with integer arguments; the filter outlives the call (the kernel copies it).
        unsafe {
            assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
            assert_eq!(libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog as *const libc::sock_fprog), 0);
        }
    }

    /// A stoppable sleep longer than `epoll_wait` takes in milliseconds (about 24.8 days), where
    /// `epoll_pwait2` is refused, sleeps until something rings: it never reports a ring nobody
    /// made (its caller would look, find nothing and sleep again at once, over and over).
    #[test]
    fn a_stoppable_sleep_of_weeks_sleeps_where_epoll_pwait2_is_refused() {
        let (a, b) = control_pair();
        let (ready, is_ready) = channel();
        let waiter = std::thread::spawn(move || {
            refuse_epoll_pwait2();
            let own = create().unwrap();
            let start = std::time::Instant::now();
            ready.send(()).unwrap();
            let w = wait_stoppable(&b, &own, None, Some(Duration::from_secs(30 * 24 * 3600)), 0).unwrap();
            (w, start.elapsed())
        });
        is_ready.recv().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        ring_peer(&a);
        let (w, slept) = within_10s("the stoppable sleep", move || waiter.join().unwrap());
        assert!(w.doorbell && !w.control && !w.interrupted, "{w:?}");
        assert!(slept >= Duration::from_millis(250), "woken after {slept:?}, before the ring");
    }

    #[test]
    fn the_readiness_fd_tells_rings_from_a_hang_up() {
        let (a, b) = control_pair();
        let own = create().unwrap();
        let r = Readiness::new(&b, &own, 0).unwrap();
        ring_peer(&a);
        let w = r.wait(Some(Duration::from_secs(10))).unwrap();
        assert!(w.doorbell && !w.control);
        assert!(drain_side(&b, &own).rung);
        ring(&own);
        let w = r.wait(Some(Duration::from_secs(10))).unwrap();
        assert!(w.doorbell && !w.control);
        assert!(drain_side(&b, &own).rung);
        close_peer(a);
        let w = r.wait(Some(Duration::from_secs(10))).unwrap();
        assert!(w.control);
    }
}
