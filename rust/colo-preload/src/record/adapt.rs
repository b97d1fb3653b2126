//! Short-lived connections stay on plain TCP.
//!
//! Setting up a segment costs a shim client and server a few dozen system calls and a
//! cross-process round trip for the claim; a connection that moves a few bytes and closes gains
//! less than that (redis-benchmark `-k 0`, HTTP without keep-alive). So the client side watches
//! how its accelerated connections to each destination end: when most of the recent ones were
//! short it dials that destination over plain TCP for a while, then offers shared memory to one
//! connection (the load may have changed) and decides by how that one ends. Long-lived connections dialed outside
//! those plain periods are never affected. `COLO_SHORT_LIVED=accelerate` turns this off.
//!
//! It also remembers, for a moment, that a destination has no colo listener at all, so that a
//! client under `colo run` talking to a plain server does not look for one on every connection.

use crate::base::log::log_info;
use rustc_hash::FxHashMap as HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A connection that moved less than `SHORT_BYTES` and lived less than this, or less than
/// `SETUP_TIMES` its own set-up, or closed within this after the one reply it asked for, was
/// short: shared memory did not pay for itself (see [`Lived::short`]).
const SHORT_LIFE: Duration = Duration::from_millis(50);
const SETUP_TIMES: u32 = 10;
const SHORT_BYTES: u64 = 64 * 1024;
/// Of the last `WINDOW` (at least `RUN`) connections to one destination, three in four short...
const RUN: u32 = 8;
const WINDOW: u32 = 16;
/// ...send the next ones there over plain TCP for this long; then one connection (the probe) is
/// offered shared memory: a short probe starts another such period, a long one (or one still open
/// after `SHORT_LIFE`) ends them. Without the probe, every connection dialed until the next run of
/// short ones had ended went through the set-up again: about 18 per period with 10 in flight.
/// The cost: connections dialed in a plain period, or while the probe may still end short (its
/// first `SHORT_LIFE`), stay plain TCP for life, even if they turn out long-lived.
const PLAIN_FOR: Duration = Duration::from_secs(1);
/// Destinations remembered (a bound on memory; the table starts over when full).
const MAX_DESTS: usize = 4096;
/// After a destination was found to have no colo listener, connections to it go plain TCP
/// without asking again for this long. Asking costs three failed connects on Unix sockets (the
/// exact address, then the wildcards) and two `getsockopt`s, more than a short plain connection
/// costs by itself (docs/ARCHITECTURE.md). A colo listener that appears at that address is used
/// from the next look on.
const NO_LISTENER_FOR: Duration = Duration::from_millis(100);

/// What this process has seen of one destination's connections.
#[derive(Default)]
struct Dest {
    /// How the last connections ended, newest in bit 0 (1: short), and how many of them there are
    /// (up to `WINDOW`). Not a run that one long connection resets: under load some connections
    /// of a connection-per-request client outlive the rule, and a reset run never completed.
    recent: u16,
    seen: u32,
    plain_until: Option<Instant>,
    /// When the probe after a plain period was dialed (no other connection is offered shared
    /// memory until it ends or outlives `SHORT_LIFE`).
    probe_since: Option<Instant>,
    /// Until when the destination counts as having no colo listener (`NO_LISTENER_FOR`).
    no_listener_until: Option<Instant>,
    /// When a connection last found no colo listener there (see [`no_listener`]).
    missed_at: Option<Instant>,
    /// Until when its server's program counts as not accepting ([`not_accepting`]), and for how
    /// long that last was (the next such period, if it comes soon, lasts twice as long).
    busy_until: Option<Instant>,
    busy_for: Duration,
}

impl Dest {
    /// Its server's program was found not accepting at `now`: no offers there for `BUSY_FOR`, or,
    /// found so again within a period's length of the last one's end, for twice that period (up
    /// to `BUSY_MAX`). A server whose accepting processes cannot answer an offer (they run
    /// without the shim: postfix and dovecot clear their children's environment) is found so
    /// at every offer, each costing the client its wait; a pool of busy workers is found so
    /// now and then.
    fn not_accepting(&mut self, now: Instant) {
        let again = self.busy_until.is_some_and(|t| now < t + self.busy_for);
        self.busy_for = if again { (self.busy_for * 2).min(BUSY_MAX) } else { BUSY_FOR };
        self.busy_until = Some(now + self.busy_for);
    }

