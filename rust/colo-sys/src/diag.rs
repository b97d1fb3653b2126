//! TCP sockets as the kernel's `sock_diag` netlink interface reports them (what `ss` uses): the
//! listening sockets alone, or the one socket with a given pair of addresses, each found without
//! walking every connection of the host. `/proc/net/tcp` lists every socket, `TIME_WAIT` ones
//! included (tens of thousands on a host that makes short-lived connections, each read and
//! parsed); these answers cost one netlink round trip.

use crate::socket::{canonical, TcpSocket};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const TCP_LISTEN: u8 = 10;
/// `struct nlmsghdr`.
const NLMSG_HDR: usize = 16;
/// `struct inet_diag_sockid`: ports, two 16-byte addresses, interface, cookie.
const SOCKID: usize = 48;
/// `struct inet_diag_req_v2`.
const REQ: usize = 8 + SOCKID;
/// `struct inet_diag_msg` up to and including `idiag_uid`.
const MSG_UID_END: usize = 4 + SOCKID + 16;
/// `struct inet_diag_msg`, whose attributes (`struct nlattr`s) follow it.
const MSG: usize = MSG_UID_END + 4;
/// The attribute the kernel adds to every IPv6 socket's message: `IPV6_V6ONLY`, one byte.
const INET_DIAG_SKV6ONLY: u16 = 11;

/// A netlink `sock_diag` socket, closed on drop.
struct Diag(rustix::fd::OwnedFd);

impl Diag {
    fn open() -> io::Result<Diag> {
        // SAFETY: plain socket(2); the result is checked before it is owned.
        let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, libc::NETLINK_SOCK_DIAG) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        let fd: rustix::fd::OwnedFd = unsafe { rustix::fd::FromRawFd::from_raw_fd(fd) };
        // The kernel answers at once; the bound only keeps a broken answer from hanging a dial.
        rustix::net::sockopt::set_socket_timeout(&fd, rustix::net::sockopt::Timeout::Recv, Some(std::time::Duration::from_secs(1)))?;
        Ok(Diag(fd))
    }

    /// Sends one `inet_diag_req_v2` for TCP sockets of `family` in `states` (a bit mask of
    /// TCP states) with the socket id `id`; `dump`: all matching sockets, else the one with
    /// exactly that id.
    fn request(&self, family: u8, states: u32, id: &[u8; SOCKID], dump: bool) -> io::Result<()> {
        let mut msg = [0u8; NLMSG_HDR + REQ];
        msg[0..4].copy_from_slice(&((NLMSG_HDR + REQ) as u32).to_ne_bytes());
        msg[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        let flags = if dump { NLM_F_REQUEST | NLM_F_DUMP } else { NLM_F_REQUEST };
        msg[6..8].copy_from_slice(&flags.to_ne_bytes());
        msg[NLMSG_HDR] = family;
        msg[NLMSG_HDR + 1] = libc::IPPROTO_TCP as u8;
        msg[NLMSG_HDR + 4..NLMSG_HDR + 8].copy_from_slice(&states.to_ne_bytes());
        msg[NLMSG_HDR + 8..].copy_from_slice(id);
        rustix::net::send(&self.0, &msg, rustix::net::SendFlags::empty())?;
        Ok(())
    }

    /// Reads the answers to the last request, calling `each` with every `inet_diag_msg`
    /// (without its attributes), until the kernel says it is done (a dump) or after the first
    /// (a lookup). A lookup that finds nothing is `Ok` with no call.
    fn answers(&self, dump: bool, mut each: impl FnMut(&[u8])) -> io::Result<()> {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            let n = rustix::net::recv(&self.0, &mut buf, rustix::net::RecvFlags::empty())?.0;
            let mut at = 0;
            while at + NLMSG_HDR <= n {
                let len = u32::from_ne_bytes(buf[at..at + 4].try_into().expect("4 bytes")) as usize;
                let kind = u16::from_ne_bytes(buf[at + 4..at + 6].try_into().expect("2 bytes"));
                if len < NLMSG_HDR || at + len > n {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, "truncated netlink message"));
                }
                let body = &buf[at + NLMSG_HDR..at + len];
                match kind {
                    NLMSG_DONE => return Ok(()),
                    NLMSG_ERROR => {
                        let errno = body.get(..4).map_or(0, |e| i32::from_ne_bytes(e.try_into().expect("4 bytes")));
                        return match -errno {
                            0 | libc::ENOENT => Ok(()),
                            e => Err(io::Error::from_raw_os_error(e)),
                        };
                    }
                    SOCK_DIAG_BY_FAMILY if body.len() >= MSG_UID_END => {
                        each(body);
                        if !dump {
                            return Ok(());
                        }
                    }
                    _ => {}
                }
                at += (len + 3) & !3;
            }
        }
    }
}

