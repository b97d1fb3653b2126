//! The client side: `connect(2)` to a local address with a live rendezvous binds the socket,
//! offers a segment keyed by the 4-tuple, then connects. The answer is awaited (bounded) at the
//! first operation that needs to know; on timeout the offer is abandoned and the connection is
//! plain TCP (nothing was written to the ring, so nothing is lost).

use crate::base::addr::{is_tcp_stream, sockaddr_of};
use crate::base::env::disabled;
use crate::base::log::{log_debug, log_info, log_level};
use crate::base::mem::try_lock;
use crate::conn::entry::Pending;
use crate::conn::{options, regs};
use crate::conn::state::Conn;
use crate::conn::table::{self, Entry, Slot};
use crate::record::adapt;
use crate::service::prepared::{geometry, timeout, Prepared};
use crate::service::{handover, server};
use colo::internal::carrier::{self, Abandon, Answer};
use colo_sys::BorrowedFd;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a dial to a destination this process listens on waits for the answer.
const SELF_WAIT: Duration = Duration::from_millis(50);

/// Destinations this process listens on whose answer did not come while it waited: it accepts
/// them itself, on the thread that dialed. Plain TCP there from then on.
static SELF_PLAIN: std::sync::Mutex<Vec<SocketAddr>> = std::sync::Mutex::new(Vec::new());

fn self_plain(target: SocketAddr) -> bool {
    try_lock(&SELF_PLAIN).is_some_and(|s| s.contains(&target))
}

/// This program's tag (spec/WIRE.md section 2), read once per process image.
fn own_tag() -> Option<u64> {
    static TAG: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *TAG.get_or_init(|| colo_sys::host::cmdline_head(None, colo::wire::TAG_BYTES).ok().map(|c| colo::wire::program_tag(&c)))
}


/// After the plain connect of [`Prepared::NoListener`] (`r`, `errno` its result): remembers that
/// `target` has no colo listener only if a TCP listener is there (connected, or a non-blocking
/// connect already established: one `poll` without waiting, which leaves a pending error for
/// the application). Nothing is remembered for a refused connect: a client retrying until its
/// server starts must look again at once, or its first connection would stay plain for life.
pub fn note_no_listener(fd: i32, target: SocketAddr, r: i32, errno: i32) {
    let through = r == 0 || errno == libc::EINPROGRESS && {
        let mut p = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
        // SAFETY: one pollfd of ours, no waiting.
        unsafe { crate::real::poll(&mut p, 1, 0) == 1 && p.revents & (libc::POLLERR | libc::POLLHUP) == 0 }
    };
    if through {
        adapt::no_listener(target);
    }
}

/// Whether a connection to `peer` goes plain TCP with no more tests: a plain period there, or no
/// colo listener a moment ago (see `adapt::known_plain`). Not at `COLO_LOG=debug`, whose line
/// for each connection says why.
pub fn known_plain(peer: SocketAddr) -> bool {
    log_level() < 2 && adapt::known_plain(target_of(peer))
}

/// Where a connection to `peer` goes: connect(2) to the unspecified address reaches loopback.
fn target_of(peer: SocketAddr) -> SocketAddr {
    match peer {
        SocketAddr::V4(a) if a.ip().is_unspecified() => SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), a.port()),
        SocketAddr::V6(a) if a.ip().is_unspecified() => SocketAddr::new(std::net::Ipv6Addr::LOCALHOST.into(), a.port()),
        _ => peer,
    }
}

