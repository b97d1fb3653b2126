//! TCP sockets bound before they connect (a CARRIER client must know its 4-tuple first).

use rustix::fd::OwnedFd;
use rustix::net::{self, AddressFamily, SocketFlags, SocketType};
use std::io;
use std::net::{IpAddr, SocketAddr};

/// A TCP socket bound to `ip` and an ephemeral port; returns it with its local address.
pub fn bind_ephemeral(ip: IpAddr) -> io::Result<(OwnedFd, SocketAddr)> {
    let family = if ip.is_ipv4() { AddressFamily::INET } else { AddressFamily::INET6 };
    let fd = net::socket_with(family, SocketType::STREAM, SocketFlags::CLOEXEC, None)?;
    net::bind(&fd, &SocketAddr::new(ip, 0))?;
    let local = net::getsockname(&fd)?;
    let local = SocketAddr::try_from(local).map_err(|_| io::Error::other("bound address is not IP"))?;
    Ok((fd, local))
}

/// Connects a socket from [`bind_ephemeral`] (blocking).
pub fn connect(fd: &OwnedFd, addr: SocketAddr) -> io::Result<()> {
    Ok(net::connect(fd, &addr)?)
}

/// Waits until `fd` is writable, for at most `timeout` (`None`: no limit); returns whether it is.
pub fn wait_writable(fd: rustix::fd::BorrowedFd<'_>, timeout: Option<std::time::Duration>) -> io::Result<bool> {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let t = timeout.map(|d| Timespec { tv_sec: d.as_secs().min(i64::MAX as u64) as i64, tv_nsec: d.subsec_nanos().into() });
    let mut p = [PollFd::new(&fd, PollFlags::OUT)];
    loop {
        match poll(&mut p, t.as_ref()) {
            Ok(n) => return Ok(n > 0),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}
