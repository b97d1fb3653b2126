//! A connection handed over by `exec` as standard input, output or error.
//!
//! glibc's stdio (`getchar`, `fgets`, `printf`, `fflush`) reads and writes descriptors 0, 1 and 2
//! through calls internal to libc that no preloaded library sees: an accelerated connection
//! there would be read and written as its carrier TCP socket, which carries no payload after the
//! claim (spec/WIRE.md section 3), so every byte would be lost in both directions. A claimed
//! connection cannot go back to its carrier without its peer (the peer's bytes wait in the
//! ring; only the peer could write them into the carrier's other end).
//!
//! So when a new image takes back a connection one of whose descriptors is 0, 1 or 2, it gives
//! every such descriptor a loopback TCP connection of its own instead, and a relay process
//! carries the bytes between that connection and the rings, in order, both ways: the bytes
//! already in the ring toward this side first, then everything the peer writes later; and all
//! the program writes, after the bytes this side's earlier image had written. A FIN goes each
//! way as the other side's end of file. The program sees a TCP socket with the same file
//! status flags and close-on-exec flags on the same numbers, whose `getsockname` and
//! `getpeername` answer the connection's addresses (`record::relayed`; the kernel's tables, and
//! an image after another `exec`, show the relay's loopback ones); what differs is the time its
//! writes reach the ring: after `write` returns. So the relay holds a slot of the connection's
//! holders page (`conn::holders`, when the page came along across `exec`) from before the
//! program runs until it has forwarded the program's end of stream, and a write (or a shutdown
//! of writing) by another holder, once the program has exited, waits for that: a parent that
//! waits for its child and then writes comes after every byte the child wrote, as over TCP.
//! The relay is a holder of the connection like the others: it takes turns writing, and when
//! the program has closed its end (not only shut down writing) while another process holds the
//! connection, it leaves without ending the connection and without reading more of the peer's
//! bytes, which are the other holder's to read, nor those it handed to the program that the
//! program never read (`service::downward`). A peer's reset is passed on as a reset.
//!
//! The relay is a grandchild of the program, orphaned at once (the program never sees a child
//! it did not make, nor its exit status), in a session of its own (a terminal's signals for the
//! program's group do not end it). It holds the connection, and the carrier TCP socket, until
//! both directions have ended, then closes them, which ends the connection for the peer.

use crate::base::env::spin;
use crate::conn::holders::{Page, TURN, TURN_WAITERS};
use crate::conn::holders_file;
use crate::conn::turns;
use crate::record::relayed::{Names, Raw};
use crate::service::downward::{downward, program_closed, Hold, Relayed};
use colo::internal::carrier::Established;
use colo_sys::{AsRawFd, BorrowedFd, OwnedFd};
use rustix::net::{self, AddressFamily, SocketAddrAny, SocketType};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

/// True if one of `socks` (the descriptors of one connection's application socket) is a
/// standard stream.
pub fn is_stdio(socks: &[i32]) -> bool {
    socks.iter().any(|&fd| (0..=2).contains(&fd))
}

/// A relay that could not be set up: the connection and the holders page handed back, and why.
pub type Failed = Box<(Established, String, Option<Page>)>;