/// Before the real connect: find a rendezvous and offer a segment.
pub fn prepare(fd: i32, peer: SocketAddr) -> Prepared {
    if disabled() || fd < 0 || fd as usize >= table::MAX_FD || table::kind(fd) != table::NONE {
        return Prepared::Plain;
    }
    let target = target_of(peer);
    // First, as it needs no system call: a connection per request costs no more than plain TCP.
    let verdict = adapt::accelerate(target);
    if verdict == adapt::Verdict::Plain {
        log_debug(format_args!("connect {peer}: short-lived connections to it, or no colo listener a moment ago; plain TCP"));
        return Prepared::Plain;
    }
    let self_served = server::may_accept(target);
    if self_served && self_plain(target) {
        log_debug(format_args!("connect {peer}: this process accepts there itself; plain TCP"));
        return Prepared::Plain;
    }
    // SAFETY: the application's socket, open during this call.
    let b = unsafe { BorrowedFd::borrow_raw(fd) };
    if !is_tcp_stream(b) {
        return Prepared::Plain;
    }
    if let Some(dir) = colo::internal::netns::peer_dir(target) {
        return crate::service::elsewhere::connect(b, peer, dir);
    }
    if verdict == adapt::Verdict::FirstOffer
        && colo_sys::host::is_local(target.ip())
        && adapt::first_look(target, || own_tag().is_some_and(|t| carrier::says_short_lived(target, t)))
    {
        log_info(format_args!(
            "connect {peer}: its listener says this program's connections to it are short-lived; plain TCP there for a while (COLO_SHORT_LIVED=accelerate keeps shared memory)"
        ));
        return Prepared::Plain;
    }
    let rendezvous = match carrier::connect_rendezvous(target) {
        Ok(Some(r)) => r,
        Ok(None) if colo_sys::host::is_local(target.ip()) => {
            log_debug(format_args!("connect {peer}: no colo listener; plain TCP"));
            return Prepared::NoListener(target);
        }
        Ok(None) => return Prepared::Plain,
        Err(e) => {
            let why = if adapt::set_up_failed(&e) { colo_sys::preload::shortage() } else { String::new() };
            log_info(format_args!("connect {peer}: rendezvous: {e}; plain TCP {why}"));
            return Prepared::Plain;
        }
    };
    let server = adapt::server_key(rendezvous.server_uid, rendezvous.server_pid);
    if verdict == adapt::Verdict::FirstOffer && adapt::process_busy(server, target) {
        log_debug(format_args!(
            "connect {peer}: its server's program was found not accepting on another of its listeners a moment ago; plain TCP there until then"
        ));
        return Prepared::Plain;
    }
    // Bind first, so the 4-tuple is known before the SYN. A socket whose connect was refused
    // still reports the port it had, on the wildcard address, but is bound to nothing: its
    // next connect would pick another port (the offer waited out its timeout for nothing).
    let mut local = rustix::net::getsockname(b).ok().and_then(|a| sockaddr_of(&a));
    if local.is_none_or(|l| l.port() == 0 || l.ip().is_unspecified()) {
        // The source address the kernel would pick (127.0.0.1 for 127.0.0.2): servers' access
        // rules (redis protected mode, nginx `allow`) look at it.
        let source = colo_sys::tcp::source_for(target.ip());
        let bind_to: std::net::IpAddr = match (local, source) {
            // An AF_INET6 socket dialing an IPv4-mapped address binds to the mapped form.
            (Some(SocketAddr::V6(_)), std::net::IpAddr::V4(v4)) => v4.to_ipv6_mapped().into(),
            _ => source,
        };
        match colo_sys::tcp::bind_ephemeral_to(b, bind_to) {
            Ok(port) => local = Some(SocketAddr::new(bind_to, port)),
            // Bound by the application to a port on the wildcard address: the kernel keeps the
            // port and picks the source address.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && local.is_some_and(|l| l.port() != 0) => {
                local = local.map(|l| SocketAddr::new(bind_to, l.port()));
            }
            Err(e) => {
                log_info(format_args!("connect {peer}: bind {bind_to}: {e}; plain TCP"));
                return Prepared::Plain;
            }
        }
    }
    let Some(local) = local else { return Prepared::Plain };
    if local.port() % 2 == 0 {
        // Bound by the application to an even port: a server may not look for its offer
        // (spec/WIRE.md section 3, CARRIER mode).
        log_debug(format_args!("connect {peer}: bound to the even port {}; plain TCP", local.port()));
        return Prepared::Plain;
    }
    match carrier::offer(rendezvous.control, rendezvous.server_pid, local, target, geometry()) {
        Ok(offer) => {
            handshake_now(fd);
            Prepared::Offered(Box::new(Pending {
            offer,
            deadline: Instant::now() + timeout(),
            peer,
            self_served: self_served.then_some(target),
            server,
            pid: colo_sys::host::pid(),
            }))
        }
        Err(e) => {
            let why = if adapt::set_up_failed(&e) { colo_sys::preload::shortage() } else { String::new() };
            log_info(format_args!("connect {peer}: offer: {e}; plain TCP {why}"));
            Prepared::Plain
        }
    }
}

