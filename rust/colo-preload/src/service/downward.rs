//! The peer's bytes toward a relayed program: one loop for the standard-I/O relay
//! (`service::stdio`) and the relay of a connection made inheritable (`service::relay`).
//!
//! A relay hands the peer's bytes to the program's end of a loopback TCP connection. Over TCP,
//! bytes a program has not read when it exits stay in the socket for the process that keeps it
//! (an inetd-style parent that reads on after its child, `head -c 5`, read its part); bytes
//! handed to the program's end would die with it. So the relay keeps a copy of the program's
//! end (`Hold`: the socket, with its unread bytes, outlives the program), peeks at the ring
//! ahead of what it handed on (`Shm::peek_at`), and takes bytes off the ring only once the
//! program has read them (`Shm::release_peeked`): what the socket received less what it holds
//! unread (`TCP_INFO`'s `tcpi_bytes_received`, then `SIOCINQ`, in that order: bytes arriving or
//! read between the two make the difference smaller, never larger). It counts again before every
//! sleep and every `LOOK_EVERY` bytes handed on, and once more, exactly, when the program has
//! ended (its pidfd), before it lets the connection's other holders read on
//! (`holders::Page::relay_read_done`, which their reads wait for): the bytes the program never
//! read are then still in the ring, unread, for them, as over TCP. All this needs the
//! connection's holders page with a relay slot of it, and one relay at a time
//! (`Page::claim_lazy`); otherwise, or without a pidfd, the relay hands bytes on as they come,
//! taking them off the ring as it sends them.
//!
//! With the copy held, the program's exit sends its end of stream to nobody, so the relay ends
//! the program's part itself: once no process holds the program's end any more (the program
//! exited, or closed it: looked at every `CLOSE_CHECK`), it shuts the end down for writing, and
//! the upward reader reads the program's last bytes, then end of stream, as from the program's
//! own close; if the relay is the connection's last holder, it closes the copy instead, which
//! does what the program's own close would have done (a reset for bytes left unread or a
//! zero linger, else a FIN). A process the program left behind holding its end (a child) keeps
//! it: the relay then lets go of its copy and hands bytes on as they come, releasing them as it
//! sends (bytes that process never reads are lost with its end: the relay cannot count what it
//! read).
//!
//! The loopback buffers are made smaller than the rings grow to (`LOOPBACK_BUFFER`), so that a
//! writer waiting for space in a full ring finds the relay blocked in its send, which the
//! program's reads end; when they are not (a small ring: `COLO_RING_KB`), the relay looks again
//! after a back-off (`STUCK_FIRST` doubling to `STUCK_LAST`) in that state only.

