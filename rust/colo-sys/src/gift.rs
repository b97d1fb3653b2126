//! Descriptors another process passed us (`SCM_RIGHTS`). The last close of some files waits for
//! as long as the process that made them likes: a TCP socket with `SO_LINGER` on and bytes its
//! peer never takes waits up to its linger time, whatever `O_NONBLOCK` says, in the thread that
//! drops the last reference. The kernel drops a passed descriptor in the receiving thread too
//! when it discards it (a receive without room for it in a control buffer, the close of a socket
//! whose queue still holds it). A peer that hands us such a socket and closes its own copy could
//! so stop whichever of our threads drains a doorbell or reads a control socket (an event loop
//! under the shim: the whole server, plain TCP clients included).
//!
//! So: every receive on a socket a peer can write to has room for all the descriptors one message
//! can carry ([`MAX_RIGHTS`]); each one received is disarmed ([`disarm`]: lingering off) before
//! anything closes it; a Unix socket we do not keep is shut down and emptied before its close
//! ([`discard`]: its queue may hold such a socket, at any depth); and the sockets a peer reaches
//! us through refuse descriptors ([`refuse_rights`]) once nothing is expected on them (the kernel
//! then refuses the sender's `sendmsg`): a client's control socket from the start, a server's
//! once the HELLO is read. Each end of a control socket is its own process's, so only our own
//! processes could turn that back on; a control socket found taking descriptors at its close is
//! shut down first (`doorbell::empty_before_close`). The sender may keep a reference of its own
//! and turn lingering back on after our disarm (then close its reference, leaving ours the
//! last): so the last reference of a peer's socket other than a Unix one is left to a thread of
//! our own that ends at once ([`disarm_peer`]; an exiting thread's close never lingers). Any other
//! file whose close may wait on its file system (a FUSE file's flush waits for its server,
//! and any user may mount one in a user namespace of its own) is closed by a closer thread
//! (`close_passed`). Not covered: on kernels without
//! `SO_PASSRIGHTS` (before Linux 6.16), descriptors that arrive on a control socket after our
//! last drain of it and before its close.

use rustix::fd::{AsFd, AsRawFd, OwnedFd};

/// The most descriptors one message carries (the kernel's `SCM_MAX_FD`).
pub const MAX_RIGHTS: usize = 253;

/// `SO_PASSRIGHTS` (Linux 6.16; the same number on every architecture's generic socket options).
const SO_PASSRIGHTS: libc::c_int = 83;

/// Makes the last close of `fd`, a descriptor a peer passed us, return at once as far as `fd`
/// itself goes: a socket's lingering is turned off (`SO_LINGER` with `l_onoff` 0; its queued
/// bytes are then sent, or not, in the background, as after any close). Anything else is left as
/// it is: what a Unix socket's queue holds is [`take_queued`]'s and [`discard`]'s.
pub fn disarm(fd: impl AsFd) {
    let _ = rustix::net::sockopt::set_socket_linger(fd, None);
}

/// [`disarm`]s the descriptors a peer passed us in one message (and may still hold), and makes
/// sure their last close by this process never waits: lingering is a socket's own setting,
/// which the peer can turn back on through its reference at any moment after the disarm, then
/// close that reference, leaving ours the last. So the references of sockets other than Unix
/// ones (those do not linger) are moved to a thread of our own that ends at once
/// ([`hand_to_ending_thread`]), and their numbers then name a stand-in: an eventfd, which is no
/// segment and closes at once.
pub fn disarm_peer(fds: &mut [OwnedFd]) {
    let mut sockets = Vec::new();
    for (i, fd) in fds.iter().enumerate() {
        match rustix::net::sockopt::socket_domain(fd) {
            Ok(rustix::net::AddressFamily::UNIX) => disarm(fd),
            Ok(_) => {
                disarm(fd);
                sockets.push(i);
            }
            Err(_) => {} // not a socket: no linger
        }
    }
    if !sockets.is_empty() {
        hand_to_ending_thread(fds, &sockets);
    }
}

