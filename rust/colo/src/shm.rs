//! One side of a shared-memory connection: the byte stream, zero-copy messages, shutdown, and
//! every way it can fail (spec/WIRE.md sections 5 to 8).
//!
//! The reading half (consumer, incoming messages) and the writing half (producer, outgoing
//! messages) each sit behind their own mutex, so one thread may read while another writes, as with
//! a TCP socket. Blocking waits go through [`Shm::block`]: one thread at a time sleeps in the
//! readiness epoll (the *leader*); any other waiting thread sleeps on a condvar and is woken
//! whenever the leader wakes, because the doorbell and the `waiting` flag are shared by both halves.

mod tcp;

use crate::segment::{Role, Segment};
use colo_ring::layout::{FLAG_FIN, FLAG_NOT_READING, FLAG_READ_CLOSED, FLAG_RESET};
use colo_ring::notify;
use colo_ring::queue::{QueueReceiver, QueueSender};
use colo_ring::ring::{Consumer, Producer, RawBytes, RingWords};
use colo_ring::spin::{SpinMode, Spinner};
use colo_ring::sync::{AtomicU32, Ordering};
use colo_ring::Corrupt;
use colo_sys::doorbell::{self, Readiness};
use colo_sys::{seqpacket, OwnedFd};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Writes are published in pieces of at most this many bytes (spec/WIRE.md section 5).
const PUBLISH_CHUNK: usize = 16 * 1024;
/// Who empties a side's doorbell (`Shm::drain_doorbell`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drainer {
    /// A thread not asleep on it (a non-blocking call; a thread back from its sleep).
    Awake,
    /// A sleeper with this wake-up eventfd of its own (`Shm::add_waker`).
    Waker(colo_sys::RawFd),
}

/// A place of `Shm::wakers`: `pid << 42 | fd << 12 | count` (0: free), where `count` is how
/// many sleepers registered that eventfd (the threads waiting on one epoll set share the set's).
/// Linux pids are below 2^22 and descriptors below 2^30.
const WAKER_COUNT: u64 = (1 << 12) - 1;

/// A wake-up eventfd of this process as `Shm::wakers` holds it, without the count.
fn waker(fd: colo_sys::RawFd) -> u64 {
    u64::from(colo_sys::host::pid()) << 42 | u64::from(fd as u32) << 12
}

/// How many wake-up eventfds at once can be registered with one side (`Shm::add_waker`).
const WAKERS: usize = 8;

/// How long a sleeper that could not register a wake-up eventfd (all `WAKERS` places taken, or
/// no eventfd to be had) sleeps at most before it looks again: a ring another thread's drain
/// takes then costs it that much latency instead of a hang.
pub const UNPASSED_SLEEP: Duration = Duration::from_millis(10);

/// One write in this many on a half looks for the hang-up watcher's mark (`Shm::notice_hangup`).
const WATCH_EVERY: u32 = 64;

/// How long a blocking wait sleeps on the futex before it moves to the doorbell.
const FUTEX_BUDGET: Duration = Duration::from_millis(2);

// Local state bits.
const WRITE_SHUT: u32 = 1;
const READ_SHUT: u32 = 2;
const PEER_GONE: u32 = 4;
const RESET: u32 = 8;
const CORRUPT: u32 = 16;
const AWAITING_WELCOME: u32 = 32;
const REFUSED: u32 = 64;
/// NOT_READING is set (READ_SHUT alone is this side's own read shutdown: `Shm::shutdown_as_tcp`).
const READ_TOLD: u32 = 128;

pub(crate) fn eproto(what: impl std::fmt::Display) -> io::Error {
    io::Error::other(ProtocolError(what.to_string()))
}

/// A peer broke the protocol (`EPROTO`): corrupted shared memory or a bad control message.
#[derive(Debug)]
pub struct ProtocolError(pub String);

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "colo protocol error (EPROTO): {}", self.0)
    }
}
impl std::error::Error for ProtocolError {}

/// The errno of an error produced by colo (for the C ABI and logs).
pub fn errno_of(e: &io::Error) -> i32 {
    if let Some(code) = e.raw_os_error() {
        return code;
    }
    if e.get_ref().is_some_and(|inner| inner.is::<ProtocolError>()) {
        return libc_errno::EPROTO;
    }
    match e.kind() {
        io::ErrorKind::WouldBlock => libc_errno::EAGAIN,
        io::ErrorKind::TimedOut => libc_errno::ETIMEDOUT,
        io::ErrorKind::ConnectionReset => libc_errno::ECONNRESET,
        io::ErrorKind::BrokenPipe => libc_errno::EPIPE,
        io::ErrorKind::ConnectionRefused => libc_errno::ECONNREFUSED,
        io::ErrorKind::NotConnected => libc_errno::ENOTCONN,
        io::ErrorKind::InvalidInput => libc_errno::EINVAL,
        io::ErrorKind::OutOfMemory => libc_errno::ENOMEM,
        _ => libc_errno::EIO,
    }
}

/// The errno values colo reports (Linux numbering).
pub mod libc_errno {
    #![allow(missing_docs)]
    pub const EINTR: i32 = 4;
    pub const EIO: i32 = 5;
    pub const EBADF: i32 = 9;
    pub const EAGAIN: i32 = 11;
    pub const ENOMEM: i32 = 12;
    pub const EINVAL: i32 = 22;
    pub const ENFILE: i32 = 23;
    pub const EMFILE: i32 = 24;
    pub const EPIPE: i32 = 32;
    pub const EPROTO: i32 = 71;
    pub const EMSGSIZE: i32 = 90;
    pub const ENOBUFS: i32 = 105;
    pub const ENOTCONN: i32 = 107;
    pub const ECONNRESET: i32 = 104;
    pub const ETIMEDOUT: i32 = 110;
    pub const ECONNREFUSED: i32 = 111;
}

struct RxHalf {
    ring: Consumer<RawBytes>,
    spinner: Spinner,
}

struct TxHalf {
    ring: Producer<RawBytes>,
    spinner: Spinner,
    /// Writes so far, wrapping (see `Shm::notice_hangup`).
    writes: u32,
    /// Whether the shrinker looks at this ring (it grew); `writes` at its last look.
    watched: bool,
    looked_at: u32,
    /// The connection closed: the shrinker must not touch the ring.
    closed: bool,
    pages: TxPages,
}

/// Where the shrinker works beside the producer: the ring's data (to give pages back) and this
/// end's `written` copy (to send the other holders of this end back to the shared size).
struct TxPages {
    data: *mut u8,
    written: *const AtomicU64,
}

// SAFETY: addresses inside the segment's mapping. They are used only under the writing half's
// lock, and `Shm::drop` marks the half closed under that lock before the mapping can go.
unsafe impl Send for TxPages {}

impl crate::shrink::Shrink for Mutex<TxHalf> {
    fn look(&self) -> crate::shrink::Look {
        use crate::shrink::Look;
        let mut tx = match self.try_lock() {
            Ok(tx) => tx,
            Err(std::sync::TryLockError::WouldBlock) => return Look::Again,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
        };
        if tx.closed {
            return Look::Done;
        }
        let writes = tx.writes;
        if std::mem::replace(&mut tx.looked_at, writes) != writes {
            return Look::Again;
        }
        let head = tx.ring.written();
        match tx.ring.shrink_if_empty() {
            Ok(Some(pages)) => {
                // The other holders of this end (a fork, an exec'd child) must write at the new
                // size: a copy no head equals sends them back to the shared words first.
                // SAFETY: an aligned atomic in the mapping, alive while the half is not closed.
                unsafe { &*tx.pages.written }.store(!head, Ordering::Relaxed);
                // SAFETY: `pages` lies inside the ring's data region, inside the mapping.
                let _ = unsafe { colo_sys::segment::release_pages(tx.pages.data.add(pages.start), pages.len()) };
                tx.watched = false;
                Look::Done
            }
            Ok(None) if tx.ring.size() > colo_ring::layout::MIN_RING as usize => Look::Again,
            _ => {
                tx.watched = false;
                Look::Done
            }
        }
    }
}

/// Receiving messages: a lock of its own, so a thread waiting for a message never holds up a
/// thread reading the byte stream (spec section 7: the two are independent).
struct MsgRx {
    msgs: QueueReceiver<2>,
    spinner: Spinner,
}

/// Loaning and sending messages, independent of the byte stream's writers likewise.
struct MsgTx {
    msgs: QueueSender<2>,
    frees: QueueReceiver<1>,
    /// Slots of the outgoing pool we may loan.
    free_slots: Vec<u32>,
    /// Slots loaned or sent and not yet released by the peer.
    in_flight: Vec<bool>,
    spinner: Spinner,
    /// Loans and sends so far, wrapping (see `Shm::notice_hangup`).
    writes: u32,
}

