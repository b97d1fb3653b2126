//! An accelerated connection: the [`Shm`] plus what the shim needs to answer readiness questions
//! without locking it, and to let go of a copy inherited over fork without closing the peer.

use crate::base::env::spin;
use crate::conn::holders::{blocking_is_own, children, parent_may_hold, Page};
use crate::record::{adapt, handover_file};
use colo::internal::carrier::Established;
use colo::internal::shm::{Drainer, Shm};
use colo_ring::layout::{FLAG_FIN, FLAG_NOT_READING, FLAG_RESET};
use colo_ring::snapshot::RingState;
use colo_ring::sync::Ordering;
use colo_sys::{AsRawFd, RawFd};
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64};

/// epoll/poll bits (identical values in both APIs).
pub const IN: u32 = 0x001;
pub const OUT: u32 = 0x004;
pub const ERR: u32 = 0x008;
pub const HUP: u32 = 0x010;
pub const RDHUP: u32 = 0x2000;
/// Reported with `IN` and `OUT`, as the kernel's TCP does (`tcp_poll`): a program may ask for
/// these alone (varnish waits for a non-blocking connect with `POLLWRNORM`).
pub const RDNORM: u32 = 0x040;
pub const WRNORM: u32 = 0x100;
/// In the last word of [`Conn::edges`]: the peer is known to be gone (outside `ring_flags` bits).
pub const GONE_EDGE: u32 = 1 << 31;
/// In the last of `Conn::edges`: a write after the peer closed was taken; the connection now
/// reports the reset kernel TCP would have received for it.
pub const RESET_EDGE: u32 = 1 << 30;

/// In the last of `Conn::edges`: reading is shut down (by any holder: another's shutdown moves
/// nothing in the rings).
pub const READ_SHUT_EDGE: u32 = 1 << 29;

/// Kernel TCP states (`enum` in the kernel's include/net/tcp_states.h), as `TCP_INFO` reports them.
pub const TCP_ESTABLISHED: u8 = 1;
const TCP_FIN_WAIT2: u8 = 5;
pub const TCP_CLOSE: u8 = 7;
const TCP_CLOSE_WAIT: u8 = 8;

use crate::conn::holders::SOCKET_FLAGS;

mod shared;

/// The directions of a connection's calls (`Conn::alone`, `Conn::lend_turns`).
const READING: usize = 0;
const WRITING: usize = 1;

/// Bits of the socket's own state (`Conn::socket_flags`), shared with every fork copy as a kernel
/// socket's are: this side shut down reading (readable, end of stream, with RDHUP); a write
/// after the peer closed was taken (`takes_write_after_close`); the peer's reset was reported
/// (by a read, a write or `SO_ERROR`: as the kernel's socket error, once, `report_reset`); closed
/// with `SO_LINGER {1, 0}` (the last close resets, `conn::options::closing`); non-blocking
/// (`O_NONBLOCK`, the open socket's flag: `Conn::nonblocking`); `TCP_INQ` on, and whether that
/// bit is known (set by a holder, or taken from the kernel's socket once: `Conn::inq`).
const READ_SHUT: u32 = 1;
const WROTE_AFTER_CLOSE: u32 = 2;
pub(crate) const RESET_REPORTED: u32 = 4;
const ABORT: u32 = 8;
const NONBLOCK: u32 = 16;
const INQ: u32 = 32;
const INQ_KNOWN: u32 = 64;

/// Records that a connection accepted on a local address, from a program tagged so, ended
/// (`short`: it did not pay for its set-up, see `adapt::Lived`).
pub type EndRecorder = fn(local: std::net::SocketAddr, tag: u64, short: bool);

/// A counter on a cache line of its own: two threads that each count on one of two lines never
/// take the line from each other, nor from readers of the connection's other fields.
#[repr(align(64))]
struct Line(AtomicU32);

pub struct Conn {
    shm: ManuallyDrop<Shm>,
    gone: AtomicBool,
    nb: AtomicBool,
    /// Our descriptors survive `exec` (an application socket of this connection does): see
    /// `handover`.
    inheritable: AtomicBool,
    /// The two processes share one CPU: waits on this connection never spin.
    never_spin: bool,
    /// Control socket (our doorbell), self bell, segment memfd (-1 once closed: see `build`).
    raw: [RawFd; 3],
    /// The memfd is kept to map the connection again after `exec` (`build`'s `keep_memfd`);
    /// otherwise one still open only serves reads through it (a peer of another user), and a
    /// connection made inheritable later is relayed (`handover`).
    exec_maps: bool,
    /// Shared with every process holding the connection (`holders`).
    holders: Page,
    /// This process's calls under way without a turn, [reading, writing] (`turns::alone`): a
    /// line each, as a reading thread and a writing thread count at once.
    alone: [Line; 2],
    /// When the connection was set up (to tell short-lived ones: `adapt` on the client side,
    /// the listener's marker on the server side).
    born: std::time::Instant,
    /// How long the client waited from its offer to the server's answer, in nanoseconds (zero
    /// on the server; eight bytes, not a `Duration`'s sixteen: see the size test below).
    setup_ns: u64,
    /// Bytes we had written when the first reply arrived (`u64::MAX` until then): at close, an
    /// unchanged count means the connection carried a single exchange (see `adapt`).
    sent_before_reply: AtomicU64,
    /// When the first reply arrived, in nanoseconds after `born`.
    first_reply_ns: AtomicU64,
    /// The application's descriptor of the carrier TCP socket whose close drops this value
    /// (-1: not known to be the last; see [`Conn::last_close`]).
    closing_fd: AtomicI32,
    /// The pid of a child sharing this process's memory (`vfork`) that put a relay's socket in
    /// place of this connection's descriptors in its own table (`service::relay`); 0: none.
    relayed_by: AtomicU32,
    /// `SO_RCVLOWAT` as this copy last set it (0: the default, 1; see `Conn::lowat`).
    lowat: AtomicU32,
    /// What a small `SO_SNDBUF` lets a non-blocking writer queue in the ring (0: the ring), as
    /// this copy last took it on (the socket's is in the holders page: `send_limit_now`).
    send_limit: AtomicU32,
    /// On the server side: the client's program tag, under which its ending is recorded for the
    /// listener's short-lived marker.
    client_tag: Option<u64>,
    /// Records the ending of a connection that has a `client_tag` (the server's service passes
    /// its own: this module knows no service).
    on_end: Option<EndRecorder>,
    /// The process that set the connection up (0: one handed over across `exec`): while it is
    /// the one closing, no parent can hold the connection (see `others_hold`).
    made_by: u32,
}

