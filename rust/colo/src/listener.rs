//! [`Listener`]: a TCP listener plus its rendezvous (spec/WIRE.md section 2).

use crate::carrier;
use crate::halfopen::{HalfOpen, Pending, MAX_HALF_OPEN};
use crate::handshake::{self, Answer};
use crate::log;
use crate::options::Options;
use crate::stream::Stream;
use crate::wire;
use colo_sys::doorbell::Poller;
use colo_sys::{seqpacket, AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use crate::recycle;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TCP: u64 = 0;
const RENDEZVOUS: u64 = 1;
const PENDING: u64 = 2;
/// The timer that expires half-open handshakes (`halfopen`).
const TIMER: u64 = 3;
/// Connections from listed peers of other namespaces waiting to be resolved (`netns_accept`).
const NETNS: u64 = 4;
/// All of `Listener::maybe_ready` (bit `1 << token`).
const ALL_SOURCES: u8 = 1 << TCP | 1 << RENDEZVOUS | 1 << PENDING | 1 << TIMER | 1 << NETNS;

/// Accepts colo connections over shared memory and plain TCP clients on the same address.
///
/// ```no_run
/// use std::io::{Read, Write};
/// let listener = colo::Listener::bind("127.0.0.1:7000")?;
/// let (mut stream, peer) = listener.accept()?;
/// let mut buf = [0u8; 4];
/// stream.read_exact(&mut buf)?;
/// stream.write_all(&buf)?;
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct Listener {
    tcp: TcpListener,
    /// The rendezvous, once bound: at `bind`, or at a TCP accept after the name was found
    /// taken (`take_over_vacant`).
    rendezvous: std::sync::OnceLock<OwnedFd>,
    /// When (`Instant` since `bind`, in ms) an accept last tried to bind a name found taken.
    looked_ms: std::sync::atomic::AtomicU64,
    born: std::time::Instant,
    poller: Poller,
    /// Silent rendezvous connections, and CARRIER offers from clients under `colo run` (by
    /// 4-tuple, until their TCP connection arrives): bounded, expired on a timer.
    half_open: Mutex<HalfOpen>,
    /// Whether `half_open` has its timer in the poll set (else every accept expires).
    timed: bool,
    /// DIRECT connections completed while looking for a carrier offer, returned by the next
    /// accept (at most `MAX_HALF_OPEN`: beyond, the rest stay queued).
    early: Mutex<Vec<(Stream, SocketAddr)>>,
    addr: SocketAddr,
    /// The TCP socket's address and `IPV6_V6ONLY` (DIRECT clients of an address it does not
    /// serve are refused, as TCP refuses them).
    served: handshake::Served,
    opts: Options,
    nonblocking: AtomicBool,
    /// Which sources (bit `1 << token`) may have something to accept: set when the poller reports
    /// them, cleared before a source is tried. Only the sources set are tried, so a connection
    /// costs no `accept` that fails with EAGAIN on the other socket. A blocking accept takes one
    /// rendezvous connection per report (the poller is level-triggered and reports it again
    /// while more wait); a non-blocking one drains what it tries until EAGAIN before it says
    /// WouldBlock, as an edge-triggered poller of the listener's fd (tokio) sees no new edge for
    /// connections already queued.
    maybe_ready: AtomicU8,
    /// Segments of closed connections kept for their clients' next dials.
    parked: Arc<recycle::Table>,
    /// The rendezvous for clients in other network namespaces (`COLO_NETNS_DIR`).
    netns: Option<crate::netns::Rendezvous>,
    /// Their connections while they wait for a PROPOSAL or a HELLO (with `netns`).
    netns_accepts: Option<Mutex<crate::netns_accept::NetnsAccepts>>,
}

impl Listener {
    /// Listens on `addr` (TCP and, for local clients, shared memory).
    pub fn bind(addr: impl ToSocketAddrs) -> io::Result<Listener> {
        Listener::bind_with(addr, Options::new())
    }

    /// Listens with the given options (spin policy of accepted connections).
    pub fn bind_with(addr: impl ToSocketAddrs, opts: Options) -> io::Result<Listener> {
        colo_sys::preload::raise_fd_limit();
        let tcp = TcpListener::bind(addr)?;
        tcp.set_nonblocking(true)?;
        let addr = tcp.local_addr()?;
        let served = handshake::Served { addr, v6only: addr.is_ipv6() && colo_sys::tcp::v6only(&tcp) };
        let poller = Poller::new()?;
        poller.add(&tcp, TCP)?;
        let name = wire::rendezvous_name(addr);
        // Half-open handshakes expire on this timer even if no connection ever comes (without
        // one, a blocking accept's poll timeout does it).
        let timer = colo_sys::timer::create().ok().filter(|t| poller.add(t, TIMER).is_ok());
        let rendezvous = std::sync::OnceLock::new();
        match seqpacket::listen(name.as_bytes()) {
            Ok(fd) => {
                poller.add(&fd, RENDEZVOUS)?;
                let _ = rendezvous.set(fd);
            }
            Err(e) => {
                log::info(format_args!("listen {addr}: rendezvous {name}: {e}; serving TCP only until it is free"));
            }
        }
        let netns = crate::netns::Rendezvous::bind(addr.port());
        let netns_accepts = match &netns {
            Some(r) => match crate::netns_accept::NetnsAccepts::new(&poller, NETNS) {
                Ok(mut a) => {
                    // A blocking accept then reads what arrives there meanwhile (a forged HELLO
                    // is answered at once, not at the next connection from another namespace).
                    a.watch_rendezvous(r, &poller);
                    Some(Mutex::new(a))
                }
                // Then each is resolved in place, in `accept`.
                Err(e) => {
                    log::info(format_args!("listen {addr}: cross-namespace accepts resolved in place: {e}"));
                    None
                }
            },
            None => None,
        };
        Ok(Listener {
            tcp,
            rendezvous,
            looked_ms: std::sync::atomic::AtomicU64::new(0),
            born: std::time::Instant::now(),
            poller,
            timed: timer.is_some(),
            half_open: Mutex::new(HalfOpen::new(timer, crate::halfopen::bound(colo_sys::host::open_files_soft()))),
            early: Mutex::new(Vec::new()),
            addr,
            served,
            opts,
            nonblocking: AtomicBool::new(false),
            maybe_ready: AtomicU8::new(ALL_SOURCES),
            parked: recycle::Table::new(),
            netns,
            netns_accepts,
        })
    }

    /// The address listened on (the actual port if 0 was asked).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.addr)
    }

    /// Whether local clients can reach this listener over shared memory.
    pub fn is_colo(&self) -> bool {
        self.rendezvous.get().is_some()
    }

    /// A listener whose rendezvous name was taken at `bind` (another process listening with
    /// `SO_REUSEPORT`, or any user's process: an abstract name is anyone's to bind while it is
    /// free) binds it once it is free, looking at most once a second, at a TCP accept: a name
    /// held for a moment around a restart would otherwise cost this listener shared memory for
    /// its whole life.
    fn take_over_vacant(&self) {
        use std::sync::atomic::Ordering;
        if self.rendezvous.get().is_some() {
            return;
        }
        let now = self.born.elapsed().as_millis() as u64 + 1;
        let last = self.looked_ms.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < 1000 || self.looked_ms.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_err() {
            return;
        }
        let name = wire::rendezvous_name(self.addr);
        if let Ok(fd) = seqpacket::listen(name.as_bytes()) {
            if self.poller.add(&fd, RENDEZVOUS).is_ok() && self.rendezvous.set(fd).is_ok() {
                log::info(format_args!("listen {}: rendezvous {name} was free: serving shared memory", self.addr));
            }
        }
    }

    /// Non-blocking mode: `accept` returns `WouldBlock` instead of waiting.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        self.nonblocking.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// Waits for the next connection, over shared memory or TCP.
    pub fn accept(&self) -> io::Result<(Stream, SocketAddr)> {
        let nonblocking = self.nonblocking.load(Ordering::Relaxed);
        let mut refreshed = false;
        loop {
            if let Some(s) = self.try_accept(nonblocking)? {
                return Ok(s);
            }
            if nonblocking && refreshed {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let wait = if nonblocking {
                // The hints may be stale: ask the poller, without waiting, before saying so.
                Some(Duration::ZERO)
            } else {
                self.pending_deadline().map(|d| d.saturating_duration_since(Instant::now()))
            };
            let ready = self.poller.wait(wait)?;
            for token in &ready {
                self.hint(*token);
            }
            if ready.len() >= Poller::MAX_EVENTS {
                // Silent rendezvous clients may have filled the batch: look at everything.
                self.maybe_ready.fetch_or(ALL_SOURCES, Ordering::Relaxed);
            }
            if nonblocking {
                if ready.is_empty() {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                refreshed = true;
            }
        }
    }

    /// Clears the hint of `token` and says whether it was set: the caller then tries that source
    /// (and sets the hint again if that failed in a way worth retrying at once).
    fn take_hint(&self, token: u64) -> bool {
        self.maybe_ready.fetch_and(!(1 << token), Ordering::Relaxed) & 1 << token != 0
    }

    fn hint(&self, token: u64) {
        self.maybe_ready.fetch_or(1 << token, Ordering::Relaxed);
    }

    fn half_open(&self) -> std::sync::MutexGuard<'_, HalfOpen> {
        self.half_open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// When a blocking accept must wake to expire half-open handshakes: never if the timer in
    /// the poll set does it.
    fn pending_deadline(&self) -> Option<Instant> {
        if self.timed { None } else { self.half_open().next_deadline() }
    }

    fn finish(&self, answer: Answer) -> Option<(Stream, SocketAddr)> {
        match answer {
            Answer::Accepted(shm) => {
                let peer = shm.peer_addr();
                log::info(format_args!("accept {}: shared memory with pid {}", self.addr, shm.peer_pid()));
                Some((Stream::from_shm(shm), peer))
            }
            Answer::Pending(fd) => {
                let uid = match seqpacket::peer_cred(&fd) {
                    Ok((_, uid)) => uid,
                    Err(e) => {
                        log::info(format_args!("accept {}: rendezvous client: peer credentials: {e}", self.addr));
                        return None;
                    }
                };
                let mut half_open = self.half_open();
                match half_open.admit_pending(Pending { fd, since: Instant::now(), uid }) {
                    Ok(()) => {
                        let p = half_open.pending.last().expect("just admitted");
                        if self.poller.add(&p.fd, PENDING).is_err() {
                            half_open.pending.pop();
                        }
                    }
                    Err((p, why)) => {
                        drop(half_open);
                        carrier::reject(&p.fd, wire::Reason::NoResources);
                        seqpacket::let_go(p.fd);
                        log::info(format_args!("accept {}: refused a rendezvous client of uid {uid}: {why}", self.addr));
                    }
                }
                None
            }
            Answer::Offer(hello) => {
                let (Some(key), Ok((_, uid))) = (hello.key(), seqpacket::peer_cred(&hello.control)) else { return None };
                let admitted = self.half_open().admit_offer(key, hello, uid);
                if let Err((hello, why)) = admitted {
                    carrier::reject(&hello.control, wire::Reason::NoResources);
                    log::info(format_args!("accept {}: refused a CARRIER offer of uid {uid}: {why}", self.addr));
                }
                None
            }
            Answer::Refused(why) => {
                log::info(format_args!("accept {}: refused a rendezvous client: {why}", self.addr));
                None
            }
        }
    }

    /// Answers the silent rendezvous clients whose HELLO has arrived; returns a DIRECT
    /// connection if one completed. Reads them only if the poller reported one, or with `force`.
    /// They are read under the lock of the half-open set (each read is non-blocking), so a
    /// place stays taken while its client is looked at.
    fn poll_pending(&self, force: bool) -> Option<(Stream, SocketAddr)> {
        let mut outcomes = Vec::new();
        {
            let mut half_open = self.half_open();
            if half_open.pending.is_empty() || !(self.take_hint(PENDING) || force) {
                return None;
            }
            let mut still = Vec::with_capacity(half_open.pending.len());
            // Only those with a HELLO (or a hang-up) queued: the others stay as they are.
            let ready = {
                let fds: Vec<_> = half_open.pending.iter().map(|p| p.fd.as_fd()).collect();
                seqpacket::with_data(&fds)
            };
            for (p, ready) in std::mem::take(&mut half_open.pending).into_iter().zip(ready) {
                if !ready {
                    still.push(p);
                    continue;
                }
                if outcomes.iter().any(|a| matches!(a, Answer::Accepted(_))) {
                    // Not looked at: look again next time.
                    self.hint(PENDING);
                    still.push(p);
                    continue;
                }
                // Out of the listener's epoll first: once answered, the socket belongs to a
                // connection (its later hang-up must not wake accept forever).
                let _ = self.poller.delete(&p.fd);
                match handshake::answer(p.fd, self.served, &self.opts, &self.parked) {
                    Answer::Pending(fd) => {
                        if self.poller.add(&fd, PENDING).is_ok() {
                            still.push(Pending { fd, ..p });
                        }
                    }
                    other => outcomes.push(other),
                }
            }
            half_open.pending = still;
        }
        let mut found = None;
        for a in outcomes {
            if let Some(s) = self.finish(a) {
                found = Some(s);
            }
        }
        found
    }

    /// One look at the sources whose hints are set; `drain`: accept rendezvous connections until
    /// EAGAIN (or a completed one), not just one.
    fn try_accept(&self, drain: bool) -> io::Result<Option<(Stream, SocketAddr)>> {
        if self.take_hint(TIMER) || !self.timed {
            // Silent clients and offers whose TCP connection never came: released.
            self.half_open().fired();
        }
        if let Some(s) = self.netns_ready() {
            return Ok(Some(s));
        }
        if let Some(s) = self.poll_pending(false) {
            return Ok(Some(s));
        }
        if let Some(s) = self.early.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Ok(Some(s));
        }
        // A source that had something may have more: the poller says so (one `epoll_wait`, which
        // finds nothing queued as often as not, where an `accept` would fail with EAGAIN).
        if self.take_hint(RENDEZVOUS) {
            match self.drain_rendezvous_new(drain) {
                Ok(None) => {}
                Ok(Some(s)) => return Ok(Some(s)),
                Err(e) => {
                    self.hint(RENDEZVOUS);
                    return Err(e);
                }
            }
        }
        if !self.take_hint(TCP) {
            return Ok(None);
        }
        loop {
            match self.tcp.accept() {
                Ok((s, peer)) => {
                    let Some(s) = self.netns_defer(s, peer) else { continue };
                    s.set_nonblocking(false)?;
                    return Ok(Some(self.claim_or_tcp(s, peer)));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                // That client gave up; the next may not have.
                Err(e) if is_transient(&e) => {}
                Err(e) => {
                    // EMFILE and the like: the connection stays queued; the caller sees the error.
                    self.hint(TCP);
                    return Err(e);
                }
            }
        }
    }

    /// A connection from a listed peer of another namespace waits to be resolved (`None`: taken,
    /// `accept` goes on with the next connection); any other is given back. A full set pushes
    /// out its oldest (`NetnsAccepts::evict_oldest`), so a flood of silent connections costs
    /// the flood's oldest their wait, never `accept` a wait in place.
    fn netns_defer(&self, tcp: TcpStream, peer: SocketAddr) -> Option<TcpStream> {
        let (Some(accepts), Some(r)) = (&self.netns_accepts, &self.netns) else { return Some(tcp) };
        if !(crate::netns::server_configured() && crate::netns::from_elsewhere(peer)) {
            return Some(tcp);
        }
        let mut a = accepts.lock().unwrap_or_else(|e| e.into_inner());
        if a.waiting() >= crate::netns_accept::MAX_WAITING {
            a.evict_oldest(r, &self.poller);
        }
        a.admit(tcp, peer, &self.poller).err()
    }

    /// A connection from another namespace that is resolved, if any; looks at those that wait
    /// when the poller reported one of their sources.
    fn netns_ready(&self) -> Option<(Stream, SocketAddr)> {
        let (Some(accepts), Some(r)) = (&self.netns_accepts, &self.netns) else { return None };
        let (resolved, peer) = {
            let mut a = accepts.lock().unwrap_or_else(|e| e.into_inner());
            if self.take_hint(NETNS) {
                a.step(r, &self.poller);
            }
            a.pop()?
        };
        // Accepted connections are handed over blocking, as every other the listener returns.
        Some(match resolved {
            crate::netns_accept::Resolved::Shm(est, tcp) => {
                let _ = tcp.set_nonblocking(false);
                match est.into_shm(self.opts.spin_mode()) {
                    Ok(shm) => {
                        log::info(format_args!("accept {}: shared memory (other namespace, carrier {peer})", self.addr));
                        (Stream::from_carrier(shm, tcp), peer)
                    }
                    Err(e) => {
                        log::info(format_args!("accept {}: carrier {peer}: {e}; plain TCP", self.addr));
                        (Stream::from_tcp(tcp), peer)
                    }
                }
            }
            crate::netns_accept::Resolved::Tcp(tcp) => {
                let _ = tcp.set_nonblocking(false);
                (Stream::from_tcp(tcp), peer)
            }
        })
    }

    /// A TCP connection whose 4-tuple a CARRIER offer names moves onto that offer's segment (the
    /// client, under `colo run`, sent its HELLO before connecting, so it is already queued);
    /// anything else stays plain TCP.
    fn claim_or_tcp(&self, tcp: TcpStream, peer: SocketAddr) -> (Stream, SocketAddr) {
        self.take_over_vacant();
        if crate::netns::server_configured() && crate::netns::from_elsewhere(peer) {
            let Some(r) = self.netns.as_ref() else {
                // Without a wait in accept: silent connections would hold every accept up.
                crate::netns::decline_now(tcp.as_fd(), peer, "no rendezvous of this process (COLO_NETNS_DIR not writable?)");
                return (Stream::from_tcp(tcp), peer);
            };
            let Ok(local) = tcp.local_addr() else { return (Stream::from_tcp(tcp), peer) };
            return match r.serve(tcp.as_fd(), local, peer).map(|e| e.into_shm(self.opts.spin_mode())) {
                Some(Ok(shm)) => {
                    log::info(format_args!("accept {}: shared memory (other namespace, carrier {peer})", self.addr));
                    (Stream::from_carrier(shm, tcp), peer)
                }
                Some(Err(e)) => {
                    log::info(format_args!("accept {}: carrier {peer}: {e}; plain TCP", self.addr));
                    (Stream::from_tcp(tcp), peer)
                }
                None => (Stream::from_tcp(tcp), peer),
            };
        }
        // A CARRIER client's port is odd (spec/WIRE.md section 3): from an even one no offer can
        // come, and the connection is plain without a look at the rendezvous connections.
        if peer.port().is_multiple_of(2) {
            return (Stream::from_tcp(tcp), peer);
        }
        let Ok(local) = tcp.local_addr() else { return (Stream::from_tcp(tcp), peer) };
        let key = carrier::key(peer, local);
        let lookup = || self.half_open().take_offer(&key);
        let mut offer = lookup();
        if offer.is_none() && self.rendezvous.get().is_some() {
            // The client sent its HELLO before connecting: read the HELLOs that have arrived
            // (on new and on already accepted rendezvous connections), then look again.
            // Each call stops at a completed DIRECT connection: keep going until both are empty.
            // At most MAX_HALF_OPEN of those wait for an accept: the rest stay queued.
            let room = || self.early.lock().unwrap_or_else(|e| e.into_inner()).len() < MAX_HALF_OPEN;
            while room() {
                let Some(s) = self.poll_pending(true) else { break };
                self.early.lock().unwrap_or_else(|e| e.into_inner()).push(s);
            }
            while room() {
                let Ok(Some(s)) = self.drain_rendezvous_new(true) else { break };
                self.early.lock().unwrap_or_else(|e| e.into_inner()).push(s);
            }
            offer = lookup();
        }
        // Offers from several users may name this 4-tuple (`HalfOpen::rivals`): each is tried in
        // turn, oldest first; the claim's owner check refuses those whose sender does not own
        // the connection's client end.
        while let Some(hello) = offer {
            let why = match hello.claim() {
                Ok(e) => match e.into_shm(self.opts.spin_mode()) {
                    Ok(shm) => {
                        log::info(format_args!("accept {}: shared memory (carrier {peer}) with pid {}", self.addr, shm.peer_pid()));
                        // The others for this connection can never be claimed now.
                        while let Some(other) = lookup() {
                            carrier::reject(&other.control, wire::Reason::NotClaimed);
                        }
                        return (Stream::from_carrier(shm, tcp), peer);
                    }
                    // Claimed: no other offer may have this connection.
                    Err(e) => {
                        log::info(format_args!("accept {}: carrier {peer} not claimed: {e}; plain TCP", self.addr));
                        break;
                    }
                },
                Err(why) => why,
            };
            log::info(format_args!("accept {}: carrier {peer} not claimed: {why}; plain TCP", self.addr));
            offer = lookup();
        }
        (Stream::from_tcp(tcp), peer)
    }

    /// Accepts new rendezvous connections and answers their HELLOs, up to the first completed one:
    /// until none is queued, or (`all` false) just one, as the poller reports the listener again
    /// while more are queued (a connection then costs no accept that fails with EAGAIN).
    fn drain_rendezvous_new(&self, all: bool) -> io::Result<Option<(Stream, SocketAddr)>> {
        if let Some(rdv) = self.rendezvous.get() {
            loop {
                match seqpacket::accept(rdv) {
                    Ok(fd) => {
                        if let Some(s) = self.finish(handshake::answer(fd, self.served, &self.opts, &self.parked)) {
                            return Ok(Some(s));
                        }
                        if !all {
                            break;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    // That client gave up; the next may not have.
                    Err(e) if is_transient(&e) => {
                        log::info(format_args!("accept {}: rendezvous: {e}", self.addr));
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(None)
    }

    /// An iterator over incoming connections.
    pub fn incoming(&self) -> impl Iterator<Item = io::Result<Stream>> + '_ {
        std::iter::repeat_with(move || self.accept().map(|(s, _)| s))
    }
}

/// Errors a client caused (it gave up or broke off): the listener looks at the next one. Running
/// out of descriptors or memory is the caller's to see, as `accept(2)` reports it (EMFILE, ENFILE,
/// ENOBUFS, ENOMEM): the waiting connection stays queued, so retrying at once would spin.
fn is_transient(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(103 | 104 | 71))
}

impl AsFd for Listener {
    /// Readable when a connection may be accepted.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.poller.fd().as_fd()
    }
}

impl AsRawFd for Listener {
    fn as_raw_fd(&self) -> RawFd {
        self.poller.fd().as_raw_fd()
    }
}