impl MsgTx {
    /// A loaned slot that was not sent returns to the pool.
    fn give_back(&mut self, slot: u32) {
        self.in_flight[slot as usize] = false;
        self.free_slots.push(slot);
    }
}

#[derive(Default)]
struct Waiters {
    leader: bool,
    epoch: u64,
    followers: usize,
}

/// The descriptors of one side of a connection.
#[derive(Debug)]
pub struct Fds {
    /// The control socket (liveness; silent after the handshake).
    pub control: OwnedFd,
    /// Our end of the doorbell pair: we wait on it; a byte sent on it rings the peer.
    pub own_bell: OwnedFd,
    /// Our self bell, an eventfd never passed to the peer: it wakes our own sleepers.
    pub self_bell: OwnedFd,
}

/// Where a side parks its segment when the connection closes cleanly (see `recycle`).
pub(crate) enum Recycle {
    /// The client, for later dials to the listener with this rendezvous name.
    Client(String),
    /// The server, in its listener's table (if the listener still exists).
    Server(std::sync::Weak<crate::recycle::Table>),
}

/// This thread's wake-up eventfd registered with a side for one blocking wait
/// (`Shm::add_waker`), from its first doorbell announcement until the wait ends.
struct Registered<'a> {
    shm: &'a Shm,
    fd: std::cell::Cell<Option<colo_sys::RawFd>>,
}

impl<'a> Registered<'a> {
    fn new(shm: &'a Shm) -> Self {
        Registered { shm, fd: std::cell::Cell::new(None) }
    }

    /// Registers the thread's wake-up eventfd if it is not yet (and a place is free).
    fn register(&self) {
        if self.fd.get().is_none() {
            if let Some(fd) = crate::wake::own_fd().filter(|&fd| self.shm.add_waker(fd)) {
                self.fd.set(Some(fd));
            }
        }
    }

    /// The application closed the eventfd (a `poll` found it invalid): unregister it and let
    /// the thread take another at its next registration.
    fn invalid(&self) {
        if let Some(fd) = self.fd.take() {
            self.shm.remove_waker(fd);
            crate::wake::forget_own();
        }
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        if let Some(fd) = self.fd.get() {
            self.shm.remove_waker(fd);
        }
    }
}

/// One side of an established shared-memory connection.
pub struct Shm {
    rx: Mutex<RxHalf>,
    /// Shared with the shrinker (`crate::shrink`) once the ring grows.
    tx: std::sync::Arc<Mutex<TxHalf>>,
    /// Message halves; `None` without a pool.
    msg_rx: Option<Mutex<MsgRx>>,
    msg_tx: Option<Mutex<MsgTx>>,
    releases: Mutex<Option<QueueSender<1>>>,
    /// Slots of the incoming pool the application holds (received, not yet released); outside the
    /// reading half's lock, so a release never waits for a blocked reader.
    held: Vec<std::sync::atomic::AtomicBool>,
    role: Role,
    state: AtomicU32,
    nonblocking: AtomicBool,
    /// A non-blocking operation drained a ring that may have been meant for the other half.
    swallowed: AtomicBool,
    /// Wake-up eventfds (`crate::wake`) of the threads asleep on this side's doorbell (this
    /// crate's blocking calls; the shim's `poll`, `select` and `epoll_wait`), with their pids
    /// and counts (`WAKER_COUNT`): a drain of the doorbell rings them (see `drain_doorbell`).
    /// The pid keeps a forked child, which inherits this memory, from ringing its parent's.
    wakers: [AtomicU64; WAKERS],
    read_timeout: AtomicU64,
    write_timeout: AtomicU64,
    waiters: Mutex<Waiters>,
    woken: Condvar,
    /// Wakes a futex sleep when the control socket becomes readable (see `hangup`).
    hangup: crate::hangup::Watch,
    /// Created on first use: blocking waits poll the two fds directly.
    readiness: std::sync::OnceLock<Readiness>,
    /// Dropped by hand in `drop`, where the doorbells may be parked for reuse.
    fds: std::mem::ManuallyDrop<Fds>,
    /// Where this side parks the segment after a clean close (DIRECT connections only).
    recycle: Option<Recycle>,
    local: SocketAddr,
    peer: SocketAddr,
    peer_pid: u32,
    /// Client side: the rendezvous name dialed (to remember a listener that answers late).
    rendezvous: Option<String>,
    /// The shared words of our outgoing and incoming rings, located once (they point into `seg`).
    out_words: RingWords,
    in_words: RingWords,
    // Declared last: dropped after every view into it.
    seg: Segment,
}

impl std::fmt::Debug for Shm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shm").field("role", &self.role).field("local", &self.local).field("peer", &self.peer).finish()
    }
}

pub use tcp::set_interrupt_policy;
use tcp::interrupted_ends_wait;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn nanos(d: Option<Duration>) -> u64 {
    d.map_or(0, |d| d.as_nanos().clamp(1, u64::MAX as u128) as u64)
}

fn from_nanos(n: u64) -> Option<Duration> {
    (n != 0).then(|| Duration::from_nanos(n))
}

/// A wait's spinner: adaptive spins are skipped while the host's CPUs are oversubscribed
/// (spinning then holds off the thread we wait for; spec/WIRE.md section 9). Also the spinner of
/// the LD_PRELOAD shim's `epoll_wait`.
pub fn spinner(mode: SpinMode) -> Spinner {
    Spinner::new(mode).yielding_when(colo_sys::host::cpus_oversubscribed)
}

impl Shm {
    /// Builds one side over a validated, mapped segment whose handshake is complete. Low-level:
    /// for transports that do their own rendezvous (the LD_PRELOAD shim's CARRIER mode).
    pub fn new(
        seg: Segment,
        role: Role,
        fds: Fds,
        local: SocketAddr,
        peer: SocketAddr,
        peer_pid: u32,
        spin: SpinMode,
    ) -> io::Result<Shm> {
        // SAFETY: each view is taken once per role and lives inside `Shm`, which also owns `seg`
        // (declared last, so dropped after the views).
        let views = unsafe { (seg.consumer(role), seg.producer(role), seg.queues(role)) };
        Shm::build(seg, views, role, fds, local, peer, peer_pid, spin)
    }

    /// Takes over one side of a connection that an earlier program image of this process set up
    /// (the LD_PRELOAD shim, after `exec`): the rings continue from their current counters, the
    /// state from the segment's flags. Zero-copy messages are not carried over (`loan` and
    /// `recv_message` report no pool).
    pub fn resume(
        seg: Segment,
        role: Role,
        fds: Fds,
        local: SocketAddr,
        peer: SocketAddr,
        peer_pid: u32,
        spin: SpinMode,
    ) -> io::Result<Shm> {
        // SAFETY: as in `new`; the earlier image that used these ends is gone (exec replaced it).
        let views = unsafe { (seg.resumed_consumer(role), seg.resumed_producer(role), None) };
        let shm = Shm::build(seg, views, role, fds, local, peer, peer_pid, spin)?;
        let (out, inn) = (shm.out_words(), shm.in_words());
        // Acquire: partners of the Release stores that set these flags (`signal`).
        // SAFETY: aligned atomics inside the mapping `shm` owns.
        let load = |w: *const AtomicU32| unsafe { (*w).load(Ordering::Acquire) };
        let (out_flags, in_flags, in_read) = (load(out.flags), load(inn.flags), load(inn.read_flags));
        if out_flags & FLAG_FIN != 0 {
            shm.set(WRITE_SHUT);
        }
        if in_read & FLAG_READ_CLOSED != 0 {
            shm.set(READ_SHUT | READ_TOLD);
            // An exec between the two stores of `shutdown` leaves READ_CLOSED without its mirror.
            if out_flags & FLAG_NOT_READING == 0 {
                shm.signal(out.flags, FLAG_NOT_READING);
            }
        }
        if (out_flags | in_flags) & FLAG_RESET != 0 {
            shm.set(RESET);
        }
        Ok(shm)
    }

    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn build(
        seg: Segment,
        views: (
            Consumer<RawBytes>,
            Producer<RawBytes>,
            Option<((QueueSender<2>, QueueReceiver<1>), (QueueReceiver<2>, QueueSender<1>))>,
        ),
        role: Role,
        fds: Fds,
        local: SocketAddr,
        peer: SocketAddr,
        peer_pid: u32,
        spin: SpinMode,
    ) -> io::Result<Shm> {
        let (ring_in, ring_out, queues) = views;
        let pool = queues.is_some();
        let g = seg.layout().geometry;
        let (out_q, in_q) = match queues {
            Some((o, i)) => (Some(o), Some(i)),
            None => (None, None),
        };
        let n = if pool { g.slot_count as usize } else { 0 };
        let spin = if spin != SpinMode::Always && colo_sys::host::share_one_cpu(peer_pid) { SpinMode::Never } else { spin };
        let msg_tx = out_q.map(|(msgs, frees)| {
            Mutex::new(MsgTx {
                msgs,
                frees,
                free_slots: (0..n as u32).rev().collect(),
                in_flight: vec![false; n],
                spinner: spinner(spin),
                writes: 0,
            })
        });
        let (msg_rx, releases) = match in_q {
            Some((msgs, releases)) => (Some(Mutex::new(MsgRx { msgs, spinner: spinner(spin) })), Some(releases)),
            None => (None, None),
        };
        Ok(Shm {
            rx: Mutex::new(RxHalf { ring: ring_in, spinner: spinner(spin) }),
            held: (0..n).map(|_| std::sync::atomic::AtomicBool::new(false)).collect(),
            tx: std::sync::Arc::new(Mutex::new(TxHalf {
                pages: TxPages { data: seg.ring_data_ptr(role == Role::Client), written: seg.written(role) },
                ring: ring_out,
                spinner: spinner(spin),
                writes: 0,
                watched: false,
                looked_at: 0,
                closed: false,
            })),
            msg_rx,
            msg_tx,
            releases: Mutex::new(releases),
            role,
            state: AtomicU32::new(0),
            nonblocking: AtomicBool::new(false),
            swallowed: AtomicBool::new(false),
            wakers: [const { AtomicU64::new(0) }; WAKERS],
            read_timeout: AtomicU64::new(0),
            write_timeout: AtomicU64::new(0),
            waiters: Mutex::new(Waiters::default()),
            woken: Condvar::new(),
            hangup: crate::hangup::Watch::new(),
            readiness: std::sync::OnceLock::new(),
            fds: std::mem::ManuallyDrop::new(fds),
            recycle: None,
            local,
            peer,
            peer_pid,
            rendezvous: None,
            out_words: seg.ring_words(role == Role::Client),
            in_words: seg.ring_words(role == Role::Server),
            seg,
        })
    }

