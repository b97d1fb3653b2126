//! CARRIER mode across network namespaces (spec/WIRE.md section 11): containers and pods on one
//! host, whose abstract rendezvous names another namespace cannot reach.
//!
//! Opt-in by configuration on both sides; without it nobody sends a byte of this and TCP stays
//! byte-identical. A listener whose process has `COLO_NETNS_DIR` also binds a rendezvous socket
//! inside that directory (mounted read-write into its own container, read-only into the
//! others). A client whose destination matches `COLO_NETNS_PEERS` (and whose directory for it
//! holds a colo rendezvous) sends a PROPOSAL as the first bytes of its admitted TCP connection;
//! the server answers ACCEPT (a fresh server nonce bound to that accepted socket, and the name of
//! its rendezvous) or DECLINE before its application sees the connection. The client then sends
//! the ordinary `HELLO(CARRIER)` over that rendezvous, flagged `NETNS`, with both nonces in the
//! segment header: only a holder of the TCP connection knows them, so the proof replaces the
//! 4-tuple owner check that cannot work across namespaces (nor through DNAT or masquerading).
//! Any failure leaves plain TCP, the handshake bytes consumed by colo on both sides.

use crate::carrier::{self, Established, Hello, Offer};
use crate::log;
use crate::wire::{self, Message, Mode, Reason, FLAG_NETNS, HEADER_FIELDS, MESSAGE_LEN, PROOF_LEN, PROOF_OFFSET};
use colo_ring::layout::Geometry;
use colo_sys::doorbell::Poller;
use colo_sys::{pathsock, seqpacket, AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// First 8 bytes of every message on the TCP stream (a NUL first: no text protocol starts so).
pub const MAGIC: [u8; 8] = *b"\0COLO-NS";
/// PROPOSAL's length.
pub const PROPOSAL_LEN: usize = 40;
/// ACCEPT's and DECLINE's length.
pub const ANSWER_LEN: usize = 112;
const PROPOSAL: u8 = 1;
const ACCEPT: u8 = 2;
const DECLINE: u8 = 3;
/// DECLINE reasons.
const OTHER_BOOT: u8 = 2;
const BAD_VERSION: u8 = 1;
const BUSY: u8 = 3;
/// Longest rendezvous name an ACCEPT carries.
const NAME_MAX: usize = 64;
/// Prefix of every rendezvous name in a directory.
const NAME_PREFIX: &str = "colo-";
/// Live nonces (connections answered ACCEPT whose HELLO has not come) per rendezvous.
const MAX_PENDING: usize = 256;
/// Rendezvous connections that have sent nothing yet, per rendezvous; the oldest is dropped.
const MAX_SILENT: usize = 64;
/// Rendezvous connections accepted per look at the rendezvous (under its state lock): a waiting
/// accept looks again at least every millisecond, so a HELLO behind a full backlog of 1024
/// arrives within 16 looks.
const MAX_ACCEPTS: usize = 64;
/// How long a rendezvous connection may stay silent.
const SILENT_LIFE: Duration = Duration::from_secs(1);

fn env_ms(name: &str, default: u64) -> Duration {
    Duration::from_millis(std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default))
}

/// How long a server waits for the first bytes of a connection from another namespace
/// (`COLO_NETNS_WAIT_MS`, 50): a client that is not colo and waits for the server to speak first
/// gets its connection that much later.
fn proposal_wait() -> Duration {
    static T: OnceLock<Duration> = OnceLock::new();
    *T.get_or_init(|| env_ms("COLO_NETNS_WAIT_MS", 50))
}

pub(crate) fn boot_id() -> Option<[u8; 16]> {
    static B: OnceLock<Option<[u8; 16]>> = OnceLock::new();
    *B.get_or_init(|| pathsock::boot_id().ok())
}

fn nonce<const N: usize>() -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    pathsock::random(&mut b)?;
    Ok(b)
}

/// PROPOSAL: magic, type, version, 6 reserved bytes, boot id, client nonce.
pub(crate) fn proposal(boot: &[u8; 16], client_nonce: &[u8; 8]) -> [u8; PROPOSAL_LEN] {
    let mut b = [0u8; PROPOSAL_LEN];
    b[0..8].copy_from_slice(&MAGIC);
    b[8] = PROPOSAL;
    b[9] = wire::VERSION;
    b[16..32].copy_from_slice(boot);
    b[32..40].copy_from_slice(client_nonce);
    b
}

/// ACCEPT (with nonce and name) or DECLINE (with a reason): magic, type, version, reason, name
/// length, 4 reserved bytes, boot id, server nonce, name (zero-padded).
fn answer(kind: u8, reason: u8, boot: &[u8; 16], server_nonce: &[u8; 16], name: &[u8]) -> [u8; ANSWER_LEN] {
    let mut b = [0u8; ANSWER_LEN];
    b[0..8].copy_from_slice(&MAGIC);
    b[8] = kind;
    b[9] = wire::VERSION;
    b[10] = reason;
    b[11] = name.len() as u8;
    b[16..32].copy_from_slice(boot);
    b[32..48].copy_from_slice(server_nonce);
    b[48..48 + name.len()].copy_from_slice(name);
    b
}

// ---------------------------------------------------------------------------------------------
// Client side.

/// One `COLO_NETNS_PEERS` entry: destinations (a network, and a port or any) and the directory
/// where their listeners' rendezvous are mounted.
#[derive(Debug, Clone)]
struct Rule {
    net: IpAddr,
    prefix: u8,
    port: Option<u16>,
    dir: PathBuf,
}

