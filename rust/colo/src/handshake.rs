//! Connection set-up over the rendezvous (spec/WIRE.md sections 2 and 3): the client's dial and
//! the server's answer to one HELLO.

use crate::fork;
use crate::known::{forget, known, known_direct, remember, Known};
use crate::log;
use crate::options::Options;
use crate::segment::{Role, Segment};
use crate::shm::{Fds, Recycle, Shm};
use crate::wire::{self, claim, Header, Message, Mode, Reason, HEADER_FIELDS, MESSAGE_LEN};
use colo_sys::{doorbell, host, segment, seqpacket, AsFd, OwnedFd};
use std::io;
use std::net::{IpAddr, SocketAddr};
use crate::recycle::Table;
use std::sync::{Arc, Mutex, MutexGuard};

/// A client's half of a connection, made before (or right after) reaching the listener.
struct Prepared {
    memfd: OwnedFd,
    map: colo_sys::segment::Mapping,
    layout: colo_ring::layout::Layout,
    /// Our self bell.
    self_bell: OwnedFd,
}

/// Builds a fresh segment and self bell for `geometry` (header addresses filled in later).
fn build(geometry: colo_ring::layout::Geometry) -> io::Result<(u32, Prepared)> {
    let layout = geometry.layout().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let (memfd, map) = segment::create(layout.segment_size)?;
    // Touch the pages every connection uses (header, ring control and first data pages) now,
    // off the connection's critical path when built by the preparer thread.
    for off in [0, layout.block_offset(true), layout.block_offset(false)] {
        // SAFETY: page-aligned offsets inside the fresh, private mapping.
        unsafe { std::ptr::write_volatile(map.as_ptr().add(off + 1024), 0u8) };
    }
    let prepared = Prepared { memfd, map, layout, self_bell: doorbell::create()? };
    Ok((host::pid(), prepared))
}

/// Segments built ahead by a background thread, so a dial only fills in the header. Each is
/// tagged with the pid that built it: a forked child never takes its parent's.
struct Pool {
    ready: Vec<(u32, Prepared)>,
    geometry: Option<colo_ring::layout::Geometry>,
    /// The pid whose preparer thread runs (a forked child has none until it starts its own).
    preparer: u32,
}

static POOL: Mutex<Pool> = Mutex::new(Pool { ready: Vec::new(), geometry: None, preparer: 0 });
static POOL_WAKE: std::sync::Condvar = std::sync::Condvar::new();
const POOL_TARGET: usize = 4;

static POOL_LOCKS: fork::Locks = fork::Locks { take: fork_guards, in_child: None };

/// The lock of the segments built ahead, taken around a fork (see `fork`).
fn fork_guards(held: &mut fork::Held) {
    held.hold(POOL.lock().unwrap_or_else(|e| e.into_inner()));
}

/// The segments built ahead, locked (registered with `fork` before its first use).
fn lock_pool() -> MutexGuard<'static, Pool> {
    fork::protect(fork::Rank::Prepared, &POOL_LOCKS);
    POOL.lock().unwrap_or_else(|e| e.into_inner())
}

fn preparer() {
    let mut pool = lock_pool();
    loop {
        while pool.ready.len() >= POOL_TARGET || pool.geometry.is_none() {
            pool = POOL_WAKE.wait(pool).unwrap_or_else(|e| e.into_inner());
        }
        let g = pool.geometry.expect("checked");
        drop(pool);
        let built = build(g);
        pool = lock_pool();
        match built {
            Ok(p) if pool.geometry == Some(g) => pool.ready.push(p),
            Ok(_) => {}
            Err(_) => pool.geometry = None,
        }
    }
}

