//! CARRIER mode (spec/WIRE.md section 3): a real loopback TCP connection whose payload moves into
//! a segment that the client offers, keyed by the connection's 4-tuple, before its TCP handshake,
//! and that the server claims when it accepts that TCP connection.
//!
//! These are the building blocks the LD_PRELOAD shim uses on both sides, and that the API uses
//! to talk to a shim: an API client retrying after `REJECT(NEED_CARRIER)`, an API listener
//! claiming CARRIER offers. Nothing here blocks unless its doc says so.
//!
//! Client side, in order:
//! 1. [`connect_rendezvous`]: find a live colo listener for the destination (section 2 lookup and
//!    peer check); `None` means plain TCP.
//! 2. bind the TCP socket (port 0 is fine), read its local address, then [`offer`]: creates the
//!    segment with `claim = OFFERED` and the 4-tuple, and sends `HELLO(CARRIER)`.
//! 3. `connect(2)` the TCP socket.
//! 4. [`Offer::wait_answer`] (bounded). On `WELCOME`: [`Offer::established`] then
//!    [`Established::into_shm`]. On anything else (or timeout): [`Offer::abandon`]; if it returns
//!    `Abandon::Claimed`, the server won the race: wait for its WELCOME with
//!    [`Offer::wait_answer`] and use the segment. If it returns `Abandon::Abandoned`, call
//!    [`Offer::flush_into`] if anything was written into the ring, and use the TCP socket.
//!
//! Server side: accept control connections on the rendezvous, [`read_hello`] each (non-blocking),
//! keep the [`Hello`]s by [`Hello::key`]; when the application accepts a TCP connection, find the
//! hello with its `(peer, local)` 4-tuple and call [`Hello::claim`] (validates, CAS
//! `OFFERED → CLAIMED`, WELCOME). A `HELLO(DIRECT)` to a listener that only accepts CARRIER gets
//! [`reject`] with [`Reason::NeedCarrier`].

use crate::log;
use crate::segment::{Role, Segment};
use crate::shm::{Fds, Shm};
use crate::wire::{self, claim, Header, Message, Mode, Reason, HEADER_FIELDS, MESSAGE_LEN};
use colo_ring::layout::{Geometry, Layout};
use colo_ring::snapshot::RingState;
use colo_ring::spin::SpinMode;
use colo_ring::sync::{AtomicU32, Ordering};
use colo_sys::{doorbell, host, segment, seqpacket, AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::floor::fd_floor;

/// `fds` moved to the floor (see [`set_fd_floor`]); an error if no numbers there are free.
fn high_all(fds: &mut [OwnedFd]) -> io::Result<()> {
    colo_sys::preload::move_all_above(fds, fd_floor())
}

/// Offset of the `claim` word in the segment header.
const CLAIM_OFFSET: usize = 36;
/// Offset of `server_pid` in the segment header.
const SERVER_PID_OFFSET: usize = 44;

/// The 4-tuple that keys an offer: `(client, server)`, IPv4-mapped addresses made IPv4.
pub type Key = (SocketAddr, SocketAddr);

/// Canonical form of a 4-tuple, as the segment header records it.
pub fn key(client: SocketAddr, server: SocketAddr) -> Key {
    let c = |a: SocketAddr| SocketAddr::new(host::canonical(a.ip()), a.port());
    (c(client), c(server))
}

fn claim_word(seg_base: *mut u8) -> &'static AtomicU32 {
    // SAFETY: offset 36 is an aligned u32 inside the header of a live mapping; callers
    // only use the reference while they hold the mapping (the 'static is local to this module).
    unsafe { &*(seg_base.add(CLAIM_OFFSET) as *const AtomicU32) }
}