fn in_net(ip: IpAddr, net: IpAddr, prefix: u8) -> bool {
    match (crate::carrier::key(SocketAddr::new(ip, 0), SocketAddr::new(ip, 0)).0.ip(), net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let bits = u32::from(prefix.min(32));
            let mask = if bits == 0 { 0 } else { u32::MAX << (32 - bits) };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let bits = u32::from(prefix.min(128));
            let mask = if bits == 0 { 0 } else { u128::MAX << (128 - bits) };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// Parses `COLO_NETNS_PEERS`: comma-separated `DEST[=DIR]`, DEST a network (`10.0.2.0/24`), an
/// address, or an address and port (`10.96.0.10:80`, `[fd00::1]:80`); DIR defaults to
/// `COLO_NETNS_PEER_DIR`. Malformed entries are skipped (and logged).
fn parse_rules(spec: &str, default_dir: Option<&str>) -> Vec<Rule> {
    let mut out = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (dest, dir) = match item.split_once('=') {
            Some((d, dir)) => (d.trim(), Some(dir.trim())),
            None => (item, default_dir),
        };
        let Some(dir) = dir.filter(|d| !d.is_empty()) else {
            log::info(format_args!("COLO_NETNS_PEERS: {item}: no directory (DEST=DIR or COLO_NETNS_PEER_DIR); skipped"));
            continue;
        };
        let parsed = if let Some((ip, bits)) = dest.split_once('/') {
            ip.parse::<IpAddr>().ok().zip(bits.parse::<u8>().ok()).map(|(ip, b)| (ip, b, None))
        } else if let Ok(sa) = dest.parse::<SocketAddr>() {
            Some((sa.ip(), 128, Some(sa.port())))
        } else {
            dest.parse::<IpAddr>().ok().map(|ip| (ip, 128, None))
        };
        match parsed {
            Some((net, prefix, port)) => out.push(Rule { net, prefix, port, dir: PathBuf::from(dir) }),
            None => log::info(format_args!("COLO_NETNS_PEERS: {item}: not a network, address or address:port; skipped")),
        }
    }
    out
}

fn rules() -> &'static [Rule] {
    static R: OnceLock<Vec<Rule>> = OnceLock::new();
    R.get_or_init(|| match std::env::var("COLO_NETNS_PEERS") {
        Ok(spec) => parse_rules(&spec, std::env::var("COLO_NETNS_PEER_DIR").ok().as_deref()),
        Err(_) => Vec::new(),
    })
}

/// Whether any cross-namespace destination is configured (nothing else here costs anything
/// when none is).
pub fn client_configured() -> bool {
    !rules().is_empty()
}

/// The directory of the colo listener serving `target` in another namespace, if `target` is
/// configured and a live colo listener has its rendezvous in that directory now: for a network
/// or address entry, one listening on `target`'s port; for an `address:port` entry (a Service
/// address, whose port translation may change), any. Only then does a client propose.
pub fn peer_dir(target: SocketAddr) -> Option<&'static Path> {
    let ip = crate::carrier::key(target, target).0.ip();
    rules()
        .iter()
        .filter(|r| r.port.is_none_or(|p| p == target.port()) && in_net(ip, r.net, r.prefix))
        .find(|r| pathsock::live_listener(&r.dir, NAME_PREFIX, if r.port.is_some() { None } else { Some(target.port()) }))
        .map(|r| r.dir.as_path())
}

/// What became of a proposal.
#[derive(Debug)]
pub enum Dialed {
    /// The server accepted; `HELLO(CARRIER)` with the proof is out: decide it as any offer.
    Offered(Box<Offer>),
    /// Plain TCP: nothing of colo remains in either direction of the stream (or the server is
    /// not colo and the stream is the application's as it is). The reason is for the log.
    Plain(String),
    /// The stream is unusable: no answer came in time (the server may still send one).
    Broken(io::Error),
}

/// Sends the PROPOSAL on the connected TCP socket `tcp` (`local` → `target`, as this side sees
/// it), reads the answer (bounded), and on ACCEPT connects to the rendezvous it names inside
/// `dir` and offers a segment of `geometry`. Blocking (bounded) whatever the socket's mode.
pub fn propose(tcp: BorrowedFd<'_>, dir: &Path, local: SocketAddr, target: SocketAddr, geometry: Geometry) -> Dialed {
    match send_proposal(tcp, dir) {
        Ok(p) => p.finish(tcp, local, target, geometry, carrier::timeout()),
        Err(d) => d,
    }
}

/// A PROPOSAL sent on a connection whose answer has not been read yet.
#[derive(Debug)]
pub struct Proposed {
    dirfd: OwnedFd,
    dir_uid: u32,
    boot: [u8; 16],
    client_nonce: [u8; 8],
}

/// What one look at the head of a stream whose PROPOSAL is unanswered found
/// ([`take_answer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Late {
    /// The whole answer was there and is now taken off the stream.
    Taken,
    /// The stream does not begin with an answer (a server that is not colo) or ended: nothing
    /// was taken.
    NotAnswer,
    /// Nothing, or part of an answer: nothing taken; look again when more comes.
    NotYet,
}

/// The first half of [`propose`]: opens `dir` and sends the PROPOSAL (the send bounded by
/// `COLO_CARRIER_TIMEOUT_MS`). `Err`: nothing was sent ([`Dialed::Plain`]) or the stream is
/// unusable ([`Dialed::Broken`]).
pub fn send_proposal(tcp: BorrowedFd<'_>, dir: &Path) -> Result<Proposed, Dialed> {
    let Some(boot) = boot_id() else { return Err(Dialed::Plain("no boot id".into())) };
    let client_nonce = match nonce::<8>() {
        Ok(n) => n,
        Err(e) => return Err(Dialed::Plain(format!("random: {e}"))),
    };
    // The directory first: a client that cannot use it sends nothing.
    let (dirfd, dir_uid) = match pathsock::open_dir(dir) {
        Ok(d) => d,
        Err(e) => return Err(Dialed::Plain(format!("{}: {e}", dir.display()))),
    };
    if let Err(e) = pathsock::send_tcp(tcp, &proposal(&boot, &client_nonce), carrier::timeout()) {
        return Err(Dialed::Broken(e));
    }
    Ok(Proposed { dirfd, dir_uid, boot, client_nonce })
}