    /// Whether a connection dialed `now` should be offered shared memory.
    fn accelerate(&mut self, now: Instant) -> bool {
        if let Some(since) = self.probe_since {
            if now.duration_since(since) < SHORT_LIFE {
                return false;
            }
            // The probe is not short (whether or not it was accelerated at all).
            *self = Dest::default();
            return true;
        }
        match self.plain_until {
            Some(t) if now < t => false,
            Some(_) => {
                self.probe_since = Some(now);
                true
            }
            None => true,
        }
    }

    /// An accelerated connection ended at `now`; returns whether that started plain TCP (first
    /// time after a run of short ones: worth a log line).
    fn ended(&mut self, now: Instant, short: bool) -> bool {
        if self.probe_since.take().is_some() {
            // The verdict on the probe (or on an older connection ending meanwhile: as good).
            if short {
                self.plain_until = Some(now + PLAIN_FOR);
            } else {
                *self = Dest::default();
            }
            return false;
        }
        self.recent = self.recent << 1 | u16::from(short);
        self.seen = (self.seen + 1).min(WINDOW);
        let window = if self.seen >= WINDOW { u16::MAX } else { (1u16 << self.seen) - 1 };
        let shorts = (self.recent & window).count_ones();
        if self.seen >= RUN && shorts * 4 >= self.seen * 3 && self.plain_until.is_none() {
            self.plain_until = Some(now + PLAIN_FOR);
            return true;
        }
        false
    }
}

// Locked at every fork: kept with what the fork handlers write (see `colo_sys::host`).
#[link_section = "colo_fork"]
static DESTS: Mutex<Option<HashMap<SocketAddr, Dest>>> = Mutex::new(None);

/// Taken around a fork, last of the shim's locks (see `crate::fork_guards`), so that a child
/// forked while another thread dialed or ended a connection finds the table unlocked at its own
/// first `connect`. A thread holding it takes no other of the shim's locks.
pub fn fork_guards(held: &mut colo::internal::fork::Held) {
    held.hold(DESTS.lock().unwrap_or_else(|e| e.into_inner()));
}

pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("COLO_SHORT_LIVED").map_or(true, |v| v != "accelerate"))
}

/// The table's key for `dest`: an IPv4-mapped IPv6 address as IPv4, as the connection reports its
/// peer when it ends (otherwise endings and dials of `[::ffff:127.0.0.1]:p` never met).
fn key(dest: SocketAddr) -> SocketAddr {
    SocketAddr::new(colo_sys::host::canonical(dest.ip()), dest.port())
}

/// What a new connection to a destination should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Plain TCP (short-lived connections there, or no colo listener a moment ago).
    Plain,
    /// Look for a colo listener and offer it shared memory.
    Offer,
    /// The same, for the first connection to it that this process makes: if a colo listener
    /// answers, ask it first whether its connections are short-lived ([`first_look`]).
    FirstOffer,
}