    fn has(&self, bits: u32) -> bool {
        self.state.load(Ordering::Acquire) & bits != 0
    }

    fn set(&self, bits: u32) {
        self.state.fetch_or(bits, Ordering::AcqRel);
    }

    fn own_waiting(&self) -> &AtomicU32 {
        self.seg.waiting(self.role)
    }

    fn wake_peer(&self) {
        self.wake_with(notify::peer_needs_wake(self.seg.waiting(self.other())));
    }

    /// After a read moved our tail from `before`: wakes the peer only if it may be waiting for
    /// space (a full ring before the read), not when it waits for our data (spec section 6).
    fn wake_for_space(&self, rx: &RxHalf, before: u64) {
        let peer = self.seg.waiting(self.other());
        self.wake_with(notify::peer_needs_space_wake(peer, || rx.ring.was_full_before(before)));
    }

    fn wake_with(&self, bits: u32) {
        let peer = self.seg.waiting(self.other());
        if bits & notify::SLEEP_FUTEX != 0 {
            colo_sys::futex::wake_all(peer);
        }
        if bits & notify::SLEEP_DOORBELL != 0 {
            doorbell::ring_peer(&self.fds.own_bell);
        }
    }

    fn other(&self) -> Role {
        if self.role == Role::Client { Role::Server } else { Role::Client }
    }

    fn out_words(&self) -> RingWords {
        self.out_words
    }

    fn in_words(&self) -> RingWords {
        self.in_words
    }

    /// Sets a flag word of the segment without taking a half's lock (a blocked reader or writer
    /// may hold it), then wakes the peer as any progress does (spec section 6): a sleeper that
    /// announced before the exchange is woken by the bits it returns; one that announces after it
    /// sees the flag in its re-check. A close wakes no one who is not asleep (a connection per
    /// request pays no system call for it).
    fn signal(&self, word: *const AtomicU32, bits: u32) {
        // SAFETY: `word` comes from `out_words`/`in_words`: an aligned atomic in our mapping.
        unsafe { &*word }.fetch_or(bits, Ordering::Release);
        self.wake_peer();
    }

    /// Wakes this side's own sleeping threads (a state they must see changed locally), those that
    /// announced a sleep; one that announces later sees the state in its re-check.
    fn wake_self(&self) {
        // SYNC POINT with `notify::announce_sleep`: changing the word stops a futex sleep that
        // was announced but not yet entered (the state change is stored before this).
        let announced = self.own_waiting().fetch_and(!notify::SLEEP_FUTEX, Ordering::AcqRel);
        if announced & notify::SLEEP_DOORBELL != 0 {
            doorbell::ring(&self.fds.self_bell);
        }
        if announced & notify::SLEEP_FUTEX != 0 {
            colo_sys::futex::wake_all(self.own_waiting());
        }
    }

    /// Resets the connection after the peer broke the protocol; returns the error to report.
    fn corrupt(&self, c: Corrupt) -> io::Error {
        if !self.has(RESET) {
            self.set(RESET | CORRUPT);
            self.signal(self.out_words().flags, FLAG_RESET);
            self.wake_self();
        }
        eproto(c)
    }

    /// Parks the segment in `r` when the connection closes cleanly.
    pub(crate) fn recycle_into(&mut self, r: Recycle) {
        self.recycle = Some(r);
    }

    /// The listener (rendezvous `name`) has not answered the HELLO yet: its answer will come on
    /// the control socket.
    pub(crate) fn expect_welcome(&mut self, name: String) {
        self.rendezvous = Some(name);
        self.set(AWAITING_WELCOME);
    }

    fn reset_error(&self) -> io::Error {
        if self.has(REFUSED) {
            return io::ErrorKind::ConnectionRefused.into();
        }
        if self.has(CORRUPT) {
            eproto("connection was reset after a protocol error")
        } else {
            io::ErrorKind::ConnectionReset.into()
        }
    }