/// One look, without waiting, at the head of `tcp` whose PROPOSAL went unanswered while its
/// client waited: a whole answer (ACCEPT or DECLINE alike) is taken off the stream, so that the
/// application, which went on over plain TCP, never reads it.
pub fn take_answer(tcp: BorrowedFd<'_>) -> Late {
    let mut a = [0u8; ANSWER_LEN];
    match pathsock::recv_tcp(tcp, &mut a, true) {
        Ok(0) => Late::NotAnswer,
        Ok(n) if a[..n.min(8)] != MAGIC[..n.min(8)] => Late::NotAnswer,
        // The magic, but not an answer (a server that is not colo echoing the PROPOSAL).
        Ok(n) if n > 8 && !matches!(a[8], ACCEPT | DECLINE) => Late::NotAnswer,
        Ok(ANSWER_LEN) => match pathsock::recv_tcp(tcp, &mut a, false) {
            Ok(ANSWER_LEN) => Late::Taken,
            _ => Late::NotAnswer,
        },
        Ok(_) => Late::NotYet,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Late::NotYet,
        Err(_) => Late::NotAnswer,
    }
}

impl Proposed {
    /// The second half of [`propose`]: reads the answer (waiting at most `wait`), and on ACCEPT
    /// connects to the rendezvous it names and offers a segment of `geometry`.
    /// [`Dialed::Broken`] with `TimedOut`: no answer within `wait`, and nothing was taken off
    /// the stream (the answer may come later: [`take_answer`]).
    pub fn finish(self, tcp: BorrowedFd<'_>, local: SocketAddr, target: SocketAddr, geometry: Geometry, wait: Duration) -> Dialed {
        let Proposed { dirfd, dir_uid, boot, client_nonce } = self;
        let mut a = [0u8; ANSWER_LEN];
        match read_answer(tcp, &mut a, wait) {
            Ok(true) => {}
            Ok(false) => return Dialed::Plain("the server is not colo (its first bytes are not an answer)".into()),
            Err(e) => return Dialed::Broken(e),
        }
        if a[8] == DECLINE || a[8] != ACCEPT {
            return Dialed::Plain(format!("declined (reason {})", a[10]));
        }
        if a[16..32] != boot {
            return Dialed::Plain("the server runs on another boot".into());
        }
        let len = usize::from(a[11]);
        let name = &a[48..48 + len.min(NAME_MAX)];
        if len > NAME_MAX || !pathsock::valid_name(name) {
            return Dialed::Plain("the server named a rendezvous outside its directory".into());
        }
        let control = match pathsock::connect_at(dirfd.as_fd(), name, carrier::timeout()) {
            Ok(c) => c,
            Err(e) => return Dialed::Plain(format!("rendezvous: {e}")),
        };
        // The rendezvous is bound by whoever may write in the directory: its owner (or root), or
        // this user. Nothing is sent to another.
        let (server_pid, server_uid) = match pathsock::peer_cred_any(&control) {
            Ok(c) => c,
            Err(e) => return Dialed::Plain(format!("rendezvous credentials: {e}")),
        };
        if ![0, dir_uid, colo_sys::host::uid()].contains(&server_uid) {
            return Dialed::Plain(format!("rendezvous of uid {server_uid}, directory of uid {dir_uid}"));
        }
        let mut proof = [0u8; PROOF_LEN];
        proof[..8].copy_from_slice(&client_nonce);
        proof[8..].copy_from_slice(&a[32..48]);
        match carrier::offer_with(control, server_pid, local, target, geometry, Some(&proof)) {
            Ok(o) => Dialed::Offered(Box::new(o)),
            Err(e) => Dialed::Plain(format!("offer: {e}")),
        }
    }
}

/// Reads exactly one answer into `a`: `Ok(false)` (nothing consumed) if the first bytes are not
/// the magic or the stream ended first; an error if it does not come within `wait`.
fn read_answer(tcp: BorrowedFd<'_>, a: &mut [u8; ANSWER_LEN], wait: Duration) -> io::Result<bool> {
    let deadline = Instant::now() + wait;
    loop {
        match pathsock::recv_tcp(tcp, a, true) {
            Ok(0) => return Ok(false),
            Ok(n) if a[..n.min(8)] != MAGIC[..n.min(8)] => return Ok(false),
            Ok(n) if n > 8 && !matches!(a[8], ACCEPT | DECLINE) => return Ok(false),
            Ok(ANSWER_LEN) => {
                // Peeked whole: now taken off the stream.
                let mut taken = [0u8; ANSWER_LEN];
                return match pathsock::recv_tcp(tcp, &mut taken, false) {
                    Ok(ANSWER_LEN) => Ok(true),
                    Ok(_) => Err(io::ErrorKind::UnexpectedEof.into()),
                    Err(e) => Err(e),
                };
            }
            Ok(_) => std::thread::sleep(Duration::from_micros(200)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "no answer to the colo proposal"));
        }
        pathsock::wait_readable(tcp, left)?;
    }
}

// ---------------------------------------------------------------------------------------------
// Server side.

