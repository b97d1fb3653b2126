//! Connection set-up over the rendezvous (spec/WIRE.md sections 2 and 3): the client's dial and
//! the server's answer to one HELLO.

use crate::log;
use crate::options::Options;
use crate::segment::{Role, Segment};
use crate::shm::{Fds, Shm};
use crate::wire::{self, claim, Header, Message, Mode, Reason, HEADER_FIELDS, MESSAGE_LEN};
use colo_sys::{doorbell, host, segment, seqpacket, AsFd, OwnedFd};
use std::io;
use std::net::{IpAddr, SocketAddr};

/// Dials `addr` over shared memory if a colo listener serves it on this host; `Ok(None)` means
/// "use TCP" (not local, nobody listening on the rendezvous, refused, or not trusted).
pub(crate) fn dial(addr: SocketAddr, opts: &Options) -> io::Result<Option<Shm>> {
    if !host::is_local(addr.ip()) {
        return Ok(None);
    }
    let mut control = None;
    for name in wire::lookup_names(addr) {
        match seqpacket::connect(name.as_bytes()) {
            Ok(fd) => {
                control = Some(fd);
                break;
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => continue,
            Err(e) => {
                log::info(format_args!("dial {addr}: rendezvous {name}: {e}; using TCP"));
                return Ok(None);
            }
        }
    }
    let Some(control) = control else { return Ok(None) };
    let (server_pid, server_uid) = seqpacket::peer_cred(&control)?;
    let me = host::uid();
    if server_uid != me && server_uid != 0 && host::tcp_listener_uid(addr.port()) != Some(server_uid) {
        log::info(format_args!("dial {addr}: rendezvous owned by uid {server_uid}, port is not; using TCP"));
        return Ok(None);
    }

    let header = Header {
        geometry: opts.geometry(),
        claim: claim::DIRECT,
        client_pid: host::pid(),
        server_pid: 0,
        client_addr: Some(SocketAddr::new(addr.ip(), 0)),
        server_addr: Some(addr),
    };
    let layout = header.geometry.layout().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let (memfd, map) = segment::create(layout.segment_size)?;
    // SAFETY: the mapping is private to us until HELLO is sent; nobody else accesses it yet.
    let head = unsafe { std::slice::from_raw_parts_mut(map.as_ptr(), HEADER_FIELDS) };
    header.encode(head).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let client_bell = doorbell::create()?;
    let server_bell = doorbell::create()?;

    let hello = Message::Hello { version: wire::VERSION, mode: Mode::Direct }.encode();
    seqpacket::send(&control, &hello, &[memfd.as_fd(), client_bell.as_fd(), server_bell.as_fd()])?;
    // Wait briefly for the answer; a server that has not reached accept() yet answers later
    // (spec/WIRE.md section 3, "The backlog").
    seqpacket::set_recv_timeout(&control, Some(opts.handshake_timeout()))?;
    let mut buf = [0u8; 64];
    let answer = seqpacket::recv(&control, &mut buf, false);
    let pending = match answer {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut => true,
        Ok(r) if r.len == MESSAGE_LEN && r.fds.is_empty() && !r.truncated => match Message::decode(&buf[..r.len]) {
            Ok(Message::Welcome { version: wire::VERSION }) => false,
            other => {
                log::info(format_args!("dial {addr}: refused ({other:?}); using TCP"));
                return Ok(None);
            }
        },
        Ok(r) if r.len == 0 => {
            log::info(format_args!("dial {addr}: listener closed the rendezvous connection; using TCP"));
            return Ok(None);
        }
        Ok(_) => {
            log::info(format_args!("dial {addr}: unexpected answer; using TCP"));
            return Ok(None);
        }
        Err(e) => {
            log::info(format_args!("dial {addr}: no answer: {e}; using TCP"));
            return Ok(None);
        }
    };
    // SAFETY: the mapping is exactly `layout.segment_size` bytes, laid out by `layout`.
    let seg = unsafe { Segment::new(map, layout, memfd) };
    let fds = Fds { control, own_bell: client_bell, peer_bell: server_bell };
    let local = SocketAddr::new(addr.ip(), 0);
    let shm = Shm::new(seg, Role::Client, fds, local, addr, server_pid, opts.spin_mode())?;
    if pending {
        shm.expect_welcome();
    }
    Ok(Some(shm))
}

/// The outcome of reading one HELLO on an accepted control connection.
pub(crate) enum Answer {
    /// Nothing complete yet.
    Pending(OwnedFd),
    /// A connection, WELCOME sent.
    Accepted(Shm),
    /// Refused or garbage; REJECT sent if possible; the reason is for the log.
    Refused(String),
}

fn reject(control: &OwnedFd, reason: Reason, why: impl Into<String>) -> Answer {
    let msg = Message::Reject { version: wire::VERSION, reason }.encode();
    let _ = seqpacket::send(control, &msg, &[]);
    Answer::Refused(why.into())
}

fn is_eventfd(fd: &OwnedFd) -> bool {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", colo_sys::AsRawFd::as_raw_fd(fd)));
    link.is_ok_and(|l| l.as_os_str() == "anon_inode:[eventfd]")
}

/// Reads and answers the HELLO waiting on `control` (non-blocking).
pub(crate) fn answer(control: OwnedFd, listen_addr: SocketAddr, opts: &Options) -> Answer {
    let mut buf = [0u8; 64];
    let r = match seqpacket::recv(&control, &mut buf, true) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Answer::Pending(control),
        Err(e) => return Answer::Refused(format!("rendezvous read: {e}")),
    };
    if r.len == 0 && r.fds.is_empty() {
        return Answer::Refused("client hung up before HELLO".into());
    }
    if r.truncated || r.len != MESSAGE_LEN {
        return reject(&control, Reason::BadMessage, "HELLO of the wrong size");
    }
    let mode = match Message::decode(&buf[..r.len]) {
        Ok(Message::Hello { version: wire::VERSION, mode }) => mode,
        Ok(Message::Hello { version, .. }) => {
            return reject(&control, Reason::BadVersion, format!("HELLO version {version}"))
        }
        Ok(_) => return reject(&control, Reason::BadMessage, "not a HELLO"),
        Err(e) => return reject(&control, Reason::BadMessage, e),
    };
    if mode != Mode::Direct {
        return reject(&control, Reason::NotClaimed, "CARRIER offer to an API listener");
    }
    let mut fds = r.fds.into_iter();
    let (Some(memfd), Some(client_bell), Some(server_bell), None) = (fds.next(), fds.next(), fds.next(), fds.next())
    else {
        return reject(&control, Reason::BadMessage, "HELLO without exactly three descriptors");
    };
    if !is_eventfd(&client_bell) || !is_eventfd(&server_bell) {
        return reject(&control, Reason::BadMessage, "doorbells are not eventfds");
    }
    let mut head = [0u8; HEADER_FIELDS];
    match segment::read_prefix(&memfd, &mut head) {
        Ok(HEADER_FIELDS) => {}
        _ => return reject(&control, Reason::BadSegment, "segment header unreadable"),
    }
    let (header, layout) = match Header::decode(&head) {
        Ok(h) => h,
        Err(e) => return reject(&control, Reason::BadSegment, e),
    };
    let map = match segment::attach(&memfd, layout.segment_size) {
        Ok(m) => m,
        Err(segment::AttachError::BadSegment(e)) => return reject(&control, Reason::BadSegment, e),
        Err(segment::AttachError::Os(e)) => return reject(&control, Reason::NoResources, e.to_string()),
    };
    let client_pid = match seqpacket::peer_cred(&control) {
        Ok((pid, _)) => pid,
        Err(e) => return Answer::Refused(format!("peer credentials: {e}")),
    };
    // SAFETY: `attach` checked the file is exactly `layout.segment_size` bytes and sealed.
    let seg = unsafe { Segment::new(map, layout, memfd) };
    // server_pid (offset 44) is informational, for `colo stat`.
    // SAFETY: offset 44 is an aligned u32 inside the header of our mapping.
    unsafe { &*(seg.base().add(44) as *const colo_ring::sync::AtomicU32) }
        .store(host::pid(), colo_ring::sync::Ordering::Relaxed);
    let local = header.server_addr.filter(|a| a.port() == listen_addr.port()).unwrap_or(listen_addr);
    let peer_ip: IpAddr = header.client_addr.map_or(local.ip(), |a| a.ip());
    let fds = Fds { control, own_bell: server_bell, peer_bell: client_bell };
    let shm = match Shm::new(seg, Role::Server, fds, local, SocketAddr::new(peer_ip, 0), client_pid, opts.spin_mode()) {
        Ok(s) => s,
        Err(e) => return Answer::Refused(format!("readiness: {e}")),
    };
    // A client that already closed cannot read WELCOME, but its bytes and FIN are in the ring and
    // are delivered all the same.
    let welcome = Message::Welcome { version: wire::VERSION }.encode();
    let _ = seqpacket::send(shm.control_fd(), &welcome, &[]);
    Answer::Accepted(shm)
}