/// How long a client waits for a server's program to claim its offer, or to answer it (a
/// PROPOSAL from another namespace, spec/WIRE.md section 11), and a server keeps a nonce it
/// answered for its HELLO (`COLO_CARRIER_TIMEOUT_MS`, 500, as the shim and the Go package read it).
pub(crate) fn timeout() -> Duration {
    static T: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *T.get_or_init(|| Duration::from_millis(std::env::var("COLO_CARRIER_TIMEOUT_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(500)))
}

/// A live colo listener, found by [`connect_rendezvous`].
#[derive(Debug)]
pub struct Rendezvous {
    /// The control socket connected to it.
    pub control: OwnedFd,
    /// The server's pid (`SO_PEERCRED`: the pid that called `listen()`, kept after it exits).
    pub server_pid: u32,
    /// The server's uid (`SO_PEERCRED`).
    pub server_uid: u32,
}

/// Whether the listener at `addr` (a local address) has raised its short-lived marker for
/// programs tagged `tag` (spec/WIRE.md section 2): recent connections from this program, run
/// this way, gained less from shared memory than their set-up cost. Tried in the order of the
/// rendezvous lookup, before it: no connection to the listener, nobody woken.
pub fn says_short_lived(addr: SocketAddr, tag: u64) -> bool {
    let markers: Vec<String> = wire::lookup_addrs(addr).into_iter().map(|a| wire::short_lived_marker(a, tag)).collect();
    colo_sys::marker::any_raised(markers.iter().map(|m| m.as_bytes()))
}

/// Connects to the rendezvous of a colo listener serving `addr` on this host, with the peer
/// check of spec/WIRE.md section 2. `Ok(None)`: not local, nobody there, or not trusted (use
/// plain TCP). Blocking (a Unix connect).
pub fn connect_rendezvous(addr: SocketAddr) -> io::Result<Option<Rendezvous>> {
    if !host::is_local(addr.ip()) {
        return Ok(None);
    }
    Ok(reach_trusted(addr, &wire::lookup_names(addr), "connect")?.map(|r| Rendezvous { control: r.control, server_pid: r.server_pid, server_uid: r.server_uid }))
}

/// A rendezvous [`reach_trusted`] connected to and trusts.
pub(crate) struct Reached {
    pub(crate) control: OwnedFd,
    pub(crate) name: String,
    pub(crate) server_pid: u32,
    pub(crate) server_uid: u32,
}

/// Connects to the first of `names` (the lookup for `addr`, spec/WIRE.md section 2) listened
/// on, with the peer check. A name that the TCP listener the kernel would give the connection to
/// does not use (another user bound it: an exact address's, while the listener is a wildcard)
/// is passed over for the listener's own, if the lookup comes to it later, checked the same way:
/// anyone may bind a free name, and that must not keep a client off the listener's rendezvous.
/// `Ok(None)` (logged, `verb` first): nobody there, or not trusted (use plain TCP). `Err`: out of
/// descriptors. Blocking (a Unix connect).
pub(crate) fn reach_trusted(addr: SocketAddr, names: &[String], verb: &str) -> io::Result<Option<Reached>> {
    let mut from = 0;
    loop {
        let (control, i) = match seqpacket::connect_first(&names[from..]) {
            Ok(Some((fd, i))) => (fd, from + i),
            Ok(None) => return Ok(None),
            // Out of descriptors: the caller's error, not a missing listener.
            Err((e, _)) if matches!(e.raw_os_error(), Some(crate::error::libc_errno::EMFILE | crate::error::libc_errno::ENFILE)) => return Err(e),
            Err((e, i)) => {
                log::info(format_args!("{verb} {addr}: rendezvous {}: {e}; using TCP", names[from + i]));
                return Ok(None);
            }
        };
        // A listener in a pid namespace we cannot see is no usable one (the shim then remembers
        // the miss for a moment, as for no listener at all).
        let (server_pid, server_uid) = match seqpacket::peer_cred(&control) {
            Ok(c) => c,
            Err(e) => {
                log::info(format_args!("{verb} {addr}: rendezvous {}: {e}; using TCP", names[i]));
                return Ok(None);
            }
        };
        // Nothing is sent before this proof (spec/WIRE.md section 2, "Peer check").
        match crate::trust::rendezvous_trusted(addr, &names[i], server_uid) {
            Ok(()) => return Ok(Some(Reached { control, name: names[i].clone(), server_pid, server_uid })),
            Err(u) => match u.own.as_ref().and_then(|own| names[i + 1..].iter().position(|n| n == own)) {
                Some(k) => {
                    log::info(format_args!("{verb} {addr}: {u}; trying {}", names[i + 1 + k]));
                    from = i + 1 + k;
                }
                None => {
                    log::info(format_args!("{verb} {addr}: {u}; using TCP"));
                    return Ok(None);
                }
            },
        }
    }
}

/// What [`Offer::read_answer`] read: a message that is no answer, a hang-up or an error is
/// `Closed`; nothing yet (or the receive timeout) is `Timeout`.
fn answer_of(r: io::Result<Option<Answer>>) -> Answer {
    match r {
        Ok(a) => a.unwrap_or(Answer::Closed),
        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => Answer::Timeout,
        Err(_) => Answer::Closed,
    }
}

/// A client's outstanding CARRIER offer.
#[derive(Debug)]
pub struct Offer {
    control: OwnedFd,
    seg: Segment,
    self_bell: OwnedFd,
    local: SocketAddr,
    peer: SocketAddr,
    server_pid: u32,
    memfd_raw: colo_sys::RawFd,
    /// The uid that sent the answer, as the kernel vouched for it (`NO_UID`: none yet, or it
    /// came without credentials). Relaxed: written and read by whichever thread holds the offer.
    answered_by: AtomicU32,
}

/// [`Offer::answered_by`] before an answer with credentials: `(uid_t) -1`, which no process
/// runs as (`setuid(-1)` means "unchanged").
const NO_UID: u32 = u32::MAX;

/// The server's answer to an offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// WELCOME: the segment is claimed.
    Welcome,
    /// REJECT with this reason.
    Reject(Reason),
    /// The control socket closed, or sent something that is not an answer.
    Closed,
    /// Nothing within the timeout.
    Timeout,
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answer::Welcome => f.write_str("welcomed"),
            Answer::Reject(r) => write!(f, "the server refused: {r}"),
            Answer::Closed => f.write_str("the server's rendezvous closed or sent no answer"),
            Answer::Timeout => f.write_str("no answer in time"),
        }
    }
}