#[derive(Debug)]
struct PendingNonce {
    server: [u8; 16],
    client: [u8; 8],
    hello: Option<Box<Hello>>,
}

#[derive(Debug, Default)]
struct State {
    pending: Vec<PendingNonce>,
    /// Rendezvous connections that have sent nothing yet, oldest first.
    silent: VecDeque<(OwnedFd, Instant)>,
    /// The process's keeper (`netns_keeper`, the shim's rendezvous only): told whether a nonce
    /// is live whenever `pending` becomes empty or not.
    keeper: Option<crate::netns_keeper::Watch>,
}

/// A listener's rendezvous inside `COLO_NETNS_DIR`, and the nonces it answered.
#[derive(Debug)]
pub struct Rendezvous {
    listen: OwnedFd,
    name: String,
    path: PathBuf,
    /// The process that bound it (a forked child that drops its copy leaves the file).
    owner: u32,
    /// Locked while the rendezvous is served (`pathsock::hold_live`).
    _live: OwnedFd,
    boot: [u8; 16],
    /// The listening socket and the silent connections (level-triggered).
    poller: Poller,
    state: Mutex<State>,
}

impl Rendezvous {
    /// The rendezvous of this process's listener on `port`, if `COLO_NETNS_DIR` is set (and
    /// usable: otherwise logged, and the listener serves its own namespace only).
    pub fn bind(port: u16) -> Option<Rendezvous> {
        let dir = served_dir()?;
        let pid = colo_sys::host::pid();
        let name = format!("{NAME_PREFIX}{pid}-{port}");
        let made = (|| -> io::Result<(OwnedFd, Poller, [u8; 16], OwnedFd)> {
            let boot = pathsock::boot_id()?;
            pathsock::sweep_stale(dir, NAME_PREFIX);
            let listen = pathsock::listen_at(dir, &name)?;
            let poller = Poller::new()?;
            poller.add(&listen, 0)?;
            // Last: clients propose once this lock is seen.
            let live = pathsock::hold_live(dir, &name)?;
            Ok((listen, poller, boot, live))
        })();
        match made {
            Ok((listen, poller, boot, live)) => Some(Rendezvous {
                _live: live,
                listen,
                path: dir.join(&name),
                name,
                owner: pid,
                boot,
                poller,
                state: Mutex::new(State::default()),
            }),
            Err(e) => {
                log::info(format_args!("COLO_NETNS_DIR {}: {name}: {e}; serving this namespace only", dir.display()));
                None
            }
        }
    }