    /// Reads the control socket without blocking: after the handshake it must stay silent, so a
    /// hang-up is the peer's end and anything else is a protocol error.
    fn poll_control(&self) {
        if self.has(PEER_GONE) {
            return;
        }
        let mut buf = [0u8; 16];
        match seqpacket::recv(&self.fds.control, &mut buf, true) {
            Ok(r) if r.len == 0 && r.fds.is_empty() => self.set(PEER_GONE),
            Ok(r) if self.has(AWAITING_WELCOME) && r.fds.is_empty() && !r.truncated => {
                self.state.fetch_and(!AWAITING_WELCOME, Ordering::AcqRel);
                match crate::wire::Message::decode(&buf[..r.len]) {
                    Ok(crate::wire::Message::Welcome { version: crate::wire::VERSION }) => {
                        if let Some(name) = &self.rendezvous {
                            crate::handshake::remember_direct(name.clone(), self.peer_pid);
                        }
                    }
                    Ok(crate::wire::Message::Reject { .. }) => {
                        self.set(RESET | REFUSED | PEER_GONE);
                        doorbell::ring(&self.fds.self_bell);
                    }
                    _ => {
                        let _ = self.corrupt(Corrupt("bad answer to HELLO"));
                    }
                }
            }
            Ok(_) => {
                // Spec section 8: a reset (ECONNRESET), not a corruption of the segment.
                self.set(PEER_GONE);
                if !self.has(RESET) {
                    self.set(RESET);
                    self.signal(self.out_words().flags, FLAG_RESET);
                    self.wake_self();
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => self.set(PEER_GONE),
        }
    }

    /// Announces that a thread of this side is about to sleep the way `bit` says (spec section
    /// 6). If the announcement finds the word woken (`notify::Announced::fresh`: the peer's
    /// wake-up took every bit since the last announcement), that wake-up may have been meant for
    /// another thread of this side that had announced and re-checked but was not asleep yet: it
    /// woke nobody. That thread would then wait behind whichever thread sleeps next, for a
    /// wake-up that may never come (a writer waiting for space the peer already made, behind a
    /// reader waiting for an echo of bytes not yet written). So a fresh announcement moves the
    /// waiters' epoch, whatever the caller's re-check then finds: every thread that announced
    /// before it looks at its condition again (`block`). `seen` is the caller's own epoch, read
    /// before it announced; it moves along when nobody else moved the epoch meanwhile, so the
    /// caller does not send itself round again.
    pub(crate) fn announce(&self, bit: u32, seen: Option<&std::cell::Cell<u64>>) -> notify::Announced {
        let announced = notify::announce_sleep(self.own_waiting(), bit);
        if announced.fresh {
            let mut w = lock(&self.waiters);
            let ours = seen.is_some_and(|s| s.get() == w.epoch);
            w.epoch = w.epoch.wrapping_add(1);
            if let (true, Some(s)) = (ours, seen) {
                s.set(w.epoch);
            }
            if w.followers > 0 {
                self.woken.notify_all();
            }
        }
        announced
    }

    /// Announces a doorbell sleep for a caller that sleeps on the readiness fd itself (the
    /// shim's `poll` and `epoll_wait`), as `announce` does for this crate's own waits.
    pub fn announce_doorbell_sleep(&self) {
        self.announce(notify::SLEEP_DOORBELL, None);
    }

    /// Registers the wake-up eventfd (`crate::wake`) of a thread about to sleep on this side's
    /// doorbell (with the eventfd in the same `poll`): from now on every drain of the doorbell
    /// by another thread rings it. Register before announcing; `remove_waker` once awake. An
    /// eventfd registered already (an epoll set's, by another thread waiting on the set) is
    /// counted once more. Returns false (not registered) if all `WAKERS` places are taken: the
    /// caller then sleeps for at most `UNPASSED_SLEEP` at a time.
    pub fn add_waker(&self, fd: colo_sys::RawFd) -> bool {
        let me = waker(fd);
        // SYNC POINT (all the compare-and-swaps here and in `remove_waker`) with the loads in
        // `drain_doorbell`: SeqCst, though what matters is the order the kernel gives the two
        // drains of the eventfd: either the caller's own drain, after this, takes the ring, or
        // it comes after the other thread's, whose load then follows this store.
        for w in &self.wakers {
            let mut v = w.load(Ordering::SeqCst);
            while v & !WAKER_COUNT == me && v & WAKER_COUNT < WAKER_COUNT {
                match w.compare_exchange(v, v + 1, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(_) => return true,
                    Err(now) => v = now,
                }
            }
        }
        // (Two threads registering one eventfd at once may each take a place: rung twice.)
        self.wakers.iter().any(|w| w.compare_exchange(0, me | 1, Ordering::SeqCst, Ordering::Relaxed).is_ok())
    }

    /// Undoes `add_waker`.
    pub fn remove_waker(&self, fd: colo_sys::RawFd) {
        let me = waker(fd);
        for w in &self.wakers {
            let mut v = w.load(Ordering::SeqCst);
            while v != 0 && v & !WAKER_COUNT == me {
                let less = if v & WAKER_COUNT == 1 { 0 } else { v - 1 };
                match w.compare_exchange(v, less, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(_) => return,
                    Err(now) => v = now,
                }
            }
        }
    }

    /// Empties this side's bells; returns whether one had rung. (A doorbell at end of stream
    /// is the peer's hang-up: `drain_side` shuts the control socket down.)
    ///
    /// Several threads may sleep on one doorbell (two threads polling one socket, one to read
    /// and one to write; an event loop, and a thread writing from outside it whose non-blocking
    /// call drains): the one that empties it takes a ring another may have waited for, and that
    /// other's `poll` or `epoll_wait`, looking only afterwards, sleeps on with its condition
    /// true. So every sleeper registers a wake-up eventfd of its own (`add_waker`), which only
    /// it empties, and a drain that took a ring rings every registered one but the drainer's
    /// (re-ringing the doorbell would not do: the passer, or another sleeper, could empty the
    /// pass before the one it was meant for looks; docs/ARCHITECTURE.md has the history).
    pub fn drain_doorbell(&self, by: Drainer) -> bool {
        let found = doorbell::drain_side(&self.fds.own_bell, &self.fds.self_bell, &self.fds.control);
        if found.hung_up {
            self.poll_control();
        }
        if !found.rung {
            return false;
        }
        let own = match by {
            Drainer::Waker(fd) => Some(fd),
            Drainer::Awake => None,
        };
        let pid = u64::from(colo_sys::host::pid());
        for w in &self.wakers {
            // SYNC POINT with the compare-and-swaps in `add_waker` and `remove_waker`.
            let v = w.load(Ordering::SeqCst);
            let fd = (v >> 12) as u32 as colo_sys::RawFd & ((1 << 30) - 1);
            if v != 0 && v >> 42 == pid && Some(fd) != own {
                // SAFETY: wake-up eventfds are never closed (`crate::wake`), so a racing removal
                // leaves, at worst, a spurious ring on an eventfd of this process.
                doorbell::ring(unsafe { colo_sys::BorrowedFd::borrow_raw(fd) });
            }
        }
        true
    }

    /// Sleeps until the doorbell rings, the control socket wakes, or `deadline` passes; with
    /// `futex = Some((value, budget))`, on the futex at our `waiting` word instead, for at most
    /// `budget` (`None`: the hang-up watcher wakes it; else a hang-up is noticed when the sleep
    /// moves on to the doorbell).
    ///
    /// `epoch` is the waiters' epoch read before this thread announced its sleep: if another
    /// thread has woken (and perhaps drained a ring meant for us) since, return at once so the
    /// caller re-checks instead of sleeping on a swallowed wake-up.
    ///
    /// `wake`: this thread's wake-up eventfd, if registered with this side, polled with the
    /// doorbell.
    fn block(
        &self,
        deadline: Option<Instant>,
        futex: Option<(u32, Option<Duration>)>,
        epoch: u64,
        wake: &Registered<'_>,
    ) -> io::Result<()> {
        let timeout = match deadline {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                Some(left)
            }
            None => None,
        };
        let mut w = lock(&self.waiters);
        if w.epoch != epoch {
            return Ok(());
        }
        if w.leader {
            w.followers += 1;
            while w.leader && w.epoch == epoch {
                w = match deadline {
                    Some(d) => {
                        let left = d.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            w.followers -= 1;
                            return Err(io::ErrorKind::WouldBlock.into());
                        }
                        self.woken.wait_timeout(w, left).unwrap_or_else(|e| e.into_inner()).0
                    }
                    None => self.woken.wait(w).unwrap_or_else(|e| e.into_inner()),
                };
            }
            w.followers -= 1;
            return Ok(());
        }
        w.leader = true;
        drop(w);
        let r = match futex {
            Some((value, budget)) => {
                let t = match (timeout, budget) {
                    (Some(t), Some(b)) => Some(t.min(b)),
                    (t, b) => t.or(b),
                };
                // The watcher may have marked us before our announcement: no sleep then.
                let fired = self.hangup.take_fired();
                let interrupted = !fired && colo_sys::futex::wait(self.own_waiting(), value, t);
                if fired || self.hangup.take_fired() {
                    self.poll_control();
                    if !self.has(PEER_GONE) {
                        self.hangup.rearm(&self.fds.control);
                    }
                }
                Ok(colo_sys::doorbell::Woken { interrupted, ..Default::default() })
            }
            None => {
                let fd = wake.fd.get();
                // SAFETY: wake-up eventfds are never closed (`crate::wake`).
                let wake_fd = fd.map(|fd| unsafe { colo_sys::BorrowedFd::borrow_raw(fd) });
                // Unregistered, another thread's drain can take our ring without passing it on.
                let timeout = match fd {
                    Some(_) => timeout,
                    None => Some(timeout.map_or(UNPASSED_SLEEP, |t| t.min(UNPASSED_SLEEP))),
                };
                let r = doorbell::wait(&self.fds.own_bell, &self.fds.self_bell, &self.fds.control, wake_fd, timeout);
                if let (Ok(w), Some(own)) = (&r, wake_fd) {
                    if w.wake_invalid {
                        wake.invalid();
                    } else if w.passed {
                        doorbell::drain(own);
                    }
                }
                r
            }
        };
        let interrupted = r.as_ref().is_ok_and(|w| w.interrupted) && interrupted_ends_wait(deadline.is_some());
        if let Ok(woken) = r {
            if woken.doorbell {
                self.drain_doorbell(wake.fd.get().map_or(Drainer::Awake, Drainer::Waker));
            }
            if woken.control {
                self.poll_control();
            }
        }
        let mut w = lock(&self.waiters);
        w.leader = false;
        w.epoch = w.epoch.wrapping_add(1);
        if w.followers > 0 {
            self.woken.notify_all();
        }
        if interrupted {
            return Err(io::Error::from_raw_os_error(libc_errno::EINTR));
        }
        r.map(drop)
    }

    fn deadline(&self, timeout: &AtomicU64) -> Option<Instant> {
        from_nanos(timeout.load(Ordering::Relaxed)).map(|t| Instant::now() + t)
    }

    /// One look (`check`) and, only if that finds nothing, [`Shm::wait_for`] with the spinner
    /// of `half` (a locked reading or writing half). Under load the look is all a call needs,
    /// and it then pays for no spinner copy, deadline or wait set-up.
    fn look_then_wait<H, T>(
        &self,
        half: &mut H,
        spinner_of: fn(&mut H) -> &mut Spinner,
        timeout: &AtomicU64,
        mut check: impl FnMut(&mut H) -> io::Result<Option<T>>,
    ) -> io::Result<T> {
        if let Some(v) = check(half)? {
            return Ok(v);
        }
        let mut spinner = spinner_of(half).clone();
        let r = self.wait_for(&mut spinner, timeout, || check(half));
        *spinner_of(half) = spinner;
        r
    }