/// Makes the real connect of an offered connection complete its handshake at once, so that the
/// server's kernel queues the connection for the accept that answers the offer; the offered
/// connection's first write waits for that answer, so whatever the kernel holds back until the
/// first write would hold up both:
/// - `TCP_FASTOPEN_CONNECT` (curl's `--tcp-fastopen`): with a Fast Open cookie cached (or
///   `TCP_FASTOPEN_NO_COOKIE`) the kernel's connect sends no SYN before the first write, which
///   would wait out the carrier timeout for an accept that cannot come. Without it the
///   connect is a plain handshake, which a Fast Open client must handle anyway (the kernel makes
///   one whenever it has no cookie): a non-blocking connect may then say `EINPROGRESS`, and
///   `getsockopt(TCP_FASTOPEN_CONNECT)` reads 0 from then on.
/// - `TCP_QUICKACK` turned off (haproxy's health checks, and its `option smart-connect`): the
///   kernel holds the handshake's last ACK back to ride with the first bytes, up to 200 ms, and
///   the server end waits unaccepted meanwhile, as behind `TCP_DEFER_ACCEPT`, for which it would
///   be taken (its connections there sent over TCP for a second). Quick ACKs are
///   turned back on; the option is a hint the kernel itself drops, and only the timing of ACKs
///   depends on it.
fn handshake_now(fd: i32) {
    // (option, the value that holds the handshake back, the value that lets it through)
    for (name, held, through) in [(libc::TCP_FASTOPEN_CONNECT, None, 0), (libc::TCP_QUICKACK, Some(0), 1)] {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: reads one int of the application's socket option into `v`, ours.
        let r = unsafe { crate::real::getsockopt(fd, libc::IPPROTO_TCP, name, (&mut v as *mut libc::c_int).cast(), &mut len) };
        if r != 0 || held.map_or(v == through, |h| v != h) {
            continue;
        }
        // SAFETY: sets one int option of the application's socket, before its connect.
        let r = unsafe { crate::real::setsockopt(fd, libc::IPPROTO_TCP, name, (&through as *const libc::c_int).cast(), len) };
        log_debug(format_args!("connect: TCP option {name} set to {through} for the handshake the offer needs ({})", if r == 0 { "done" } else { "refused" }));
    }
}

/// After the real connect succeeded or is in progress.
pub fn record(fd: i32, p: Box<Pending>) {
    record_entry(fd, Entry::Pending(p));
}

/// Records what a connect left to decide later (`Prepared::Connected`).
pub fn record_entry(fd: i32, e: Entry) {
    if let Some(mut slot) = table::lock(fd) {
        slot.set(e);
    }
}

/// After the real connect failed: withdraw the offer.
pub fn withdraw(p: Box<Pending>) {
    let _ = p.offer.abandon();
}