/// Replaces `fds[i]` for each `i` of `which` by an eventfd after a thread of our own, with a
/// copy of the descriptor table of its own (`unshare(CLONE_FILES)`), has taken a reference to
/// their files; that thread then ends, its table with it: a last close made by an exiting
/// thread never lingers (the kernel gives a socket's close no linger time in a task that is
/// exiting). Where no thread or stand-in can be had, they stay as they are (disarmed).
fn hand_to_ending_thread(fds: &mut [OwnedFd], which: &[usize]) {
    use rustix::event::{eventfd, EventfdFlags};
    let Ok(stand_in) = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK) else { return };
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel::<bool>(1);
    let (done_tx, done_rx) = std::sync::mpsc::sync_channel::<()>(1);
    let spawned = crate::host::spawn("colo-gift-end", move || {
        // SAFETY: unshare(CLONE_FILES) gives this thread its own copy of the descriptor table
        // (every descriptor's file gains a reference, dropped when the thread ends); it reads
        // and writes no memory of ours.
        let own = unsafe { libc::unshare(libc::CLONE_FILES) } == 0;
        let _ = ready_tx.send(own);
        if own {
            // Until the numbers name the stand-in (the sender dropped): then this thread's
            // references may be the last, and go with its table as it ends.
            let _ = done_rx.recv();
        }
    });
    if spawned.is_err() || ready_rx.recv() != Ok(true) {
        return;
    }
    for &i in which {
        let _ = rustix::io::dup3(&stand_in, &mut fds[i], rustix::io::DupFlags::CLOEXEC);
    }
    drop(done_tx);
}

/// Whether the Unix socket `fd` takes descriptors (`SO_PASSRIGHTS` reads 1). False where the
/// kernel does not know the option.
pub fn rights_on(fd: impl AsFd) -> bool {
    let mut on: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes at `&mut on`, an int we own; `fd` is open.
    let r = unsafe {
        libc::getsockopt(fd.as_fd().as_raw_fd(), libc::SOL_SOCKET, SO_PASSRIGHTS, &mut on as *mut libc::c_int as *mut libc::c_void, &mut len)
    };
    r == 0 && on != 0
}

/// How many Unix sockets one [`discard`] empties in the calling thread, and how many descriptors
/// it takes from their queues there; a thread of its own empties the rest.
const INLINE_SOCKETS: usize = 16;
const INLINE_RIGHTS: usize = 512;

/// Closes a descriptor a peer passed us and we do not keep, so that its close returns at once:
/// [`disarm`]ed first, and a Unix socket emptied first ([`empty`]), with whatever its queue holds
/// closed the same way (a Unix socket's release releases its queue's descriptors in the closing
/// thread, and one of them may be a lingering socket, or another Unix socket holding one). Deep
/// or wide nesting is emptied by a thread of its own beyond [`INLINE_SOCKETS`] sockets or
/// [`INLINE_RIGHTS`] descriptors, so a peer cannot keep the caller busy either.
pub fn discard(fd: OwnedFd) {
    disarm(&fd);
    if !is_unix(&fd) {
        return close_passed(fd);
    }
    let rest = empty_all(vec![fd], INLINE_SOCKETS, INLINE_RIGHTS);
    if rest.is_empty() {
        return;
    }
    // Signals blocked: the application's handlers never run on this thread. Should no thread
    // start, the closure, and with it the rest, is dropped here (the one case that may wait).
    let _ = crate::host::spawn("colo-gifts", move || {
        let _ = empty_all(rest, usize::MAX, usize::MAX);
    });
}

/// Closes `fd`, a descriptor a peer passed us that is not a Unix socket. Every close of a file
/// calls its file system's flush, and a FUSE file's waits for its FUSE server's answer: any user
/// may mount one (in a user namespace of its own) and pass us a file of it, whose close would
/// hold the thread that makes it (a listener's service thread refusing a HELLO) for as long as
/// that user likes. So only a file of the kernel's own in-memory file systems (a memfd, a pipe,
/// a socket, an eventfd) is closed here; any other by a closer thread, at most
/// [`MAX_SLOW_CLOSERS`] at once, the rest queued for them.
fn close_passed(fd: OwnedFd) {
    if closes_at_once(&fd) {
        return drop(fd);
    }
    let mut slow = SLOW_CLOSES.lock().unwrap_or_else(|e| e.into_inner());
    if slow.running >= MAX_SLOW_CLOSERS {
        return slow.queue.push(fd);
    }
    slow.running += 1;
    drop(slow);
    // Should no thread start, the closure, and `fd` with it, is dropped here (the one case
    // that may wait), and the count is given back.
    let started = crate::host::spawn("colo-close", move || close_queued(fd));
    if started.is_err() {
        SLOW_CLOSES.lock().unwrap_or_else(|e| e.into_inner()).running -= 1;
    }
}