    /// Runs `check` until it yields, by the protocol of spec/WIRE.md section 6; called after the
    /// caller's own `check` found nothing (so the wait starts with the spin or the announcement).
    fn wait_for<T>(
        &self,
        spinner: &mut Spinner,
        timeout: &AtomicU64,
        mut check: impl FnMut() -> io::Result<Option<T>>,
    ) -> io::Result<T> {
        if self.nonblocking.load(Ordering::Relaxed) {
            let r = notify::poll_after_miss(
                &mut check,
                || {
                    if self.drain_doorbell(Drainer::Awake) {
                        self.swallowed.store(true, Ordering::Release);
                    }
                },
                || self.announce(notify::SLEEP_DOORBELL, None),
            )?;
            if let Some(v) = r {
                return Ok(v);
            }
            // A hang-up leaves the readiness fd readable: notice it now, not never.
            self.poll_control();
            return check()?.ok_or_else(|| io::ErrorKind::WouldBlock.into());
        }
        let deadline = self.deadline(timeout);
        if spinner.mode() == SpinMode::Always {
            // Busy polling never sleeps, so look at the control socket now and then.
            let mut polls = 0u32;
            return notify::wait_after_miss(
                spinner,
                || {
                    polls = polls.wrapping_add(1);
                    if polls.is_multiple_of(4096) {
                        self.poll_control();
                    }
                    if deadline.is_some_and(|d| polls.is_multiple_of(64) && Instant::now() >= d) {
                        return Err(io::ErrorKind::WouldBlock.into());
                    }
                    check()
                },
                || self.announce(notify::SLEEP_DOORBELL, None),
                |_| Ok(()),
            );
        }
        // With no deadline and the hang-up watcher running, sleep on the futex until woken (one
        // syscall each way, no timer). Otherwise on the futex for up to FUTEX_BUDGET, then on the
        // doorbell and the control socket (no CPU while idle; a hang-up wakes it).
        // Whether futex sleeps are untimed; asked at the first sleep itself (in `block`'s closure,
        // after the re-check), as the answer registers the connection with the watcher.
        let untimed = std::cell::Cell::new(None::<bool>);
        let sleep_untimed = || {
            let u = untimed.get().unwrap_or_else(|| {
                deadline.is_none() && self.hangup.armed(&self.fds.control, self.own_waiting())
            });
            untimed.set(Some(u));
            u
        };
        // An adaptive spinner learns from how long its sleeps last.
        let measure = matches!(spinner.mode(), SpinMode::For(_));
        let asleep_since = std::cell::Cell::new(None::<Instant>);
        let seen_epoch = std::cell::Cell::new(0u64);
        let registered = Registered::new(self);
        let futex_left = || {
            let since = asleep_since.get().unwrap_or_else(Instant::now);
            FUTEX_BUDGET.checked_sub(since.elapsed()).filter(|d| !d.is_zero())
        };
        let r = notify::wait_after_miss(
            spinner,
            &mut check,
            || {
                // Read before the announcement: see `block`.
                seen_epoch.set(lock(&self.waiters).epoch);
                let bit = if self.has(AWAITING_WELCOME) {
                    // A pending connection's answer comes on the control socket, before any of
                    // the peer's bytes: the doorbell sleep watches both, so the answer wakes this
                    // thread directly, not the hang-up watcher (which would wake it in turn).
                    notify::SLEEP_DOORBELL
                } else if deadline.is_none() && untimed.get() != Some(false) || futex_left().is_some() {
                    notify::SLEEP_FUTEX
                } else {
                    notify::SLEEP_DOORBELL
                };
                if bit == notify::SLEEP_DOORBELL {
                    registered.register();
                }
                self.announce(bit, Some(&seen_epoch))
            },
            |announced| {
                let (value, bit) = (announced.value, announced.bit);
                let untimed = bit == notify::SLEEP_FUTEX && sleep_untimed();
                if (measure || !untimed) && asleep_since.get().is_none() {
                    asleep_since.set(Some(Instant::now()));
                }
                let futex = match bit {
                    notify::SLEEP_FUTEX if untimed => Some((value, None)),
                    notify::SLEEP_FUTEX => match futex_left() {
                        Some(d) => Some((value, Some(d))),
                        // Announced a futex sleep that cannot be had (no watcher, budget spent):
                        // look again; the next announcement is a doorbell one.
                        None => return Ok(()),
                    },
                    _ => None,
                };
                self.block(deadline, futex, seen_epoch.get(), &registered)
            },
        );
        if let (true, Some(since)) = (measure, asleep_since.get()) {
            spinner.slept(since.elapsed());
        }
        r
    }

    // ---- the byte stream -------------------------------------------------------------------

    /// Another process that shares this end of the connection (the LD_PRELOAD shim: a fork or
    /// an exec'd child holding a copy of the socket, taking turns with us as processes sharing a
    /// TCP socket do) may have written since we last did: continue from the shared `ring_head`,
    /// as a resumed end does. It looks at this end's `written` copy, not at `ring_head` itself:
    /// the peer spins on `ring_head`'s line, and loading it just before the write that stores
    /// it cost a cache-line transfer on every write (about 40 ns of a 0.3 us round trip here).
    /// The copy's line is this end's alone. A write marks the copy stale before it publishes
    /// (see `write`), so a holder that dies mid-write leaves a copy no head equals. A peer can
    /// scribble over the copy as over anything in the segment: that can only cost a resume or
    /// garble the stream it receives itself; the resumed producer validates `ring_head`.
    fn adopt_tx(&self, tx: &mut TxHalf) {
        let written = self.seg.written(self.role).load(Ordering::Relaxed);
        if written != tx.ring.written() {
            // SAFETY: the view lives in `self` next to `seg`; the stale one it replaces is dropped.
            tx.ring = unsafe { self.seg.resumed_producer(self.role) };
        }
    }

    /// As [`Shm::adopt_tx`], for reading: another holder may have consumed (`ring_tail` moved).
    fn adopt_rx(&self, rx: &mut RxHalf) {
        // SAFETY: the incoming ring's tail, an aligned atomic in our mapping.
        let tail = unsafe { &*self.in_words().tail }.load(Ordering::Relaxed);
        if tail != rx.ring.consumed() {
            // SAFETY: as in `adopt_tx`.
            rx.ring = unsafe { self.seg.resumed_consumer(self.role) };
        }
    }

    fn try_read(&self, rx: &mut RxHalf, buf: &mut [u8], peek: bool) -> io::Result<Option<usize>> {
        if self.has(READ_SHUT) {
            return self.read_after_shutdown(rx, buf, peek).map(Some);
        }
        self.adopt_rx(rx);
        let before = rx.ring.consumed();
        let got = if peek { rx.ring.peek(buf) } else { rx.ring.read(buf) };
        let n = got.map_err(|c| self.corrupt(c))?;
        if n > 0 {
            if !peek {
                self.wake_for_space(rx, before);
            }
            return Ok(Some(n));
        }
        if self.has(RESET) {
            return Err(self.reset_error());
        }
        // PEER_GONE first: a peer that set FIN and then hung up is seen with its FIN.
        let gone = self.has(PEER_GONE);
        let flags = rx.ring.flags().map_err(|c| self.corrupt(c))?;
        if flags & (FLAG_FIN | FLAG_RESET) == 0 && !gone {
            return Ok(None);
        }
        // Everything published before FIN or the hang-up is visible now; deliver it first.
        let n = if peek { rx.ring.peek(buf) } else { rx.ring.read(buf) }.map_err(|c| self.corrupt(c))?;
        if flags & FLAG_RESET != 0 {
            self.set(RESET);
            return Err(io::ErrorKind::ConnectionReset.into());
        }
        if n > 0 {
            if !peek {
                self.wake_for_space(rx, before);
            }
            return Ok(Some(n));
        }
        if flags & FLAG_FIN != 0 {
            return Ok(Some(0));
        }
        // Hung up without FIN: the peer died.
        Err(io::ErrorKind::ConnectionReset.into())
    }