/// Gives each of `socks` a loopback TCP connection whose other end a relay process joins to the
/// connection `est` (see the module's comment), and returns the connection's addresses for
/// `record::relayed`. On failure nothing has changed, and the caller keeps the connection as it
/// would have.
pub fn relay(est: Established, socks: &[i32], page: Option<Page>) -> Result<Option<Names>, Failed> {
    let Some(&first) = socks.first() else { return Err(Box::new((est, "no socket".into(), page))) };
    let (app, relay_end) = match loopback_pair(est.local.is_ipv6()) {
        Ok(p) => p,
        Err(e) => return Err(Box::new((est, format!("no loopback pair: {e}"), page))),
    };
    // SAFETY: the application's socket, open (listed in /proc/self/fd by the caller).
    let orig = unsafe { BorrowedFd::borrow_raw(first) };
    // The carrier stays open in the relay for as long as the connection (spec/WIRE.md 3.4).
    let carrier = match rustix::io::fcntl_dupfd_cloexec(orig, 3) {
        Ok(c) => c,
        Err(e) => return Err(Box::new((est, format!("no copy of the carrier: {e}"), page))),
    };
    // The addresses the program saw before the relay, as the kernel gives them; the peer's from
    // the connection once a client's reset of its carrier left the socket unconnected (the
    // program was told the same by the shim's `getpeername`).
    let names = (|| {
        let local = net::getsockname(orig).ok()?;
        let peer = match net::getpeername(orig) {
            Ok(Some(p)) => p,
            _ => SocketAddrAny::from(as_family_of(&local, est.peer)),
        };
        Some((Raw::of(&local)?, Raw::of(&peer)?))
    })();
    let status = rustix::fs::fcntl_getfl(orig).unwrap_or(rustix::fs::OFlags::empty());
    // The program's end, as the relay finds it in the program's descriptors (`Relay::closed`).
    let app_ino = rustix::fs::fstat(&app).map_or(0, |st| st.st_ino);
    let program = colo_sys::host::pid();
    // Taken before the program runs: a holder's write waits for it once the program exited.
    let slot = page.as_ref().and_then(|p| p.claim_relay(program));
    let release = |page: &Option<Page>| {
        if let (Some(p), Some(slot)) = (page, slot) {
            p.relay_done(slot, program);
            p.relay_read_done(slot, program);
        }
    };
    let _ = rustix::fs::fcntl_setfl(&app, status & rustix::fs::OFlags::NONBLOCK);
    let (mut est_moved, mut page_moved) = (Some(est), Some(page));
    // The grandchild takes its own copies (its memory is a copy of ours); ours stay here.
    let started = start_relay(|say| {
        let (Some(est), Some(page)) = (est_moved.take(), page_moved.take()) else {
            // SAFETY: ends the relay process before it ran.
            unsafe { libc::_exit(1) }
        };
        run(est, relay_end, carrier, Relay { page, slot, program, app_ino }, &app, say)
    });
    let (Some(est), Some(page)) = (est_moved, page_moved) else { unreachable!("taken only in the relay process") };
    let started = match started {
        Ok(s) => s,
        Err(why) => {
            release(&page);
            return Err(Box::new((est, why, page)));
        }
    };
    if !started {
        release(&page);
        return Err(Box::new((est, "the relay process could not be started".into(), page)));
    }
    for &fd in socks {
        // SAFETY: the application's descriptor, open.
        let cloexec = rustix::io::fcntl_getfd(unsafe { BorrowedFd::borrow_raw(fd) })
            .map(|f| f.contains(rustix::io::FdFlags::CLOEXEC))
            .unwrap_or(false);
        let flags = if cloexec { libc::O_CLOEXEC } else { 0 };
        // SAFETY: replaces the application's descriptor by the loopback connection, atomically
        // (the number never refers to anything else in between).
        unsafe { libc::syscall(libc::SYS_dup3, app.as_raw_fd(), fd, flags) };
    }
    let ino = rustix::fs::fstat(&app).map(|st| st.st_ino);
    drop((est, app, page));
    Ok(names.zip(ino.ok()).map(|((local, peer), ino)| Names { ino, local, peer }))
}

/// Starts a relay process: a grandchild of this one, orphaned at once, so that the program never
/// sees a child of its own. It runs `relay` (which does not return: it ends the process) with the
/// write end of a pipe, on which it writes one byte once it is a holder of the connection. Whether it did (the intermediate child's exit
/// status may be out of reach: with SIGCHLD ignored, which `exec` keeps, the kernel reaps it at
/// once); an error if it could not be forked.
pub(crate) fn start_relay(relay: impl FnOnce(OwnedFd)) -> Result<bool, String> {
    let (said, say) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
    // SAFETY: libc's `fork`, whose handlers (the shim's and libc's) leave the child's copy of the
    // shim's state whole and unlocked; the children run only what follows.
    let child = unsafe { crate::real::fork() };
    if child < 0 {
        return Err(format!("fork: {}", std::io::Error::last_os_error()));
    }
    if child == 0 {
        drop(said);
        // SAFETY: as above.
        if unsafe { crate::real::fork() } == 0 {
            colo_sys::host::renew_pid();
            if crate::base::uids::changed() {
                // The relay holds the segment of a connection whose peer judged us by the uid
                // before the change (`handover::relay_inheritable`): the new uid may not take
                // its descriptors or write its memory, as it could were it dumpable (a program
                // may have made itself dumpable again after its set*id call).
                // SAFETY: prctl with integer arguments only.
                unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
            }
            relay(say);
        }
        // SAFETY: ends the intermediate child at once (or a relay that returned), without
        // running the image's exit code; its copy of `say` goes with it.
        unsafe { libc::_exit(0) };
    }
    drop(say);
    let mut byte = [0u8; 1];
    let started = loop {
        match rustix::io::read(&said, &mut byte) {
            Err(rustix::io::Errno::INTR) => continue,
            r => break r == Ok(1),
        }
    };
    let mut status = 0;
    // SAFETY: reaps the intermediate child made just above, which has exited or is exiting (an
    // ECHILD under an ignored SIGCHLD is fine).
    unsafe { libc::waitpid(child, &mut status, 0) };
    Ok(started)
}