/// Whether a new connection to `dest` should look for a colo listener and offer it shared memory.
pub fn accelerate(dest: SocketAddr) -> Verdict {
    let out_of_fds_until = OUT_OF_FDS_UNTIL.load(Ordering::Relaxed);
    if out_of_fds_until != 0 && coarse_ms() < out_of_fds_until {
        // Each connection left on TCP for want of a resource is named (one line, and one
        // `getrlimit`, only at `info`; the set-up that found none logged the band and count).
        if crate::base::log::log_level() >= 1 {
            let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
            let n = |v: Option<u64>| v.map_or("unlimited".to_string(), |v| v.to_string());
            log_info(format_args!(
                "connect {dest}: left on TCP: no descriptor number was free for colo a moment ago (RLIMIT_NOFILE soft {} hard {})",
                n(lim.current),
                n(lim.maximum)
            ));
        }
        return Verdict::Plain;
    }
    let (dest, k, known) = cached(dest);
    if known.holds(k) {
        return Verdict::Plain;
    }
    let mut g = DESTS.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = g.get_or_insert_with(HashMap::default).get_mut(&dest) else { return Verdict::FirstOffer };
    let now = Instant::now();
    let plain_until = if d.no_listener_until.is_some_and(|t| now < t) {
        d.no_listener_until
    } else if d.busy_until.is_some_and(|t| now < t) {
        d.busy_until
    } else if !enabled() || d.accelerate(now) {
        return Verdict::Offer;
    } else {
        d.plain_until.filter(|&t| now < t && d.probe_since.is_none())
    };
    if let Some(t) = plain_until {
        known.until.store(coarse_ms() + t.duration_since(now).as_millis() as u64, Ordering::Relaxed);
        known.key.store(k, Ordering::Relaxed);
    }
    Verdict::Plain
}

/// Whether connections to `dest` go plain TCP for now (a plain period, or no colo listener a
/// moment ago), as far as is known without a lock: the test [`accelerate`] makes after the
/// out-of-descriptors pause, for the shim's `connect` to make before anything else.
#[inline]
pub fn known_plain(dest: SocketAddr) -> bool {
    let (_, k, known) = cached(dest);
    known.holds(k)
}

/// `dest` as the table keys it, its compact key and its entry in `PLAIN_UNTIL`.
fn cached(dest: SocketAddr) -> (SocketAddr, u64, &'static PlainUntil) {
    let dest = key(dest);
    let k = compact(dest);
    (dest, k, &PLAIN_UNTIL[slot_of(k)])
}

/// Destinations that are dialed plain TCP until a deadline (a plain period, or no colo listener
/// there a moment ago), for [`known_plain`] and [`accelerate`] to answer without the lock or a
/// precise clock: a client in a plain period dials hundreds of connections a second there.
/// Direct-mapped by a compact key; a torn or overwritten entry only sends one connection the
/// locked way, or keeps one plain a clock tick longer.
struct PlainUntil {
    key: AtomicU64,
    /// `coarse_ms` deadline.
    until: AtomicU64,
}

impl PlainUntil {
    /// Whether this entry is the destination with key `k`, and its deadline is still ahead.
    fn holds(&self, k: u64) -> bool {
        self.key.load(Ordering::Relaxed) == k && coarse_ms() < self.until.load(Ordering::Relaxed)
    }
}

static PLAIN_UNTIL: [PlainUntil; 64] = [const { PlainUntil { key: AtomicU64::new(0), until: AtomicU64::new(0) } }; 64];

/// A destination as one nonzero word: an IPv4 one exactly, an IPv6 one hashed.
fn compact(dest: SocketAddr) -> u64 {
    match dest {
        SocketAddr::V4(a) => 1 << 63 | u64::from(u32::from(*a.ip())) << 16 | u64::from(a.port()),
        SocketAddr::V6(a) => {
            use std::hash::BuildHasher;
            rustc_hash::FxBuildHasher.hash_one((a.ip(), a.port())) | 1
        }
    }
}