/// Who won the `claim` compare-and-swap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abandon {
    /// We did: the connection is plain TCP.
    Abandoned,
    /// The server claimed first: the connection is on the segment; its WELCOME is on its way.
    Claimed,
}

/// Sends `HELLO(CARRIER)` on `control` with a fresh segment of `geometry` whose header carries
/// the 4-tuple `local` (the client's bound TCP address) → `peer` (the server's TCP address) and
/// `claim = OFFERED`. Call before `connect(2)` on the TCP socket.
pub fn offer(
    control: OwnedFd,
    server_pid: u32,
    local: SocketAddr,
    peer: SocketAddr,
    geometry: Geometry,
) -> io::Result<Offer> {
    offer_with(control, server_pid, local, peer, geometry, None)
}

/// [`offer`], with the cross-namespace proof (spec/WIRE.md section 11) written into the header's
/// proof field and announced by the HELLO's `NETNS` flag when `proof` is given.
pub(crate) fn offer_with(
    control: OwnedFd,
    server_pid: u32,
    local: SocketAddr,
    peer: SocketAddr,
    geometry: Geometry,
    proof: Option<&[u8; wire::PROOF_LEN]>,
) -> io::Result<Offer> {
    let (local, peer) = key(local, peer);
    let header = Header {
        geometry,
        claim: claim::OFFERED,
        client_pid: host::pid(),
        server_pid: 0,
        client_addr: Some(local),
        server_addr: Some(peer),
    };
    let layout = geometry.layout().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let (memfd, map) = segment::create(layout.segment_size)?;
    // Moved above the floor together (one helper task when the floor is above the limit).
    let mut fds = [memfd, doorbell::create()?, control];
    high_all(&mut fds)?;
    let [memfd, self_bell, control] = fds;
    // SAFETY: the mapping is private to us until HELLO is sent; nobody else accesses it yet.
    let head = unsafe { std::slice::from_raw_parts_mut(map.as_ptr(), HEADER_FIELDS) };
    header.encode(head).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut hello = Message::Hello { version: wire::VERSION, mode: Mode::Carrier }.encode();
    if let Some(proof) = proof {
        head[wire::PROOF_OFFSET..wire::PROOF_OFFSET + wire::PROOF_LEN].copy_from_slice(proof);
        hello[8..12].copy_from_slice(&wire::FLAG_NETNS.to_le_bytes());
    }
    Segment::start_rings(&map, &layout);
    seqpacket::send(&control, &hello, &[memfd.as_fd()])?;
    // The answer says who serves us now (`Offer::established`); the server can claim only once
    // our TCP connect, after this, reaches it. Refused, the connection is judged foreign.
    let _ = colo_sys::gift::mark_messages(&control, true);
    let memfd_raw = memfd.as_raw_fd();
    // SAFETY: the mapping is exactly `layout.segment_size` bytes, laid out by `layout`.
    let seg = unsafe { Segment::new(map, layout, memfd) };
    let answered_by = AtomicU32::new(NO_UID);
    Ok(Offer { control, seg, self_bell, local, peer, server_pid, memfd_raw, answered_by })
}