impl Conn {
    /// The server side of a connection dialed by a program tagged `client_tag` (see
    /// `server::client_tag`), whose ending `on_end` records. `keep_memfd`: see `build`.
    pub fn accepted(client_tag: Option<u64>, on_end: EndRecorder, est: Established, nonblocking: bool, keep_memfd: bool) -> std::io::Result<Conn> {
        let mut c = Conn::build(est, nonblocking, None, keep_memfd, std::time::Duration::ZERO)?;
        c.client_tag = client_tag;
        c.on_end = Some(on_end);
        Ok(c)
    }

    /// The client side of a connection whose set-up (offer to answer) took `setup`.
    /// `keep_memfd`: see `build`.
    pub fn dialed(est: Established, nonblocking: bool, setup: std::time::Duration, keep_memfd: bool) -> std::io::Result<Conn> {
        Conn::build(est, nonblocking, None, keep_memfd, setup)
    }

    /// A connection an earlier image of this process handed over across `exec` (inheritable:
    /// it keeps its memfd), with the holders page it handed over (`holders::Page::inherited`),
    /// if any.
    pub fn resume(est: Established, nonblocking: bool, holders: Option<Page>) -> std::io::Result<Conn> {
        Conn::build(est, nonblocking, Some(holders), true, std::time::Duration::ZERO)
    }

    /// `resumed`: a connection handed over across `exec` (with the page that came with it).
    /// `keep_memfd`: whether the segment memfd stays open, as it must for a connection whose
    /// application socket is inheritable (`service::handover` maps it again after `exec` from
    /// the memfd). A connection born close-on-exec closes it here, one descriptor less, unless
    /// its incoming ring is read through it (a peer of another user); should one without it
    /// become inheritable later, `handover` relays it instead (`service::relay`).
    fn build(est: Established, nonblocking: bool, resumed: Option<Option<Page>>, keep_memfd: bool, setup: std::time::Duration) -> std::io::Result<Conn> {
        let mut raw0 = [est.fds.control.as_raw_fd(), est.fds.self_bell.as_raw_fd(), est.memfd];
        let resumed_shm = resumed.is_some();
        let holders = match resumed.flatten() {
            Some(page) => page,
            None => Page::new()?,
        };
        let mut shm = if resumed_shm { est.into_resumed_shm(spin())? } else { est.into_shm(spin())? };
        if !keep_memfd && shm.close_memfd() {
            raw0[2] = -1;
        }
        // SAFETY: the socket flags' word of the holders page, a field of the `Conn` built here:
        // dropped after `Drop` dropped `shm` (or, for a copy others hold, left it unused).
        unsafe { shm.share_read_shut(holders.word(SOCKET_FLAGS), READ_SHUT) };
        shm.set_nonblocking(nonblocking);
        let never_spin = shm.spin_mode() == colo::SpinMode::Never;
        let c = Conn {
            shm: ManuallyDrop::new(shm),
            gone: AtomicBool::new(false),
            nb: AtomicBool::new(nonblocking),
            inheritable: AtomicBool::new(false),
            never_spin,
            raw: raw0,
            exec_maps: keep_memfd,
            holders,
            alone: [Line(AtomicU32::new(0)), Line(AtomicU32::new(0))],
            born: std::time::Instant::now(),
            setup_ns: u64::try_from(setup.as_nanos()).unwrap_or(u64::MAX),
            sent_before_reply: AtomicU64::new(u64::MAX),
            first_reply_ns: AtomicU64::new(0),
            closing_fd: AtomicI32::new(-1),
            relayed_by: AtomicU32::new(0),
            lowat: AtomicU32::new(0),
            send_limit: AtomicU32::new(0),
            client_tag: None,
            on_end: None,
            made_by: if resumed_shm { 0 } else { colo_sys::host::pid() },
        };
        // The first holder of a fresh page; one more of a page an earlier image handed over
        // (a no-op if this process held it before its `exec`).
        c.add_holder(colo_sys::host::pid());
        c.set_nonblocking(nonblocking);
        Ok(c)
    }

    /// A read returned bytes: the first time, remember how much we had sent (`sent_before_reply`).
    pub fn got_reply(&self) {
        if self.sent_before_reply.load(Ordering::Relaxed) == u64::MAX {
            let sent = self.outgoing().head;
            self.first_reply_ns.store(self.born.elapsed().as_nanos() as u64, Ordering::Relaxed);
            self.sent_before_reply.store(sent, Ordering::Relaxed);
        }
    }