/// The socket id fields of an `inet_diag_sockid` for `local` → `remote` (in the family of
/// `local`), with no interface and no cookie.
fn sockid(local: SocketAddr, remote: SocketAddr) -> [u8; SOCKID] {
    let mut id = [0u8; SOCKID];
    id[0..2].copy_from_slice(&local.port().to_be_bytes());
    id[2..4].copy_from_slice(&remote.port().to_be_bytes());
    let put = |b: &mut [u8], ip: IpAddr| match ip {
        IpAddr::V4(v4) => b[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => b.copy_from_slice(&v6.octets()),
    };
    put(&mut id[4..20], local.ip());
    put(&mut id[20..36], remote.ip());
    // INET_DIAG_NOCOOKIE: any socket, whatever its cookie.
    id[40..48].fill(0xff);
    id
}

/// The socket an `inet_diag_msg` describes (addresses canonical).
fn socket_of(msg: &[u8]) -> TcpSocket {
    let family = msg[0];
    let addr = |ip: &[u8], port: &[u8]| {
        let ip: IpAddr = if family == libc::AF_INET as u8 {
            Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3]).into()
        } else {
            Ipv6Addr::from(<[u8; 16]>::try_from(ip).expect("16 bytes")).into()
        };
        SocketAddr::new(canonical(ip), u16::from_be_bytes([port[0], port[1]]))
    };
    let id = &msg[4..4 + SOCKID];
    TcpSocket {
        local: addr(&id[4..20], &id[0..2]),
        remote: addr(&id[20..36], &id[2..4]),
        listening: msg[1] == TCP_LISTEN,
        uid: u32::from_ne_bytes(msg[MSG_UID_END - 4..MSG_UID_END].try_into().expect("4 bytes")),
        // `idiag_if`: the interface the socket is bound to, 0 for none.
        device: Some(u32::from_ne_bytes(id[36..40].try_into().expect("4 bytes")) != 0),
        v6only: if family == libc::AF_INET as u8 { Some(false) } else { attribute(msg, INET_DIAG_SKV6ONLY).and_then(|v| v.first()).map(|&b| b != 0) },
    }
}

/// The payload of the attribute of type `kind` after an `inet_diag_msg`, if the kernel sent it.
fn attribute(msg: &[u8], kind: u16) -> Option<&[u8]> {
    let mut at = MSG;
    while at + 4 <= msg.len() {
        let len = usize::from(u16::from_ne_bytes([msg[at], msg[at + 1]]));
        let ty = u16::from_ne_bytes([msg[at + 2], msg[at + 3]]) & 0x3fff;
        if len < 4 || at + len > msg.len() {
            return None;
        }
        if ty == kind {
            return Some(&msg[at + 4..at + len]);
        }
        at += (len + 3) & !3;
    }
    None
}

/// Every listening TCP socket of this network namespace, IPv4 and IPv6.
pub fn listeners() -> io::Result<Vec<TcpSocket>> {
    let diag = Diag::open()?;
    let mut out = Vec::new();
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        let mut id = [0u8; SOCKID];
        id[40..48].fill(0xff);
        diag.request(family, 1 << TCP_LISTEN, &id, true)?;
        diag.answers(true, |m| out.push(socket_of(m)))?;
    }
    Ok(out)
}

/// The TCP socket (any state but LISTEN) whose local address is `local` and remote address
/// `remote`, found by the kernel's own lookup; `None` if there is none.
pub fn connection(local: SocketAddr, remote: SocketAddr) -> io::Result<Option<TcpSocket>> {
    Ok(lookup(local, remote)?.map(|(s, _, _)| s))
}