impl Offer {
    /// The control socket (readable when the answer arrives or the server goes away).
    pub fn control_fd(&self) -> &OwnedFd {
        &self.control
    }

    /// Waits up to `timeout` for WELCOME or REJECT. Blocking.
    pub fn wait_answer(&self, timeout: Duration) -> Answer {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Answer::Timeout;
            }
            if seqpacket::set_recv_timeout(&self.control, Some(left)).is_err() {
                return Answer::Closed;
            }
            match self.read_answer(false) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => return answer_of(r),
            }
        }
    }

    /// The answer if it is there, without waiting (`Timeout` if not yet): for a caller that saw
    /// the control socket readable (the answer, or the server gone), one system call where
    /// [`Offer::wait_answer`] makes two.
    pub fn answer_now(&self) -> Answer {
        answer_of(self.read_answer(true))
    }

    /// Reads one message from the control socket: what it says, or the error.
    fn read_answer(&self, dontwait: bool) -> io::Result<Option<Answer>> {
        let mut buf = [0u8; 64];
        let r = seqpacket::recv_answer(&self.control, &mut buf, dontwait)?;
        // Before this side rings: a socket without an address that sends with it on gets one.
        let _ = colo_sys::gift::mark_messages(&self.control, false);
        if r.odd || r.len != MESSAGE_LEN {
            return Ok(None);
        }
        if let Some(uid) = r.sender_uid {
            self.answered_by.store(uid, Ordering::Relaxed);
        }
        Ok(match Message::decode(&buf[..r.len]) {
            Ok(Message::Welcome { version: wire::VERSION }) => Some(Answer::Welcome),
            Ok(Message::Reject { reason, .. }) => Some(Answer::Reject(reason)),
            _ => None,
        })
    }

    /// Tries to abandon the offer: CAS `claim` from OFFERED to ABANDONED. Exactly one of this and
    /// the server's claim wins.
    pub fn abandon(&self) -> Abandon {
        // SYNC POINT with the CAS in `Hello::claim`: one of the two compare-exchanges wins.
        match claim_word(self.seg.base()).compare_exchange(
            claim::OFFERED,
            claim::ABANDONED,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) | Err(claim::ABANDONED) => Abandon::Abandoned,
            Err(_) => Abandon::Claimed,
        }
    }

    /// After a won [`Offer::abandon`]: writes the bytes the client put into its (client→server)
    /// ring and nobody consumed into the TCP socket `tcp`, in order, before any other byte.
    /// Blocking. Returns how many bytes were copied.
    pub fn flush_into(&self, tcp: BorrowedFd<'_>) -> io::Result<usize> {
        let layout = *self.seg.layout();
        // SAFETY: used in this call only, while `self.seg` keeps the segment mapped.
        let words = unsafe { self.seg.ring_words(true) };
        // Acquire (`RingState::consumer_view`) partners the Release store of `ring_head` by this
        // client's producer (another thread of it, perhaps): the bytes up to the head are
        // visible. There is no consumer once the abandon won (the server never claimed).
        let RingState { head, tail, .. } = RingState::consumer_view(&words);
        let pending = head.wrapping_sub(tail);
        let cap = layout.geometry.ring_capacity as u64;
        if pending > cap {
            return Err(crate::error::eproto("ring counters out of range"));
        }
        let data = self.seg.base().wrapping_add(layout.block_offset(true) + layout.data_off);
        let mut done = 0u64;
        while done < pending {
            let at = (tail.wrapping_add(done) % cap) as usize;
            let n = ((pending - done) as usize).min(cap as usize - at);
            // SAFETY: `at + n <= cap`, inside the ring data of our mapping; the server never
            // claimed the segment, so nobody writes this range any more.
            let chunk = unsafe { std::slice::from_raw_parts(data.add(at), n) };
            let w = colo_sys::preload::write_all_blocking(tcp, chunk)?;
            done += w as u64;
        }
        Ok(done as usize)
    }

    /// After WELCOME: the established client side. Its incoming ring is read through the memfd
    /// (`Segment::read_through_memfd`) unless the WELCOME came from a process of our own uid:
    /// the rendezvous's `SO_PEERCRED` is the listener's at its `listen`, and a server that
    /// listened as us and serves as another user (a master that starts its workers as `nobody`)
    /// is that user's to take over, memfd and control socket included.
    pub fn established(mut self) -> Established {
        let by = self.answered_by.load(Ordering::Relaxed);
        if by == NO_UID {
            // The answer is still due (the claim won our abandon): it is taken later, as a
            // ring is, with no credentials (and without giving this socket an address).
            let _ = colo_sys::gift::mark_messages(&self.control, false);
        }
        if by != host::uid() {
            self.seg.read_through_memfd();
        }
        let memfd = self.memfd_raw;
        Established {
            memfd,
            seg: self.seg,
            fds: Fds { control: self.control, self_bell: self.self_bell },
            role: Role::Client,
            local: self.local,
            peer: self.peer,
            peer_pid: self.server_pid,
        }
    }
}