    /// Waits on this connection must not spin (see `never_spin`).
    pub fn never_spin(&self) -> bool {
        self.never_spin
    }

    pub fn shm(&self) -> &Shm {
        &self.shm
    }

    /// `O_NONBLOCK`, the open socket's, for all its holders (a relay's: `holders::own_blocking`).
    pub fn set_nonblocking(&self, on: bool) {
        if !blocking_is_own() {
            // Relaxed: the bit is the whole message (as `raise_socket_flag`).
            if on { self.socket_flags().fetch_or(NONBLOCK, Ordering::Relaxed) } else { self.socket_flags().fetch_and(!NONBLOCK, Ordering::Relaxed) };
        }
        self.nb.store(on, Ordering::Relaxed);
        self.shm.set_nonblocking(on);
    }

    /// `TCP_INQ` set (or cleared) on this connection by a process holding it, or read from the
    /// kernel's socket: the socket's option, for all its holders, as the kernel keeps it once
    /// for the socket.
    pub fn set_inq(&self, on: bool) {
        // Relaxed: the bits are the whole message (as `raise_socket_flag`).
        if on { self.socket_flags().fetch_or(INQ, Ordering::Relaxed) } else { self.socket_flags().fetch_and(!INQ, Ordering::Relaxed) };
        self.socket_flags().fetch_or(INQ_KNOWN, Ordering::Relaxed);
    }

    /// The connection's `TCP_INQ` once known (`set_inq`); `None` before.
    pub fn inq(&self) -> Option<bool> {
        self.socket_flag(INQ_KNOWN).then(|| self.socket_flag(INQ))
    }

    /// Whether calls must not wait, as a call begins: this copy's own word, or once another
    /// process held the connection, the open socket's flag they share, which another process may
    /// have changed (as a kernel file's `O_NONBLOCK`): taken on here.
    pub fn nonblocking(&self) -> bool {
        let nb = self.nb.load(Ordering::Relaxed);
        if !self.holders.ever_shared() || blocking_is_own() {
            return nb;
        }
        let shared = self.socket_flag(NONBLOCK);
        if shared != nb {
            self.nb.store(shared, Ordering::Relaxed);
            self.shm.set_nonblocking(shared);
        }
        shared
    }

    /// Control socket (our doorbell), self bell and segment memfd (-1 once closed: `Conn::build`),
    /// as raw numbers.
    pub fn fds(&self) -> [RawFd; 3] {
        self.raw
    }

    /// Whether a new image after `exec` can map this connection again from its memfd (see
    /// `exec_maps`); otherwise it is relayed when it becomes inheritable.
    pub fn exec_maps(&self) -> bool {
        self.exec_maps
    }

    /// Whether this process (a child sharing the memory of the one that made the connection)
    /// relayed it already: its descriptors of the connection are the relay's socket.
    pub fn relayed_here(&self) -> bool {
        // Relaxed (here and in `set_relayed_here`): the word is the whole message, a pid, read
        // and written by the same thread of the child.
        self.relayed_by.load(Ordering::Relaxed) == rustix::process::getpid().as_raw_nonzero().get() as u32
    }

    /// Records that this process relayed the connection (see `relayed_here`).
    pub fn set_relayed_here(&self) {
        self.relayed_by.store(rustix::process::getpid().as_raw_nonzero().get() as u32, Ordering::Relaxed);
    }

    pub fn inheritable(&self) -> bool {
        self.inheritable.load(Ordering::Relaxed)
    }

    /// Lets our descriptors survive `exec` (or not).
    pub fn set_inheritable(&self, on: bool) {
        // The holders page goes along with the connection, by its index in the holders file.
        self.holders.set_inheritable(on);
        self.inheritable.store(on, Ordering::Relaxed);
        let flags = if on { rustix::io::FdFlags::empty() } else { rustix::io::FdFlags::CLOEXEC };
        for fd in self.fds() {
            // SAFETY: descriptors owned by `shm`, open while `self` lives.
            let _ = rustix::io::fcntl_setfd(unsafe { colo_sys::BorrowedFd::borrow_raw(fd) }, flags);
        }
    }

    /// The index of the holders page in the holders file, if it is there (`holders`): handed
    /// over with the connection across `exec`.
    pub fn holders_index(&self) -> Option<u32> {
        self.holders.index()
    }

