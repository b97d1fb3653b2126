//! TCP sockets bound before they connect (a CARRIER client must know its 4-tuple first).

use rustix::fd::OwnedFd;
use rustix::net::{self, AddressFamily, SocketFlags, SocketType};
use std::io;
use std::net::{IpAddr, SocketAddr};

/// The source address the kernel gives a connection to `dst` (127.0.0.1 for 127.0.0.2, as the
/// loopback route says), found once per destination with a connected UDP socket and cached.
pub fn source_for(dst: IpAddr) -> IpAddr {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static CACHE: Mutex<Option<HashMap<IpAddr, IpAddr>>> = Mutex::new(None);
    if let Some(src) = CACHE.try_lock().ok().and_then(|c| c.as_ref().and_then(|m| m.get(&dst).copied())) {
        return src;
    }
    let family = if dst.is_ipv4() { AddressFamily::INET } else { AddressFamily::INET6 };
    let asked = net::socket_with(family, SocketType::DGRAM, SocketFlags::CLOEXEC, None)
        .and_then(|u| net::connect(&u, &SocketAddr::new(dst, 9)).map(|()| u))
        .and_then(|u| net::getsockname(&u));
    let src = asked.ok().and_then(|a| SocketAddr::try_from(a).ok()).map_or(dst, |a| a.ip());
    // Not waited for (a fork child may inherit it held): without it, the answer is not kept.
    if let Ok(mut cache) = CACHE.try_lock() {
        let map = cache.get_or_insert_with(HashMap::new);
        if map.len() < 1024 {
            map.insert(dst, src);
        }
    }
    src
}

/// The ephemeral port range (`ip_local_port_range`), read once.
fn port_range() -> (u16, u16) {
    static R: std::sync::OnceLock<(u16, u16)> = std::sync::OnceLock::new();
    *R.get_or_init(|| {
        let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
        let mut it = text.split_whitespace().filter_map(|w| w.parse::<u16>().ok());
        match (it.next(), it.next()) {
            (Some(lo), Some(hi)) if lo <= hi => (lo, hi),
            _ => (32768, 60999),
        }
    })
}

/// `ip_local_reserved_ports` (ranges the kernel never hands out on its own), read once.
fn reserved_ports() -> &'static [(u16, u16)] {
    static R: std::sync::OnceLock<Vec<(u16, u16)>> = std::sync::OnceLock::new();
    R.get_or_init(|| {
        let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_reserved_ports").unwrap_or_default();
        text.trim()
            .split(',')
            .filter_map(|r| {
                let (a, b) = r.split_once('-').unwrap_or((r, r));
                Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
            })
            .collect()
    })
}

/// Ports tried by [`bind_ephemeral_to`] before it gives up.
const BIND_TRIES: u32 = 16;

/// Binds `fd` to `ip` and a free ephemeral port, known before `connect` (a CARRIER client keys
/// its offer by the 4-tuple). Random ports are tried rather than the kernel's `bind(ip, 0)`: a
/// port left in TIME_WAIT by a plain connection cannot be bound again (only `connect` may reuse
/// it), and on a host that churns loopback connections the kernel's search through a range
/// full of them takes milliseconds before it fails. `AddrInUse` after `BIND_TRIES` ports.
/// Returns the port bound (the local address is `ip` and it).
///
/// `SO_REUSEADDR`/`SO_REUSEPORT` of the application's socket are off during the bind: with them,
/// an explicit port may be shared with another connected socket (which `bind(ip, 0)` never does),
/// and a `connect` to the same destination would then fail.
pub fn bind_ephemeral_to(fd: rustix::fd::BorrowedFd<'_>, ip: IpAddr) -> io::Result<u16> {
    use net::sockopt::{set_socket_reuseaddr, set_socket_reuseport, socket_reuseaddr, socket_reuseport};
    let (addr, port) = (socket_reuseaddr(fd).unwrap_or(false), socket_reuseport(fd).unwrap_or(false));
    if addr {
        set_socket_reuseaddr(fd, false)?;
    }
    if port {
        set_socket_reuseport(fd, false)?;
    }
    let r = bind_random_port(fd, ip);
    if addr {
        set_socket_reuseaddr(fd, true)?;
    }
    if port {
        set_socket_reuseport(fd, true)?;
    }
    r
}