/// A claimed CARRIER connection, not yet wrapped in a [`Shm`] (so that a caller can look at the
/// segment, e.g. to precompute readiness checks, before handing it over).
#[derive(Debug)]
pub struct Established {
    /// The mapped segment.
    pub seg: Segment,
    /// Control socket and self bell.
    pub fds: Fds,
    /// Which end we are.
    pub role: Role,
    /// Our TCP address.
    pub local: SocketAddr,
    /// The peer's TCP address.
    pub peer: SocketAddr,
    /// The peer's pid.
    pub peer_pid: u32,
    /// The raw number of the segment memfd (owned by `seg`), for callers that must release the
    /// connection's descriptors without a clean close (a forked process letting go of its copy).
    /// Kept open by the [`Shm`] built from this only if `segment::keep_memfds` was asked for (the
    /// shim does), or where the incoming ring is read through it (`Shm::close_memfd`).
    pub memfd: colo_sys::RawFd,
}

impl Established {
    /// Builds the [`Shm`].
    pub fn into_shm(self, spin: SpinMode) -> io::Result<Shm> {
        Shm::new(self.seg, self.role, self.fds, self.local, self.peer, self.peer_pid, spin)
    }

    /// Builds the [`Shm`] of a connection set up by an earlier image of this process (see
    /// [`reattach`]): the rings continue where they are.
    pub fn into_resumed_shm(self, spin: SpinMode) -> io::Result<Shm> {
        Shm::resume(self.seg, self.role, self.fds, self.local, self.peer, self.peer_pid, spin)
    }
}