fn prepare(addr: SocketAddr, opts: &Options) -> io::Result<Prepared> {
    let geometry = opts.geometry();
    let me = host::pid();
    let taken = {
        let mut pool = lock_pool();
        if pool.geometry != Some(geometry) {
            pool.ready.clear();
            pool.geometry = Some(geometry);
        }
        if pool.preparer != me {
            // First dial in this process, or in a forked child: the parent's prepared segments
            // are the parent's (dropping our copies leaves its own intact).
            pool.ready.retain(|(pid, _)| *pid == me);
            if colo_sys::host::spawn("colo-prepare", preparer).is_ok() {
                pool.preparer = me;
            }
        }
        let i = pool.ready.iter().position(|(pid, _)| *pid == me);
        let taken = i.map(|i| pool.ready.swap_remove(i).1);
        POOL_WAKE.notify_one();
        taken
    };
    let p = match taken {
        Some(p) => p,
        None => build(geometry)?.1,
    };
    let header = Header {
        geometry,
        claim: claim::DIRECT,
        client_pid: me,
        server_pid: 0,
        client_addr: Some(SocketAddr::new(addr.ip(), 0)),
        server_addr: Some(addr),
    };
    // SAFETY: the mapping is private to us until HELLO is sent; nobody else accesses it yet.
    let head = unsafe { std::slice::from_raw_parts_mut(p.map.as_ptr(), HEADER_FIELDS) };
    header.encode(head).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    Segment::start_rings(&p.map, &p.layout);
    Ok(p)
}

/// A client's segment, ready before it reaches the listener.
enum Ready {
    /// Parked by both sides after an earlier connection to the listener `name` (pid `server_pid`).
    Recycled { name: String, server_pid: u32, parked: crate::recycle::Parked, ticket: u32 },
    /// Newly built.
    Fresh(Prepared),
}

/// How a dial ended.
pub(crate) enum Dialed {
    /// DIRECT: shared memory, no TCP connection.
    Direct(Shm),
    /// CARRIER (the server is an unmodified program under `colo run`): shared memory, with the
    /// TCP connection that carries the 4-tuple.
    Carrier(Shm, std::net::TcpStream),
    /// Plain TCP, already connected (a CARRIER offer that was not claimed).
    Tcp(std::net::TcpStream),
    /// Plain TCP, already connected, whose cross-namespace answer is still owed
    /// ([`crate::owed::Owed`]): the server's program had not accepted it within the wait.
    Owed(std::net::TcpStream),
    /// Not a colo listener here: dial plain TCP.
    No,
}

/// Dials `addr` in CARRIER mode (spec/WIRE.md section 3): bind, offer, connect, wait for the claim.
fn dial_carrier(addr: SocketAddr, opts: &Options) -> io::Result<Dialed> {
    use crate::carrier;
    let Some(carrier::Rendezvous { control, server_pid, .. }) = carrier::connect_rendezvous(addr)? else { return Ok(Dialed::No) };
    let (sock, local) = colo_sys::tcp::bind_ephemeral(addr.ip())?;
    let offer = carrier::offer(control, server_pid, local, addr, opts.geometry())?;
    colo_sys::tcp::connect(&sock, addr)?;
    let tcp = std::net::TcpStream::from(sock);
    let _ = tcp.set_nodelay(true);
    // The server's program accepts, and claims the offer, within `carrier::timeout()`, or the
    // connection stays plain TCP.
    if !claimed(&offer, carrier::timeout()) {
        log::info(format_args!("dial {addr}: carrier offer not claimed; plain TCP"));
        return Ok(Dialed::Tcp(tcp));
    }
    let shm = offer.established().into_shm(opts.spin_mode())?;
    // The carrier carries nothing after the claim: closed with a reset (spec/WIRE.md section 3),
    // its port is free again at once instead of held a minute in TIME_WAIT, which at a few
    // hundred connections a second would use up the odd ports a carrier may bind.
    let _ = colo_sys::tcp::reset_on_close(tcp.as_fd());
    Ok(Dialed::Carrier(shm, tcp))
}

