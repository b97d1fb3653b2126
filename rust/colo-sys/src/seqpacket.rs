//! Abstract-namespace `SOCK_SEQPACKET` sockets: the rendezvous and the control connections
//! (spec/WIRE.md sections 2 and 3).

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::net::{
    self, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::time::Duration;

fn socket(nonblocking: bool) -> io::Result<OwnedFd> {
    let mut flags = SocketFlags::CLOEXEC;
    if nonblocking {
        flags |= SocketFlags::NONBLOCK;
    }
    Ok(net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, flags, None)?)
}

/// Binds and listens on the abstract name `name` (without the leading NUL). Non-blocking.
pub fn listen(name: &[u8]) -> io::Result<OwnedFd> {
    let fd = socket(true)?;
    net::bind(&fd, &SocketAddrUnix::new_abstract_name(name)?)?;
    net::listen(&fd, 4096)?;
    Ok(fd)
}

/// How long a connect waits for room in a listener's backlog. A colo listener's backlog is 4096
/// deep and its service thread drains it; one full for longer is a listener that does not
/// accept (another user may bind a name first and fill its backlog itself): the connect then
/// fails with `WouldBlock`, which callers take as no listener there.
const CONNECT_WAIT: Duration = Duration::from_millis(10);

/// A blocking socket whose connects wait at most [`CONNECT_WAIT`] for a backlog's room (the
/// timeout is `SO_SNDTIMEO`'s; this module's sends never wait anyway).
fn connecting_socket() -> io::Result<OwnedFd> {
    let fd = socket(false)?;
    // A client's control socket receives no descriptor, ever (answers and rings carry none):
    // refused before the connect, so that not even a listener that sends at once can queue one.
    crate::gift::refuse_rights(&fd);
    net::sockopt::set_socket_timeout(&fd, net::sockopt::Timeout::Send, Some(CONNECT_WAIT))?;
    Ok(fd)
}

/// Connects to the abstract name `name`. Blocking, for at most [`CONNECT_WAIT`] while its
/// listener's backlog is full (`WouldBlock` then); `ECONNREFUSED` when nobody listens.
pub fn connect(name: &[u8]) -> io::Result<OwnedFd> {
    let fd = connecting_socket()?;
    net::connect(&fd, &SocketAddrUnix::new_abstract_name(name)?)?;
    Ok(fd)
}

/// Connects to the first of the abstract names `names` that has a listener taking connections,
/// on one socket (a refused or timed-out connect leaves a Unix socket unconnected, ready for the
/// next name): the socket and the name's index, `None` when every name refused or kept its
/// backlog full for [`CONNECT_WAIT`]. Any other error ends the tries, with the index of the
/// name that met it.
pub fn connect_first<S: AsRef<[u8]>>(names: &[S]) -> Result<Option<(OwnedFd, usize)>, (io::Error, usize)> {
    let fd = connecting_socket().map_err(|e| (e, 0))?;
    for (i, name) in names.iter().enumerate() {
        let addr = SocketAddrUnix::new_abstract_name(name.as_ref()).map_err(|e| (e.into(), i))?;
        match net::connect(&fd, &addr) {
            Ok(()) => return Ok(Some((fd, i))),
            Err(rustix::io::Errno::CONNREFUSED | rustix::io::Errno::AGAIN) => {}
            Err(e) => return Err((e.into(), i)),
        }
    }
    Ok(None)
}

/// Connects to the abstract name `name` without blocking: `WouldBlock` when its listener's
/// backlog is full, `ECONNREFUSED` when nobody listens. The socket stays non-blocking.
pub fn connect_nonblocking(name: &[u8]) -> io::Result<OwnedFd> {
    let fd = socket(true)?;
    net::connect(&fd, &SocketAddrUnix::new_abstract_name(name)?)?;
    Ok(fd)
}

/// Whether `fd` is an `AF_UNIX`, `SOCK_SEQPACKET` socket (a control socket handed over across
/// `exec` must be one: it is rung and drained as a datagram socket).
pub fn is_seqpacket(fd: impl AsFd) -> bool {
    let fd = fd.as_fd();
    matches!(net::sockopt::socket_domain(fd), Ok(AddressFamily::UNIX)) && matches!(net::sockopt::socket_type(fd), Ok(SocketType::SEQPACKET))
}