/// Takes back one side of an established CARRIER connection whose descriptors this process
/// inherited across `exec` (the LD_PRELOAD shim's handover): validates the segment and bells as
/// a claim does, and maps the segment again. `role` is our side; addresses and the peer's pid
/// come from the header.
pub fn reattach(memfd: OwnedFd, control: OwnedFd, self_bell: OwnedFd, role: Role) -> Result<Established, String> {
    let mut head = [0u8; HEADER_FIELDS];
    if !matches!(segment::read_prefix(&memfd, &mut head), Ok(HEADER_FIELDS)) {
        return Err("segment header unreadable".into());
    }
    let (header, layout) = Header::decode(&head)?;
    let (Some(client), Some(server)) = (header.client_addr, header.server_addr) else {
        return Err("segment without a 4-tuple".into());
    };
    if header.claim != claim::CLAIMED {
        return Err("segment was never claimed".into());
    }
    if !seqpacket::is_seqpacket(&control) || !is_eventfd(&self_bell) {
        return Err("control socket or self bell of the wrong kind".into());
    }
    let map = segment::attach(&memfd, layout.segment_size).map_err(|e| match e {
        segment::AttachError::BadSegment(e) => e.to_string(),
        segment::AttachError::Os(e) => e.to_string(),
        segment::AttachError::Refused(e) => e,
    })?;
    if map.len() != layout.segment_size {
        return Err("segment size differs from its header".into());
    }
    let raw = memfd.as_raw_fd();
    // SAFETY: `attach` checked the file is sealed; its size equals `layout.segment_size`.
    let seg = unsafe { Segment::new(map, layout, memfd) };
    let (local, peer, peer_pid) = match role {
        Role::Client => (client, server, header.server_pid),
        Role::Server => (server, client, header.client_pid),
    };
    Ok(Established { seg, fds: Fds { control, self_bell }, role, local, peer, peer_pid, memfd: raw })
}

/// A HELLO read from a rendezvous control connection (server side), not yet validated beyond
/// its header fields.
#[derive(Debug)]
pub struct Hello {
    /// The control connection.
    pub control: OwnedFd,
    /// The segment memfd, found sealed against resizing as the header was read (not public:
    /// a claim maps it without asking its seals again).
    memfd: OwnedFd,
    /// The mode asked for.
    pub mode: Mode,
    header: Header,
    layout: Layout,
}

/// Result of [`read_hello`].
#[derive(Debug)]
pub enum HelloRead {
    /// Nothing yet (the control socket is given back).
    Pending(OwnedFd),
    /// A well-formed HELLO.
    Hello(Box<Hello>),
    /// An ASK (spec section 3, "Offers for another process's listener"): the connection text it
    /// names, to be answered on the control socket by the service that holds the offers.
    Ask(OwnedFd, Vec<u8>),
    /// Refused (REJECT sent if it made sense) or hung up; the reason is for the log.
    Refused(String),
}

/// Sends `REJECT(reason)` on `control` (best effort).
pub fn reject(control: &OwnedFd, reason: Reason) {
    let msg = Message::Reject { version: wire::VERSION, reason }.encode();
    let _ = seqpacket::send(control, &msg, &[]);
}

/// Whether `fd` is an eventfd (a self bell handed over across `exec` must be one).
fn is_eventfd(fd: &OwnedFd) -> bool {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    link.is_ok_and(|l| l.as_os_str() == "anon_inode:[eventfd]")
}


/// A fresh self bell (an eventfd of this process), moved to the floor (see [`set_fd_floor`]).
pub(crate) fn new_self_bell() -> io::Result<OwnedFd> {
    let mut fd = [doorbell::create()?];
    high_all(&mut fd)?;
    let [fd] = fd;
    Ok(fd)
}