use crate::base::addr::sockaddr_of;
use crate::conn::holders::Page;
use crate::conn::state::TCP_CLOSE;
use colo::internal::shm::Shm;
use colo_sys::{AsRawFd, OwnedFd, RawFd};
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::net::{self, SendFlags};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How often the relay looks whether a living program still holds its end (one that closed it
/// without exiting, `exec >&-`, ends its stream there, as over TCP).
const CLOSE_CHECK: Duration = Duration::from_millis(250);

/// The longest wait between two looks whether the program's end is still held, once the program
/// sent its end of stream (without a hold: `downward`).
const GONE_LAST: Duration = Duration::from_secs(8);

/// The first and the longest wait for the program's reads when the ring is full and all of it
/// was handed on (no event tells the relay of a read then).
const STUCK_FIRST: Duration = Duration::from_millis(1);
const STUCK_LAST: Duration = Duration::from_millis(50);
/// The loopback send and receive buffers while the relay holds the program's end
/// (`SO_SNDBUF`, `SO_RCVBUF`; the kernel doubles them): about a megabyte together, below the
/// rings' default growth (twice TCP's largest send buffer).
const LOOPBACK_BUFFER: usize = 256 * 1024;
/// How many bytes the relay hands on between two looks at the program's end while it has
/// bytes to hand on (it looks before every sleep too).
const LOOK_EVERY: u64 = 256 * 1024;
/// `offsetof(struct tcp_info, tcpi_bytes_received)` (Linux 4.1 on) and the size the kernel
/// must give for it.
const TCPI_BYTES_RECEIVED: usize = 128;
/// `TCP_INFO`'s `tcpi_state` values in which the socket has received its peer's FIN, which
/// `tcpi_bytes_received` counts as a byte: CLOSE_WAIT, LAST_ACK, CLOSING, TIME_WAIT.
const FIN_RECEIVED: [u8; 4] = [8, 9, 11, 6];

/// The relay's hold on the program's end: a copy of the socket and the program's pidfd.
pub(crate) struct Hold {
    app: OwnedFd,
    pidfd: OwnedFd,
}

impl Hold {
    /// Taken in the relay process while `program` waits for it to start (so the pid is the
    /// program's), from `app`, the relay's copy of the program's end; `None` if the system
    /// cannot give what the count needs (a pidfd, `tcpi_bytes_received`): the relay then hands
    /// bytes on as they come.
    pub(crate) fn new(app: &OwnedFd, program: u32) -> Option<Hold> {
        let pid = rustix::process::Pid::from_raw(program as i32)?;
        let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()?;
        let app = rustix::io::fcntl_dupfd_cloexec(app, 3).ok()?;
        taken(&app)?;
        let _ = net::sockopt::set_socket_recv_buffer_size(&app, LOOPBACK_BUFFER);
        Some(Hold { app, pidfd })
    }

    /// The descriptors the relay keeps (`stdio::close_all_but`).
    pub(crate) fn fds(&self) -> [RawFd; 2] {
        [self.app.as_raw_fd(), self.pidfd.as_raw_fd()]
    }
}

/// What the program has read of its end: bytes received less bytes unread, and less the FIN
/// once received (counted as a byte); `None` if the kernel does not tell. The kernel loads
/// `tcpi_state` before it locks the socket for `tcpi_bytes_received`, so a FIN that arrives in
/// between is counted in the bytes while the state does not say so yet (one byte more than the
/// program read, taken off the ring for good): the count is taken between two looks that agree.
fn taken(app: &OwnedFd) -> Option<u64> {
    let mut last = None;
    for _ in 0..4 {
        let (received, state) = tcp_info(app)?;
        let unread = rustix::io::ioctl_fionread(app).ok()?;
        let again = tcp_info(app)?;
        let fin = u64::from(FIN_RECEIVED.contains(&state));
        let count = received.saturating_sub(unread).saturating_sub(fin);
        if again == (received, state) {
            return Some(count);
        }
        // Still moving (bytes or a FIN arriving): the lower of the counts is safe (a release
        // never takes back, and bytes the program read are released at the next look).
        let fin_after = u64::from(FIN_RECEIVED.contains(&again.1));
        let low = count.min(received.saturating_sub(unread).saturating_sub(fin_after));
        last = Some(last.map_or(low, |l: u64| l.min(low)));
    }
    last
}

/// `TCP_INFO`'s `tcpi_bytes_received` and `tcpi_state` of `app`.
pub(crate) fn tcp_info(app: &impl AsRawFd) -> Option<(u64, u8)> {
    let mut info = [0u8; 256];
    let mut len = info.len() as libc::socklen_t;
    // SAFETY: `info` is writable for `len` bytes; the kernel writes at most that and sets `len`.
    let r = unsafe {
        libc::syscall(libc::SYS_getsockopt, app.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_INFO, info.as_mut_ptr(), &mut len)
    };
    if r != 0 || (len as usize) < TCPI_BYTES_RECEIVED + 8 {
        return None;
    }
    let received = u64::from_ne_bytes(info[TCPI_BYTES_RECEIVED..TCPI_BYTES_RECEIVED + 8].try_into().ok()?);
    Some((received, info[0]))
}

/// At most this many descriptors are looked at by [`others_have`]; beyond, it answers yes.
const OTHERS_LOOK_MAX: usize = 1 << 16;

/// Whether a process other than this one has socket `ino` open: a child the program left
/// behind. Only processes of this relay's user are looked at (the program's children are its
/// user's, as the relay is), so that another user's descriptors cost it nothing; at most
/// `OTHERS_LOOK_MAX` descriptors in all, beyond which the answer is yes (the bytes are then
/// handed on as they come, as to a program that left a process behind).
fn others_have(ino: u64) -> bool {
    use std::os::unix::fs::MetadataExt;
    let me = colo_sys::host::pid().to_string();
    let uid = rustix::process::geteuid().as_raw();
    let link = format!("socket:[{ino}]");
    let Ok(procs) = std::fs::read_dir("/proc") else { return false };
    let mut looked = 0;
    procs
        .flatten()
        .filter(|p| p.file_name().to_str().is_some_and(|n| n != me && n.bytes().all(|b| b.is_ascii_digit())))
        .filter(|p| p.metadata().is_ok_and(|m| m.uid() == uid))
        .any(|p| {
            std::fs::read_dir(p.path().join("fd")).is_ok_and(|fds| {
                fds.flatten().any(|e| {
                    looked += 1;
                    looked > OTHERS_LOOK_MAX || std::fs::read_link(e.path()).is_ok_and(|l| l.as_os_str() == link.as_str())
                })
            })
        })
}

/// What the loop needs of its relay.
pub(crate) struct Relayed<'a> {
    /// The connection's holders page, if the relay has one.
    pub page: Option<&'a Page>,
    /// The relay's own pid, its slot of the page and its control socket (`Page::others_hold`).
    pub me: u32,
    pub slot: Option<usize>,
    pub control: RawFd,
    /// The program's pid and the inode of its end (`program_closed`).
    pub program: u32,
    pub app_ino: u64,
    /// Set by the upward reader when the relay leaves the connection to another holder.
    pub leave: &'a AtomicBool,
    /// Set by the upward reader once it passed the program's end of stream on to the peer.
    pub upward_ended: &'a AtomicBool,
    /// Set, if given, when bytes of the peer's went to the program's end after every process
    /// closed it (its kernel answered them with a reset) or could not be handed on: no program
    /// read them.
    pub lost: Option<&'a AtomicBool>,
}