/// Whether `fd`'s file is one of the kernel's in-memory file systems' (tmpfs, a memfd's; pipefs;
/// sockfs; anon_inodefs, an eventfd's), whose close never waits on another process. A HELLO's
/// segment that is not is refused with its descriptors still in the datagram, which discards
/// them ([`crate::seqpacket::Received`]): any other file's plain close may wait (a FUSE file's).
pub fn closes_at_once(fd: impl AsFd) -> bool {
    // statfs(2)'s f_type of tmpfs, pipefs, sockfs and anon_inodefs.
    const IN_MEMORY: [i64; 4] = [0x0102_1994, 0x5049_5045, 0x534F_434B, 0x0904_1934];
    #[allow(clippy::unnecessary_cast, reason = "f_type is i64 on 64-bit Linux, narrower elsewhere")]
    rustix::fs::fstatfs(fd).is_ok_and(|fs| IN_MEMORY.contains(&(fs.f_type as i64)))
}

/// How many closer threads [`close_passed`] runs at once (each one waiting holds a thread).
const MAX_SLOW_CLOSERS: usize = 64;

/// The descriptors [`close_passed`] left to closer threads, and how many of those run.
struct SlowCloses {
    queue: Vec<OwnedFd>,
    running: usize,
}

static SLOW_CLOSES: std::sync::Mutex<SlowCloses> = std::sync::Mutex::new(SlowCloses { queue: Vec::new(), running: 0 });

/// A closer thread: closes `fd`, then the queued descriptors one by one until none is left.
fn close_queued(mut fd: OwnedFd) {
    loop {
        drop(fd);
        let mut slow = SLOW_CLOSES.lock().unwrap_or_else(|e| e.into_inner());
        match slow.queue.pop() {
            Some(next) => fd = next,
            None => {
                slow.running -= 1;
                return;
            }
        }
    }
}

/// Takes what a Unix socket a peer passed us has queued, without shutting it down, as it is
/// received (whatever becomes of it later, a plain close then releases nothing): it refuses
/// descriptors from now on ([`refuse_rights`]), and every descriptor queued before is
/// [`discard`]ed (bytes are dropped). At most `MAX_TAKES` receives.
pub fn take_queued(u: impl AsFd) {
    const MAX_TAKES: usize = 1024;
    let u = u.as_fd();
    refuse_rights(u);
    // A zero-length datagram is not the end (see `empty`).
    let stream = rustix::net::sockopt::socket_type(u).map_or(true, |t| t == rustix::net::SocketType::STREAM);
    let marked = !stream && mark_messages(u, true);
    let mut buf = [0u8; 256];
    for _ in 0..MAX_TAKES {
        let Some(t) = take_one(u, &mut buf, &mut discard) else { break };
        if t.is_end() || (!marked && t.bytes == 0 && t.rights == 0) {
            break;
        }
    }
}

/// Whether `fd` is a Unix socket.
pub fn is_unix(fd: impl AsFd) -> bool {
    matches!(rustix::net::sockopt::socket_domain(fd), Ok(rustix::net::AddressFamily::UNIX))
}

/// Empties and closes the Unix sockets of `work` and those found in their queues, at most
/// `sockets` of them and `rights` descriptors taken; returns those left (emptied in part or not
/// at all).
fn empty_all(mut work: Vec<OwnedFd>, sockets: usize, rights: usize) -> Vec<OwnedFd> {
    let (mut done, mut taken) = (0, 0);
    while let Some(u) = work.pop() {
        if done >= sockets || taken >= rights {
            work.push(u);
            return work;
        }
        match empty(&u, &mut work, rights - taken) {
            Some(n) => {
                taken += n;
                done += 1;
                drop(u);
            }
            None => {
                work.push(u);
                return work;
            }
        }
    }
    work
}