fn bind_random_port(fd: rustix::fd::BorrowedFd<'_>, ip: IpAddr) -> io::Result<u16> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEED: AtomicU64 = AtomicU64::new(0);
    let (lo, hi) = port_range();
    let span = u64::from(hi - lo) + 1;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let mut x = SEED.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed) ^ now ^ u64::from(std::process::id()) << 32;
    for _ in 0..BIND_TRIES {
        // splitmix64: a different port each try, and across threads and processes.
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // Odd, as the kernel's own `bind(ip, 0)` prefers: its `connect` takes even ports first,
        // and leaves them in TIME_WAIT by the thousand on a host that churns connections.
        let port = (lo + (z % span) as u16) | 1;
        if port > hi || reserved_ports().iter().any(|&(a, b)| (a..=b).contains(&port)) {
            continue;
        }
        match net::bind(fd, &SocketAddr::new(ip, port)) {
            Ok(()) => return Ok(port),
            Err(rustix::io::Errno::ADDRINUSE) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(io::Error::new(io::ErrorKind::AddrInUse, "no free ephemeral port among those tried"))
}

/// A TCP socket bound to the source address the kernel would choose for `dst` and an ephemeral
/// port; returns it with its local address.
pub fn bind_ephemeral(dst: IpAddr) -> io::Result<(OwnedFd, SocketAddr)> {
    let ip = source_for(dst);
    let family = if ip.is_ipv4() { AddressFamily::INET } else { AddressFamily::INET6 };
    let fd = net::socket_with(family, SocketType::STREAM, SocketFlags::CLOEXEC, None)?;
    let port = bind_ephemeral_to(rustix::fd::AsFd::as_fd(&fd), ip)?;
    Ok((fd, SocketAddr::new(ip, port)))
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

/// Makes the last close of `fd` reset the connection (`SO_LINGER {1, 0}`): its port is free at
/// once, never held in TIME_WAIT.
pub fn reset_on_close(fd: rustix::fd::BorrowedFd<'_>) -> io::Result<()> {
    Ok(rustix::net::sockopt::set_socket_linger(fd, Some(std::time::Duration::ZERO))?)
}

/// Whether `sock`, a TCP socket bound to an IPv6 address, has `IPV6_V6ONLY` set (it then takes
/// no IPv4 connections); false for an IPv4 socket or when the option cannot be read.
pub fn v6only(sock: impl rustix::fd::AsFd) -> bool {
    net::sockopt::ipv6_v6only(sock).unwrap_or(false)
}

/// Sets `SO_RCVLOWAT` on the TCP socket `fd`: poll and epoll report it readable only once `n`
/// bytes are queued (or the stream ended, or failed). 1 is the default.
pub fn set_rcvlowat(fd: rustix::fd::BorrowedFd<'_>, n: usize) -> io::Result<()> {
    let v = libc::c_int::try_from(n).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `fd` is a borrowed, open descriptor; `v` is a c_int that lives across the call,
    // and its size is the length given.
    let r = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            std::ptr::from_ref(&v).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The socket's `SO_RCVLOWAT` (an accepted socket's is its listener's), at least 1 (the kernel
/// reads 0 as 1); `None` if it cannot be read.
pub fn rcvlowat(fd: rustix::fd::BorrowedFd<'_>) -> Option<usize> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes at `&mut v`, a c_int we own; `fd` is open.
    let r = unsafe {
        libc::getsockopt(std::os::fd::AsRawFd::as_raw_fd(&fd), libc::SOL_SOCKET, libc::SO_RCVLOWAT, std::ptr::from_mut(&mut v).cast(), &mut len)
    };
    (r == 0).then(|| v.max(1) as usize)
}

/// Whether the peer of the connected TCP socket `fd` ended its stream (its FIN came, or the
/// connection failed): no more bytes will be queued. One look, no wait.
pub fn peer_ended(fd: rustix::fd::BorrowedFd<'_>) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut p = [PollFd::new(&fd, PollFlags::RDHUP)];
    matches!(poll(&mut p, Some(&Timespec::default())), Ok(1)) && p[0].revents().intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR)
}

/// Bytes waiting to be read on a socket (`FIONREAD`; 0 if it cannot be told).
pub fn unread(fd: rustix::fd::BorrowedFd<'_>) -> usize {
    rustix::io::ioctl_fionread(fd).map_or(0, |n| n as usize)
}

/// Whether a descriptor's file description is in non-blocking mode (true if it cannot be told).
pub fn nonblocking(fd: rustix::fd::BorrowedFd<'_>) -> bool {
    rustix::fs::fcntl_getfl(fd).map_or(true, |f| f.contains(rustix::fs::OFlags::NONBLOCK))
}