/// Dials `addr`, a configured listener of another namespace whose rendezvous is in `dir`
/// (spec/WIRE.md section 11): TCP first, then the proposal; plain TCP on that same connection
/// unless the offer is claimed.
fn dial_netns(addr: SocketAddr, dir: &std::path::Path, opts: &Options) -> io::Result<Dialed> {
    use crate::netns::{self, Dialed as Proposed};
    if crate::owed::recently_late(addr) {
        log::info(format_args!("dial {addr}: cross-namespace: its server did not answer in time a moment ago; plain TCP"));
        return Ok(Dialed::No);
    }
    let tcp = match opts.tcp_connect_limit() {
        Some(t) => std::net::TcpStream::connect_timeout(&addr, t),
        None => std::net::TcpStream::connect(addr),
    }?;
    let _ = tcp.set_nodelay(true);
    let local = tcp.local_addr()?;
    let offer = match netns::propose(tcp.as_fd(), dir, local, addr, opts.geometry()) {
        Proposed::Offered(o) => o,
        Proposed::Plain(why) => {
            log::info(format_args!("dial {addr}: cross-namespace: {why}; plain TCP"));
            return Ok(Dialed::Tcp(tcp));
        }
        Proposed::Broken(e) if e.kind() == io::ErrorKind::TimedOut => {
            log::info(format_args!(
                "dial {addr}: cross-namespace: no answer within {} ms (its server's program has not accepted the connection); plain TCP, the answer taken off the stream when it comes, and plain TCP there for a second",
                crate::carrier::timeout().as_millis()
            ));
            crate::owed::late_server(addr);
            return Ok(Dialed::Owed(tcp));
        }
        Proposed::Broken(e) => return Err(e),
    };
    if !claimed(&offer, crate::carrier::timeout()) {
        log::info(format_args!("dial {addr}: cross-namespace offer not claimed; plain TCP"));
        return Ok(Dialed::Tcp(tcp));
    }
    Ok(Dialed::Carrier(offer.established().into_shm(opts.spin_mode())?, tcp))
}

/// Whether the server claimed `offer`: its answer within `wait`, or, once the offer is abandoned
/// too late to withdraw it (the server had claimed it), the answer it then owes. An offer not
/// claimed leaves the connection on plain TCP; nothing was written into its ring yet, so there
/// is nothing to flush.
fn claimed(offer: &crate::carrier::Offer, wait: std::time::Duration) -> bool {
    use crate::carrier::{Abandon, Answer};
    match offer.wait_answer(wait) {
        Answer::Welcome => true,
        _ => match offer.abandon() {
            Abandon::Abandoned => false,
            Abandon::Claimed => offer.wait_answer(std::time::Duration::from_secs(5)) == Answer::Welcome,
        },
    }
}

/// Dials `addr` over shared memory if a colo listener serves it on this host.
pub(crate) fn dial(addr: SocketAddr, opts: &Options) -> io::Result<Dialed> {
    // Configured as a listener in another network namespace (spec/WIRE.md section 11).
    if let Some(dir) = crate::netns::peer_dir(addr) {
        return dial_netns(addr, dir, opts);
    }
    match dial_direct(addr, opts)? {
        Direct::Done(shm) => Ok(Dialed::Direct(shm)),
        Direct::NeedCarrier => dial_carrier(addr, opts),
        Direct::No => Ok(Dialed::No),
    }
}

// One value per dial, moved once: boxing the Shm would add an allocation for nothing.
#[allow(clippy::large_enum_variant)]
enum Direct {
    Done(Shm),
    NeedCarrier,
    No,
}