/// Accepts one connection, non-blocking and close-on-exec; `WouldBlock` when none is pending.
pub fn accept(listener: impl AsFd) -> io::Result<OwnedFd> {
    Ok(net::accept_with(listener, SocketFlags::CLOEXEC | SocketFlags::NONBLOCK)?)
}

/// Sends one datagram with descriptors attached, without blocking whatever the socket's mode
/// (a full queue at the other end is an error, `EAGAIN`: a side sends at most one datagram on a
/// control socket, so only a peer that broke the protocol fills it).
pub fn send(fd: impl AsFd, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    net::sendmsg(fd, &[IoSlice::new(bytes)], &mut control, SendFlags::NOSIGNAL | SendFlags::DONTWAIT)?;
    Ok(())
}

/// One received datagram.
#[derive(Debug)]
pub struct Received {
    /// Bytes received (0 with no descriptors: the peer closed).
    pub len: usize,
    /// The datagram was longer than the buffer.
    pub truncated: bool,
    /// Descriptors that came with it, each [`crate::gift::disarm`]ed (a peer's:
    /// [`crate::gift::disarm_peer`]ed), and a Unix socket's queue taken
    /// ([`crate::gift::take_queued`]). Those still here when the datagram is dropped (a
    /// protocol error's, a refused HELLO's) are [`crate::gift::discard`]ed, if a peer sent them
    /// ([`recv`]); [`Received::take_fds`] takes them for use.
    pub fds: Vec<OwnedFd>,
    from_peer: bool,
}

impl Received {
    /// The descriptors, for use: no longer discarded with the datagram.
    pub fn take_fds(&mut self) -> Vec<OwnedFd> {
        std::mem::take(&mut self.fds)
    }
}

impl Drop for Received {
    fn drop(&mut self) {
        if self.from_peer {
            self.fds.drain(..).for_each(crate::gift::discard);
        }
    }
}

/// Receives one datagram into `buf`, with its descriptors (close-on-exec; room for all one
/// message can carry: the kernel would drop the others here, undisarmed). `dontwait` makes it
/// non-blocking whatever the socket's mode.
pub fn recv(fd: impl AsFd, buf: &mut [u8], dontwait: bool) -> io::Result<Received> {
    recv_from(fd, buf, dontwait, true)
}

/// [`recv`] from a socket only processes of our own lineage reach (the descriptors of an offer
/// one of them hands over, live sockets whose queues are not ours to take): descriptors are
/// disarmed, Unix sockets' queues left as they are.
pub fn recv_own(fd: impl AsFd, buf: &mut [u8], dontwait: bool) -> io::Result<Received> {
    recv_from(fd, buf, dontwait, false)
}

fn recv_from(fd: impl AsFd, buf: &mut [u8], dontwait: bool, from_peer: bool) -> io::Result<Received> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(crate::gift::MAX_RIGHTS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut flags = RecvFlags::CMSG_CLOEXEC;
    if dontwait {
        flags |= RecvFlags::DONTWAIT;
    }
    let msg = net::recvmsg(fd, &mut [IoSliceMut::new(buf)], &mut control, flags)?;
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = m {
            // A Unix socket (a gift in a HELLO's segment slot, or anywhere) may hold
            // descriptors in its queue that its close would release here: taken now.
            fds.extend(rights);
        }
    }
    if from_peer {
        crate::gift::disarm_peer(&mut fds);
        fds.iter().filter(|f| crate::gift::is_unix(f)).for_each(crate::gift::take_queued);
    } else {
        fds.iter().for_each(crate::gift::disarm);
    }
    Ok(Received {
        len: msg.bytes,
        truncated: msg.flags.contains(net::ReturnFlags::TRUNC) || msg.flags.contains(net::ReturnFlags::CTRUNC),
        fds,
        from_peer,
    })
}