/// Shuts `u`, a Unix socket a peer passed us, down both ways (from then on the kernel refuses to
/// queue anything on it, and to connect to it, whoever asks, so what is taken here is all it will
/// ever hold), then takes what it holds: each descriptor is [`disarm`]ed, and a Unix socket among
/// them goes to `work`, anything else is closed; a listening socket's pending connections go to
/// `work`. Returns how many descriptors it took, or `None` if it stopped at `max` with more
/// queued (the rest are taken by a later call).
fn empty(u: &OwnedFd, work: &mut Vec<OwnedFd>, max: usize) -> Option<usize> {
    use rustix::net::SocketFlags;
    // Before the shutdown: every datagram taken from now on carries credentials, so a
    // zero-length one (with descriptors queued behind it) is not taken for the end. (A stream
    // queues nothing for a zero-length send, and its end carries credentials too.)
    let stream = rustix::net::sockopt::socket_type(u).map_or(true, |t| t == rustix::net::SocketType::STREAM);
    let marked = !stream && mark_messages(u, true);
    let _ = rustix::net::shutdown(u, rustix::net::Shutdown::Both);
    let mut taken = 0;
    if rustix::net::sockopt::socket_acceptconn(u).unwrap_or(false) {
        while let Ok(c) = rustix::net::accept_with(u, SocketFlags::CLOEXEC | SocketFlags::NONBLOCK) {
            work.push(c);
            taken += 1;
            if taken >= max {
                return None;
            }
        }
        return Some(taken);
    }
    let mut buf = [0u8; 256];
    loop {
        if taken >= max {
            return None;
        }
        let Some(t) = take_one(u.as_fd(), &mut buf, &mut |f| {
            if is_unix(&f) {
                work.push(f);
            } else {
                close_passed(f);
            }
        }) else {
            break;
        };
        taken += t.rights;
        if t.is_end() || (!marked && t.bytes == 0 && t.rights == 0) {
            break;
        }
    }
    Some(taken)
}

/// Turns `SO_PASSCRED` on or off on the Unix socket `u`; false if the kernel refused. While it
/// is on, every message received carries its sender's credentials, a zero-length datagram too,
/// and the end of a shut-down socket carries none: [`Took::is_end`] tells them apart (`recv`
/// returns 0 for both). Not for a stream socket, whose end carries credentials too (and which
/// queues nothing for a zero-length send).
///
/// Each message then also says who sent it ([`Took::uid`]), as the kernel vouches for it (a
/// process may name only one of its own uids, or any with `CAP_SETUID`). A socket without an
/// address that sends while it is on is given one (autobind).
pub fn mark_messages(u: impl AsFd, on: bool) -> bool {
    rustix::net::sockopt::set_socket_passcred(u, on).is_ok()
}

/// What one [`take_one`] received.
#[derive(Debug, Clone, Copy)]
pub struct Took {
    /// Bytes received.
    pub bytes: usize,
    /// Descriptors that came along.
    pub rights: usize,
    /// Credentials came along ([`mark_messages`]).
    pub marked: bool,
    /// The sender's uid at its send, where the kernel attached credentials (a message sent
    /// while [`mark_messages`] was off comes with pid 0: none).
    pub uid: Option<u32>,
    /// The datagram or its control messages did not fit (`MSG_TRUNC`, `MSG_CTRUNC`).
    pub truncated: bool,
}

impl Took {
    /// Nothing came: the end of a socket shut down or hung up (a datagram, a zero-length one
    /// too, brings credentials where [`mark_messages`] is on).
    pub fn is_end(&self) -> bool {
        self.bytes == 0 && self.rights == 0 && !self.marked
    }
}

/// Receives one message from the Unix socket `u` without blocking, its bytes into `buf` (the
/// rest of a longer datagram is dropped), with room for every descriptor one message carries and
/// for credentials; each descriptor that came along is [`disarm_peer`]ed and handed to `each`.
/// `None`: nothing was received (`EAGAIN`, an error).
pub fn take_one(u: rustix::fd::BorrowedFd<'_>, buf: &mut [u8], each: &mut dyn FnMut(OwnedFd)) -> Option<Took> {
    take(u, buf, true, each).ok()
}