/// The DIRECT handshake; `No` means "use TCP" (not local, nobody listening on the rendezvous,
/// refused, or not trusted).
fn dial_direct(addr: SocketAddr, opts: &Options) -> io::Result<Direct> {
    if !host::is_local(addr.ip()) {
        return Ok(Direct::No);
    }
    let names = wire::lookup_names(addr);
    // For a listener known to speak DIRECT, have the segment ready first so the HELLO follows the
    // connect at once and the listener finds it on its first read: one that this process and that
    // listener both parked after an earlier connection (no new segment, no descriptors to pass,
    // nothing to map: section 3, "Recycling"), or one built ahead.
    let mut ready = match names.iter().find_map(|n| known_direct(n).map(|pid| (n, pid))) {
        Some((n, pid)) => Some(match crate::recycle::take_client(n, pid, opts.geometry()) {
            Some((parked, ticket)) => Ready::Recycled { name: n.clone(), server_pid: pid, parked, ticket },
            None => Ready::Fresh(prepare(addr, opts)?),
        }),
        None => None,
    };
    let crate::carrier::Reached { control, name, server_pid, server_uid } = match crate::carrier::reach_trusted(addr, &names, "dial") {
        Ok(Some(r)) => r,
        Ok(None) => return Ok(Direct::No),
        Err(e) => {
            log::info(format_args!("dial {addr}: rendezvous: {e}; using TCP"));
            return Ok(Direct::No);
        }
    };
    let seen = known(&name, server_pid);
    if seen == Some(Known::Carrier) {
        return Ok(Direct::NeedCarrier);
    }
    let ready = match ready.take() {
        Some(r @ Ready::Recycled { .. }) if matches!(&r, Ready::Recycled { name: n, server_pid: p, .. } if *n == name && *p == server_pid) => r,
        Some(r @ Ready::Fresh(_)) => r,
        // A segment parked with another listener (it was replaced): the server's side of it is
        // dropped by its own timer.
        _ => Ready::Fresh(prepare(addr, opts)?),
    };
    let (seg, self_bell) = match ready {
        Ready::Recycled { parked, ticket, .. } => {
            write_addresses(&parked.seg, addr, server_pid)?;
            seqpacket::send(&control, &Message::Recycle { version: wire::VERSION, ticket }.encode(), &[])?;
            (parked.seg, parked.self_bell)
        }
        Ready::Fresh(p) => {
            let hello = Message::Hello { version: wire::VERSION, mode: Mode::Direct }.encode();
            seqpacket::send(&control, &hello, &[p.memfd.as_fd()])?;
            // SAFETY: the mapping is exactly `layout.segment_size` bytes, laid out by `layout`.
            (unsafe { Segment::new(p.map, p.layout, p.memfd) }, p.self_bell)
        }
    };

    // Wait briefly for the answer; a server that has not reached accept() yet answers later
    // (spec/WIRE.md section 3, "The backlog"). A listener that answered before is not waited for,
    // nor asked now (it has not read the HELLO yet): its answer is read with the first wait.
    // Not for an IPv4 dial that reached the IPv6 wildcard: that listener may be IPV6_V6ONLY,
    // and its REJECT(NOT_SERVED) must come before connect returns, as TCP's refusal would.
    let cross_family = host::canonical(addr.ip()).is_ipv4() && name.starts_with("colo/1/[");
    // A server of another uid takes DIRECT only if it opted in (spec/WIRE.md section 3): its
    // answer, likely NEED_CARRIER, must be read now, not after bytes went into the ring.
    let must_answer = server_uid != host::uid() || cross_family;
    // A listener is known by name and pid, and a pid is reused: one of another uid now (the
    // listener that welcomed us exited, another user's took its port and its pid) is waited for.
    let known = seen == Some(Known::Direct) && !must_answer;
    let mut seg = seg;
    let pending = known || {
        let mut buf = [0u8; 64];
        seqpacket::set_recv_timeout(&control, Some(opts.handshake_timeout()))?;
        // Who answers: the rendezvous's `SO_PEERCRED` is the listener's at its `listen`, and a
        // server that listened as us may serve as another user now (see `Offer::established`).
        // An answer sent before this takes effect comes without credentials: judged foreign.
        let _ = colo_sys::gift::mark_messages(&control, true);
        let got = seqpacket::recv_answer(&control, &mut buf, false);
        let _ = colo_sys::gift::mark_messages(&control, false);
        match got {
            Err(e) if (e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut) && must_answer => {
                // Abandoned (a listener that reads the HELLO later finds its client gone, as
                // for a TCP client that closed before accept): CARRIER, whose claim waits for
                // the server's accept, serves a slow server of any uid.
                log::info(format_args!("dial {addr}: no answer from {name} yet; offering a carrier"));
                return Ok(Direct::NeedCarrier);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut => {
                // Pending, its answer to come without credentials: nobody vouched for who
                // serves it (the rendezvous's listener may have handed its descriptors to
                // another user since), so it is read through the memfd, as a foreign one.
                if !seg.has_memfd() {
                    log::info(format_args!("dial {addr}: no answer from {name} yet to a recycled segment; using TCP"));
                    forget(&name);
                    return Ok(Direct::No);
                }
                seg.read_through_memfd();
                true
            }
            Ok(r) if r.len == MESSAGE_LEN && !r.odd => match Message::decode(&buf[..r.len]) {
                Ok(Message::Welcome { version: wire::VERSION }) if r.sender_uid == Some(host::uid()) => false,
                Ok(Message::Welcome { version: wire::VERSION }) if seg.has_memfd() => {
                    // Read through the memfd (`Segment::read_through_memfd`), and never
                    // pending: each answer is looked at.
                    seg.read_through_memfd();
                    false
                }
                Ok(Message::Welcome { .. }) => {
                    // A recycled segment, without its memfd: nothing to read it through.
                    log::info(format_args!("dial {addr}: {name} answers as another user now; using TCP"));
                    forget(&name);
                    return Ok(Direct::No);
                }
                Ok(Message::Reject { reason: Reason::NeedCarrier, .. }) => {
                    remember(name, server_pid, Known::Carrier);
                    return Ok(Direct::NeedCarrier);
                }
                Ok(Message::Reject { reason, .. }) => {
                    log::info(format_args!("dial {addr}: refused: {reason}; using TCP"));
                    return Ok(Direct::No);
                }
                other => {
                    log::info(format_args!("dial {addr}: not an answer ({other:?}); using TCP"));
                    return Ok(Direct::No);
                }
            },
            Ok(r) if r.len == 0 => {
                log::info(format_args!("dial {addr}: listener closed the rendezvous connection; using TCP"));
                return Ok(Direct::No);
            }
            Ok(_) => {
                log::info(format_args!("dial {addr}: unexpected answer; using TCP"));
                return Ok(Direct::No);
            }
            Err(e) => {
                log::info(format_args!("dial {addr}: no answer: {e}; using TCP"));
                return Ok(Direct::No);
            }
        }
    };
    // Served by another user now: neither waited for less nor recycled (a recycled segment
    // comes without the memfd its ring is read through).
    let foreign = seg.reads_through_memfd();
    if !pending && !known && !foreign {
        remember(name.clone(), server_pid, Known::Direct);
    }
    let fds = Fds { control, self_bell };
    let local = SocketAddr::new(addr.ip(), 0);
    let mut shm = Shm::new(seg, Role::Client, fds, local, addr, server_pid, opts.spin_mode())?;
    if !foreign {
        shm.recycle_into(Recycle::Client(name.clone()));
    }
    if pending {
        // A listener whose answer came without credentials is not taken for known.
        shm.expect_welcome((!foreign).then_some(name));
    }
    Ok(Direct::Done(shm))
}

/// Rewrites the address records of a recycled segment for the dial to `addr` (the rest of the
/// header is as the first connection left it).
fn write_addresses(seg: &Segment, addr: SocketAddr, server_pid: u32) -> io::Result<()> {
    let header = Header {
        geometry: seg.layout().geometry,
        claim: claim::DIRECT,
        client_pid: host::pid(),
        server_pid,
        client_addr: Some(SocketAddr::new(addr.ip(), 0)),
        server_addr: Some(addr),
    };
    let mut b = [0u8; HEADER_FIELDS];
    header.encode(&mut b).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: the header lies in our mapping and neither side uses the segment (we took it back
    // from both parked sides); the bytes from offset 96 on (`parked`, `ticket`, waiting words)
    // are not touched.
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), seg.base(), 96) };
    Ok(())
}