/// Takes every datagram queued on a control socket, without blocking, so that descriptors a
/// peer queued (after its HELLO, before the socket refused them) are closed disarmed here
/// rather than released by its close (see `gift`); returns how many it took (a hang-up is not
/// one; a zero-length datagram is: `gift::mark_messages` tells them apart while this runs).
/// After 64 the socket is shut down both ways: what is queued then is all it will ever hold, so
/// a peer that keeps sending cannot keep the caller here, and a datagram with descriptors
/// behind any number of others is still taken here, never left for the close.
pub fn empty_before_close(fd: impl AsFd) -> usize {
    const BEFORE_SHUTDOWN: usize = 64;
    let fd = fd.as_fd();
    let marked = crate::gift::mark_messages(fd, true);
    let mut buf = [0u8; 16];
    let mut taken = 0;
    loop {
        if taken == BEFORE_SHUTDOWN {
            let _ = net::shutdown(fd, net::Shutdown::Both);
        }
        match crate::gift::take_one(fd, &mut buf, &mut crate::gift::discard) {
            Some(t) if !t.is_end() && (marked || t.bytes > 0 || t.rights > 0) => taken += 1,
            _ => break,
        }
    }
    if marked {
        // Later receives (the doorbell's drains) expect no credentials.
        crate::gift::mark_messages(fd, false);
    }
    taken
}

/// Closes a rendezvous connection that may still take descriptors (its HELLO never read):
/// it refuses them first, and what it holds is taken ([`empty_before_close`]), so that nothing a
/// peer queued is released by the close in this thread.
pub fn let_go(fd: OwnedFd) {
    crate::gift::refuse_rights(&fd);
    empty_before_close(&fd);
}

/// One datagram read by [`recv_answer`].
#[derive(Debug, Clone, Copy)]
pub struct Answer {
    /// Bytes received (0: the peer closed).
    pub len: usize,
    /// Truncated, or descriptors came along (closed disarmed here): not an answer.
    pub odd: bool,
    /// The sender's uid at its send, where the kernel attached it (`gift::mark_messages` was on
    /// then).
    pub sender_uid: Option<u32>,
}

/// Receives the answer to a HELLO (a datagram without descriptors) into `buf`, with its
/// sender's credentials if it carries them. `dontwait` makes it non-blocking whatever the
/// socket's mode.
pub fn recv_answer(fd: impl AsFd, buf: &mut [u8], dontwait: bool) -> io::Result<Answer> {
    let t = crate::gift::take(fd.as_fd(), buf, dontwait, &mut crate::gift::discard)?;
    Ok(Answer { len: t.bytes, odd: t.truncated || t.rights > 0, sender_uid: t.uid })
}

/// Sets a receive timeout on a blocking socket.
pub fn set_recv_timeout(fd: impl AsFd, timeout: Option<Duration>) -> io::Result<()> {
    Ok(net::sockopt::set_socket_timeout(fd, net::sockopt::Timeout::Recv, timeout)?)
}