    /// A rendezvous `dir/name` of this boot, without `COLO_NETNS_DIR` (tests).
    #[cfg(test)]
    pub(crate) fn for_test(dir: &Path, name: &str) -> Rendezvous {
        let listen = pathsock::listen_at(dir, name).unwrap();
        let poller = Poller::new().unwrap();
        poller.add(&listen, 0).unwrap();
        Rendezvous {
            _live: pathsock::hold_live(dir, name).unwrap(),
            listen,
            name: name.into(),
            path: dir.join(name),
            owner: colo_sys::host::pid(),
            boot: pathsock::boot_id().unwrap(),
            poller,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Before the application sees the TCP connection `tcp` just accepted (`local` ← `peer`, as
    /// this side sees it): if it opens with a PROPOSAL, answers it and waits (bounded) for the
    /// proved offer, then claims it. `None`: plain TCP, the stream as the client sent it (a
    /// PROPOSAL answered is consumed, and so is the answer on the client's side). Waits up to
    /// `COLO_NETNS_WAIT_MS` for the first bytes, then up to `COLO_CARRIER_TIMEOUT_MS` for the
    /// HELLO: a caller that must not wait uses [`peek_proposal`], [`Rendezvous::answer`],
    /// [`Rendezvous::poll_hello`] and [`Rendezvous::finish`] instead, as the API's listener does.
    pub fn serve(&self, tcp: BorrowedFd<'_>, local: SocketAddr, peer: SocketAddr) -> Option<Established> {
        let mut p = [0u8; PROPOSAL_LEN];
        if !read_proposal(tcp, &mut p) {
            return None;
        }
        let wait = carrier::timeout();
        let server = self.answer(tcp, peer, &p, wait)?;
        let deadline = Instant::now() + wait;
        loop {
            // A client that went on over plain TCP instead sends no HELLO (section 11, step 3).
            if self.poll_hello(&server) || client_went_on(tcp) {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            // Another thread may drain what woke us: look again at least every millisecond.
            let _ = self.poller.wait(Some(left.min(Duration::from_millis(1))));
        }
        let Some(hello) = self.finish(&server) else {
            log::info(format_args!("accept {peer}: no proved offer in time; plain TCP"));
            return None;
        };
        claim(*hello, local, peer)
    }

    /// Answers the PROPOSAL `p` just taken off the accepted connection `tcp` from `peer`:
    /// DECLINE (`None`; the stream is then plain TCP), or ACCEPT with a fresh server nonce,
    /// which stays live (at most [`MAX_PENDING`] of them) until [`Rendezvous::finish`]. The
    /// answer is 112 bytes on a new connection: `send_wait` bounds a send that finds no room.
    pub fn answer(&self, tcp: BorrowedFd<'_>, peer: SocketAddr, p: &[u8; PROPOSAL_LEN], send_wait: Duration) -> Option<[u8; 16]> {
        let declined = |reason: u8, why: &str| {
            let _ = pathsock::send_tcp(tcp, &answer(DECLINE, reason, &self.boot, &[0; 16], b""), send_wait);
            log::info(format_args!("accept {peer}: cross-namespace proposal declined: {why}; plain TCP"));
            None
        };
        if p[9] != wire::VERSION {
            return declined(BAD_VERSION, "version");
        }
        if p[16..32] != self.boot {
            return declined(OTHER_BOOT, "another boot (another host)");
        }
        // A client sends nothing after its PROPOSAL until answered, unless it stopped waiting
        // and went on over plain TCP (section 11, step 3): its HELLO will not come.
        if client_went_on(tcp) {
            return declined(BUSY, "the client went on without waiting for the answer");
        }
        let Ok(server) = nonce::<16>() else { return declined(BUSY, "no random bytes") };
        let client: [u8; 8] = p[32..40].try_into().expect("8 bytes");
        {
            let mut st = self.state();
            if st.pending.len() >= MAX_PENDING {
                drop(st);
                return declined(BUSY, "too many handshakes under way");
            }
            st.pending.push(PendingNonce { server, client, hello: None });
            if st.pending.len() == 1 {
                if let Some(k) = &st.keeper {
                    k.reported(self.wait_fd(), false);
                }
            }
        }
        let a = answer(ACCEPT, 0, &self.boot, &server, self.name.as_bytes());
        if pathsock::send_tcp(tcp, &a, send_wait).is_err() {
            let _ = self.finish(&server);
            return None;
        }
        Some(server)
    }

    /// One look, without waiting: reads what arrived at the rendezvous ([`Rendezvous::look`])
    /// and says whether the HELLO proving `server` is among it (then [`Rendezvous::finish`]
    /// returns it).
    pub fn poll_hello(&self, server: &[u8; 16]) -> bool {
        self.look();
        self.arrived(server)
    }

    /// Reads what arrived at the rendezvous, without waiting (bounded work: [`MAX_ACCEPTS`]).
    pub fn look(&self) {
        let mut st = self.state();
        self.drain(&mut st);
    }

    /// Whether the HELLO proving `server` has been read.
    pub fn arrived(&self, server: &[u8; 16]) -> bool {
        self.state().pending.iter().any(|e| &e.server == server && e.hello.is_some())
    }

    /// Ends the wait for the HELLO proving `server`: the nonce is no longer live (a HELLO that
    /// proves it later is refused); returns the HELLO if it came.
    pub fn finish(&self, server: &[u8; 16]) -> Option<Box<Hello>> {
        let mut st = self.state();
        let at = st.pending.iter().position(|e| &e.server == server)?;
        let hello = st.pending.swap_remove(at).hello;
        if st.pending.is_empty() {
            if let Some(k) = &st.keeper {
                k.reported(self.wait_fd(), true);
            }
        }
        hello
    }

    /// From now on `k` (this process's keeper) reads the rendezvous while no nonce is live.
    fn keep_with(&self, k: crate::netns_keeper::Watch) {
        let mut st = self.state();
        k.reported(self.wait_fd(), st.pending.is_empty());
        st.keeper = Some(k);
    }

    /// The keeper's look: reads what arrived (refusing what proves nothing), unless a nonce is
    /// live, whose accept reads it: then the keeper is told again to stop reporting this
    /// rendezvous meanwhile (it was reported just before `answer` said so, or saying so failed).
    fn look_as_keeper(&self) {
        let mut st = self.state();
        if st.pending.is_empty() {
            self.drain(&mut st);
        } else if let Some(k) = &st.keeper {
            k.reported(self.wait_fd(), false);
        }
    }

    /// Readable when the rendezvous may have something to read (a connection or a HELLO): for
    /// a caller's own poll set while it waits on [`Rendezvous::poll_hello`].
    pub fn wait_fd(&self) -> BorrowedFd<'_> {
        self.poller.fd().as_fd()
    }

    /// Accepts queued rendezvous connections and reads the HELLOs that arrived, routing each to
    /// the nonce it proves (refused: none does); expires silent connections. Bounded work under
    /// the state lock: at most [`MAX_ACCEPTS`] connections accepted per call (another tenant
    /// connecting without end cannot keep one call, and every thread waiting for the lock, going),
    /// and the at most [`MAX_SILENT`] silent ones looked at. Returns how many it accepted.
    fn drain(&self, st: &mut State) -> usize {
        let mut accepted = 0;
        // One accept per turn, whatever it gives (aborted connections count too).
        for _ in 0..MAX_ACCEPTS {
            match seqpacket::accept(&self.listen) {
                Ok(fd) => {
                    accepted += 1;
                    // A client sends its HELLO right after connecting: read at once, so that a
                    // flood of silent connections cannot push it out of the bounded set below.
                    if seqpacket::with_data(&[fd.as_fd()])[0] {
                        if let Some(h) = read_proved_hello(fd) {
                            route(st, h);
                        }
                        continue;
                    }
                    if st.silent.len() >= MAX_SILENT {
                        if let Some((old, _)) = st.silent.pop_front() {
                            let _ = self.poller.delete(&old);
                        }
                    }
                    if self.poller.add(&fd, 1).is_ok() {
                        st.silent.push_back((fd, Instant::now()));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if matches!(e.raw_os_error(), Some(103 | 104 | 71)) => {}
                Err(_) => break,
            }
        }
        let now = Instant::now();
        let ready = {
            let fds: Vec<_> = st.silent.iter().map(|(f, _)| f.as_fd()).collect();
            seqpacket::with_data(&fds)
        };
        let mut keep = VecDeque::with_capacity(st.silent.len());
        for ((fd, since), ready) in std::mem::take(&mut st.silent).into_iter().zip(ready) {
            if !ready {
                if now.duration_since(since) < SILENT_LIFE {
                    keep.push_back((fd, since));
                } else {
                    let _ = self.poller.delete(&fd);
                }
                continue;
            }
            let _ = self.poller.delete(&fd);
            if let Some(h) = read_proved_hello(fd) {
                route(st, h);
            }
        }
        st.silent = keep;
        accepted
    }
}

/// Hands a proved HELLO to the connection whose nonces it carries; refuses it otherwise.
fn route(st: &mut State, (h, proof): (Box<Hello>, [u8; PROOF_LEN])) {
    let slot = st.pending.iter_mut().find(|e| e.hello.is_none() && e.client[..] == proof[..8] && e.server[..] == proof[8..]);
    match slot {
        Some(e) => e.hello = Some(h),
        None => {
            carrier::reject(&h.control, Reason::NotClaimed);
            log::info(format_args!("cross-namespace offer with no live nonce (forged, replayed or late); refused"));
        }
    }
}

/// Reads the `HELLO(CARRIER)` flagged NETNS queued on `control`, with its descriptors and the
/// proof from its segment header; anything else is refused (REJECT where it makes sense).
fn read_proved_hello(control: OwnedFd) -> Option<(Box<Hello>, [u8; PROOF_LEN])> {
    let mut buf = [0u8; 64];
    let mut r = seqpacket::recv(&control, &mut buf, true).ok()?;
    // Nothing after the HELLO may carry descriptors, and nothing may follow it before our
    // answer: what did (queued before the socket refused descriptors) is taken now, its
    // descriptors closed disarmed, and the HELLO refused (spec sections 3 and 6).
    colo_sys::gift::refuse_rights(&control);
    let behind = seqpacket::empty_before_close(&control);
    if r.len == 0 && r.fds.is_empty() {
        return None;
    }
    if behind > 0 {
        carrier::reject(&control, Reason::BadMessage);
        return None;
    }
    let netns = r.len == MESSAGE_LEN && u32::from_le_bytes(buf[8..12].try_into().expect("4 bytes")) & FLAG_NETNS != 0;
    let carrier_hello = matches!(Message::decode(&buf[..r.len.min(MESSAGE_LEN)]), Ok(Message::Hello { version: wire::VERSION, mode: Mode::Carrier }));
    if r.fds.len() != 1 || !colo_sys::gift::closes_at_once(&r.fds[0]) {
        // Discarded with the datagram: another file's plain close could wait (a FUSE file's).
        carrier::reject(&control, Reason::BadMessage);
        return None;
    }
    let Some(memfd) = r.take_fds().pop() else { unreachable!("one descriptor") };
    if r.truncated || !netns || !carrier_hello {
        carrier::reject(&control, Reason::BadMessage);
        return None;
    }
    let hello = carrier::hello_from_fds(control, memfd, Mode::Carrier).ok()?;
    let mut head = [0u8; HEADER_FIELDS];
    if !matches!(colo_sys::segment::read_prefix(hello.memfd(), &mut head), Ok(HEADER_FIELDS)) {
        carrier::reject(&hello.control, Reason::BadSegment);
        return None;
    }
    let proof: [u8; PROOF_LEN] = head[PROOF_OFFSET..PROOF_OFFSET + PROOF_LEN].try_into().expect("24 bytes");
    Some((Box::new(hello), proof))
}

/// Claims the proved offer `hello` for the accepted connection `local` ← `peer`; `None` (logged):
/// plain TCP.
pub fn claim(hello: Hello, local: SocketAddr, peer: SocketAddr) -> Option<Established> {
    match hello.claim_proved(local, peer) {
        Ok(est) => Some(est),
        Err(why) => {
            log::info(format_args!("accept {peer}: cross-namespace offer not claimed: {why}; plain TCP"));
            None
        }
    }
}

/// Whether the client of `tcp`, whose PROPOSAL was taken off the stream, has sent more bytes
/// or ended its stream (one look, without waiting): a client that proposed sends nothing until
/// answered unless it stopped waiting and went on over plain TCP (spec/WIRE.md section 11,
/// step 3), and one that ended its stream sends no HELLO either.
pub fn client_went_on(tcp: BorrowedFd<'_>) -> bool {
    !matches!(pathsock::recv_tcp(tcp, &mut [0u8; 1], true), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

/// What one look at the first bytes of an accepted connection found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opening {
    /// Nothing yet (0), or the start of a PROPOSAL (that many bytes of it): look again, until
    /// the wait for first bytes ([`proposal_wait`]) ends; the stream is untouched.
    NotYet(usize),
    /// Not a PROPOSAL, or the stream ended: plain TCP, the stream untouched.
    Plain,
    /// A whole PROPOSAL, now taken off the stream.
    Proposal,
}

/// One look, without waiting, at the first bytes of the accepted connection `tcp`: takes a whole
/// PROPOSAL off the stream into `p`, and nothing else.
pub fn peek_proposal(tcp: BorrowedFd<'_>, p: &mut [u8; PROPOSAL_LEN]) -> Opening {
    match pathsock::recv_tcp(tcp, p, true) {
        Ok(0) => Opening::Plain,
        Ok(n) if p[..n.min(8)] != MAGIC[..n.min(8)] => Opening::Plain,
        Ok(n) if n >= 10 && p[8] != PROPOSAL => Opening::Plain,
        Ok(PROPOSAL_LEN) => {
            let mut taken = [0u8; PROPOSAL_LEN];
            match pathsock::recv_tcp(tcp, &mut taken, false) {
                Ok(PROPOSAL_LEN) => Opening::Proposal,
                _ => Opening::Plain,
            }
        }
        Ok(n) => Opening::NotYet(n),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Opening::NotYet(0),
        Err(_) => Opening::Plain,
    }
}

/// How long a server waits for the first bytes of a connection from a listed peer.
pub fn first_bytes_wait() -> Duration {
    proposal_wait()
}

/// How long a server keeps a nonce it answered, waiting for its HELLO.
pub fn hello_wait() -> Duration {
    carrier::timeout()
}

/// Waits (bounded) for the first bytes of an accepted connection and takes a whole PROPOSAL off
/// the stream if they are one; leaves the stream untouched otherwise.
fn read_proposal(tcp: BorrowedFd<'_>, p: &mut [u8; PROPOSAL_LEN]) -> bool {
    let deadline = Instant::now() + proposal_wait();
    loop {
        match peek_proposal(tcp, p) {
            Opening::Proposal => return true,
            Opening::Plain => return false,
            Opening::NotYet(0) => {}
            Opening::NotYet(_) => std::thread::sleep(Duration::from_micros(200)),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || !pathsock::wait_readable(tcp, left).unwrap_or(false) {
            // A PROPOSAL whole in the stream by now is taken, however late this thread ran:
            // left there, the program would read it as its first bytes.
            return peek_proposal(tcp, p) == Opening::Proposal;
        }
    }
}

/// For an accept that must not wait on a peer's bytes (a listener without a rendezvous of this
/// process, its directory having refused the bind; a connection pushed out of a full set):
/// one look at the first bytes of `tcp`; a whole PROPOSAL there is taken off the stream and
/// answered DECLINE(BUSY) (the client goes on over plain TCP), so that the application never
/// sees it. Anything else is left as it is.
pub fn decline_now(tcp: BorrowedFd<'_>, peer: SocketAddr, why: &str) {
    let mut p = [0u8; PROPOSAL_LEN];
    if peek_proposal(tcp, &mut p) == Opening::Proposal {
        let boot = boot_id().unwrap_or([0; 16]);
        // 112 bytes first on a new connection: room is there, or the connection is of no use.
        let _ = pathsock::send_tcp(tcp, &answer(DECLINE, BUSY, &boot, &[0; 16], b""), Duration::ZERO);
        log::info(format_args!("accept {peer}: cross-namespace proposal declined: {why}; plain TCP"));
    }
}

/// Whether a connection from `peer` may carry a PROPOSAL this server takes: not from an address
/// of this namespace, and from a network `COLO_NETNS_CLIENTS` names. Only those peers make an
/// accept wait for a PROPOSAL or a HELLO, and only they can be answered: a relay that is not
/// colo (a TCP load balancer, a proxy) must not be listed, or a tenant behind it could reach this
/// server around it.
pub fn from_elsewhere(peer: SocketAddr) -> bool {
    !colo_sys::host::is_local(peer.ip()) && clients().iter().any(|r| in_net(peer.ip(), r.net, r.prefix))
}

/// `COLO_NETNS_CLIENTS`: comma-separated networks or addresses whose proposals this server takes
/// (none when unset: a server with `COLO_NETNS_DIR` alone answers nobody). Read once, with
/// `COLO_NETNS_DIR` (`served_dir`).
fn clients() -> &'static [Rule] {
    static C: OnceLock<Vec<Rule>> = OnceLock::new();
    C.get_or_init(|| match std::env::var("COLO_NETNS_CLIENTS") {
        // Only the networks matter: the directory is a placeholder the parser wants.
        Ok(spec) => parse_rules(&spec, Some("/")),
        Err(_) => Vec::new(),
    })
}

/// The rendezvous of this process's listeners by port (the LD_PRELOAD shim's, which has no
/// listener object of its own to keep them in). Never freed: at most one per listening port and
/// process, and a closed listener's rendezvous answers nobody (no TCP connection names it).
// Locked at every fork: kept with what the fork handlers write (see `colo_sys::host`).
#[link_section = "colo_fork"]
static SERVING: Mutex<Vec<(u16, &'static Rendezvous)>> = Mutex::new(Vec::new());

static SERVING_LOCKS: crate::fork::Locks = crate::fork::Locks { take: serving_guard, in_child: None };

/// The lock of [`SERVING`], taken around a fork (see `fork`): a child forked while another thread
/// bound a rendezvous would otherwise find it locked at its own first listen or accept.
fn serving_guard(held: &mut crate::fork::Held) {
    held.hold(SERVING.lock().unwrap_or_else(|e| e.into_inner()));
}

/// [`SERVING`], locked (registered with `fork` before its first use).
fn serving_lock() -> std::sync::MutexGuard<'static, Vec<(u16, &'static Rendezvous)>> {
    crate::fork::protect(crate::fork::Rank::Netns, &SERVING_LOCKS);
    SERVING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether this process serves other namespaces (`COLO_NETNS_DIR` is set): then a connection
/// from another namespace may carry a PROPOSAL whatever its port (address translation may have
/// changed the client's odd port).
pub fn server_configured() -> bool {
    served_dir().is_some()
}

/// `COLO_NETNS_DIR`, read once: a forked worker whose server cleared its environment (nginx's
/// workers keep only `TZ`) still has the directory its master listened with.
fn served_dir() -> Option<&'static Path> {
    static D: OnceLock<Option<PathBuf>> = OnceLock::new();
    D.get_or_init(|| {
        clients();
        std::env::var_os("COLO_NETNS_DIR").filter(|d| !d.is_empty()).map(PathBuf::from)
    })
    .as_deref()
}

/// A listener of this process on `port` started listening: binds its rendezvous if
/// `COLO_NETNS_DIR` is set (so that clients see a colo listener in the directory).
pub fn listening(port: u16) {
    let _ = serving(port);
}

/// The rendezvous of this process's listener on `port`, bound now if this process has none (a
/// forked child gets its own: the nonces it hands out are its own).
pub fn serving(port: u16) -> Option<&'static Rendezvous> {
    if !server_configured() {
        return None;
    }
    let mut all = serving_lock();
    let pid = colo_sys::host::pid();
    if let Some((_, r)) = all.iter().find(|(p, r)| *p == port && r.owner == pid) {
        return Some(r);
    }
    let r: &'static Rendezvous = Box::leak(Box::new(Rendezvous::bind(port)?));
    // A parent's entry for the port is replaced (its descriptor stays open in this process).
    all.retain(|(p, _)| *p != port);
    all.push((port, r));
    // Under the lock of `SERVING`, as `netns_keeper::keep` requires.
    crate::netns_keeper::keep(r);
    Some(r)
}

impl Drop for Rendezvous {
    fn drop(&mut self) {
        if colo_sys::host::pid() == self.owner {
            let _ = std::fs::remove_file(&self.path);
            let mut live = self.path.clone().into_os_string();
            live.push(pathsock::LIVE_SUFFIX);
            let _ = std::fs::remove_file(live);
        }
    }
}

impl AsRawFd for Rendezvous {
    fn as_raw_fd(&self) -> colo_sys::RawFd {
        self.listen.as_raw_fd()
    }
}

impl crate::netns_keeper::Keepable for Rendezvous {
    fn wait_fd(&self) -> BorrowedFd<'_> {
        Rendezvous::wait_fd(self)
    }
    fn kept_by(&self, w: crate::netns_keeper::Watch) {
        self.keep_with(w);
    }
    fn keep_look(&self) {
        self.look_as_keeper();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_and_match() {
        let r = parse_rules("10.0.2.0/24=/a, 10.96.0.10:80 ,bad,[fd00::1]:443=/c", Some("/b"));
        assert_eq!(r.len(), 3);
        assert!(in_net("10.0.2.7".parse().unwrap(), r[0].net, r[0].prefix));
        assert!(!in_net("10.0.3.7".parse().unwrap(), r[0].net, r[0].prefix));
        assert!(in_net("::ffff:10.0.2.9".parse().unwrap(), r[0].net, r[0].prefix));
        assert_eq!((r[1].port, r[1].dir.as_path()), (Some(80), Path::new("/b")));
        assert_eq!(r[2].port, Some(443));
        assert!(parse_rules("10.0.0.1", None).is_empty());
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    #[test]
    fn golden_vectors() {
        let path = format!("{}/../../spec/vectors/netns.json", env!("CARGO_MANIFEST_DIR"));
        let vs: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        for v in vs.as_array().unwrap() {
            let hex = |k: &str| unhex(v[k].as_str().unwrap());
            let want = hex("hex");
            let boot: [u8; 16] = if v["boot"].is_null() { [0; 16] } else { hex("boot").try_into().unwrap() };
            let got = match v["name"].as_str().unwrap() {
                "proposal" => proposal(&boot, &hex("client_nonce").try_into().unwrap()).to_vec(),
                "accept" => answer(ACCEPT, 0, &boot, &hex("server_nonce").try_into().unwrap(), v["rendezvous"].as_str().unwrap().as_bytes()).to_vec(),
                "decline_other_boot" => answer(DECLINE, OTHER_BOOT, &boot, &[0; 16], b"").to_vec(),
                "hello_carrier_netns" => {
                    assert_eq!((v["proof_offset"].as_u64(), v["proof_len"].as_u64()), (Some(PROOF_OFFSET as u64), Some(PROOF_LEN as u64)));
                    let mut h = Message::Hello { version: 1, mode: Mode::Carrier }.encode();
                    h[8..12].copy_from_slice(&FLAG_NETNS.to_le_bytes());
                    h.to_vec()
                }
                other => panic!("unknown vector {other}"),
            };
            assert_eq!(got, want, "{v}");
        }
    }

    /// Another tenant queues more silent connections at a rendezvous than one look accepts: each
    /// look (under the state lock) accepts at most MAX_ACCEPTS and keeps at most MAX_SILENT; the
    /// later looks take the rest.
    #[test]
    fn a_look_at_the_rendezvous_does_bounded_work() {
        let dir = std::env::temp_dir().join(format!("colo-netns-drain-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let name = "colo-9-9";
        let r = Rendezvous::for_test(&dir, name);
        let (d, _) = pathsock::open_dir(&dir).unwrap();
        let queued = 300;
        let flood: Vec<_> = (0..queued).map(|_| pathsock::connect_at(d.as_fd(), name.as_bytes(), Duration::from_secs(5)).unwrap()).collect();
        assert_eq!(r.drain(&mut r.state()), MAX_ACCEPTS, "one look accepts a bounded number");
        assert!(r.state().silent.len() <= MAX_SILENT);
        let mut total = MAX_ACCEPTS;
        for _ in 0..queued {
            let n = r.drain(&mut r.state());
            assert!(n <= MAX_ACCEPTS);
            if n == 0 {
                break;
            }
            total += n;
        }
        assert_eq!(total, queued, "later looks take the rest");
        assert!(r.state().silent.len() <= MAX_SILENT);
        drop((flood, r));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn messages_have_their_layout() {
        let p = proposal(&[7; 16], &[9; 8]);
        assert_eq!(&p[..8], b"\0COLO-NS");
        assert_eq!((p[8], p[9]), (PROPOSAL, 1));
        assert_eq!(&p[32..], &[9; 8]);
        let a = answer(ACCEPT, 0, &[7; 16], &[5; 16], b"colo-1-80");
        assert_eq!((a[8], a[11]), (ACCEPT, 9));
        assert_eq!(&a[48..57], b"colo-1-80");
        assert!(a[57..].iter().all(|b| *b == 0));
    }
}
