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
//! anything closes it; and the sockets a peer reaches us through refuse descriptors
//! ([`refuse_rights`]) once nothing is expected on them (the kernel then refuses the sender's
//! `sendmsg`). Not covered: a file whose close waits for something else (a FUSE file's flush:
//! mounting one needs `fusermount`), a Unix socket passed to us whose own queue holds such a
//! socket (its close releases what it holds), and, on kernels without `SO_PASSRIGHTS` (before
//! Linux 6.16), descriptors that arrive on a doorbell or control socket after our last drain of
//! it and before its close.

use rustix::fd::{AsFd, AsRawFd, OwnedFd};

/// The most descriptors one message carries (the kernel's `SCM_MAX_FD`).
pub const MAX_RIGHTS: usize = 253;

/// `SO_PASSRIGHTS` (Linux 6.16; the same number on every architecture's generic socket options).
const SO_PASSRIGHTS: libc::c_int = 83;

/// Makes the last close of `fd`, a descriptor a peer passed us, return at once: a socket's
/// lingering is turned off (`SO_LINGER` with `l_onoff` 0; its queued bytes are then sent, or not,
/// in the background, as after any close). Anything else is left as it is.
pub fn disarm(fd: impl AsFd) {
    let _ = rustix::net::sockopt::set_socket_linger(fd, None);
}

/// Closes a descriptor a peer passed us, [`disarm`]ed first.
pub fn discard(fd: OwnedFd) {
    disarm(&fd);
    drop(fd);
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

    #[test]
    fn a_socket_that_refuses_rights_gets_none() {
        let (a, b) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::STREAM,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        if !refuse_rights(&b) {
            return; // a kernel before 6.16
        }
        let e = crate::seqpacket::send(&a, &[1], &[a.as_fd()]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));
        crate::seqpacket::send(&a, &[1], &[]).unwrap();
    }
}