/// The pid and uid of the process at the other end. An error for a process in a pid namespace
/// this one cannot see (the kernel reports pid 0): colo's pid-keyed records (parked segments,
/// listeners that answered, program tags) cannot tell such peers apart, so it is not used.
/// (Not rustix's `socket_peercred`, whose pid type cannot hold the 0.)
pub fn peer_cred(fd: impl AsFd) -> io::Result<(u32, u32)> {
    use rustix::fd::AsRawFd;
    let mut c = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED writes at most `len` bytes into `c`, a `ucred` we own; a raw system
    // call like rustix's.
    let r = unsafe {
        libc::syscall(
            libc::SYS_getsockopt,
            fd.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut c as *mut libc::ucred,
            &mut len as *mut libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    if c.pid <= 0 {
        return Err(io::Error::other("peer in a pid namespace this process cannot see"));
    }
    Ok((c.pid as u32, c.uid))
}

/// Which of `fds` have something to read or have hung up, in one `poll(2)` that does not wait
/// (all `true` if the call fails, so that a caller looks at each as it would without this).
/// A listener holds up to a thousand rendezvous connections whose client has said nothing; a
/// look at each (a `recv`, and the poll set's bookkeeping) for every TCP connection it accepts
/// would let any local user make every accept cost that many system calls.
pub fn with_data(fds: &[BorrowedFd<'_>]) -> Vec<bool> {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut p: Vec<PollFd<'_>> = fds.iter().map(|f| PollFd::new(f, PollFlags::IN)).collect();
    match poll(&mut p, Some(&Timespec { tv_sec: 0, tv_nsec: 0 })) {
        Ok(_) => p.iter().map(|x| !x.revents().is_empty()).collect(),
        Err(_) => vec![true; fds.len()],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer says who sent it only while credentials are asked for at its send; one with
    /// descriptors, or truncated, is no answer, and the descriptors are closed, not kept.
    #[test]
    fn an_answer_says_its_sender_and_keeps_no_descriptor() {
        let pair = || net::socketpair(net::AddressFamily::UNIX, net::SocketType::SEQPACKET, net::SocketFlags::CLOEXEC, None).unwrap();
        let (a, b) = pair();
        let mut buf = [0u8; 64];
        send(&b, b"before", &[]).unwrap();
        assert!(crate::gift::mark_messages(&a, true));
        send(&b, b"after", &[]).unwrap();
        let r = recv_answer(&a, &mut buf, true).unwrap();
        assert_eq!((r.len, r.odd, r.sender_uid), (6, false, None), "sent before the option: no sender");
        let r = recv_answer(&a, &mut buf, true).unwrap();
        assert_eq!((r.len, r.odd, r.sender_uid), (5, false, Some(rustix::process::getuid().as_raw())));
        let (rd, wr) = rustix::pipe::pipe().unwrap();
        send(&b, b"with", &[wr.as_fd()]).unwrap();
        drop(wr);
        let r = recv_answer(&a, &mut buf, true).unwrap();
        assert!(r.odd, "an answer with a descriptor");
        assert_eq!(rustix::io::read(&rd, &mut buf).unwrap(), 0, "the descriptor that came along is closed");
        send(&b, b"too long", &[]).unwrap();
        assert!(recv_answer(&a, &mut [0u8; 2], true).unwrap().odd, "truncated");
    }

    /// Whatever is queued on a control socket, descriptors behind a zero-length datagram or
    /// behind more datagrams than are taken before the shutdown, is taken before its close.
    #[test]
    fn a_control_socket_is_emptied_of_everything_before_its_close() {
        use crate::gift::tests::{closes, lingering};
        for (rings, zero) in [(1, true), (100, false)] {
            let (t, _peer, _l) = lingering(600);
            let (a, b) = net::socketpair(net::AddressFamily::UNIX, net::SocketType::SEQPACKET, net::SocketFlags::CLOEXEC, None).unwrap();
            for i in 0..rings {
                send(&a, if zero && i == 0 { &[] } else { &[1] }, &[]).unwrap();
            }
            send(&a, &[1], &[t.as_fd()]).unwrap();
            drop(t);
            let emptied = closes(move || {
                assert_eq!(empty_before_close(&b), rings + 1);
                drop(b);
            });
            assert!(emptied, "the close waited for a gift behind {rings} datagrams");
            if !zero {
                // Shut down once past its bound: nothing more is queued.
                assert!(send(&a, &[1], &[]).is_err());
            }
        }
    }

    #[test]
    fn connect_first_takes_the_first_name_listened_on_through_one_socket() {
        let base = format!("colo-test/connect-first/{}", std::process::id());
        let (none, second, third) = (format!("{base}/a"), format!("{base}/b"), format!("{base}/c"));
        assert!(matches!(connect_first(&[&none, &second]), Ok(None)), "nobody listens");
        let b = listen(second.as_bytes()).unwrap();
        let _c = listen(third.as_bytes()).unwrap();
        let (fd, i) = connect_first(&[&none, &second, &third]).unwrap().expect("a listener");
        assert_eq!(i, 1, "the first name listened on, after a refused one");
        let peer = accept(&b).expect("connected to the second name's listener");
        send(&fd, b"hi", &[]).unwrap();
        let mut buf = [0u8; 4];
        assert_eq!(net::recv(&peer, &mut buf, net::RecvFlags::empty()).unwrap().0, 2);
    }
}