    /// Reads into `buf`; 0 is end of stream. Blocks (spin, then sleep) unless non-blocking.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv(buf, false)
    }

    /// Like [`Shm::read`] but leaves the bytes in the ring (`MSG_PEEK`).
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv(buf, true)
    }

    fn recv(&self, buf: &mut [u8], peek: bool) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.has(READ_TOLD) {
            return Ok(0);
        }
        let mut rx = lock(&self.rx);
        self.look_then_wait(&mut rx, |h| &mut h.spinner, &self.read_timeout, |rx| self.try_read(rx, buf, peek))
    }

    /// Bytes ready to read now (`FIONREAD`).
    pub fn readable(&self) -> io::Result<usize> {
        let mut rx = lock(&self.rx);
        self.adopt_rx(&mut rx);
        rx.ring.available().map_err(|c| self.corrupt(c))
    }

    /// Whether this side may still send (bytes or messages): not reset, not shut down for writing,
    /// and the peer neither reset nor stopped reading nor hung up. Loads the incoming ring's flags
    /// only, a line this side reads anyway (spec section 8).
    fn may_send(&self, writes: &mut u32) -> io::Result<()> {
        self.notice_hangup(writes);
        if self.has(RESET) {
            return Err(self.reset_error());
        }
        if self.has(WRITE_SHUT) {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let in_flags = self.in_words().producer_flags().map_err(|c| self.corrupt(c))?;
        // The peer's RESET wins over its hang-up or read shutdown (spec/WIRE.md section 8).
        if in_flags & FLAG_RESET != 0 {
            self.set(RESET);
            return Err(io::ErrorKind::ConnectionReset.into());
        }
        // The peer stopped reading: seen in its own ring's flags, not in our ring's `read_flags`
        // (whose line is the consumer's `ring_tail`: a write would pull it across CPUs each time).
        if in_flags & FLAG_NOT_READING != 0 || self.has(PEER_GONE) {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        Ok(())
    }

    /// A writer waits only when the ring is full, so it would never look at the control socket:
    /// a peer killed mid-stream went unnoticed by a process that only wrote to it (a byte every
    /// 2 ms, for as long as the test ran; over TCP the second write fails). The hang-up watcher
    /// watches for it, and one write in `WATCH_EVERY` (`writes`, the half's count) looks for its
    /// mark and, if set, reads the control socket, so that a later write fails with `EPIPE`.
    /// The first look sets up the watch (a system call and the watcher's lock, twice): a
    /// short-lived connection never pays for it. Looking at every write cost 10-20 ns of a
    /// 0.24 us round trip.
    fn notice_hangup(&self, writes: &mut u32) {
        *writes = writes.wrapping_add(1);
        if !(*writes).is_multiple_of(WATCH_EVERY) {
            return;
        }
        if self.hangup.armed(&self.fds.control, self.own_waiting()) && self.hangup.take_fired() {
            self.poll_control();
            if self.has(PEER_GONE) {
                // The mark was a reader's too (one the watcher woke may not have looked yet):
                // woken whatever the shared word holds, as the peer may have cleared its bit.
                self.wake_self();
                colo_sys::futex::wake_all(self.own_waiting());
            } else {
                self.hangup.rearm(&self.fds.control);
            }
        }
    }

    fn write_blocked(&self, tx: &mut TxHalf) -> io::Result<Option<usize>> {
        self.may_send(&mut tx.writes)?;
        self.adopt_tx(tx);
        let space = tx.ring.space().map_err(|c| self.corrupt(c))?;
        Ok((space > 0).then_some(space))
    }

    /// Bounds how far writes grow the outgoing ring (a program's `SO_SNDBUF`): `bytes` rounded
    /// up to a power of two, from 4 KiB to the segment's `ring_capacity`.
    pub fn set_send_buffer(&self, bytes: usize) {
        lock(&self.tx).ring.set_limit(bytes);
    }


    /// Writes as much of `buf` as the ring takes, waiting only while nothing could be written;
    /// publishes in pieces so the reader starts early.
    pub fn write(&self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut guard = lock(&self.tx);
        let tx = &mut *guard;
        self.look_then_wait(tx, |h| &mut h.spinner, &self.write_timeout, |tx| self.write_blocked(tx))?;
        // For the other holders of this end (`adopt_tx`): stale while we publish, so that one
        // that takes over after we died mid-write resumes from `ring_head`; our head once done.
        // They take turns with us, so once per call is enough.
        let written = self.seg.written(self.role);
        written.store(!tx.ring.written(), Ordering::Relaxed);
        let mut done = 0;
        while done < buf.len() {
            let end = buf.len().min(done + PUBLISH_CHUNK);
            let n = tx.ring.write(&buf[done..end]).map_err(|c| self.corrupt(c))?;
            if n == 0 {
                break;
            }
            done += n;
            self.wake_peer();
        }
        written.store(tx.ring.written(), Ordering::Relaxed);
        if !tx.watched && tx.ring.size() > colo_ring::layout::MIN_RING as usize {
            tx.watched = true;
            let ring: std::sync::Weak<dyn crate::shrink::Shrink> = std::sync::Arc::downgrade(&self.tx) as _;
            crate::shrink::watch(ring);
        }
        Ok(done)
    }

    /// Writes all of `buf`, waiting for space as needed.
    pub fn write_all(&self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            let n = self.write(buf)?;
            buf = &buf[n..];
        }
        Ok(())
    }

    /// `shutdown(2)`: `read`, `write` or both. One signal to the peer for both: FIN and
    /// NOT_READING in our ring's flags (and READ_CLOSED in the peer's `read_flags`, section 8).
    pub fn shutdown(&self, read: bool, write: bool) {
        let mut ours = 0;
        if write && !self.has(WRITE_SHUT) {
            self.set(WRITE_SHUT);
            ours |= FLAG_FIN;
        }
        if read && !self.has(READ_TOLD) {
            self.set(READ_SHUT | READ_TOLD);
            // SAFETY: an aligned atomic in our mapping (`in_words`).
            unsafe { &*self.in_words().read_flags }.fetch_or(FLAG_READ_CLOSED, Ordering::Release);
            ours |= FLAG_NOT_READING;
        }
        if ours != 0 {
            self.signal(self.out_words().flags, ours);
        }
        // A thread of ours blocked in read or write must see the shutdown now.
        self.wake_self();
    }

    // ---- zero-copy messages ------------------------------------------------------------------

    fn take_slot(&self, tx: &mut MsgTx) -> io::Result<Option<u32>> {
        self.may_send(&mut tx.writes)?;
        // Slots the peer released are taken back, all at once, only when none is left here: the
        // free queue's `free_head` line is the peer's, and loading it on every loan cost a
        // cache-line transfer per message.
        if tx.free_slots.is_empty() {
            while let Some([slot]) = tx.frees.pop().map_err(|c| self.corrupt(c))? {
                if slot as usize >= tx.in_flight.len() || !tx.in_flight[slot as usize] {
                    return Err(self.corrupt(Corrupt("released a slot that was not in flight")));
                }
                tx.in_flight[slot as usize] = false;
                tx.free_slots.push(slot);
            }
        }
        Ok(tx.free_slots.pop().inspect(|&s| tx.in_flight[s as usize] = true))
    }

    fn geometry(&self) -> colo_ring::layout::Geometry {
        self.seg.layout().geometry
    }

    /// Loans a slot of the outgoing pool; waits while all are in flight.
    pub(crate) fn loan(&self, len: usize) -> io::Result<(u32, *mut u8)> {
        let g = self.geometry();
        let Some(msg_tx) = &self.msg_tx else {
            // No pool (or one not carried over by `resume`).
            return Err(io::Error::from_raw_os_error(libc_errno::ENOBUFS));
        };
        if len > g.slot_size as usize {
            return Err(io::Error::from_raw_os_error(libc_errno::EMSGSIZE));
        }
        let mut tx = lock(msg_tx);
        let slot = self.look_then_wait(&mut tx, |h| &mut h.spinner, &self.write_timeout, |tx| self.take_slot(tx))?;
        Ok((slot, self.seg.slot(self.role == Role::Client, slot)))
    }

    /// Gives back a loaned slot that was not sent.
    pub(crate) fn unloan(&self, slot: u32) {
        lock(self.msg_tx.as_ref().expect("a loan implies a pool")).give_back(slot);
    }

    /// Sends a loaned slot holding `len` bytes.
    pub(crate) fn send_slot(&self, slot: u32, len: usize) -> io::Result<()> {
        let mut tx = lock(self.msg_tx.as_ref().expect("a loan implies a pool"));
        // As a write: not after our shutdown or close, nor to a peer that stopped reading, reset
        // or died (the loan may be older than any of those).
        if let Err(e) = self.may_send(&mut tx.writes) {
            // Nothing more is sent on this connection; the slot still goes back to the pool.
            tx.give_back(slot);
            return Err(e);
        }
        tx.msgs.push([slot, len as u32]).map_err(|c| self.corrupt(c))?;
        drop(tx);
        self.wake_peer();
        Ok(())
    }

    fn take_message(&self, rx: &mut MsgRx) -> io::Result<Option<Option<(u32, usize)>>> {
        // As a read: after our own read shutdown (or close, from another thread) end of stream.
        if self.has(READ_SHUT) {
            return Ok(Some(None));
        }
        let g = self.geometry();
        let q = &mut rx.msgs;
        match q.pop().map_err(|c| self.corrupt(c))? {
            Some([slot, len]) => {
                if slot >= g.slot_count || len > g.slot_size {
                    return Err(self.corrupt(Corrupt("message entry out of range")));
                }
                // A load and a store, not a swap (a locked instruction on every message): we hold
                // the receiving lock, so no other take runs, and `release` only clears slots that
                // are held. SYNC POINT with the Release store in `release`: a slot it cleared
                // before handing it back to the peer reads as free here.
                let held = &self.held[slot as usize];
                if held.load(Ordering::Acquire) {
                    return Err(self.corrupt(Corrupt("message in a slot we still hold")));
                }
                held.store(true, Ordering::Relaxed);
                Ok(Some(Some((slot, len as usize))))
            }
            None => {
                if self.has(RESET) {
                    return Err(self.reset_error());
                }
                // PEER_GONE first, as in `try_read`: a peer that set FIN and then hung up is seen
                // with its FIN.
                let gone = self.has(PEER_GONE);
                let flags = self.in_words().producer_flags().map_err(|c| self.corrupt(c))?;
                if flags & FLAG_RESET != 0 {
                    self.set(RESET);
                    return Err(io::ErrorKind::ConnectionReset.into());
                }
                if q.is_ready().map_err(|c| self.corrupt(c))? {
                    return self.take_message(rx);
                }
                if flags & FLAG_FIN != 0 {
                    return Ok(Some(None));
                }
                if gone {
                    // Hung up without FIN: the peer died (as for the byte stream).
                    return Err(io::ErrorKind::ConnectionReset.into());
                }
                Ok(None)
            }
        }
    }

    /// Receives the next message: `(slot, len)`, or `None` at end of stream.
    pub(crate) fn recv_message(&self) -> io::Result<Option<(u32, *const u8, usize)>> {
        let Some(msg_rx) = &self.msg_rx else {
            return Err(io::Error::from_raw_os_error(libc_errno::ENOBUFS));
        };
        let mut rx = lock(msg_rx);
        let r = self.look_then_wait(&mut rx, |h| &mut h.spinner, &self.read_timeout, |rx| self.take_message(rx))?;
        Ok(r.map(|(slot, len)| (slot, self.seg.slot(self.role == Role::Server, slot) as *const u8, len)))
    }

    /// Returns a received slot to the peer.
    pub(crate) fn release(&self, slot: u32) {
        self.held[slot as usize].store(false, Ordering::Release);
        let mut releases = lock(&self.releases);
        if let Some(q) = releases.as_mut() {
            if let Err(c) = q.push([slot]) {
                drop(releases);
                let _ = self.corrupt(c);
                return;
            }
        }
        drop(releases);
        self.wake_peer();
    }

    // ---- settings and facts ------------------------------------------------------------------

    /// Whether a non-blocking operation has drained a ring since the last call. The doorbell is
    /// shared by the reading and the writing half: a poller whose read half drained it must wake
    /// its write half too (and the reverse), or that half may miss its wake-up.
    pub fn take_swallowed(&self) -> bool {
        self.swallowed.swap(false, Ordering::AcqRel)
    }

    /// Non-blocking mode: operations that would wait return `WouldBlock`.
    pub fn set_nonblocking(&self, on: bool) {
        self.nonblocking.store(on, Ordering::Relaxed);
    }
    /// Read timeout (`None`: wait forever).
    pub fn set_read_timeout(&self, t: Option<Duration>) {
        self.read_timeout.store(nanos(t), Ordering::Relaxed);
    }
    /// Write timeout.
    pub fn set_write_timeout(&self, t: Option<Duration>) {
        self.write_timeout.store(nanos(t), Ordering::Relaxed);
    }
    /// Current read timeout.
    pub fn read_timeout(&self) -> Option<Duration> {
        from_nanos(self.read_timeout.load(Ordering::Relaxed))
    }
    /// Current write timeout.
    pub fn write_timeout(&self) -> Option<Duration> {
        from_nanos(self.write_timeout.load(Ordering::Relaxed))
    }
    /// The spin policy in force (after the one-CPU adaptation made at set-up).
    pub fn spin_mode(&self) -> SpinMode {
        lock(&self.rx).spinner.mode()
    }
    /// Changes the spin policy of both halves.
    pub fn set_spin(&self, mode: SpinMode) {
        lock(&self.rx).spinner = spinner(mode);
        lock(&self.tx).spinner = spinner(mode);
        if let Some(m) = &self.msg_rx {
            lock(m).spinner = spinner(mode);
        }
        if let Some(m) = &self.msg_tx {
            lock(m).spinner = spinner(mode);
        }
    }
    /// Which end of the connection we are.
    pub fn role(&self) -> Role {
        self.role
    }
    /// Our address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }
    /// The peer's pid.
    pub fn peer_pid(&self) -> u32 {
        self.peer_pid
    }
    /// The readiness fd: readable when the peer made progress or hung up, or another thread of
    /// ours rang the self bell (an epoll fd holding both bells and the control socket, created on
    /// first use). If it cannot be created (out of descriptors), our end of the doorbell pair
    /// stands in: the peer's progress is still reported, the rest when the next operation looks.
    pub fn readiness_fd(&self) -> &OwnedFd {
        if self.readiness.get().is_none() {
            match Readiness::new(&self.fds.own_bell, &self.fds.self_bell, &self.fds.control, crate::carrier::fd_floor()) {
                Ok(r) => {
                    let _ = self.readiness.set(r);
                }
                Err(e) => {
                    crate::log::info(format_args!("readiness fd: {e}; using the doorbell"));
                    return &self.fds.own_bell;
                }
            }
        }
        self.readiness.get().map_or(&self.fds.own_bell, |r| r.fd())
    }
    /// The control socket.
    pub fn control_fd(&self) -> &OwnedFd {
        &self.fds.control
    }
    /// Bytes a zero-copy message may hold (0: no pool).
    pub fn pool_slot_size(&self) -> usize {
        if self.msg_tx.is_none() { 0 } else { self.geometry().slot_size as usize }
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        // A clean close: FIN and NOT_READING on our direction, READ_CLOSED on theirs, then the
        // control socket closes and the peer sees the hang-up with FIN set.
        let clean = !self.has(RESET | CORRUPT | REFUSED);
        if clean {
            self.shutdown(true, true);
        }
        // The shrinker looks no more (it holds this lock while it looks).
        lock(&self.tx).closed = true;
        let seg = std::mem::replace(&mut self.seg, Segment::placeholder());
        // SAFETY: `fds` is not used after this point (this is the last use of `self` that reads
        // it; the remaining fields never refer to it).
        let Fds { control, own_bell, self_bell } = unsafe { std::mem::ManuallyDrop::take(&mut self.fds) };
        // Before the segment can be unmapped: the watcher holds the address of our word.
        self.hangup.release();
        drop(control);
        let parked = |seg| crate::recycle::Parked::new(seg, own_bell, self_bell);
        match self.recycle.take() {
            Some(Recycle::Client(name)) if clean => crate::recycle::park_client(name, self.peer_pid, parked(seg)),
            Some(Recycle::Server(table)) if clean => match table.upgrade() {
                Some(t) => t.park(self.peer_pid, parked(seg)),
                None => retire(seg),
            },
            // Unmapping a shared mapping is the slowest step of a close (TLB shoot-downs): a
            // background thread does it. Nothing refers to the segment any more.
            _ => retire(seg),
        }
    }
}