/// Decides a pending connection (waiting for the server's answer, bounded): afterwards the slot
/// holds a `Conn` or nothing (plain TCP).
pub fn resolve(fd: i32, slot: &mut Slot) {
    use crate::service::elsewhere;
    match slot.entry() {
        Entry::Pending(_) => {}
        // A connect to another namespace: its answer first (an offer to decide here, or plain).
        Entry::Dialing(_) => {
            elsewhere::resolve_dialing(fd, slot);
            if !matches!(slot.entry(), Entry::Pending(_)) {
                return;
            }
        }
        // An answer owed: taken off the stream if it is there, without waiting.
        Entry::Owed(_) => {
            elsewhere::settle(fd, slot);
            return;
        }
        _ => return,
    }
    // Keep the fd marked PENDING while we wait for the answer: a second thread's send must wait
    // for the outcome here, not go to the kernel socket (its bytes would bypass the ring).
    let Entry::Pending(p) = slot.take_keeping_kind() else { unreachable!() };
    let mut left = p.deadline.saturating_duration_since(Instant::now());
    if p.self_served.is_some() {
        left = left.min(SELF_WAIT);
    }
    // The set-up cost the short-lived rule weighs: the time spent waiting here (not the time
    // the application took before its first operation).
    let waiting = Instant::now();
    let answer = if p.self_served.is_some() { p.offer.wait_answer(left) } else { wait_while_accepting(fd, &p, left) };
    let setup = waiting.elapsed();
    let mut due = false;
    let welcomed = match answer {
        Answer::Welcome => true,
        other => match p.offer.abandon() {
            Abandon::Abandoned => {
                if other == Answer::Timeout {
                    // Not a resource: the server's program had not accepted the connection
                    // yet, or accepted it without the shim (`wait_while_accepting` said which).
                    log_info(format_args!(
                        "connect {}: not accelerated: no answer within {} ms (COLO_CARRIER_TIMEOUT_MS bounds the wait for a late accept); plain TCP",
                        p.peer,
                        setup.as_millis()
                    ));
                } else {
                    log_info(format_args!("connect {}: not accelerated ({other}); plain TCP", p.peer));
                }
                if let (Some(target), Answer::Timeout) = (p.self_served, other) {
                    log_info(format_args!("connect {}: this process accepts there itself; plain TCP there from now on", p.peer));
                    if let Some(mut s) = try_lock(&SELF_PLAIN) {
                        if !s.contains(&target) && s.len() < 256 {
                            s.push(target);
                        }
                    }
                }
                false
            }
            // The server claimed just before we gave up: its WELCOME is on the way, taken off
            // the control socket whenever it comes (`answer_due`), not waited for here: a
            // server that claims and never answers would hold this call (a fork's decision,
            // connection after connection) for as long as the wait.
            Abandon::Claimed => {
                due = p.offer.answer_now() == Answer::Timeout;
                true
            }
        },
    };
    if !welcomed {
        slot.set(Entry::None);
        return;
    }
    // SAFETY: the application's socket, open during this call.
    let b = unsafe { BorrowedFd::borrow_raw(fd) };
    let nonblocking = rustix::fs::fcntl_getfl(b).map(|f| f.contains(rustix::fs::OFlags::NONBLOCK)).unwrap_or(false);
    let peer = p.peer;
    let inheritable = !handover::is_cloexec(fd);
    match Conn::dialed(p.offer.established(), nonblocking, setup, inheritable) {
        Ok(c) => {
            if due {
                c.shm().answer_due();
            }
            let c = Arc::new(c);
            slot.set(Entry::Conn(c.clone()));
            options::adopt_options(fd, &c);
            handover::on_new(fd, &c, inheritable);
            // Registered in an epoll set before `connect` (as nginx does its upstreams): those
            // registrations watch the TCP socket, which will carry nothing now.
            regs::adopt_plain(fd, &c);
            log_info(format_args!("connect {peer}: accelerated (shared memory)"));
        }
        Err(e) => {
            slot.set(Entry::None);
            log_info(format_args!("connect {peer}: {e}; connection lost"));
        }
    }
}

/// Whether this process holds an established accelerated connection: one a server's program may
/// be waiting on (a worker reading the request of a connection the client has not written on
/// yet, an FTP server's control connection) while the client waits for another's accept.
/// Whether this process holds a connection a server's program may be waiting on while a
/// connection `fd` to `peer` waits in its queue: an accelerated one to anywhere, or another
/// plain TCP one to `peer` (a synchronous worker holds it, waiting for its request).
fn holds_a_connection(fd: i32, peer: SocketAddr) -> bool {
    table::fds_of_kind(table::CONN).next().is_some() || holds_another_to(fd, peer)
}

/// Whether a descriptor of this process other than `fd` is a socket connected to `peer`
/// (through rustix: the shim must not reach its own wrappers of libc's calls).
fn holds_another_to(fd: i32, peer: SocketAddr) -> bool {
    use rustix::fs::{open, Dir, Mode, OFlags};
    let Ok(dir) = open("/proc/self/fd", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()) else {
        return false;
    };
    let Ok(entries) = Dir::read_from(&dir) else { return false };
    let peer = SocketAddr::new(colo_sys::host::canonical(peer.ip()), peer.port());
    entries.filter_map(Result::ok).filter_map(|e| e.file_name().to_str().ok()?.parse::<i32>().ok()).any(|n| {
        if n == fd {
            return false;
        }
        // SAFETY: listed in this process's descriptor table just now; a descriptor closed since
        // (or reused) only answers for whatever it is then, and is not kept.
        let b = unsafe { BorrowedFd::borrow_raw(n) };
        rustix::net::getpeername(b)
            .ok()
            .flatten()
            .and_then(|a| sockaddr_of(&a))
            .is_some_and(|a| SocketAddr::new(colo_sys::host::canonical(a.ip()), a.port()) == peer)
    })
}