/// The outcome of reading one HELLO on an accepted control connection.
// One value per HELLO, moved once: boxing the Shm would add an allocation for nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Answer {
    /// Nothing complete yet.
    Pending(OwnedFd),
    /// A connection, WELCOME sent.
    Accepted(Shm),
    /// A CARRIER offer: claimed when the TCP connection with its 4-tuple is accepted.
    Offer(Box<crate::carrier::Hello>),
    /// Refused or garbage; REJECT sent if possible; the reason is for the log.
    Refused(String),
}

fn reject(control: &OwnedFd, reason: Reason, why: impl Into<String>) -> Answer {
    let msg = Message::Reject { version: wire::VERSION, reason }.encode();
    let _ = seqpacket::send(control, &msg, &[]);
    Answer::Refused(why.into())
}

/// The TCP socket a listener serves: its address, and whether it is an IPv6 socket with
/// `IPV6_V6ONLY` (which refuses IPv4 connections).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Served {
    pub addr: SocketAddr,
    pub v6only: bool,
}

/// Reads and answers the HELLO waiting on `control` (non-blocking); `parked` is the listener's
/// table of recycled segments.
pub(crate) fn answer(control: OwnedFd, served: Served, opts: &Options, parked: &Arc<Table>) -> Answer {
    let mut buf = [0u8; 64];
    let mut r = match seqpacket::recv(&control, &mut buf, true) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Answer::Pending(control),
        Err(e) => return Answer::Refused(format!("rendezvous read: {e}")),
    };
    // Nothing after the HELLO may carry descriptors (spec section 3; `colo_sys::gift`), and
    // nothing may follow it before our answer: what did (queued before the socket refused
    // descriptors) is taken now, its descriptors closed disarmed, and the HELLO refused.
    colo_sys::gift::refuse_rights(&control);
    let behind = seqpacket::empty_before_close(&control);
    if r.len == 0 && r.fds.is_empty() {
        return Answer::Refused("client hung up before HELLO".into());
    }
    if r.truncated || r.len != MESSAGE_LEN {
        return reject(&control, Reason::BadMessage, "HELLO of the wrong size");
    }
    if behind > 0 {
        return reject(&control, Reason::BadMessage, "a message behind the HELLO");
    }
    let mode = match Message::decode(&buf[..r.len]) {
        Ok(Message::Hello { version: wire::VERSION, mode }) => mode,
        Ok(Message::Recycle { version: wire::VERSION, ticket }) => {
            if !r.fds.is_empty() {
                return reject(&control, Reason::BadMessage, "recycling HELLO with descriptors");
            }
            return answer_recycled(control, ticket, served, opts, parked);
        }
        Ok(Message::Hello { version, .. } | Message::Recycle { version, .. }) => {
            return reject(&control, Reason::BadVersion, format!("HELLO version {version}"))
        }
        Ok(_) => return reject(&control, Reason::BadMessage, "not a HELLO"),
        Err(e) => return reject(&control, Reason::BadMessage, e),
    };
    if r.fds.len() != 1 {
        return reject(&control, Reason::BadMessage, "HELLO without exactly one descriptor");
    }
    if !colo_sys::gift::closes_at_once(&r.fds[0]) {
        // Discarded with the datagram: its plain close could wait (a FUSE file's).
        return reject(&control, Reason::BadSegment, "the segment is not a memfd");
    }
    let Some(memfd) = r.take_fds().pop() else { unreachable!("one descriptor") };
    if mode == Mode::Carrier {
        // An unmodified client under `colo run`: its TCP connection will claim the offer.
        return match crate::carrier::hello_from_fds(control, memfd, mode) {
            Ok(h) => Answer::Offer(Box::new(h)),
            Err(e) => Answer::Refused(e),
        };
    }
    let (client_pid, client_uid) = match seqpacket::peer_cred(&control) {
        Ok(c) => c,
        Err(e) => return reject(&control, Reason::NoResources, format!("peer credentials: {e}")),
    };
    if !crate::trust::direct_admitted(client_uid, opts) {
        // No TCP handshake, so no firewall rule, would see this connection: a real one must.
        return reject(&control, Reason::NeedCarrier, format!("DIRECT HELLO from uid {client_uid}: a carrier is required"));
    }
    // Counted against this process's budgets of peer segments (not mapped if it does not fit).
    let (map, lease) = match segment::attach_admitted(&memfd, HEADER_FIELDS, |size| crate::budget::Lease::take(client_uid, size)) {
        Ok(m) => m,
        Err(segment::AttachError::BadSegment(e)) => return reject(&control, Reason::BadSegment, e),
        Err(segment::AttachError::Os(e)) => return reject(&control, Reason::NoResources, e.to_string()),
        Err(segment::AttachError::Refused(e)) => return reject(&control, Reason::NoResources, e),
    };
    let (header, layout) = match read_header(map.as_ptr()) {
        Ok(h) => h,
        Err(e) => return reject(&control, Reason::BadSegment, e),
    };
    if map.len() != layout.segment_size {
        return reject(&control, Reason::BadSegment, "segment size differs from its header");
    }
    // SAFETY: `attach` checked the file is exactly `layout.segment_size` bytes and sealed.
    let seg = unsafe { Segment::new(map, layout, memfd) }.leased(lease);
    // server_pid (offset 44) is informational, for `colo stat`.
    // SAFETY: offset 44 is an aligned u32 inside the header of our mapping.
    unsafe { &*(seg.base().add(44) as *const colo_ring::sync::AtomicU32) }
        .store(host::pid(), colo_ring::sync::Ordering::Relaxed);
    let self_bell = match crate::carrier::new_self_bell() {
        Ok(fd) => fd,
        Err(e) => return reject(&control, Reason::NoResources, format!("self bell: {e}")),
    };
    let fds = Fds { control, self_bell };
    welcome(seg, fds, &header, client_pid, served, opts, parked)
}