/// Drops `seg` on a background thread (unmapping is slow).
pub(crate) fn retire(seg: Segment) {
    reaper::retire(seg);
}

/// The reaper's lock, taken around a fork (see `fork`).
pub(crate) fn reaper_fork_guard() -> Box<dyn std::any::Any> {
    Box::new(reaper::lock())
}

mod reaper {
    use crate::segment::Segment;
    use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
    use std::sync::Mutex;
    use std::time::Duration;

    /// The reaper ends after this long without work (the next retirement starts another): a
    /// server whose accelerated connections are gone (its clients' connections turned out
    /// short-lived, and went plain TCP) is single-threaded again, and the kernel looks up its
    /// descriptors without the reference counting a second thread costs every system call.
    const IDLE: Duration = Duration::from_millis(250);

    /// The reaper's queue and the pid that started it (a forked child starts its own).
    static REAPER: Mutex<Option<(u32, Sender<Segment>)>> = Mutex::new(None);

    pub fn lock() -> std::sync::MutexGuard<'static, Option<(u32, Sender<Segment>)>> {
        REAPER.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops `seg` on the reaper thread (inline if that thread cannot be started).
    pub fn retire(seg: Segment) {
        let me = colo_sys::host::pid();
        let mut r = lock();
        if r.as_ref().is_none_or(|(pid, _)| *pid != me) {
            *r = None;
            crate::fork::protect();
            let (tx, rx) = channel::<Segment>();
            let spawn = || std::thread::Builder::new().name("colo-reaper".into()).spawn(move || run(me, rx));
            if colo_sys::host::with_signals_blocked(spawn).is_ok() {
                *r = Some((me, tx));
            }
        }
        match r.as_ref() {
            Some((_, tx)) => {
                if let Err(e) = tx.send(seg) {
                    drop(e.0);
                }
            }
            None => drop(seg),
        }
    }