/// [`take_one`], waiting as the socket's mode says unless `dontwait`, with the error. (Not
/// rustix's ancillary parser: the kernel reports credentials it did not attach with pid 0,
/// which rustix's `Pid` cannot hold.)
pub fn take(u: rustix::fd::BorrowedFd<'_>, buf: &mut [u8], dontwait: bool, each: &mut dyn FnMut(OwnedFd)) -> std::io::Result<Took> {
    use rustix::fd::FromRawFd;
    const WORDS: usize =
        (rustix::cmsg_space!(ScmRights(MAX_RIGHTS)) + rustix::cmsg_space!(ScmCredentials(1))).div_ceil(8);
    let mut space = [0u64; WORDS];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: an all-zero msghdr is a valid value (null pointers, zero lengths).
    let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
    h.msg_iov = &mut iov;
    h.msg_iovlen = 1;
    h.msg_control = space.as_mut_ptr().cast();
    h.msg_controllen = (WORDS * 8) as _;
    // SAFETY: `h` names one iovec of `buf` and the control buffer `space`, both alive for the call.
    let n = unsafe { libc::recvmsg(u.as_raw_fd(), &mut h, libc::MSG_CMSG_CLOEXEC | if dontwait { libc::MSG_DONTWAIT } else { 0 }) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let truncated = h.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0;
    let mut took = Took { bytes: n as usize, rights: 0, marked: false, uid: None, truncated };
    let mut got = Vec::new();
    // SAFETY: the kernel filled `h`'s control buffer (msg_controllen bytes) with well-formed
    // control messages; CMSG_FIRSTHDR/NXTHDR stay inside it.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&h);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<libc::c_int>();
                let count = ((*c).cmsg_len as usize - (data as usize - c as usize)) / std::mem::size_of::<libc::c_int>();
                for k in 0..count {
                    // SAFETY: each int of an SCM_RIGHTS message is a descriptor the kernel just
                    // installed for us, owned by nobody else.
                    got.push(OwnedFd::from_raw_fd(data.add(k).read_unaligned()));
                }
            } else if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_CREDENTIALS {
                took.marked = true;
                if (*c).cmsg_len as usize >= libc::CMSG_LEN(std::mem::size_of::<libc::ucred>() as u32) as usize {
                    let cred = libc::CMSG_DATA(c).cast::<libc::ucred>().read_unaligned();
                    took.uid = (cred.pid > 0).then_some(cred.uid);
                }
            }
            c = libc::CMSG_NXTHDR(&h, c);
        }
    }
    disarm_peer(&mut got);
    took.rights = got.len();
    got.into_iter().for_each(each);
    Ok(took)
}