/// Copies the header fields out of a mapping (once: they are never read from the segment again)
/// and validates them.
fn read_header(base: *const u8) -> Result<(Header, colo_ring::layout::Layout), &'static str> {
    let mut head = [0u8; HEADER_FIELDS];
    // SAFETY: callers pass a mapping of at least HEADER_FIELDS bytes (`attach` checked the file
    // size and seals, or the segment was validated when first accepted).
    unsafe { std::ptr::copy_nonoverlapping(base, head.as_mut_ptr(), HEADER_FIELDS) };
    Header::decode(&head)
}

/// A RECYCLE HELLO: the client took back the segment this listener parked under `ticket`.
fn answer_recycled(control: OwnedFd, ticket: u32, served: Served, opts: &Options, parked: &Arc<Table>) -> Answer {
    let (client_pid, client_uid) = match seqpacket::peer_cred(&control) {
        Ok(c) => c,
        Err(e) => return reject(&control, Reason::NoResources, format!("peer credentials: {e}")),
    };
    if !crate::trust::direct_admitted(client_uid, opts) {
        return reject(&control, Reason::NeedCarrier, format!("recycling HELLO from uid {client_uid}: a carrier is required"));
    }
    let p = match parked.take(ticket, client_pid) {
        Ok(p) => p,
        Err(e) => return reject(&control, Reason::BadSegment, e),
    };
    if client_uid != host::uid() && !p.seg.has_memfd() {
        // Parked by a connection of our own user, which closed the memfd at set-up: a process
        // that changed uid since would have its ring read through our mapping, where a peer of
        // another user's is read through the memfd (`Segment::read_through_memfd`: holes it
        // claims allocate nothing of ours). Refused as any other (the client dials TCP).
        crate::shm::retire(p.seg);
        return reject(&control, Reason::BadSegment, format!("recycling HELLO from uid {client_uid}, parked by a connection of ours"));
    }
    // The geometry stays the one validated when the segment was first accepted; only the
    // addresses are read again.
    let header = match read_header(p.seg.base()) {
        Ok((h, _)) if h.geometry == p.seg.layout().geometry && h.claim == claim::DIRECT => h,
        Ok(_) => return reject(&control, Reason::BadSegment, "recycled segment changed its geometry or mode"),
        Err(e) => return reject(&control, Reason::BadSegment, e),
    };
    let fds = Fds { control, self_bell: p.self_bell };
    welcome(p.seg, fds, &header, client_pid, served, opts, parked)
}