/// Hands the peer's bytes on to the program's end `tcp` (the relay's end) until the stream
/// ends either way, then ends it toward the program (a FIN, or a reset for a reset); see the
/// module's comment. Returns the copy of the program's end if it must stay open until the
/// upward reader is done (it was shut down for writing: closing it could reset).
pub(crate) fn downward(shm: &Shm, tcp: &OwnedFd, mut hold: Option<Hold>, r: &Relayed<'_>) -> Option<OwnedFd> {
    if hold.is_some() {
        let _ = net::sockopt::set_socket_send_buffer_size(tcp, LOOPBACK_BUFFER);
    }
    // A relay of a program that ended before this one's began releases what that one read
    // first (`Page::wait_read`), or the bytes would be handed on twice.
    if let Some(p) = r.page {
        p.wait_read();
    }
    let mut buf = vec![0u8; 64 * 1024];
    // Counted from the ring's tail when the relay began (`base`): another holder that reads
    // meanwhile (a parent, racing as over TCP) moves the tail, and the relay's next bytes are
    // then past what it took, and its releases stop where its own count says.
    let base = shm.incoming_consumed();
    let (mut sent, mut released) = (0u64, 0u64);
    let skip = |sent: u64| base.wrapping_add(sent).saturating_sub(shm.incoming_consumed()) as usize;
    // Where the next peek starts: past what the relay handed on while it keeps unread bytes;
    // otherwise at the first unread byte, each peek's bytes taken off the ring at once
    // (`take_now`), so that a relay beside this one, reading too, never peeks the same bytes
    // (taken only after the send, both relays handed them on: each program got them).
    let at = |hold: &Option<Hold>, sent: u64| if hold.is_some() { skip(sent) } else { 0 };
    // Peeked bytes not yet sent: `buf[pending.0..pending.1]`.
    let mut pending = (0usize, 0usize);
    let mut fin = false;
    let mut reset = false;
    let mut stuck = STUCK_FIRST;
    let mut next_check = Instant::now() + CLOSE_CHECK;
    // Whether the last sleep ended with the ring's readiness fd readable.
    let mut ring_woke = false;
    // Whether to look at the program's end now, and `sent` when it was last looked at.
    let (mut look, mut looked_at) = (true, 0u64);
    let mut kept = None;
    // Without a hold, when to look next whether a process still holds the program's end, once
    // the program sent its end of stream (`program_end_held`), and the wait after that look.
    let (mut gone_check, mut gone_wait) = (Instant::now(), CLOSE_CHECK);
    // What the relay took off the ring is all it will take for what the program read: another
    // relay may keep unread bytes now, and the connection's other holders read on.
    let settle = || {
        if let Some(p) = r.page {
            p.drop_lazy(r.me);
            if let Some(slot) = r.slot {
                p.relay_read_done(slot, r.program);
            }
        }
    };
    let let_go = |hold: &mut Option<Hold>| {
        if hold.take().is_some() {
            settle();
        }
    };
    // One relay at a time keeps unread bytes (`Page::claim_lazy`), and only one with a slot of
    // the holders page, which the other holders' reads wait for: without one, a read right
    // after the program's exit could take again bytes the program had read.
    let lazy = |p: &Page| r.slot.is_some() && p.claim_lazy(r.me, r.slot);
    if hold.is_some() && !r.page.is_some_and(lazy) {
        let_go(&mut hold);
    }
    if hold.is_none() {
        // From here on each byte leaves the ring as it is handed on.
        settle();
    }
    'relay: loop {
        if hold.is_some() && r.page.is_some_and(|p| p.lazy_yield_asked()) {
            // A relay beside this one reads too: the bytes handed on are the program's, and
            // so are those peeked to hand on next (from now on bytes leave the ring as peeked).
            release(shm, base, &mut released, sent + (pending.1 - pending.0) as u64);
            let_go(&mut hold);
        }
        // The program's end is looked at (its exit, its reads) before every sleep and every
        // `LOOK_EVERY` bytes handed on, not after every send: three system calls a look.
        let looked = hold.is_some() && (look || sent - looked_at >= LOOK_EVERY);
        if let (true, Some(h)) = (looked, &hold) {
            look = false;
            looked_at = sent;
            let now = Instant::now();
            let exited = poll_one(&h.pidfd, PollFlags::IN, Some(Duration::ZERO));
            let closed = exited || now >= next_check && program_closed(r.program, r.app_ino);
            if now >= next_check {
                next_check = now + CLOSE_CHECK;
            }
            if closed {
                if others_have(r.app_ino) {
                    // A process the program left behind holds its end: the bytes handed on are
                    // that process's, and so are those peeked to hand on next; from now on,
                    // as they come.
                    release(shm, base, &mut released, sent + (pending.1 - pending.0) as u64);
                    let_go(&mut hold);
                    continue;
                }
                // Nobody reads the program's end any more: exactly what it read leaves the ring.
                if let Some(t) = taken(&h.app) {
                    release(shm, base, &mut released, t.min(sent));
                }
                // A reset the program read (its end's error taken) is reported, as a kernel
                // socket's error is reported once to whichever holder reads that far first.
                if reset && net::sockopt::socket_error(&h.app).is_ok_and(|e| e.is_ok()) {
                    if let Some(p) = r.page {
                        // Relaxed: the bit is the whole message (`Conn::socket_flag`).
                        p.word(crate::conn::holders::SOCKET_FLAGS).fetch_or(crate::conn::state::RESET_REPORTED, Ordering::Relaxed);
                    }
                }
                let Some(h) = hold.take() else { unreachable!("held above") };
                if r.page.is_some_and(|p| p.others_hold(r.me, r.control)) {
                    // The upward reader reads the program's last bytes, then end of stream.
                    let _ = net::shutdown(&h.app, net::Shutdown::Write);
                    kept = Some(h.app);
                } else {
                    // The last holder: the program's own close, as the kernel makes it.
                    drop(h.app);
                }
                settle();
                break 'relay;
            }
            if let Some(t) = taken(&h.app) {
                if t.min(sent) > released {
                    stuck = STUCK_FIRST;
                }
                release(shm, base, &mut released, t.min(sent));
            }
        }
        if hold.is_none() && (fin || r.leave.load(Ordering::Acquire)) {
            // SYNC POINT (the Acquire above) with the upward reader's Release store of `leave`.
            break;
        }
        if pending.0 == pending.1 && !fin {
            let from = shm.incoming_consumed();
            match shm.peek_at(at(&hold, sent), &mut buf) {
                Ok(Some(0)) => {
                    // The peer's end of stream, after every byte handed on.
                    end_toward_program(tcp, false);
                    fin = true;
                    continue;
                }
                Ok(Some(n)) => {
                    if !take_now(shm, &hold, from, n, &mut released, sent) {
                        continue;
                    }
                    pending = (0, n);
                }
                Ok(None) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // A reset (or a broken connection) is passed on as a reset: the last close
                    // of this end sends RST; the program's reader ends first.
                    reset = e.kind() != std::io::ErrorKind::BrokenPipe;
                    if hold.is_some() {
                        // The program may not have read all it was handed: it gets the reset
                        // now (a disconnect sends RST and keeps the descriptor; the program
                        // reads what it was handed, then the reset, as from the peer's kernel),
                        // and the relay goes on counting until the program ends, as after a
                        // FIN: what it read leaves the ring, the rest stays for the other
                        // holders (and their reset after it).
                        end_toward_program(tcp, reset);
                        if reset {
                            let _ = net::connect_unspec(tcp);
                        }
                        fin = true;
                        continue;
                    }
                    break;
                }
            }
        }
        if pending.0 < pending.1 {
            match net::send(tcp, &buf[pending.0..pending.1], SendFlags::NOSIGNAL | SendFlags::DONTWAIT) {
                Ok(k) => {
                    pending.0 += k;
                    sent += k as u64;
                    if hold.is_none() {
                        release(shm, base, &mut released, sent);
                    }
                    // SYNC POINT (Acquire) with the upward reader's Release store. After the
                    // program's end of stream, bytes its closed end answered with a reset (over
                    // loopback, within the send) end the relay now: the peer's next write fails.
                    if let Some(l) = r.lost.filter(|_| r.upward_ended.load(Ordering::Acquire)) {
                        if tcp_info(tcp).is_some_and(|(_, state)| state == TCP_CLOSE) {
                            l.store(true, Ordering::Relaxed);
                            break;
                        }
                    }
                    continue;
                }
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {}
                // The program's end is closed (only once the relay let go of its copy).
                Err(_) => {
                    r.lost.inspect(|l| l.store(true, Ordering::Relaxed));
                    break;
                }
            }
        }
        if hold.is_some() && !looked {
            look = true;
            continue;
        }
        // Nothing to do now: sleep until the peer's next progress (announced, then looked at
        // again), room in the loopback, the program's exit, or a timer.
        let want_ring = pending.0 == pending.1 && !fin;
        if want_ring {
            // A wake-up no ring explains is the control socket's hang-up or a reset: look at it,
            // so that the look below reports that.
            if !shm.drain_doorbell(colo::internal::shm::Drainer::Awake) && ring_woke {
                shm.read_control();
            }
            shm.announce_doorbell_sleep();
            let from = shm.incoming_consumed();
            match shm.peek_at(at(&hold, sent), &mut buf) {
                Ok(Some(n)) if n > 0 => {
                    if !take_now(shm, &hold, from, n, &mut released, sent) {
                        continue;
                    }
                    pending = (0, n);
                    continue;
                }
                Ok(None) => {}
                _ => continue,
            }
        }
        let mut timeout = None;
        // SYNC POINT (Acquire) with the upward reader's Release store: its FIN went out first.
        if hold.is_none() && want_ring && r.upward_ended.load(Ordering::Acquire) {
            // The program sent its end of stream. Once no process holds its end any more (it
            // closed it; one in flight over a Unix socket is held), nothing will read what the
            // peer sends (kernel TCP would answer it with a reset) and the relay ends: a silent
            // peer must not keep it for good, where the kernel keeps a closed socket
            // (`FIN_WAIT2`) for `tcp_fin_timeout`. A program that only shut down writing keeps
            // its end, looked at again after a doubling wait.
            let now = Instant::now();
            if now >= gone_check {
                if !program_end_held(tcp) {
                    // Reset: the closed end got bytes (the relay's end, not shut down yet, is
                    // otherwise in CLOSE_WAIT).
                    if tcp_info(tcp).is_some_and(|(_, state)| state == TCP_CLOSE) {
                        r.lost.inspect(|l| l.store(true, Ordering::Relaxed));
                    }
                    break;
                }
                gone_check = now + gone_wait;
                gone_wait = (gone_wait * 2).min(GONE_LAST);
            }
            timeout = Some(gone_check.saturating_duration_since(now));
        }
        if hold.is_some() {
            let mut t = next_check.saturating_duration_since(Instant::now());
            if want_ring && sent > released && shm.incoming_full() {
                t = t.min(stuck);
                stuck = (stuck * 2).min(STUCK_LAST);
            }
            timeout = Some(t);
        }
        // The ring only while the relay waits for it (it drained the bells above, so that a
        // ring already taken cannot end the sleep at once again); `leave` rings the self bell.
        let ring = shm.readiness_fd();
        let mut fds = Vec::with_capacity(3);
        if want_ring {
            fds.push(PollFd::new(ring, PollFlags::IN));
        }
        if pending.0 < pending.1 {
            fds.push(PollFd::new(tcp, PollFlags::OUT));
        }
        if let Some(h) = &hold {
            fds.push(PollFd::new(&h.pidfd, PollFlags::IN));
        }
        let _ = poll(&mut fds, timeout.map(timespec).as_ref());
        ring_woke = want_ring && !fds[0].revents().is_empty();
        look = true;
    }
    if hold.is_some() {
        // The stream ended before the program did (a reset, or a send that failed): nothing
        // more is released.
        let_go(&mut hold);
    }
    if !fin {
        end_toward_program(tcp, reset);
    }
    kept
}