/// A connected loopback TCP pair: (the program's end, the relay's end), both close-on-exec.
///
/// The listener lets in only the program's end: its address is bound first, and a socket filter
/// on the listener drops every packet from elsewhere before the kernel queues a connection for
/// it. Another local user can see the listener (`/proc/net/tcp`) and connect to it between its
/// `listen` and our `connect`; with its backlog of 1, two such connections fill the queue, the
/// kernel then drops our SYN, and our blocking `connect` would wait out its SYN retries (about two
/// minutes) in the application's thread: an `exec`'d program's start, a `sendmsg` passing a
/// connection. The `getpeername` check below stays as a second line. Where the kernel refuses
/// the filter (socket filters for unprivileged processes are off on some hosts), such a queue
/// can only make the pair fail: the connect waits [`PAIR_CONNECT_WAIT`] at most.
pub(crate) fn loopback_pair(v6: bool) -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (family, addr) = if v6 {
        (AddressFamily::INET6, SocketAddr::from((Ipv6Addr::LOCALHOST, 0)))
    } else {
        (AddressFamily::INET, SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
    };
    let ty = SocketType::STREAM;
    let app = net::socket_with(family, ty, net::SocketFlags::CLOEXEC, None)?;
    net::bind(&app, &addr)?;
    let mine: SocketAddrAny = net::getsockname(&app)?;
    let port = crate::base::addr::sockaddr_of(&mine).ok_or_else(|| std::io::Error::other("the program's end has no address"))?.port();
    let listener = net::socket_with(family, ty, net::SocketFlags::CLOEXEC, None)?;
    net::bind(&listener, &addr)?;
    let _ = only_from(&listener, port, v6);
    net::listen(&listener, 1)?;
    let name = net::getsockname(&listener)?;
    connect_within(&app, &name, PAIR_CONNECT_WAIT)?;
    // Only the connection just made, never another process's that raced to the listener (the
    // filter keeps those out; any that got in are closed): it is queued (the connect returned).
    let mut strangers = 0;
    let relay_end = loop {
        let c = net::accept_with(&listener, net::SocketFlags::CLOEXEC)?;
        if net::getpeername(&c)?.as_ref() == Some(&mine) {
            break c;
        }
        strangers += 1;
        if strangers > 64 {
            return Err(std::io::Error::other("strangers keep connecting to the loopback listener"));
        }
    };
    let _ = net::sockopt::set_tcp_nodelay(&app, true);
    let _ = net::sockopt::set_tcp_nodelay(&relay_end, true);
    Ok((app, relay_end))
}

/// How long [`loopback_pair`]'s connect may wait for room in its listener's queue (a loopback
/// connect with room completes at once).
const PAIR_CONNECT_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Connects the blocking socket `s` to `to`, waiting at most `wait`.
fn connect_within(s: &OwnedFd, to: &SocketAddrAny, wait: std::time::Duration) -> std::io::Result<()> {
    rustix::io::ioctl_fionbio(s, true)?;
    let r = match net::connect(s, to) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::INPROGRESS) => {
            let until = std::time::Instant::now() + wait;
            loop {
                let left = until.saturating_duration_since(std::time::Instant::now());
                let t = rustix::event::Timespec { tv_sec: left.as_secs() as i64, tv_nsec: i64::from(left.subsec_nanos()) };
                let mut p = [rustix::event::PollFd::new(s, rustix::event::PollFlags::OUT)];
                match rustix::event::poll(&mut p, Some(&t)) {
                    Err(rustix::io::Errno::INTR) => {}
                    Err(e) => break Err(e.into()),
                    Ok(0) => break Err(std::io::Error::from(std::io::ErrorKind::TimedOut)),
                    Ok(_) => break net::sockopt::socket_error(s)?.map_err(std::io::Error::from),
                }
            }
        }
        Err(e) => Err(e.into()),
    };
    rustix::io::ioctl_fionbio(s, false)?;
    r
}