/// Builds the server's side of a DIRECT connection and sends WELCOME.
fn welcome(
    seg: Segment,
    fds: Fds,
    header: &Header,
    client_pid: u32,
    served: Served,
    opts: &Options,
    parked: &Arc<Table>,
) -> Answer {
    let listen_addr = served.addr;
    if !crate::trust::serves(listen_addr, served.v6only, header.server_addr) {
        // An IPv4 client of an IPV6_V6ONLY listener, which TCP would refuse too.
        let dialed = header.server_addr.map_or("an unknown address".to_string(), |a| a.to_string());
        return reject(&fds.control, Reason::NotServed, format!("DIRECT HELLO for {dialed}, which this TCP socket does not serve"));
    }
    let local = header.server_addr.filter(|a| a.port() == listen_addr.port()).unwrap_or(listen_addr);
    // The client writes its own address: believe it only if it names this host.
    let peer_ip: IpAddr = header.client_addr.map(|a| a.ip()).filter(|ip| host::is_local(*ip)).unwrap_or(local.ip());
    let mut shm = match Shm::new(seg, Role::Server, fds, local, SocketAddr::new(peer_ip, 0), client_pid, opts.spin_mode()) {
        Ok(s) => s,
        Err(e) => return Answer::Refused(format!("readiness: {e}")),
    };
    shm.recycle_into(Recycle::Server(Arc::downgrade(parked)));
    // A client that already closed cannot read WELCOME, but its bytes and FIN are in the ring and
    // are delivered all the same.
    let welcome = Message::Welcome { version: wire::VERSION }.encode();
    let _ = seqpacket::send(shm.control_fd(), &welcome, &[]);
    Answer::Accepted(shm)
}