/// Reads the HELLO waiting on an accepted rendezvous connection, without blocking.
pub fn read_hello(control: OwnedFd) -> HelloRead {
    let mut buf = [0u8; MESSAGE_LEN + wire::ASK_KEY_MAX + 1];
    let mut r = match seqpacket::recv(&control, &mut buf, true) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return HelloRead::Pending(control),
        Err(e) => return HelloRead::Refused(format!("rendezvous read: {e}")),
    };
    // Nothing after the HELLO may carry descriptors (spec section 3; `colo_sys::gift`), and
    // nothing may follow it before our answer: what did (queued before the socket refused
    // descriptors) is taken now, its descriptors closed disarmed, and the HELLO refused.
    colo_sys::gift::refuse_rights(&control);
    let behind = seqpacket::empty_before_close(&control);
    if r.len == 0 && r.fds.is_empty() {
        return HelloRead::Refused("client hung up before HELLO".into());
    }
    let bad = |why: &str| {
        reject(&control, Reason::BadMessage);
        HelloRead::Refused(why.to_string())
    };
    if let Some((version, key)) = wire::decode_ask(&buf[..r.len]).filter(|_| !r.truncated && r.fds.is_empty() && behind == 0) {
        if version != wire::VERSION {
            reject(&control, Reason::BadVersion);
            return HelloRead::Refused(format!("ASK version {version}"));
        }
        return HelloRead::Ask(control, key.to_vec());
    }
    if r.truncated || r.len != MESSAGE_LEN {
        return bad("HELLO of the wrong size");
    }
    let mode = match Message::decode(&buf[..r.len]) {
        Ok(Message::Hello { version: wire::VERSION, mode }) => mode,
        Ok(Message::Hello { version, .. }) => {
            reject(&control, Reason::BadVersion);
            return HelloRead::Refused(format!("HELLO version {version}"));
        }
        Ok(_) => return bad("not a HELLO"),
        Err(e) => return bad(e),
    };
    if behind > 0 {
        return bad("a message behind the HELLO");
    }
    if r.fds.len() != 1 {
        return bad("HELLO without exactly one descriptor");
    }
    if !colo_sys::gift::closes_at_once(&r.fds[0]) {
        // Discarded with the datagram: its plain close could wait (a FUSE file's).
        reject(&control, Reason::BadSegment);
        return HelloRead::Refused("the segment is not a memfd".into());
    }
    let Some(memfd) = r.take_fds().pop() else { unreachable!("one descriptor") };
    match hello_from_fds(control, memfd, mode) {
        Ok(h) => HelloRead::Hello(Box::new(h)),
        Err(e) => HelloRead::Refused(e),
    }
}

/// How the reason [`hello_from_fds`] gives begins when no descriptor number was free for the
/// HELLO's descriptors (a resource, not the client's fault).
pub const NO_DESCRIPTORS: &str = "descriptors";

/// Rebuilds a [`Hello`] from its descriptors (e.g. after passing them to another process of
/// the same server with `SCM_RIGHTS`). Sends REJECT(BAD_SEGMENT) if the header is invalid.
pub fn hello_from_fds(control: OwnedFd, memfd: OwnedFd, mode: Mode) -> Result<Hello, String> {
    let mut fds = [control, memfd];
    if let Err(e) = high_all(&mut fds) {
        reject(&fds[0], Reason::NoResources);
        return Err(format!("{NO_DESCRIPTORS}: {e}"));
    }
    let [control, memfd] = fds;
    let mut head = [0u8; HEADER_FIELDS];
    match segment::read_prefix(&memfd, &mut head) {
        Ok(HEADER_FIELDS) => {}
        _ => {
            reject(&control, Reason::BadSegment);
            return Err("segment header unreadable".into());
        }
    }
    let (header, layout) = match Header::decode(&head) {
        Ok(h) => h,
        Err(e) => {
            reject(&control, Reason::BadSegment);
            return Err(e.into());
        }
    };
    if mode == Mode::Carrier && (header.client_addr.is_none() || header.server_addr.is_none()) {
        reject(&control, Reason::BadSegment);
        return Err("CARRIER offer without a 4-tuple".into());
    }
    Ok(Hello { control, memfd, mode, header, layout })
}