/// Makes the Unix socket `fd` refuse descriptors from now on (`SO_PASSRIGHTS` 0: a sender's
/// `sendmsg` with `SCM_RIGHTS` fails with `EPERM`). False where the kernel does not know the
/// option (before Linux 6.16): descriptors then still arrive, and are disarmed as they are taken.
pub fn refuse_rights(fd: impl AsFd) -> bool {
    let off: libc::c_int = 0;
    // SAFETY: setsockopt reads `size_of::<c_int>()` bytes at `&off`, an int we own; `fd` is open.
    unsafe {
        libc::setsockopt(
            fd.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PASSRIGHTS,
            &off as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        ) == 0
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Write;
    use std::time::Duration;

    /// A TCP socket whose last close would wait `secs` seconds: bytes queued that its peer
    /// (returned, kept open) never reads, and lingering on.
    pub(crate) fn lingering(secs: i32) -> (OwnedFd, std::net::TcpStream, std::net::TcpListener) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let t = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (peer, _) = l.accept().unwrap();
        rustix::net::sockopt::set_socket_recv_buffer_size(&peer, 4096).unwrap();
        rustix::net::sockopt::set_socket_send_buffer_size(&t, 4096).unwrap();
        t.set_nonblocking(true).unwrap();
        while (&t).write(&[0u8; 65536]).is_ok() {}
        let t = OwnedFd::from(t);
        rustix::net::sockopt::set_socket_linger(&t, Some(Duration::from_secs(secs as u64))).unwrap();
        (t, peer, l)
    }

    /// Closes `fd` on a thread of its own; whether it finished within the watchdog (the linger
    /// is ten times longer, so a close that waits for it never does).
    pub(crate) fn closes(f: impl FnOnce() + Send + 'static) -> bool {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            f();
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(60)).is_ok()
    }

    #[test]
    fn a_disarmed_lingering_socket_closes_at_once() {
        let (t, _peer, _l) = lingering(600);
        assert!(closes(move || discard(t)), "the close waited for the linger");
    }

    /// A Unix socket whose queue holds `fd` (closed here), and nothing else refers to.
    fn holding(fd: OwnedFd) -> OwnedFd {
        let (u, w) = unix_pair();
        crate::seqpacket::send(&w, &[1], &[fd.as_fd()]).unwrap();
        u
    }

    #[test]
    fn a_unix_socket_holding_a_lingering_one_is_discarded_at_once() {
        let (t, _peer, _l) = lingering(600);
        let u = holding(t);
        assert!(closes(move || discard(u)), "the close waited for the linger one level down");
    }

    #[test]
    fn a_chain_deeper_than_the_inline_budget_is_discarded_at_once() {
        let (t, _peer, _l) = lingering(600);
        let mut u = holding(t);
        for _ in 0..INLINE_SOCKETS * 3 {
            u = holding(u);
        }
        assert!(closes(move || discard(u)), "the close waited for the linger at the chain's bottom");
    }

    /// A zero-length datagram reads as the end of a shut-down socket to `recv`; the descriptors
    /// queued behind it are taken all the same.
    /// A seqpacket socket whose queue holds a zero-length datagram, then a lingering socket (its
    /// peer and listener kept in the second and third values).
    fn empty_then_gift() -> (OwnedFd, impl Sized) {
        let (t, peer, l) = lingering(600);
        let (u, w) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        crate::seqpacket::send(&w, &[], &[]).unwrap();
        crate::seqpacket::send(&w, &[1], &[t.as_fd()]).unwrap();
        (u, (peer, l, w))
    }

    #[test]
    fn a_zero_length_datagram_does_not_hide_what_follows() {
        let (u, _kept) = empty_then_gift();
        assert!(closes(move || discard(u)), "the close waited for the linger behind a zero-length datagram");
        // Taken as it is received, then closed plainly (a HELLO's descriptor that is no memfd).
        let (u, _kept) = empty_then_gift();
        assert!(
            closes(move || {
                take_queued(&u);
                drop(u);
            }),
            "a plain close after take_queued waited for the linger behind a zero-length datagram"
        );
    }

    /// A connected pair of Unix stream sockets.
    fn unix_pair() -> (OwnedFd, OwnedFd) {
        rustix::net::socketpair(rustix::net::AddressFamily::UNIX, rustix::net::SocketType::STREAM, rustix::net::SocketFlags::CLOEXEC, None)
            .unwrap()
    }

    /// The sender of a lingering socket keeps its own reference, turns lingering back on after
    /// our disarm and closes its reference: ours is then the last, and its close (a plain drop,
    /// as of a refused HELLO's descriptor) must not wait. Received by [`take_one`] and by
    /// `seqpacket::recv`.
    #[test]
    fn a_socket_its_sender_arms_again_closes_at_once() {
        for by_recv in [false, true] {
            let (t, _peer, _l) = lingering(600);
            let (a, b) = unix_pair();
            crate::seqpacket::send(&a, &[1], &[t.as_fd()]).unwrap();
            let got = if by_recv {
                crate::seqpacket::recv(&b, &mut [0u8; 8], true).unwrap().take_fds()
            } else {
                let mut got = Vec::new();
                take_one(b.as_fd(), &mut [0u8; 8], &mut |f| got.push(f)).unwrap();
                got
            };
            assert_eq!(got.len(), 1);
            rustix::net::sockopt::set_socket_linger(&t, Some(Duration::from_secs(600))).unwrap();
            // The sender's close, on a thread of its own: once our hand-off's thread has ended,
            // it is the last and waits out the linger (the sender's cost, as it should be).
            // Ours comes after its descriptor is gone (a number another test may reuse: then
            // after a bounded wait).
            let n = t.as_raw_fd();
            std::thread::spawn(move || drop(t));
            let until = std::time::Instant::now() + Duration::from_secs(5);
            // SAFETY: F_GETFD on a number only asks whether it is open.
            while unsafe { libc::fcntl(n, libc::F_GETFD) } >= 0 && std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(closes(move || drop(got)), "our close waited for the linger its sender set again (by_recv {by_recv})");
        }
    }

    #[test]
    fn a_socket_that_refuses_rights_gets_none() {
        let (a, b) = unix_pair();
        if !refuse_rights(&b) {
            return; // a kernel before 6.16
        }
        let e = crate::seqpacket::send(&a, &[1], &[a.as_fd()]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));
        crate::seqpacket::send(&a, &[1], &[]).unwrap();
    }
}