fn slot_of(k: u64) -> usize {
    (k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize
}

/// Milliseconds on the coarse monotonic clock (a tick of a few ms, read without a system call
/// and cheaper than the precise one).
fn coarse_ms() -> u64 {
    colo_sys::host::monotonic_ns(true) / 1_000_000
}

/// The first connection to `dest` (a [`Verdict::FirstOffer`]) found its colo listener, which
/// `says_short` (its short-lived marker, spec/WIRE.md section 2, asked only here): returns
/// whether to dial it over plain TCP, starting a plain period there as a run of short
/// connections of our own would. So a new process that opens a connection per request (wrk,
/// redis-benchmark `-k 0`, a script running curl in a loop) does not first set up shared memory
/// for a burst of them before its own rule takes over.
pub fn first_look(dest: SocketAddr, says_short: impl FnOnce() -> bool) -> bool {
    let dest = key(dest);
    let mut g = DESTS.lock().unwrap_or_else(|e| e.into_inner());
    let map = g.get_or_insert_with(HashMap::default);
    if map.contains_key(&dest) {
        // Another thread looked first.
        return false;
    }
    // Made whatever `COLO_SHORT_LIVED` says: its next connections are no longer the first
    // ([`process_busy`] applies only to those).
    let d = dest_entry(map, dest);
    if !enabled() {
        return false;
    }
    let short = says_short();
    if short {
        d.plain_until = Some(Instant::now() + PLAIN_FOR);
    }
    short
}

/// A connection to `dest` found no colo listener there, but a TCP one: the second such
/// connection within `NO_LISTENER_FOR` starts the period of `NO_LISTENER_FOR` without looking.
/// (Not the first: a server under `colo run` listens on TCP a moment before its rendezvous
/// exists, and a client that retried until the port answered would otherwise dial its next,
/// long-lived connection plain.)
pub fn no_listener(dest: SocketAddr) {
    let dest = key(dest);
    let now = Instant::now();
    let mut g = DESTS.lock().unwrap_or_else(|e| e.into_inner());
    let d = dest_entry(g.get_or_insert_with(HashMap::default), dest);
    if d.missed_at.is_some_and(|t| now.duration_since(t) < NO_LISTENER_FOR) {
        d.no_listener_until = Some(now + NO_LISTENER_FOR);
    }
    d.missed_at = Some(now);
}

/// How long connections to a destination go plain TCP after one found its server's program not
/// accepting ([`not_accepting`]).
pub const BUSY_FOR: Duration = Duration::from_secs(1);
/// The longest such period, for a server found not accepting time after time.
const BUSY_MAX: Duration = Duration::from_secs(64);

/// A connection to `dest` was given up on because its server's program was not accepting
/// connections (the shim's `wait_while_accepting`: its queue did not move), or because a program
/// that does not serve the rendezvous accepted it (a `SO_REUSEPORT` sibling). Such a server is a
/// pool of workers each waiting on a connection it accepted, often for this very client's
/// request: the next connections there would only wait and be given up on too, each costing the
/// client the wait. They go plain TCP without an offer for `BUSY_FOR` (those stay plain for
/// life), whatever `COLO_SHORT_LIVED` says: the cost here is waiting, not the set-up.
pub fn not_accepting(dest: SocketAddr) {
    let dest = key(dest);
    let mut g = DESTS.lock().unwrap_or_else(|e| e.into_inner());
    dest_entry(g.get_or_insert_with(HashMap::default), dest).not_accepting(Instant::now());
}

/// Whether a connection to `dest` found its server's program not accepting within the last
/// `BUSY_FOR` ([`not_accepting`]): the connections offered before that finding, still waiting
/// for their answers, stop waiting as well.
pub fn busy(dest: SocketAddr) -> bool {
    let dest = key(dest);
    let g = DESTS.lock().unwrap_or_else(|e| e.into_inner());
    g.as_ref().and_then(|m| m.get(&dest)).and_then(|d| d.busy_until).is_some_and(|t| Instant::now() < t)
}

/// Server processes found not accepting ([`process_not_accepting`]), each with the `coarse_ms`
/// deadline of its period: the destination's period covers one listener, and a program that
/// accepts a connection only after the client's next request on another connection opens a new
/// listener for each (an FTP session's passive data connections, a new port each), so each of
/// its listeners would cost the client the wait once. Only destinations this client has not
/// dialed yet ([`Verdict::FirstOffer`]) follow the process's period: one program serving several
/// pools (php-fpm, uwsgi, gunicorn, apache's `Listen` ports) may have one saturated and the others
/// idle, and a pool dialed before keeps its own history. Keyed by [`server_key`]: the
/// `SO_PEERCRED` pid is the one that called `listen()` and stays after that process exits, so with
/// the uid a reused pid cannot make another user's stalled listener send this user's connections
/// plain (one the same user reused within the period only dials its first connections plain TCP
/// until the period's end). Direct-mapped by pid, as `PLAIN_UNTIL`: a torn or overwritten entry only offers one
/// connection shared memory (and its wait), or keeps one plain a tick longer.
static BUSY_PROCESSES: [PlainUntil; 16] = [const { PlainUntil { key: AtomicU64::new(0), until: AtomicU64::new(0) } }; 16];

/// The key of a server process in [`BUSY_PROCESSES`]: its uid and pid (`SO_PEERCRED` of its
/// rendezvous); 0 when the pid is not known.
pub fn server_key(uid: u32, pid: u32) -> u64 {
    if pid == 0 {
        return 0;
    }
    u64::from(uid) << 32 | u64::from(pid)
}

fn busy_process_entry(server: u64) -> &'static PlainUntil {
    &BUSY_PROCESSES[(server as u32) as usize % BUSY_PROCESSES.len()]
}