    fn run(me: u32, rx: Receiver<Segment>) {
        loop {
            match rx.recv_timeout(IDLE) {
                Ok(seg) => drop(seg),
                Err(RecvTimeoutError::Disconnected) => return,
                Err(RecvTimeoutError::Timeout) => {
                    let mut r = lock();
                    // Retirements are sent under this lock: with none queued, none is coming
                    // to this thread once its queue is taken away.
                    match rx.try_recv() {
                        Ok(seg) => {
                            drop(r);
                            drop(seg);
                        }
                        Err(_) => {
                            if r.as_ref().is_some_and(|(pid, _)| *pid == me) {
                                *r = None;
                            }
                            return;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Shm;
    use crate::{Listener, Options, SpinMode, Stream};
    use colo_ring::notify;
    use std::cell::Cell;
    use std::io::{Read, Write};
    use std::sync::mpsc::channel;
    use std::time::{Duration, Instant};

    /// A thread of one side announces a sleep and has re-checked (nothing yet); the peer's
    /// wake-up comes before it sleeps (so nobody is woken); then `meanwhile` runs on this side,
    /// and the other half of the side (a reader) goes to sleep first. The first thread must look
    /// at its condition again instead of waiting behind the reader for a wake-up that is not
    /// coming (a C echo client's writer hung so, with space in its ring, behind its reader
    /// waiting for the echo of bytes it had not written yet).
    fn first_thread_looks_again(meanwhile: impl FnOnce(&Shm)) {
        let l = Listener::bind("127.0.0.1:0").unwrap();
        let opts = Options::new().spin(SpinMode::Never);
        let a = Stream::connect_with(l.local_addr().unwrap(), &opts).unwrap();
        let (b, _) = l.accept().unwrap();
        let (sa, sb) = (a.shm().unwrap(), b.shm().unwrap());
        let read_one = || {
            let mut byte = [0u8; 1];
            (&a).read(&mut byte).map(|n| (n, byte[0]))
        };
        let until_asleep = || {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !super::lock(&sa.waiters).leader {
                assert!(Instant::now() < deadline, "the reader never went to sleep");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        std::thread::scope(|s| {
            // A first sleep sets up how later ones sleep (the hang-up watcher), and may wake once.
            let warm = s.spawn(read_one);
            until_asleep();
            std::thread::sleep(Duration::from_millis(20));
            (&b).write_all(&[1]).unwrap();
            assert_eq!(warm.join().unwrap().unwrap(), (1, 1));

            // The first thread reads the epoch and announces (and has re-checked: nothing yet).
            let seen = Cell::new(super::lock(&sa.waiters).epoch);
            sa.announce(notify::SLEEP_FUTEX, Some(&seen));
            // The peer makes progress and takes the announcement: nobody is asleep.
            sb.wake_peer();
            meanwhile(sa);
            // The other half reads (nothing to read) and becomes the sleeping leader.
            let reader = s.spawn(read_one);
            until_asleep();
            // The first thread now sleeps: it must come back to look again, not wait.
            let (done, returned) = channel();
            s.spawn(move || {
                let wake = super::Registered::new(sa);
                wake.register();
                done.send(sa.block(None, None, seen.get(), &wake).is_ok()).unwrap()
            });
            let looked_again = returned.recv_timeout(Duration::from_secs(5));
            // Either way, end the reader's sleep (and a stuck first thread's with it).
            (&b).write_all(&[7]).unwrap();
            assert_eq!(reader.join().unwrap().unwrap(), (1, 7));
            assert_eq!(looked_again, Ok(true), "the first thread slept through the wake-up it had lost");
        });
    }

    /// A thread announces a doorbell sleep (its wake-up eventfd registered), the peer rings,
    /// and another thread of the side empties the doorbell before the first sleeps (a
    /// non-blocking call's drain): the first must be woken through its own eventfd, not sleep
    /// on with its ring taken (the shim's `epoll_wait` reader stalled so behind a writer thread).
    #[test]
    fn a_ring_another_thread_empties_reaches_the_sleeper_through_its_own_eventfd() {
        let l = Listener::bind("127.0.0.1:0").unwrap();
        let a = Stream::connect_with(l.local_addr().unwrap(), &Options::new().spin(SpinMode::Never)).unwrap();
        let (b, _) = l.accept().unwrap();
        let (sa, sb) = (a.shm().unwrap(), b.shm().unwrap());
        // The server's welcome on the control socket would end the sleep: take it now.
        sa.poll_control();
        let wake = crate::wake::own_fd().unwrap();
        let registered = super::Registered::new(sa);
        assert!(sa.add_waker(wake));
        registered.fd.set(Some(wake));
        let seen = Cell::new(super::lock(&sa.waiters).epoch);
        sa.announce(notify::SLEEP_DOORBELL, Some(&seen));
        sb.wake_peer();
        std::thread::scope(|s| {
            assert!(s.spawn(|| sa.drain_doorbell(super::Drainer::Awake)).join().unwrap(), "the peer rang");
            let (done, returned) = channel();
            let deadline = Instant::now() + Duration::from_secs(3600);
            s.spawn(move || done.send(sa.block(Some(deadline), None, seen.get(), &registered).is_ok()).unwrap());
            let woken = returned.recv_timeout(Duration::from_secs(5));
            // Either way, end the sleep (a stuck one's too).
            colo_sys::doorbell::ring(&sa.fds.self_bell);
            assert_eq!(woken, Ok(true), "the sleeper slept through the ring another thread took");
        });
    }

    /// The threads waiting on one epoll set register the set's eventfd: it takes one place
    /// however many they are, and stays until the last of them removes it.
    #[test]
    fn an_eventfd_many_sleepers_register_takes_one_place() {
        let l = Listener::bind("127.0.0.1:0").unwrap();
        let a = Stream::connect(l.local_addr().unwrap()).unwrap();
        let sa = a.shm().unwrap();
        // (Numbers only: nothing drains this side's doorbell while they are registered.)
        let (set, others) = (20_000, 20_001..20_008);
        for _ in 0..20 {
            assert!(sa.add_waker(set));
        }
        for fd in others.clone() {
            assert!(sa.add_waker(fd));
        }
        assert!(!sa.add_waker(20_008), "all places are taken");
        for _ in 0..19 {
            sa.remove_waker(set);
        }
        assert!(!sa.add_waker(20_008), "one sleeper on the set is left");
        sa.remove_waker(set);
        assert!(sa.add_waker(20_008), "the last one's removal freed the place");
        for fd in others.chain([20_008]) {
            sa.remove_waker(fd);
        }
        assert!(sa.wakers.iter().all(|w| w.load(std::sync::atomic::Ordering::Relaxed) == 0));
    }

    /// A peer that sends again a slot this side still holds (received, not yet released) is
    /// caught as corrupt, and only that; a slot released and then sent again is a new message.
    #[test]
    fn a_slot_sent_again_while_held_is_corruption_and_once_released_is_not() {
        let l = Listener::bind("127.0.0.1:0").unwrap();
        let a = Stream::connect_with(l.local_addr().unwrap(), &Options::new().pool(64, 2)).unwrap();
        let (b, _) = l.accept().unwrap();
        let (sa, sb) = (a.shm().unwrap(), b.shm().unwrap());
        // Sends `slot` as the peer's queue would carry it, whatever the sender's own books say.
        let send_raw_entry = |slot: u32| {
            let mut tx = super::lock(sa.msg_tx.as_ref().unwrap());
            tx.msgs.push([slot, 8]).unwrap();
        };
        let (slot, _) = sa.loan(8).unwrap();
        sa.send_slot(slot, 8).unwrap();
        let (got, _, len) = sb.recv_message().unwrap().unwrap();
        assert_eq!((got, len), (slot, 8));
        // Released, then sent again (as a peer reusing the slot does): fine.
        sb.release(got);
        send_raw_entry(slot);
        let (again, _, _) = sb.recv_message().unwrap().unwrap();
        assert_eq!(again, slot);
        // Sent again while still held: the receiver reports corruption.
        send_raw_entry(slot);
        let e = sb.recv_message().unwrap_err();
        assert_eq!(crate::errno_of(&e), 71, "EPROTO, got {e:?}");
        assert!(e.to_string().contains("still hold"), "{e}");
    }

    /// The reader's own announcement finds the word woken.
    #[test]
    fn a_wake_up_taken_before_the_sleep_is_not_lost_behind_the_other_half() {
        first_thread_looks_again(|_| {});
    }

    /// A third announcement finds the word woken and its look then succeeds (or it was a
    /// non-blocking call's): it does not sleep, and the reader's announcement after it is not
    /// fresh. The fresh one must still send the first thread round.
    #[test]
    fn a_fresh_announcement_whose_look_succeeded_still_sends_the_others_round() {
        first_thread_looks_again(|sa| {
            sa.announce(notify::SLEEP_DOORBELL, None);
        });
    }
}