/// How often a waiting client looks at its server's accept queue (`wait_while_accepting`), and
/// how many looks in a row may find it no shorter than at the look before (its program not
/// accepting, or arrivals outpacing its accepts) before a connection still in it is given up on.
const STALL: Duration = Duration::from_millis(10);
const STALL_LOOKS: u32 = 3;
/// The first look: an accepting server answers well before it, so only a connection whose
/// answer is late pays for a look.
const FIRST_LOOK: Duration = Duration::from_millis(2);
/// How long an answer may take once the server end was accepted. The accept that takes a
/// connection claims its offer and answers at once; an accepted connection still unanswered
/// after this was taken by a program that does not serve this rendezvous (another process's
/// listener in the same `SO_REUSEPORT` group, a program that accepts by raw system calls), which
/// treats it as plain TCP and may be waiting for the client's first bytes. (A listener whose
/// rendezvous another process holds asks that process for the offer first, for up to 25 ms:
/// `server::guest`.)
const ANSWER_AFTER_ACCEPT: Duration = Duration::from_millis(50);

/// Waits for the answer to `p` (at most `left`) while the server's program is getting to the
/// connection. Its answer comes when that program accepts the connection; over TCP a client
/// never waits on that accept (the kernel completes the connection in the listener's queue and
/// buffers what the client writes). A client that opens several connections before it writes on
/// any (an event loop: wrk, nginx to its upstreams), to a server that accepts one at a time and
/// then waits for that connection's request (a pool of synchronous workers: gunicorn, php-fpm),
/// would wait the whole `left` for every connection beyond the workers' number, and the workers
/// for it meanwhile. So the wait goes on only while the server makes progress: to the end once
/// its program has accepted the connection (the claim and the answer follow), and in steps of
/// `STALL` while its listener's queue gets shorter. A queue that got no shorter over
/// `STALL_LOOKS` steps in a row means its program is not accepting now (a queue's length alone
/// cannot tell accepts matched by arrivals: one look would take a server in a burst of
/// connections for one that stopped): the connection goes on over plain TCP, as it would
/// at the end of `left`, and so do the next ones there, and to the other listeners of the
/// process serving its rendezvous that this process has not dialed yet, for a while
/// (`adapt::not_accepting`, `adapt::process_not_accepting`: an FTP session listens on a new
/// port for each transfer).
/// Only where this process holds another connection (one such a server may be waiting on: any
/// accelerated one, or a plain one to the same server): a lone client, which no server can be
/// waiting on, waits the whole `left` for a late accept.
/// A connection already accepted gets `ANSWER_AFTER_ACCEPT` for its answer. Where this network
/// namespace does not list the connection (a server in another one), the wait is the whole `left`.
fn wait_while_accepting(fd: i32, p: &Pending, left: Duration) -> Answer {
    let end = Instant::now() + left;
    if let Some(a) = answered_within(p, left.min(FIRST_LOOK)) {
        return a;
    }
    // SAFETY: the application's socket, open during this call.
    let b = unsafe { BorrowedFd::borrow_raw(fd) };
    let Some(client) = rustix::net::getsockname(b).ok().and_then(|a| sockaddr_of(&a)) else {
        return p.offer.wait_answer(end.saturating_duration_since(Instant::now()));
    };
    let mut queue = None;
    let mut flat = 0;
    loop {
        let rest = end.saturating_duration_since(Instant::now());
        // Another connection there, of this process, found its program not accepting: this one,
        // queued behind it, waits for the same accepts.
        if rest.is_zero() || (queue.is_some() && adapt::busy(p.peer)) {
            return Answer::Timeout;
        }
        use colo_sys::diag::ServerEnd;
        let now_queued = match colo_sys::diag::server_end(p.peer, client) {
            Ok(Some(ServerEnd::Queued)) => colo_sys::diag::accept_queue(p.peer).ok().flatten(),
            Ok(Some(ServerEnd::Accepted)) => {
                let answer = answered_within(p, rest.min(ANSWER_AFTER_ACCEPT)).unwrap_or(Answer::Timeout);
                if answer == Answer::Timeout {
                    // Which listener takes a connection is the kernel's choice, so the next
                    // ones there may wait the same way: plain TCP there for a while.
                    adapt::not_accepting(p.peer);
                    log_info(format_args!(
                        "connect {}: accepted by a program that does not serve its rendezvous (another process's SO_REUSEPORT listener, or raw system calls); plain TCP there for {:?}",
                        p.peer,
                        adapt::BUSY_FOR
                    ));
                }
                return answer;
            }
            // Its listener accepts only once the client sends (`TCP_DEFER_ACCEPT`: pgbouncer,
            // nginx's `deferred`), which it does only once answered: no answer can come.
            Ok(Some(ServerEnd::Deferred)) => {
                adapt::not_accepting(p.peer);
                log_info(format_args!(
                    "connect {}: its listener accepts only once the client sends (TCP_DEFER_ACCEPT); plain TCP there for {:?}",
                    p.peer,
                    adapt::BUSY_FOR
                ));
                return Answer::Timeout;
            }
            _ => None,
        };
        match (now_queued, queue) {
            // Not to be told: the rest of the wait.
            (None, _) => return p.offer.wait_answer(rest),
            (Some(n), Some(before)) if n >= before && flat + 1 >= STALL_LOOKS && holds_a_connection(fd, p.peer) => {
                adapt::not_accepting(p.peer);
                adapt::process_not_accepting(p.server);
                log_info(format_args!(
                    "connect {}: its server's program is not accepting ({n} connections in its queue); plain TCP there, and to its other listeners not dialed yet, for {:?}",
                    p.peer,
                    adapt::BUSY_FOR
                ));
                return Answer::Timeout;
            }
            (Some(n), before) => {
                flat = if before.is_some_and(|b| n >= b) { flat + 1 } else { 0 };
                queue = Some(n);
            }
        }
        if let Some(a) = answered_within(p, rest.min(STALL)) {
            return a;
        }
    }
}