/// The TCP socket (not a listener) with exactly these addresses, with its state (`TCP_*`) and
/// inode (0 for one no program holds yet: in an accept queue), by the kernel's own lookup.
fn lookup(local: SocketAddr, remote: SocketAddr) -> io::Result<Option<(TcpSocket, u8, u32)>> {
    let c = |a: SocketAddr| SocketAddr::new(canonical(a.ip()), a.port());
    let (local, remote) = (c(local), c(remote));
    if local.is_ipv4() != remote.is_ipv4() {
        return Ok(None);
    }
    let family = if local.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 } as u8;
    let diag = Diag::open()?;
    diag.request(family, u32::MAX, &sockid(local, remote), false)?;
    let mut found = None;
    diag.answers(false, |m| found = Some((socket_of(m), m[1], field(m, MSG_UID_END))))?;
    // The lookup falls back to a listener on the local address: only the exact pair counts.
    Ok(found.filter(|(s, _, _)| !s.listening && s.local == local && s.remote == remote))
}

/// The `u32` at byte `at` of an `inet_diag_msg` (0 past its end).
fn field(msg: &[u8], at: usize) -> u32 {
    msg.get(at..at + 4).map_or(0, |b| u32::from_ne_bytes(b.try_into().expect("4 bytes")))
}

/// Where the server end of a connection stands (see [`server_end`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerEnd {
    /// Its program has accepted it: its socket has an inode.
    Accepted,
    /// In its listener's accept queue: no inode yet.
    Queued,
    /// Still a request (`SYN_RECV`) although the client's end is established: its listener
    /// defers accepting until the client sends (`TCP_DEFER_ACCEPT`).
    Deferred,
}

/// Where the server end of the connection from `client` to `server` stands; `None` if this
/// network namespace lists no such connection.
pub fn server_end(server: SocketAddr, client: SocketAddr) -> io::Result<Option<ServerEnd>> {
    const TCP_SYN_RECV: u8 = 3;
    Ok(lookup(server, client)?.map(|(_, state, inode)| match (state, inode) {
        (TCP_SYN_RECV, _) => ServerEnd::Deferred,
        (_, 0) => ServerEnd::Queued,
        _ => ServerEnd::Accepted,
    }))
}

/// How many connections the listening sockets that take connections to `addr` hold in their
/// accept queues, not yet accepted by their program (wildcard listeners on its port, and
/// `SO_REUSEPORT` siblings, included); `None` if no listener of this namespace takes them.
pub fn accept_queue(addr: SocketAddr) -> io::Result<Option<u64>> {
    let addr = SocketAddr::new(canonical(addr.ip()), addr.port());
    let diag = Diag::open()?;
    let mut found: Option<u64> = None;
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        let mut id = [0u8; SOCKID];
        id[40..48].fill(0xff);
        diag.request(family, 1 << TCP_LISTEN, &id, true)?;
        diag.answers(true, |m| {
            let s = socket_of(m);
            if s.local.port() == addr.port() && (s.local.ip() == addr.ip() || s.local.ip().is_unspecified()) {
                // `idiag_rqueue` (after `idiag_expires`): a listener's count of queued connections.
                *found.get_or_insert(0) += u64::from(field(m, 4 + SOCKID + 4));
            }
        })?;
    }
    Ok(found)
}