    fn self_bell(&self) -> colo_sys::BorrowedFd<'_> {
        // SAFETY: our self bell, owned by `shm`, which lives as long as `self`.
        unsafe { colo_sys::BorrowedFd::borrow_raw(self.raw[1]) }
    }

    /// What stands for this connection in the kernel's waits (`poll`, and each application epoll
    /// set it is registered in): its control socket (our doorbell, and the peer's hang-up) and its
    /// self bell, each readable when the connection may have news. No epoll set of our own is
    /// made for it: that would cost every connection in an event loop a third descriptor.
    pub fn kernel_fds(&self) -> [RawFd; 2] {
        [self.raw[0], self.raw[1]]
    }

    /// The socket's own state beside the rings (`READ_SHUT` and the rest), one word of the
    /// holders page: a kernel socket keeps it once for every process holding it, and so does
    /// this, for every fork copy.
    fn socket_flags(&self) -> &AtomicU32 {
        self.holders.word(SOCKET_FLAGS)
    }

    fn socket_flag(&self, bit: u32) -> bool {
        // Relaxed (here and in `raise_socket_flag`): each bit is the whole message; what a
        // reader does on its strength it asks of the rings, which order their own data.
        self.socket_flags().load(Ordering::Relaxed) & bit != 0
    }

    /// Sets `bit`; whether it was set already.
    fn raise_socket_flag(&self, bit: u32) -> bool {
        self.socket_flags().fetch_or(bit, Ordering::Relaxed) & bit != 0
    }

    /// The holders page every process holding the connection shares (`holders`).
    pub fn holders(&self) -> &Page {
        &self.holders
    }

    /// Records that process `pid` (a fork child) holds a copy.
    pub fn add_holder(&self, pid: u32) {
        self.holders.add_holder(pid);
    }

    /// Before a shutdown of writing: bytes a relayed program wrote before it exited go first
    /// (`holders::wait_forwarded`), as its writes were in the socket before it exited.
    pub fn wait_forwarded(&self) {
        if self.holders.ever_shared() {
            self.holders.wait_forwarded();
        }
    }

    /// Before a read: the bytes a relayed program read before it exited are off the ring, and
    /// those it left unread are the next (`holders::wait_read`, `service::downward`), as over
    /// TCP they stayed in the socket.
    pub fn wait_read(&self) {
        if self.holders.ever_shared() {
            self.holders.wait_read();
        }
    }

    /// Removes us from the holders; true if another process still holds the connection: a
    /// recorded holder (fork), or, for a connection whose descriptors survive exec, a child
    /// (posix_spawn, vfork, system, popen: not recorded) or our parent (when we are the exec'd
    /// child). A process counts only while it has our end's control socket open under the same
    /// number: a child that exec'd without the connection, or released its copy, holds nothing.
    /// (Not the segment memfd: the peer holds the same one, often under the same number, as both
    /// shims move descriptors to the same floor, so a client forked by its server would take the
    /// server for a holder and close without telling it.)
    fn others_hold(&self) -> bool {
        let me = colo_sys::host::pid();
        let control = self.raw[0];
        let others = self.holders.leave(me, control);
        if others || !self.inheritable() {
            return others;
        }
        // Looked at only if the kernel cannot compare the files itself (`holds_same`).
        let own = std::cell::OnceCell::new();
        // SAFETY: our control socket, open while `self` lives.
        let own = || own.get_or_init(|| rustix::fs::fstat(unsafe { colo_sys::BorrowedFd::borrow_raw(control) }).ok());
        // Processes that never registered as holders (an exec'd child that is not preloaded)
        // count only if we can see the descriptor in them: a parent of another user (nginx's
        // root master above its `nobody` workers) is alive but holds nothing of ours, and taking
        // it for a holder would keep every connection from ever closing.
        let seen_holding = |pid: u32| {
            colo_sys::host::holds_same(pid, control).unwrap_or_else(|| match (rustix::fs::stat(format!("/proc/{pid}/fd/{control}")), own()) {
                (Ok(st), Some(own)) => st.st_ino == own.st_ino && st.st_dev == own.st_dev,
                _ => false,
            })
        };
        // Our parent can hold it only if the connection came from it: we are a fork child
        // (raw `clone` ones included: the kernel's pid, not the cached one, is compared) or an
        // image it handed over to across `exec`.
        let parent = if parent_may_hold(self.made_by, rustix::process::getpid().as_raw_nonzero().get() as u32) {
            rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get() as u32)
        } else {
            0
        };
        children().into_iter().chain([parent]).any(|p| p != 0 && p != me && seen_holding(p))
    }

    /// Rings our self bell, so that the connection's kernel fds report and the state is looked at again.
    pub fn poke(&self) {
        colo_sys::doorbell::ring(self.self_bell());
    }

    /// Empties our doorbell (after the kernel reported our kernel fds): a level-triggered
    /// registration would otherwise report it again at the next sleep, for nothing. A ring
    /// another thread asleep on it may have waited for is passed on (`Shm::drain_doorbell`).
    pub fn drain(&self, by: Drainer) {
        self.shm.drain_doorbell(by);
    }

    /// The peer's processes are all gone (the control socket hung up): one `poll` that never
    /// waits and reads nothing (rings queued before the hang-up are the drains'), then
    /// remembered.
    pub fn peer_gone(&self) -> bool {
        if self.gone.load(Ordering::Relaxed) {
            return true;
        }
        let gone = colo_sys::doorbell::hung_up(self.shm.control_fd());
        if gone {
            // The core's reads and writes report it from now on too, not only once the hang-up
            // watcher has seen it (a non-blocking miss does not ask the control socket itself).
            self.shm.read_control();
            self.gone.store(true, Ordering::Relaxed);
        }
        gone
    }

    /// `peer_gone`, without a system call while the hang-up watcher vouches that the control
    /// socket stayed silent (`Shm::control_silent`). For a look before a sleep on the readiness
    /// fd, or a miss: a hang-up the watcher has not seen yet keeps the control socket readable, so
    /// the sleep ends at once and the look after it asks (`peer_gone`); and the watcher rings
    /// the self bell when it sees it, a new edge for an edge-triggered waiter.
    pub fn peer_gone_quick(&self) -> bool {
        self.gone.load(Ordering::Relaxed) || !self.shm.control_silent() && self.peer_gone()
    }

    /// The readiness of the connection, in epoll bits. `check_gone`: also ask the control socket
    /// (a syscall) when nothing else makes the connection readable.
    pub fn ready(&self, check_gone: bool) -> u32 {
        self.ready_with(if check_gone { Ask::Always } else { Ask::Never })
    }

    /// `ready(true)` for a look before a sleep on the kernel fds or after a miss: the control
    /// socket is asked only if the hang-up watcher cannot vouch for it (`peer_gone_quick`).
    pub fn ready_quick(&self) -> u32 {
        self.ready_with(Ask::Quick)
    }

    fn ready_with(&self, ask: Ask) -> u32 {
        // The bytes a relayed program that exited read are off the ring first, as for a read:
        // else they would make the connection readable for a read that finds nothing.
        self.wait_read();
        let (inc, out) = (self.incoming(), self.outgoing());
        let (in_flags, out_flags) = (inc.flags, out.flags);
        // The peer stopped reading (spec section 8).
        let read_closed = in_flags & FLAG_NOT_READING != 0;
        let (avail, used) = (inc.used(self.shm.ring_capacity()), out.used(self.shm.ring_capacity()));
        let corrupt = avail.is_err() || used.is_err();
        // Corrupt counters count as more than any bound: readable, no room, bytes unread.
        let (avail, used) = (avail.unwrap_or(u64::MAX), used.unwrap_or(u64::MAX));
        let reset = (in_flags | out_flags) & FLAG_RESET != 0;
        if reset || corrupt {
            // Reported as an error below: the connection's reads and writes must fail so too
            // (a reset our halves did not see yet: the peer's, or a peer's scribble on our words).
            self.shm.found_in_view(corrupt);
        }
        let fin = in_flags & FLAG_FIN != 0;
        let mut m = 0;
        if avail >= self.lowat() as u64 || fin || reset {
            m |= IN;
        }
        if fin || reset {
            m |= RDHUP;
        }
        if used < self.send_room() || read_closed || reset {
            m |= OUT;
        }
        if reset || corrupt {
            // Reset or corrupt: make every waiter look, so the next call reports the error.
            m |= ERR | HUP | IN | OUT;
        }
        let read_shut = self.adopt_read_shut();
        if read_shut {
            // As the kernel after our own SHUT_RD: reads return end of stream.
            m |= IN | RDHUP;
        }
        // As the kernel: hung up once both directions are shut (the peer's FIN or our read
        // shutdown, and our FIN); a peer that closed is readable (end of stream) with RDHUP
        // until then.
        if (fin || read_shut) && out_flags & FLAG_FIN != 0 {
            m |= HUP;
        }
        let gone = self.known_gone()
            || m & IN == 0
                && match ask {
                    Ask::Never => false,
                    Ask::Quick => self.peer_gone_quick(),
                    Ask::Always => self.peer_gone(),
                };
        if gone && m & IN == 0 {
            // As a kernel socket whose peer closed: readable (end of stream), writable (EPIPE).
            m |= IN | RDHUP | OUT;
        }
        // The peer reset, or its processes ended (without FIN) leaving bytes of ours unread,
        // which its kernel would have answered with a reset.
        let peer_reset = in_flags & FLAG_RESET != 0 && out_flags & FLAG_RESET == 0 || gone && !fin && used > 0;
        if gone && !fin && used > 0 {
            m |= IN | RDHUP | OUT | ERR | HUP;
        }
        if self.socket_flag(WROTE_AFTER_CLOSE) {
            // As a kernel socket whose write to a closed peer was answered with a reset (in
            // error until a write or `SO_ERROR` reported it).
            m |= IN | RDHUP | OUT | HUP;
            if !self.socket_flag(RESET_REPORTED) {
                m |= ERR;
            }
        }
        if peer_reset && self.socket_flag(RESET_REPORTED) {
            // The peer's reset, already reported as the socket's error: as the kernel's socket
            // once its error was read, still hung up but no longer in error.
            m &= !ERR;
        }
        if m & IN != 0 {
            m |= RDNORM;
        }
        if m & OUT != 0 {
            m |= WRNORM;
        }
        m
    }

    /// A read or write found the connection reset: whether this is the first report (true
    /// once), as the kernel reports the error a RST left once; later reads see end of stream,
    /// later writes `EPIPE`.
    pub fn report_reset(&self) -> bool {
        !self.raise_socket_flag(RESET_REPORTED)
    }

    /// `SO_ERROR`: whether the peer reset the connection (or died leaving our bytes unread) and
    /// no read, write or earlier
    /// `SO_ERROR` has reported it yet (then it is reported now).
    pub fn take_reset_error(&self) -> bool {
        (self.peer_reset() || self.wrote_after_close()) && self.report_reset()
    }

    /// Whether the peer reset the connection after its FIN (shut down writing, then closed with
    /// bytes unread): kernel TCP then reads end of stream (the FIN came first) and keeps the
    /// reset as `EPIPE` (a RST in CLOSE_WAIT), for `SO_ERROR` or the next write.
    pub fn peer_reset_after_fin(&self) -> bool {
        let (in_flags, out_flags, _) = self.flags_and_all_read();
        in_flags & FLAG_FIN != 0 && in_flags & FLAG_RESET != 0 && out_flags & FLAG_RESET == 0
    }

    /// Whether the peer reset the connection (or died leaving our bytes unread), reported or not.
    pub fn peer_reset(&self) -> bool {
        let (in_flags, out_flags, all_read) = self.flags_and_all_read();
        let died = in_flags & FLAG_FIN == 0 && !all_read && self.peer_gone();
        in_flags & FLAG_RESET != 0 && out_flags & FLAG_RESET == 0 || died
    }

    /// The application shut down reading (`READ_SHUT`), before the rings hear of it (the
    /// caller's `shutdown_as_tcp`), so that the sleepers that shutdown wakes, here and in the
    /// other holders, find it.
    pub fn shut_read(&self) {
        self.raise_socket_flag(READ_SHUT);
    }

    /// Whether reading is shut down; one another holder of the connection (a fork copy) shut
    /// down is taken into this process's rings here, the first time it is seen, so that reads
    /// here answer as after a shutdown of our own (`Shm::adopt_shared_read_shut`, which the
    /// rings' own reads ask as well: a read asleep when the shutdown came wakes to it).
    pub fn adopt_read_shut(&self) -> bool {
        self.shm.adopt_shared_read_shut()
    }

    /// What `TCP_INFO` reports that only the rings know: the state (kernel `TCP_*` numbers, for
    /// a kernel socket that stays ESTABLISHED under colo) and the bytes sent and received.
    pub fn tcp_info(&self) -> (u8, u64, u64) {
        let (inc, out) = (self.incoming(), self.outgoing());
        let (in_flags, out_flags, sent, got) = (inc.flags, out.flags, out.head, inc.head);
        let (ours, theirs) = (out_flags & FLAG_FIN != 0, in_flags & FLAG_FIN != 0);
        // Both FINs: closed (the side that closed first waits in TIME_WAIT in a separate kernel
        // object; its socket reads CLOSE, as the other's does once its FIN is acknowledged).
        // A write taken after the peer closed was answered with a reset, as kernel TCP's.
        let state = if (in_flags | out_flags) & FLAG_RESET != 0 || ours && theirs || self.socket_flag(WROTE_AFTER_CLOSE) {
            TCP_CLOSE
        } else if ours {
            TCP_FIN_WAIT2
        } else if theirs {
            TCP_CLOSE_WAIT
        } else {
            TCP_ESTABLISHED
        };
        (state, sent, got)
    }

    /// Whether kernel TCP's socket would be closed (`TCP_CLOSE`: both FINs, a reset either way,
    /// or a write taken after the peer closed): `getpeername` and `shutdown` fail `ENOTCONN`.
    pub fn closed_as_tcp(&self) -> bool {
        self.tcp_info().0 == TCP_CLOSE || self.peer_reset()
    }

    /// The application closed this connection with `SO_LINGER {1, 0}`: the last close resets.
    pub fn abort_on_close(&self) {
        self.raise_socket_flag(ABORT);
    }

    /// The application is closing `fd`, this connection's last descriptor in this process, and
    /// this value is dropped before the kernel's close of `fd` (the caller holds the only
    /// reference left). See `Drop`: a client whose connection no other process holds closes its
    /// carrier with a reset.
    pub fn last_close(&self, fd: RawFd) {
        self.closing_fd.store(fd, Ordering::Relaxed);
    }

    /// Bytes in the incoming ring now (`FIONREAD`), from the counters alone: no lock, so it does
    /// not wait for a thread blocked in read. Corrupt counters: asks the ring, which reports it.
    pub fn available(&self) -> std::io::Result<usize> {
        match self.incoming().used(self.shm.ring_capacity()) {
            Ok(avail) => Ok(avail as usize),
            Err(_) => self.shm.readable(),
        }
    }

    /// What `TCP_INQ` reports after a read (the kernel's `tcp_inq_hint`, `rcv_nxt - copied_seq`):
    /// the bytes left to read, and 1 more once the peer's FIN came (its sequence number counts),
    /// which stays 1 after the end is read, so that a reader goes on to read the end.
    pub fn inq_hint(&self) -> usize {
        let inc = self.incoming();
        match inc.used(self.shm.ring_capacity()) {
            Ok(n) => n as usize + usize::from(inc.flags & FLAG_FIN != 0),
            Err(_) => 0,
        }
    }

    /// The peer's processes are all gone (the control socket hung up), with no RESET either
    /// way, after reading everything we sent. An exit (or a kill) closes a process's TCP sockets
    /// gracefully, so the kernel would report end of stream here, not a reset.
    pub fn peer_exited_cleanly(&self) -> bool {
        let (in_flags, out_flags, all_read) = self.flags_and_all_read();
        (in_flags | out_flags) & FLAG_RESET == 0 && all_read && self.peer_gone()
    }

    /// The peer's and our ring flags, and whether the peer has read everything we sent.
    fn flags_and_all_read(&self) -> (u32, u32, bool) {
        let (inc, out) = (self.incoming(), self.outgoing());
        (inc.flags, out.flags, out.head == out.tail)
    }

    /// The incoming ring as its consumer sees it ([`RingState::consumer_view`]: the peer's
    /// head and flags loaded with Acquire, so the bytes counted are in the ring and a FIN comes
    /// with the head of the stream's last byte).
    fn incoming(&self) -> RingState {
        RingState::consumer_view(self.shm.ring_words().0)
    }

    /// The outgoing ring as its producer sees it ([`RingState::producer_view`]: the peer's
    /// tail loaded with Acquire, so the room counted is free).
    fn outgoing(&self) -> RingState {
        RingState::producer_view(self.shm.ring_words().1)
    }

    /// A write failed with EPIPE: whether kernel TCP would have taken it. It takes one write
    /// after the peer closed having read everything, or shut down both ways (`SHUT_RDWR`) read
    /// or not (the peer's kernel answers it with a reset, which fails the next write): a
    /// keep-alive client that reuses a connection its server just closed finds out by reading
    /// end of stream, not by a SIGPIPE. Not after our own shutdown, a reset, a peer gone leaving
    /// bytes unread (closing so, its kernel resets at once), or a peer that only shut down
    /// reading (kernel TCP takes those writes; we refuse them).
    pub fn takes_write_after_close(&self) -> bool {
        let (in_flags, out_flags, all_read) = self.flags_and_all_read();
        if (in_flags | out_flags) & FLAG_RESET != 0 || out_flags & FLAG_FIN != 0 {
            return false;
        }
        // Closed: FIN and NOT_READING (a live peer with ours unread shut down), or all gone.
        let shut_both = in_flags & (FLAG_FIN | FLAG_NOT_READING) == FLAG_FIN | FLAG_NOT_READING;
        let closed = if all_read { shut_both || self.peer_gone() } else { shut_both && !self.peer_gone() };
        let taken = closed && !self.raise_socket_flag(WROTE_AFTER_CLOSE);
        if taken {
            // The reset that answers it is news for pollers (`ready`, `RESET_EDGE`): wake them.
            self.poke();
        }
        taken
    }

    /// Whether only the peer's close or read shutdown refuses our writes: no reset either way,
    /// no write shutdown of ours, and no write of ours taken after the close (which the peer's
    /// kernel would have answered with a reset, `takes_write_after_close`).
    pub fn refused_by_peer_close_only(&self) -> bool {
        let (in_flags, out_flags, _) = self.flags_and_all_read();
        (in_flags | out_flags) & FLAG_RESET == 0 && out_flags & FLAG_FIN == 0 && !self.peer_reset() && !self.wrote_after_close()
    }

    /// Whether a write after the peer closed was taken (`takes_write_after_close`): kernel TCP's
    /// socket would have been reset by the peer's answer to it, in CLOSE_WAIT (`EPIPE`).
    pub fn wrote_after_close(&self) -> bool {
        self.socket_flag(WROTE_AFTER_CLOSE)
    }

    /// Whether the peer is known to be gone (no system call; see [`Conn::peer_gone`]), also when
    /// only a drain of the doorbell learned it (`Shm::known_hung_up`): a look that finds bytes
    /// to read does not ask the control socket, and a peer that moved our tail back shows bytes
    /// for good, so its hang-up must come from what the drains saw, or an edge-triggered waiter
    /// never learns it (`GONE_EDGE`).
    pub fn known_gone(&self) -> bool {
        if self.gone.load(Ordering::Relaxed) {
            return true;
        }
        let gone = self.shm.known_hung_up();
        if gone {
            self.gone.store(true, Ordering::Relaxed);
        }
        gone
    }

    /// The counters and flags whose change is an edge for an edge-triggered waiter: incoming
    /// head and flags, outgoing tail (what the peer moves), our own outgoing flags (a shutdown
    /// of ours can make the connection hang up), and whether the peer is known to be gone
    /// ([`GONE_EDGE`] in the last: a peer that dies moves nothing in the rings). Readiness only grows when
    /// one of them changes.
    /// This side's own counters as the segment holds them (incoming tail, outgoing head). Not
    /// edges (our own reads and writes move them), but what `ready` reports depends on them and
    /// a peer can write them: a registration's "not ready" memo (`Reg::quiet`) holds only while
    /// they stay the same too, or a peer that moved our tail back would leave bytes readable
    /// that no wait reports, and with them the peer's hang-up.
    pub fn own_counters(&self) -> (u64, u64) {
        // Relaxed, as in `edges`: a change is only a hint to look again.
        (RingState::relaxed(self.shm.ring_words().0).tail, RingState::relaxed(self.shm.ring_words().1).head)
    }

    pub fn edges(&self) -> (u64, u32, u64, u32) {
        let mut gone = if self.known_gone() { GONE_EDGE } else { 0 };
        if self.socket_flag(WROTE_AFTER_CLOSE) {
            gone |= RESET_EDGE;
        }
        if self.socket_flag(READ_SHUT) {
            gone |= READ_SHUT_EDGE;
        }
        // Relaxed (`RingState::relaxed`): a change is only a hint to look; `ready` loads the
        // views that order the data.
        let (inc, out) = (RingState::relaxed(self.shm.ring_words().0), RingState::relaxed(self.shm.ring_words().1));
        (inc.head, inc.flags, out.tail, out.flags | gone)
    }

    /// Announces that we are about to sleep (no system call): the peer's next progress rings
    /// the doorbell. The caller re-checks `ready` afterwards.
    pub fn will_sleep(&self) {
        self.shm.announce_doorbell_sleep();
    }

    /// Prepares to sleep on the kernel fds: drain our doorbell, announce that we wait, and
    /// return the readiness after that (a peer's progress from now on rings the doorbell).
    /// `by`: whether the caller sleeps, and how (`Waking`, `Asleep`). `always_ask`: ask the
    /// control socket whether the peer is gone even if the doorbell had rung. (A level-triggered
    /// registration of the kernel fds need not: a ring explains the kernel's report, and a
    /// hung-up control socket keeps it readable, so the next wait is reported
    /// again, finds no ring, as a peer that is gone rings nothing, and asks then.)
    pub fn arm(&self, by: Drainer, always_ask: bool) -> u32 {
        let rang = self.shm.drain_doorbell(by);
        self.shm.announce_doorbell_sleep();
        self.ready(always_ask || !rang)
    }

    /// `arm` before a sleep on the kernel fds (`poll`), or at a miss: the control socket is
    /// asked only if the hang-up watcher cannot vouch for it (`ready_quick`), and the bells are
    /// drained only if our doorbell announcement was taken: while it stands, the peer has not
    /// rung since it was made (a ring takes it, spec/WIRE.md section 6), and the drain that came
    /// before it emptied the doorbell. A ring or a self ring left behind all the same ends the
    /// sleep at once, and the look after a sleep the kernel ended drains (`arm`).
    pub fn arm_quick(&self, by: Drainer) -> u32 {
        if !self.shm.doorbell_announced() {
            self.shm.drain_doorbell(by);
        }
        self.shm.announce_doorbell_sleep();
        self.ready_quick()
    }
}