/// The answer to `p` if one comes within `d`. `poll` is timed to the microsecond, where the
/// receive timeout `wait_answer` sets counts in scheduler ticks (4 ms at 250 Hz): the steps of
/// `wait_while_accepting` stay as short as `STALL`.
fn answered_within(p: &Pending, d: Duration) -> Option<Answer> {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut fds = [PollFd::new(p.offer.control_fd(), PollFlags::IN)];
    let t = Timespec { tv_sec: d.as_secs() as i64, tv_nsec: i64::from(d.subsec_nanos()) };
    match poll(&mut fds, Some(&t)) {
        // Readable: the answer, or the server gone (`answer_now` tells which; `wait_answer`
        // waits for one should the socket have been readable for nothing).
        Ok(n) if n > 0 => Some(match p.offer.answer_now() {
            Answer::Timeout => p.offer.wait_answer(STALL),
            a => a,
        }),
        Ok(_) => None,
        // Interrupted, or poll failed: the rest of the wait as before.
        Err(_) => Some(p.offer.wait_answer(d)).filter(|a| *a != Answer::Timeout),
    }
}

/// Before `fork`: decides every connection still waiting for its server's answer. A pending
/// connection has no holders page yet, so each process's copy would be decided on its own: two
/// processes writing into one ring without turns, or the parent's close ending the connection
/// under its child. A connection to another process's listener waits for the answer as its
/// first read or write would (`wait_while_accepting`: while that program is accepting, within
/// the connect's deadline): a client that forks right after `connect` (a child writes, the
/// parent reads) would otherwise find its server's answer, a matter of microseconds, not yet
/// come, and go on over plain TCP. One this process may accept itself, and one to another
/// namespace, is decided at once: the answer if it came (shared memory), else plain TCP (or,
/// if the server claimed it meanwhile, the answer it then owes); this process cannot accept
/// while it waits here.
pub fn decide_before_fork() {
    let pending: Vec<usize> = table::fds_of_kind(table::PENDING).collect();
    for fd in pending {
        let Some(mut slot) = table::lock(fd as i32) else { continue };
        match slot.entry() {
            Entry::Pending(p) if p.self_served.is_some() => p.deadline = Instant::now(),
            Entry::Pending(_) => {}
            Entry::Dialing(d) => d.deadline = Instant::now(),
            _ => continue,
        }
        resolve(fd as i32, &mut slot);
    }
}

/// Resolves `fd` if it is pending.
pub fn resolve_fd(fd: i32) {
    if table::kind(fd) != table::PENDING {
        return;
    }
    if let Some(mut slot) = table::lock(fd) {
        resolve(fd, &mut slot);
    }
}

/// A pending connection is closed before it was decided: abandon the offer, or, if the server
/// already claimed it, close the shared-memory connection cleanly (FIN). A fork child's copy,
/// while the process that dialed lives, is only let go of: that process still holds the
/// connection and decides it (over TCP a copy's close does nothing to the connection).
pub fn close_pending(p: Box<Pending>) {
    if p.pid != colo_sys::host::pid() && colo_sys::host::alive(p.pid) {
        return;
    }
    if p.offer.abandon() == Abandon::Claimed {
        let _ = p.offer.wait_answer(Duration::from_millis(200));
        let est = p.offer.established();
        drop(est.into_shm(colo_ring::spin::SpinMode::Never));
    }
}