/// The program of the server process `server` ([`server_key`]; 0: not known) did not accept a
/// connection offered to one of its listeners while its queue stood still ([`not_accepting`] for
/// the destination): connections to its listeners this client has not dialed yet go plain TCP
/// without an offer for `BUSY_FOR` ([`process_busy`]).
pub fn process_not_accepting(server: u64) {
    if server == 0 {
        return;
    }
    let e = busy_process_entry(server);
    e.until.store(coarse_ms() + BUSY_FOR.as_millis() as u64, Ordering::Relaxed);
    e.key.store(server, Ordering::Relaxed);
}

/// Whether the server process `server` ([`server_key`]) was found not accepting within the last
/// `BUSY_FOR` ([`process_not_accepting`]), for a connection to `dest`, one of its listeners this
/// client has not dialed yet ([`Verdict::FirstOffer`]). If so, `dest` is dialed plain TCP until
/// the end of the process's period without reaching its rendezvous ([`known_plain`]).
pub fn process_busy(server: u64, dest: SocketAddr) -> bool {
    if server == 0 {
        return false;
    }
    let e = busy_process_entry(server);
    let until = e.until.load(Ordering::Relaxed);
    if e.key.load(Ordering::Relaxed) != server || coarse_ms() >= until {
        return false;
    }
    let (_, k, known) = cached(dest);
    known.until.store(until, Ordering::Relaxed);
    known.key.store(k, Ordering::Relaxed);
    true
}

/// After a set-up found no descriptor number free for the shim (see the shim's `init`), no
/// connection is offered shared memory for this long: each attempt costs system calls and a log
/// line, and a client that opens hundreds of connections at once would make one per connection.
const OUT_OF_FDS_FOR: Duration = Duration::from_millis(100);
/// Until when (`coarse_ms`; 0: never set): one atomic, so that a connect takes no lock for it.
static OUT_OF_FDS_UNTIL: AtomicU64 = AtomicU64::new(0);

/// A set-up failed with `e`: if for want of descriptors, pause offering shared memory
/// (`OUT_OF_FDS_FOR`); returns whether it did.
pub fn set_up_failed(e: &std::io::Error) -> bool {
    let out = matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
    if out {
        OUT_OF_FDS_UNTIL.store(coarse_ms() + OUT_OF_FDS_FOR.as_millis() as u64, Ordering::Relaxed);
    }
    out
}

/// The entry of `dest`, made if needed (the table starts over when full).
fn dest_entry(map: &mut HashMap<SocketAddr, Dest>, dest: SocketAddr) -> &mut Dest {
    if map.len() >= MAX_DESTS && !map.contains_key(&dest) {
        map.clear();
    }
    map.entry(dest).or_default()
}

/// How an accelerated connection ended.
pub struct Lived {
    /// From set-up to close.
    pub lived: Duration,
    /// The set-up itself (offer to answer).
    pub setup: Duration,
    /// Bytes moved both ways.
    pub bytes: u64,
    /// When the client wrote nothing after the first reply (one request, one response): how
    /// long the connection lived after that reply.
    pub after_only_reply: Option<Duration>,
}