/// Whether a listening TCP socket of this network namespace has inode `inode` (the `st_ino` of
/// its descriptors): whether some process still holds a listener that one process closed.
pub fn listening(inode: u64) -> io::Result<bool> {
    let diag = Diag::open()?;
    let mut found = false;
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        let mut id = [0u8; SOCKID];
        id[40..48].fill(0xff);
        diag.request(family, 1 << TCP_LISTEN, &id, true)?;
        // `idiag_inode` follows `idiag_uid`.
        diag.answers(true, |m| {
            let ino = m.get(MSG_UID_END..MSG_UID_END + 4).map(|b| u32::from_ne_bytes(b.try_into().expect("4 bytes")));
            found |= ino.is_some_and(|i| u64::from(i) == inode);
        })?;
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_kernel_finds_listeners_and_connections() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let c = std::net::TcpStream::connect(addr).unwrap();
        let uid = crate::host::uid();
        let listeners = super::listeners().unwrap();
        assert!(listeners.iter().any(|s| s.listening && s.local == addr && s.uid == uid), "{listeners:?}");
        let local = c.local_addr().unwrap();
        let got = super::connection(local, addr).unwrap().expect("the client end");
        assert_eq!((got.local, got.remote, got.uid, got.listening), (local, addr, uid, false));
        let (server_end, _) = l.accept().unwrap();
        assert_eq!(super::connection(server_end.local_addr().unwrap(), local).unwrap().map(|s| s.local), Some(addr));
        assert_eq!(super::connection("127.0.0.1:1".parse().unwrap(), addr).unwrap(), None);
        // Not the listener the lookup falls back to.
        assert_eq!(super::connection(addr, "127.0.0.9:5".parse().unwrap()).unwrap(), None);
        let v6 = std::net::TcpListener::bind("[::1]:0").unwrap();
        let a6 = v6.local_addr().unwrap();
        let c6 = std::net::TcpStream::connect(a6).unwrap();
        assert!(super::listeners().unwrap().iter().any(|s| s.local == a6));
        assert_eq!(super::connection(c6.local_addr().unwrap(), a6).unwrap().map(|s| s.uid), Some(uid));
    }

    #[test]
    fn the_kernel_says_which_ipv6_listeners_are_v6only() {
        let listen = |v6only: bool| {
            let s = rustix::net::socket(rustix::net::AddressFamily::INET6, rustix::net::SocketType::STREAM, None).unwrap();
            rustix::net::sockopt::set_ipv6_v6only(&s, v6only).unwrap();
            rustix::net::bind(&s, &std::net::SocketAddr::from(([0u16; 8], 0))).unwrap();
            rustix::net::listen(&s, 1).unwrap();
            let l = std::net::TcpListener::from(s);
            (l.local_addr().unwrap().port(), l)
        };
        let ((only, _l1), (dual, _l2)) = (listen(true), listen(false));
        let all = super::listeners().unwrap();
        let of = |port: u16| all.iter().find(|s| s.local.port() == port).map(|s| s.v6only);
        assert_eq!(of(only), Some(Some(true)), "{all:?}");
        assert_eq!(of(dual), Some(Some(false)));
        let v4 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let all = super::listeners().unwrap();
        assert_eq!(all.iter().find(|s| s.local == v4.local_addr().unwrap()).map(|s| s.v6only), Some(Some(false)));
    }

    #[test]
    fn a_connection_is_accepted_once_its_program_accepts_it() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        assert_eq!(super::accept_queue(addr).unwrap(), Some(0));
        let c1 = std::net::TcpStream::connect(addr).unwrap();
        let c2 = std::net::TcpStream::connect(addr).unwrap();
        let (a1, a2) = (c1.local_addr().unwrap(), c2.local_addr().unwrap());
        use super::ServerEnd::{Accepted, Queued};
        assert_eq!(super::server_end(addr, a1).unwrap(), Some(Queued));
        assert_eq!(super::accept_queue(addr).unwrap(), Some(2));
        let (_s1, _) = l.accept().unwrap();
        assert_eq!(super::server_end(addr, a1).unwrap(), Some(Accepted));
        assert_eq!(super::server_end(addr, a2).unwrap(), Some(Queued));
        assert_eq!(super::accept_queue(addr).unwrap(), Some(1));
        assert_eq!(super::server_end(addr, "127.0.0.1:1".parse().unwrap()).unwrap(), None);
        assert_eq!(super::accept_queue("127.0.0.1:1".parse().unwrap()).unwrap(), None);
    }

    #[test]
    fn a_connection_to_a_deferring_listener_is_deferred_until_the_client_sends() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let secs: libc::c_int = 5;
        // SAFETY: setsockopt on an open socket with a c_int option value.
        let r = unsafe {
            libc::setsockopt(l.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_DEFER_ACCEPT, (&secs as *const libc::c_int).cast(), 4)
        };
        assert_eq!(r, 0);
        let addr = l.local_addr().unwrap();
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        let a = c.local_addr().unwrap();
        assert_eq!(super::server_end(addr, a).unwrap(), Some(super::ServerEnd::Deferred));
        c.write_all(b"x").unwrap();
        let (_s, _) = l.accept().unwrap();
        assert_eq!(super::server_end(addr, a).unwrap(), Some(super::ServerEnd::Accepted));
    }

    #[test]
    fn a_listener_is_found_by_inode_while_open() {
        use std::os::fd::AsRawFd;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        // SAFETY: fstat of an open descriptor into a zeroed stat.
        let ino = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            assert_eq!(libc::fstat(l.as_raw_fd(), &mut st), 0);
            st.st_ino
        };
        assert!(super::listening(ino).unwrap());
        drop(l);
        assert!(!super::listening(ino).unwrap());
    }
}