/// Whether `Conn::ready_with` asks the control socket when nothing else makes the connection
/// readable.
#[derive(Clone, Copy)]
enum Ask {
    Never,
    /// Only if the hang-up watcher cannot vouch for it (`Conn::peer_gone_quick`).
    Quick,
    Always,
}

impl Drop for Conn {
    fn drop(&mut self) {
        let others = self.others_hold();
        if self.inheritable() {
            // A holder that exec'd may not have read the handover file yet: leave it unchanged.
            handover_file::forget(self.raw[2], others);
            handover_file::closing(self.raw[2]);
            self.holders.set_inheritable(false);
        }
        if others {
            // Another process (fork) still uses this connection: release our copy only, so the
            // peer sees neither FIN nor a hang-up. The hang-up watcher and the shrinker let go
            // of it first: they would otherwise touch the unmapped segment.
            self.shm.let_go_unmapped();
            for fd in self.raw {
                // (Not a number the application took with `dup2`: `placed::give_away`.)
                if colo_sys::placed::closing(fd) {
                    // SAFETY: these descriptors belong to the Shm we deliberately do not drop.
                    unsafe { libc::syscall(libc::SYS_close, fd) };
                }
            }
            // SAFETY: the segment mapping; nothing refers to it once this Conn is gone.
            unsafe {
                let (base, len) = self.shm.mapping();
                libc::syscall(libc::SYS_munmap, base, len)
            };
        } else {
            // The segment is still mapped here (`shm` is dropped below).
            let (sent, got) = (self.outgoing().head, self.incoming().tail);
            let age = self.born.elapsed();
            let client = self.shm.role() == colo::internal::segment::Role::Client;
            if client {
                let reply_at = std::time::Duration::from_nanos(self.first_reply_ns.load(Ordering::Relaxed));
                let after_only_reply = (self.sent_before_reply.load(Ordering::Relaxed) == sent).then(|| age.saturating_sub(reply_at));
                let lived = adapt::Lived { lived: age, setup: std::time::Duration::from_nanos(self.setup_ns), bytes: sent + got, after_only_reply };
                adapt::ended(self.shm.peer_addr(), lived);
            } else if let (Some(tag), Some(on_end)) = (self.client_tag, self.on_end) {
                // The server's side lives from its accept, after any wait in the backlog: its
                // age alone tells a connection per request.
                let lived = adapt::Lived { lived: age, setup: std::time::Duration::from_nanos(self.setup_ns), bytes: sent + got, after_only_reply: None };
                on_end(self.shm.local_addr(), tag, lived.short());
            }
            // As kernel TCP, which answers a close with RST instead of FIN when the socket
            // lingers for zero seconds or bytes it received were never read.
            // Loaded again: bytes that arrived while the ending was recorded count too.
            let unread = self.incoming().head != got;
            if self.socket_flag(ABORT) || unread {
                self.shm.abort();
            }
            // SAFETY: dropped exactly once, here.
            unsafe { ManuallyDrop::drop(&mut self.shm) };
            // No process holds the connection any more, and the rings no longer look at the
            // page's read-shutdown word (`share_read_shut`): the page goes back.
            self.holders.release();
            // The carrier never carried a byte (spec/WIRE.md section 3: FIN or RST only). Closed
            // with FIN by the client, which closes first in a connection per request, it would
            // leave a TIME_WAIT on the client's bound port for a minute, and `bind` (unlike
            // `connect`) cannot reuse such a port: a client dialing thousands of short
            // connections a second ran out of the odd ports carriers bind (plain TCP) and paid
            // the FIN handshake on both sides. A reset leaves no TIME_WAIT; the server's shim
            // answers `SO_ERROR` and `getpeername` of the connection from the rings, not from
            // its reset carrier (`api::sockopt`, `api::names`).
            let fd = self.closing_fd.load(Ordering::Relaxed);
            if fd >= 0 && client {
                let l = libc::linger { l_onoff: 1, l_linger: 0 };
                let len = std::mem::size_of::<libc::linger>() as libc::socklen_t;
                // SAFETY: `fd` is the application's descriptor being closed, still open: the
                // caller of `last_close` drops us before the kernel's close of it.
                unsafe { crate::real::setsockopt(fd, libc::SOL_SOCKET, libc::SO_LINGER, (&l as *const libc::linger).cast(), len) };
            }
        }
    }
}

#[cfg(test)]
#[test]
fn a_connection_is_one_kilobyte_of_heap() {
    // `Arc<Conn>`: the counts, then the value, aligned to a cache line. Within a kilobyte (one of
    // jemalloc's size classes): memory per connection is what colo costs at scale.
    let arc_inner = std::mem::align_of::<Conn>().max(16) + std::mem::size_of::<Conn>();
    assert!(arc_inner <= 1024, "Arc<Conn> takes {arc_inner} bytes");
}