impl Hello {
    /// The segment memfd.
    pub fn memfd(&self) -> BorrowedFd<'_> {
        self.memfd.as_fd()
    }

    /// The 4-tuple `(client, server)` this offer is for (CARRIER mode).
    pub fn key(&self) -> Option<Key> {
        Some(key(self.header.client_addr?, self.header.server_addr?))
    }

    /// Claims the offer for the TCP connection just accepted: checks that the offer's sender
    /// owns the client end of that connection (its uid is ours or root's, or the socket with the
    /// offer's client address and server address as its two ends is its own), validates the
    /// descriptors and the segment, maps it, CAS `claim` OFFERED → CLAIMED, writes
    /// `server_pid`, sends WELCOME. On failure sends the matching REJECT (NOT_CLAIMED when the
    /// client abandoned first or the sender does not own the connection) and the connection
    /// stays plain TCP.
    pub fn claim(self) -> Result<Established, String> {
        self.claim_checked(None)
    }

    /// [`Hello::claim`] of a cross-namespace offer whose proof the caller matched against the
    /// nonces it handed out on the accepted TCP connection (spec/WIRE.md section 11): the proof,
    /// not the owner of a 4-tuple in this namespace's table, shows that the sender holds the
    /// connection's client end. `(local, peer)` is the accepted connection as this side sees it
    /// (the client's header records its own view, before any address translation).
    pub(crate) fn claim_proved(self, local: SocketAddr, peer: SocketAddr) -> Result<Established, String> {
        self.claim_checked(Some((local, peer)))
    }

    fn claim_checked(self, proved: Option<(SocketAddr, SocketAddr)>) -> Result<Established, String> {
        let fail = |control: &OwnedFd, reason: Reason, why: String| {
            reject(control, reason);
            Err(why)
        };
        if self.mode != Mode::Carrier {
            return fail(&self.control, Reason::NeedCarrier, "DIRECT HELLO to a CARRIER-only listener".into());
        }
        let (client, server) = self.key().ok_or_else(|| "CARRIER offer without a 4-tuple".to_string())?;
        // A proved offer may come from another pid namespace (pid 0).
        let cred = if proved.is_some() { colo_sys::pathsock::peer_cred_any(&self.control) } else { seqpacket::peer_cred(&self.control) };
        let (client_pid, client_uid) = match cred {
            Ok(c) => c,
            Err(e) => return fail(&self.control, Reason::NoResources, format!("peer credentials: {e}")),
        };
        // Only the owner of the connection's client end may move it onto a segment.
        if proved.is_none() {
            if let Err(why) = crate::trust::offer_sender_trusted(client, server, client_uid) {
                return fail(&self.control, Reason::NotClaimed, why);
            }
        }
        let (server, client) = proved.unwrap_or((server, client));
        let self_bell = match new_self_bell() {
            Ok(fd) => fd,
            Err(e) => return fail(&self.control, Reason::NoResources, format!("self bell: {e}")),
        };
        // Counted against this process's budgets of peer segments (not mapped if it does not fit).
        let admit = |size| crate::budget::Lease::take(client_uid, size);
        // `hello_from_fds` read the header through `read_prefix`: the memfd is sealed.
        let (map, lease) = match segment::attach_sealed(&self.memfd, self.layout.segment_size, admit) {
            Ok(m) => m,
            Err(segment::AttachError::BadSegment(e)) => return fail(&self.control, Reason::BadSegment, e.into()),
            Err(segment::AttachError::Os(e)) => return fail(&self.control, Reason::NoResources, e.to_string()),
            Err(segment::AttachError::Refused(e)) => return fail(&self.control, Reason::NoResources, e),
        };
        let memfd = self.memfd.as_raw_fd();
        if map.len() != self.layout.segment_size {
            return fail(&self.control, Reason::BadSegment, "segment size differs from its header".into());
        }
        // SAFETY: `attach` checked the file is sealed; its size equals `layout.segment_size`.
        let seg = unsafe { Segment::new(map, self.layout, self.memfd) }.leased(lease);
        // SYNC POINT with the CAS in `Offer::abandon`: exactly one of the two wins.
        if claim_word(seg.base())
            .compare_exchange(claim::OFFERED, claim::CLAIMED, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return fail(&self.control, Reason::NotClaimed, "offer already abandoned or not an offer".into());
        }
        // SAFETY: offset 44 is an aligned u32 inside the header of our mapping.
        unsafe { &*(seg.base().add(SERVER_PID_OFFSET) as *const AtomicU32) }.store(host::pid(), Ordering::Relaxed);
        let welcome = Message::Welcome { version: wire::VERSION }.encode();
        if let Err(e) = seqpacket::send(&self.control, &welcome, &[]) {
            // The client is gone; the claim stands but nobody will use it.
            return Err(format!("WELCOME: {e}"));
        }
        Ok(Established {
            seg,
            fds: Fds { control: self.control, self_bell },
            role: Role::Server,
            local: server,
            peer: client,
            peer_pid: client_pid,
            memfd,
        })
    }
}