/// Whether a process holds the program's end of the loopback connection whose relay end is
/// `tcp`: its socket has an inode (a file: a descriptor in some process, or in flight). A socket
/// every process closed is an orphan without one (`FIN_WAIT2`), then none at all. Assumed held
/// when the kernel cannot say (no `sock_diag`).
fn program_end_held(tcp: &OwnedFd) -> bool {
    let (Ok(mine), Ok(Some(theirs))) = (net::getsockname(tcp), net::getpeername(tcp)) else { return true };
    let (Some(mine), Some(theirs)) = (sockaddr_of(&mine), sockaddr_of(&theirs)) else { return true };
    !matches!(colo_sys::diag::server_end(theirs, mine), Ok(None | Some(colo_sys::diag::ServerEnd::Queued)))
}

/// Without a hold, the `n` bytes just peeked at ring position `from` leave the ring at once,
/// before they are handed on, unless another holder took bytes off it meanwhile
/// (`Shm::take_peeked_at`): false, they are not this relay's (peek again); `released` counts
/// what it took. With a hold, nothing leaves now (true).
fn take_now(shm: &Shm, hold: &Option<Hold>, from: u64, n: usize, released: &mut u64, sent: u64) -> bool {
    if hold.is_some() {
        return true;
    }
    if !shm.take_peeked_at(from, n).unwrap_or(false) {
        return false;
    }
    *released = sent + n as u64;
    true
}