impl Lived {
    /// Whether shared memory did not pay for itself: few bytes, and a short life, or a single
    /// exchange closed soon after its reply, however long the reply took: with hundreds of
    /// connection-per-request clients every connection waits long for its turn, and a rule on
    /// its life alone would never find one short (docs/ARCHITECTURE.md). (Soon after the reply:
    /// a stream the server pushes, or a pooled connection closed when idle, is not short.)
    pub fn short(&self) -> bool {
        let quick = self.lived < SHORT_LIFE || self.lived < self.setup * SETUP_TIMES;
        let one_exchange = self.after_only_reply.is_some_and(|d| d < SHORT_LIFE);
        (quick || one_exchange) && self.bytes < SHORT_BYTES
    }
}

/// An accelerated connection to `dest` ended as `lived` says.
pub fn ended(dest: SocketAddr, lived: Lived) {
    if !enabled() {
        return;
    }
    let short = lived.short();
    let dest = key(dest);
    let mut g = DESTS.lock().unwrap_or_else(|e| e.into_inner());
    if dest_entry(g.get_or_insert_with(HashMap::default), dest).ended(Instant::now(), short) {
        log_info(format_args!(
            "connect {dest}: most of its connections are short-lived; plain TCP there for {PLAIN_FOR:?} at a time (COLO_SHORT_LIVED=accelerate keeps shared memory)"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_short_connections_goes_plain_then_probes_one_at_a_time() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut d = Dest::default();
        for i in 0..RUN - 1 {
            assert!(d.accelerate(ms(0)));
            assert!(!d.ended(ms(1), true), "connection {i}: not yet a run");
        }
        assert!(d.ended(ms(1), true), "the run is complete");
        assert!(!d.accelerate(ms(500)), "plain for PLAIN_FOR");
        assert!(d.accelerate(ms(1002)), "then one probe");
        assert!(!d.accelerate(ms(1003)), "and only one while it may still end short");
        assert!(!d.ended(ms(1004), true), "a short probe: no new log line");
        assert!(!d.accelerate(ms(1500)), "another plain period");
        assert!(d.accelerate(ms(2005)), "the next probe");
        assert!(!d.ended(ms(2100), false), "a long probe...");
        assert!(d.accelerate(ms(2101)) && d.accelerate(ms(2101)), "...ends the plain periods");
    }

    #[test]
    fn a_destination_without_a_colo_listener_is_remembered_after_the_second_miss() {
        let d: SocketAddr = "127.0.0.9:4321".parse().unwrap();
        no_listener(d);
        assert_eq!(accelerate(d), Verdict::Offer, "one miss: look again (its server may be starting)");
        no_listener(d);
        assert_eq!(accelerate(d), Verdict::Plain, "a second miss soon after: not for a while");
    }

    #[test]
    fn a_process_found_not_accepting_is_remembered_for_its_other_listeners() {
        // Pids no test process has: the table is the process's.
        let (p, q) = (server_key(1000, 4_000_001), server_key(1000, 4_000_002));
        let same_pid_other_user = server_key(1001, 4_000_001);
        let (d, e): (SocketAddr, SocketAddr) = ("127.0.0.9:4341".parse().unwrap(), "127.0.0.9:4342".parse().unwrap());
        assert_eq!(server_key(1000, 0), 0, "an unknown pid is unknown whatever the uid");
        assert!(!process_busy(p, d) && !process_busy(0, d));
        assert!(!known_plain(d));
        process_not_accepting(p);
        process_not_accepting(0);
        assert!(process_busy(p, d), "found so: for BUSY_FOR");
        assert!(known_plain(d), "the destination is then dialed plain without its rendezvous");
        assert!(!process_busy(q, e) && !process_busy(0, e), "not another process, nor an unknown one");
        assert!(!process_busy(same_pid_other_user, e), "nor another user's process with that pid");
        assert!(!known_plain(e));
    }

    #[test]
    fn a_server_found_not_accepting_gets_plain_connections_for_a_while() {
        let d: SocketAddr = "127.0.0.9:4331".parse().unwrap();
        let other: SocketAddr = "127.0.0.9:4332".parse().unwrap();
        assert_eq!(accelerate(d), Verdict::FirstOffer);
        not_accepting(d);
        assert_eq!(accelerate(d), Verdict::Plain);
        assert!(known_plain(d), "told without the lock");
        assert_ne!(accelerate(other), Verdict::Plain, "another destination is not affected");
    }

    #[test]
    fn a_server_found_not_accepting_time_after_time_is_left_alone_longer() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut d = Dest::default();
        d.not_accepting(s(0));
        assert_eq!(d.busy_until, Some(s(1)), "a first finding: BUSY_FOR");
        d.not_accepting(s(1));
        assert_eq!(d.busy_until, Some(s(3)), "again right after: twice as long");
        d.not_accepting(s(4));
        assert_eq!(d.busy_until, Some(s(8)), "and again");
        for _ in 0..10 {
            let t = d.busy_until.unwrap();
            d.not_accepting(t);
        }
        assert_eq!(d.busy_for, BUSY_MAX, "up to BUSY_MAX");
        let later = d.busy_until.unwrap() + BUSY_MAX + Duration::from_secs(1);
        d.not_accepting(later);
        assert_eq!(d.busy_until, Some(later + BUSY_FOR), "found so only long after: BUSY_FOR again");
    }

    #[test]
    fn only_the_first_connection_asks_the_listener_and_its_answer_starts_a_plain_period() {
        let d: SocketAddr = "127.0.0.9:4322".parse().unwrap();
        assert_eq!(accelerate(d), Verdict::FirstOffer);
        assert!(first_look(d, || true), "the listener says short-lived: plain TCP");
        assert!(!first_look(d, || panic!("asked twice")), "asked once per destination");
        assert_eq!(accelerate(d), Verdict::Plain, "a plain period, then the usual probe");
        let e: SocketAddr = "127.0.0.9:4323".parse().unwrap();
        assert!(!first_look(e, || false));
        assert_eq!(accelerate(e), Verdict::Offer);
    }

    #[test]
    fn a_mapped_address_is_the_same_destination() {
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:5".parse().unwrap();
        assert_eq!(key(mapped), "127.0.0.1:5".parse().unwrap());
    }

    #[test]
    fn one_exchange_is_short_however_long_it_waited() {
        let ms = Duration::from_millis;
        let l = |lived, bytes, after: Option<u64>| Lived { lived: ms(lived), setup: ms(1), bytes, after_only_reply: after.map(ms) };
        assert!(l(90, 1100, Some(1)).short(), "a request and its response, slow under load");
        assert!(!l(90, 1100, None).short(), "a second request: the connection is reused");
        assert!(!l(9000, 1100, Some(8000)).short(), "one reply, then open for long: pushed to, or pooled");
        assert!(l(5, 1100, None).short(), "quick, whatever it carried");
        assert!(!l(5, SHORT_BYTES, Some(1)).short(), "a large transfer pays for the set-up");
    }

    #[test]
    fn a_few_long_connections_among_short_ones_do_not_keep_shared_memory() {
        let t0 = Instant::now();
        let mut d = Dest::default();
        let mut went_plain = false;
        // One in five outlives the rule, as under load: three in four short is enough.
        for i in 0..WINDOW {
            went_plain |= d.ended(t0, i % 5 != 4);
        }
        assert!(went_plain);
        let mut d = Dest::default();
        for i in 0..4 * WINDOW {
            assert!(!d.ended(t0, i % 2 == 0), "half long: shared memory pays for itself");
        }
    }

    #[test]
    fn a_probe_still_open_after_the_short_life_ends_the_plain_periods() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut d = Dest { recent: u16::MAX, seen: WINDOW, plain_until: Some(ms(10)), probe_since: None, no_listener_until: None, missed_at: None, busy_until: None, busy_for: Duration::ZERO };
        assert!(d.accelerate(ms(11)), "the probe");
        assert!(!d.accelerate(ms(20)));
        assert!(d.accelerate(ms(11) + SHORT_LIFE), "the probe lives on: accelerate again");
        assert!(d.accelerate(ms(40)));
        assert!(!d.ended(ms(41), true), "one short connection is not a run");
        assert!(d.accelerate(ms(42)));
    }
}