/// Attaches to `listener` a classic BPF socket filter that accepts only packets from the
/// loopback address (`127.0.0.1`, or `::1` if `v6`) and TCP port `port`, and drops the others
/// (a SYN dropped so never becomes a queued connection). A socket filter on a TCP socket sees the
/// TCP header at offset 0 (its first 16 bits are the source port) and the IP header at
/// `SKF_NET_OFF` (the source address at 12 in IPv4, at 8 in IPv6). Another user cannot send from
/// that address and port: the program's end is bound there, without `SO_REUSEADDR`.
fn only_from(listener: &OwnedFd, port: u16, v6: bool) -> std::io::Result<()> {
    const LD_H_ABS: u16 = (libc::BPF_LD | libc::BPF_H | libc::BPF_ABS) as u16;
    const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    let net_off = |at: i32| (libc::SKF_NET_OFF + at) as u32;
    // (where, value) pairs that must all match; the source address in 32-bit big-endian words.
    let mut tests: Vec<(u16, u32, u32)> = vec![(LD_H_ABS, 0, u32::from(port))];
    if v6 {
        for (i, w) in [0u32, 0, 0, 1].into_iter().enumerate() {
            tests.push((LD_W_ABS, net_off(8 + 4 * i as i32), w));
        }
    } else {
        tests.push((LD_W_ABS, net_off(12), u32::from(Ipv4Addr::LOCALHOST)));
    }
    let n = tests.len();
    let mut prog: Vec<libc::sock_filter> = Vec::with_capacity(2 * n + 2);
    for (i, (load, at, want)) in tests.into_iter().enumerate() {
        prog.push(libc::sock_filter { code: load, jt: 0, jf: 0, k: at });
        // A mismatch jumps over the remaining tests and the accept, to the drop.
        let to_drop = (2 * (n - 1 - i) + 1) as u8;
        prog.push(libc::sock_filter { code: JEQ_K, jt: 0, jf: to_drop, k: want });
    }
    prog.push(libc::sock_filter { code: RET_K, jt: 0, jf: 0, k: u32::MAX });
    prog.push(libc::sock_filter { code: RET_K, jt: 0, jf: 0, k: 0 });
    let fprog = libc::sock_fprog { len: prog.len() as u16, filter: prog.as_mut_ptr() };
    // SAFETY: `listener` is our own open socket; `fprog` points at `prog`, alive for the call
    // (the kernel copies the program).
    let r = unsafe {
        crate::real::setsockopt(
            listener.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// What the relay process knows of the connection's other holders.
struct Relay {
    /// The connection's holders page, if it came along across `exec`.
    page: Option<Page>,
    /// The slot of the page the relay holds until the program's end of stream is forwarded.
    slot: Option<usize>,
    /// The program's pid.
    program: u32,
    /// The inode of the program's end of the loopback connection.
    app_ino: u64,
}

impl Relay {
    /// After the program's end of stream: whether the program closed its end (exited, or
    /// closed every descriptor of it), rather than only shutting down writing.
    fn closed(&self) -> bool {
        program_closed(self.program, self.app_ino)
    }
}


/// The relay process (`app`: its copy of the program's end): never returns.
fn run(est: Established, tcp: OwnedFd, carrier: OwnedFd, relay: Relay, app: &OwnedFd, say: OwnedFd) -> ! {
    let _ = rustix::process::setsid();
    let me = colo_sys::host::pid();
    let control = est.fds.control.as_raw_fd();
    if let Some(p) = &relay.page {
        p.add_holder(me);
        if let Some(slot) = relay.slot {
            p.relay_started(slot, me);
        }
    }
    // Before the program goes on (it waits for `say`): its pid is its own.
    let hold = Hold::new(app, relay.program);
    let _ = rustix::io::write(&say, &[1]);
    drop(say);
    // Nothing of the program's but the connection: its other descriptors (pipes, sockets,
    // files) must close when the program closes them.
    let keep = [
        tcp.as_raw_fd(),
        carrier.as_raw_fd(),
        est.fds.control.as_raw_fd(),
        est.fds.self_bell.as_raw_fd(),
        est.memfd,
        holders_file::fd().unwrap_or(-1),
        hold.as_ref().map_or(-1, |h| h.fds()[0]),
        hold.as_ref().map_or(-1, |h| h.fds()[1]),
    ];
    close_all_but(&keep);
    crate::conn::table::abandon_all_but(&keep);
    // 0, 1 and 2 taken by /dev/null, so that nothing the relay opens later (an eventfd of the
    // rings) sits where a panic message or a log line would be written.
    for _ in 0..3 {
        let _ = rustix::fs::open("/dev/null", rustix::fs::OFlags::RDWR, rustix::fs::Mode::empty()).map(std::mem::forget);
    }
    let shm = match est.into_resumed_shm(spin()) {
        Ok(s) => s,
        // SAFETY: ends this process; the kernel closes the connection's descriptors.
        Err(_) => unsafe { libc::_exit(1) },
    };
    // The program closed its end while another process holds the connection: the relay leaves
    // it to that process (no FIN, and the peer's bytes stay in the ring for it).
    let leave = std::sync::atomic::AtomicBool::new(false);
    let upward_ended = std::sync::atomic::AtomicBool::new(false);
    let mut kept = None;
    std::thread::scope(|s| {
        // The program's bytes toward the peer, its FIN as the connection's.
        s.spawn(|| {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match rustix::io::read(&tcp, &mut buf) {
                    Err(rustix::io::Errno::INTR) => {}
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        // A turn per write, as the other holders take (`turns`).
                        let _turn = relay.page.as_ref().map(|p| turns::take(p.word(TURN), p.word(TURN_WAITERS)));
                        if shm.write_all(&buf[..n]).is_err() {
                            // The peer is gone or reads no more: the program's next write fails,
                            // as after the RST the peer's kernel would answer (a disconnect
                            // resets and keeps the descriptor), rather than blocking once the
                            // loopback is full with nobody reading it.
                            let _ = rustix::net::connect_unspec(&tcp);
                            break;
                        }
                    }
                }
            }
            let page = relay.page.as_ref();
            // Taken off the holders before a waiting writer goes on (`relay_done`): a holder
            // that writes and closes then knows it is the last.
            let others = relay.closed() && page.is_some_and(|p| p.leave(me, control));
            if let (Some(p), Some(slot)) = (page, relay.slot) {
                p.relay_done(slot, relay.program);
            }
            if others {
                // SYNC POINT: Release, with the Acquire load in `downward`.
                leave.store(true, std::sync::atomic::Ordering::Release);
                // A read shutdown of the relay's own (no other holder's), which wakes its
                // reading loop, asleep for the peer's next bytes.
                shm.shutdown_as_tcp(true, false);
            } else {
                // SYNC POINT: Release, with the Acquire load in `downward`; the shutdown wakes it.
                upward_ended.store(true, std::sync::atomic::Ordering::Release);
                shm.shutdown(false, true);
            }
        });
        // The peer's bytes toward the program, from the first one this side has not read, each
        // taken off the ring only once the program read it (`downward`): a relay that leaves
        // leaves the rest in the ring.
        let r = Relayed {
            page: relay.page.as_ref(),
            me,
            slot: relay.slot,
            control,
            program: relay.program,
            app_ino: relay.app_ino,
            leave: &leave,
            upward_ended: &upward_ended,
            lost: None,
        };
        kept = downward(&shm, &tcp, hold, &r);
    });
    drop(kept);
    if leave.load(std::sync::atomic::Ordering::Relaxed) {
        // Another holder has the connection: exiting closes the relay's descriptors, and the
        // rings are left as they are (no FIN; the peer sees no hang-up while that holder lives).
        // SAFETY: ends the relay without running the program's exit handlers.
        unsafe { libc::_exit(0) };
    }
    // Whether another process still holds the connection: if none, the page goes back once
    // the rings are done with it.
    let last = relay.page.as_ref().is_some_and(|p| !p.leave(me, control));
    if last {
        // As in `relay::run`: the exit below would leave the bytes a peer of another user has
        // yet to read charged to us for as long as it keeps its memfd.
        shm.let_go_before_exit();
    }
    drop(shm);
    if let (true, Some(p)) = (last, &relay.page) {
        p.release();
    }
    drop((tcp, carrier));
    // SAFETY: ends the relay without running the program's exit handlers.
    unsafe { libc::_exit(0) }
}


pub(crate) fn close_all_but(keep: &[i32]) {
    let mut keep: Vec<u32> = keep.iter().filter(|&&fd| fd >= 0).map(|&fd| fd as u32).collect();
    keep.sort_unstable();
    let mut from = 0u32;
    for k in keep {
        if k > from {
            // SAFETY: closes descriptors of this process that the relay does not use. libc's
            // `syscall`, not the shim's, which would keep the shim's descriptors open.
            unsafe { crate::real::syscall(libc::SYS_close_range, from as libc::c_long, (k - 1) as libc::c_long, 0, 0, 0, 0) };
        }
        from = k + 1;
    }
    // SAFETY: closes the descriptors of this process above the last one kept, none of which the
    // relay uses (by libc's `syscall`, as above).
    unsafe { crate::real::syscall(libc::SYS_close_range, from as libc::c_long, libc::c_long::from(u32::MAX), 0, 0, 0, 0) };
}

/// `a` as a socket of `local`'s family names it: an IPv4 address IPv4-mapped for an IPv6 socket.
fn as_family_of(local: &SocketAddrAny, a: SocketAddr) -> SocketAddr {
    match (local.address_family(), a) {
        (AddressFamily::INET6, SocketAddr::V4(v4)) => SocketAddr::new(v4.ip().to_ipv6_mapped().into(), v4.port()),
        _ => a,
    }
}