/// Takes the bytes up to `upto` (counted from the relay's first, at ring position `base`) off
/// the ring, but those another holder read already.
fn release(shm: &Shm, base: u64, released: &mut u64, upto: u64) {
    if upto > *released {
        let left = base.wrapping_add(upto).saturating_sub(shm.incoming_consumed());
        if left > 0 {
            let _ = shm.release_peeked(left as usize);
        }
        *released = upto;
    }
}

fn timespec(d: Duration) -> Timespec {
    Timespec { tv_sec: d.as_secs() as _, tv_nsec: d.subsec_nanos() as _ }
}

/// Whether `fd` reports `events` within `timeout`.
fn poll_one(fd: &OwnedFd, events: PollFlags, timeout: Option<Duration>) -> bool {
    let mut fds = [PollFd::new(fd, events)];
    poll(&mut fds, timeout.map(timespec).as_ref()).is_ok_and(|n| n > 0)
}

/// Whether `program` (a pid) closed its end of a relay's loopback connection (socket inode
/// `app_ino`): exited, or closed every descriptor of it, rather than only shut down writing.
pub(crate) fn program_closed(program: u32, app_ino: u64) -> bool {
    if !colo_sys::host::running(program) {
        return true;
    }
    // The standard streams first (a stat each), the numbers the relayed end has but for a
    // program that moved it: the whole list only if none of them is it.
    let on = |fd: &str| {
        rustix::fs::stat(format!("/proc/{program}/fd/{fd}"))
            .is_ok_and(|st| st.st_ino == app_ino && rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Socket)
    };
    if ["0", "1", "2"].into_iter().any(on) {
        return false;
    }
    let link = format!("socket:[{app_ino}]");
    let Ok(dir) = std::fs::read_dir(format!("/proc/{program}/fd")) else { return true };
    !dir.flatten().any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.as_os_str() == link.as_str()))
}

/// The peer's stream ended: the program's end of a relay's loopback connection gets a reset
/// (a close with lingering off sends RST; its reader ends first) or a FIN.
pub(crate) fn end_toward_program(tcp: &OwnedFd, reset: bool) {
    if reset {
        let _ = net::sockopt::set_socket_linger(tcp, Some(std::time::Duration::ZERO));
        let _ = net::shutdown(tcp, net::Shutdown::Read);
    } else {
        let _ = net::shutdown(tcp, net::Shutdown::Write);
    }
}
