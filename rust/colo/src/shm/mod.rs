//! One side of a shared-memory connection: the byte stream, zero-copy messages, shutdown, and
//! every way it can fail (spec/WIRE.md sections 5 to 8).
//!
//! The reading half (consumer, incoming messages) and the writing half (producer, outgoing
//! messages) each sit behind their own mutex, so one thread may read while another writes, as with
//! a TCP socket. Blocking waits go through [`Shm::block`]: one thread at a time sleeps in the
//! readiness epoll (the *leader*); any other waiting thread sleeps on a condvar and is woken
//! whenever the leader wakes, because the doorbell and the `waiting` flag are shared by both halves.
//!
//! This file holds the side itself: its state, its construction and the signals it exchanges
//! with the peer. The rest is one file a section:
//! - `wakers`: who empties the doorbell, and the wake-up eventfds of the threads asleep on it;
//! - `wait`: the sleep protocol of spec/WIRE.md section 6 (leader, followers, futex, doorbell);
//! - `stream`: the byte stream (read, write, shutdown);
//! - `message`: zero-copy messages (loan, send, receive, release);
//! - `tcp`: what kernel TCP does that the LD_PRELOAD shim mirrors;
//! - `settings`: timeouts, spinning, addresses and descriptors.

mod message;
mod quiet;
mod settings;
mod stream;
mod tcp;
mod wait;
mod wakers;
#[cfg(test)]
mod tests;

use crate::segment::{InBytes, Role, Segment};
use colo_ring::layout::{FLAG_FIN, FLAG_NOT_READING, FLAG_READ_CLOSED, FLAG_RESET};
use colo_ring::notify;
use colo_ring::queue::{QueueReceiver, QueueSender};
use colo_ring::ring::{Consumer, Producer, RawBytes, RingWords};
use colo_ring::snapshot::RingState;
use colo_ring::spin::{SpinMode, Spinner};
use colo_ring::sync::{AtomicU32, Ordering};
use colo_ring::Corrupt;
use colo_sys::doorbell::{self, Readiness};
use colo_sys::OwnedFd;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64};
use crate::fork::ForkableMutex;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::error::{eproto, libc_errno};
pub use wakers::{Drainer, UNPASSED_SLEEP};
use wakers::WAKERS;

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

struct RxHalf {
    ring: Consumer<InBytes>,
    spinner: Spinner,
}

struct TxHalf {
    ring: Producer<RawBytes>,
    spinner: Spinner,
    /// Writes so far, wrapping (see `Shm::notice_hangup`).
    writes: u32,
    /// The program's bound on the ring's growth (`Shm::set_send_buffer`), kept across resumes.
    limit: Option<usize>,
    /// A server's bound on the bytes its ring holds unread (`Producer::set_bound`), kept
    /// across resumes, which read the ring's size back from the segment.
    bound: Option<usize>,
    /// Whether the shrinker looks at this ring (it grew); `writes` at its last look.
    watched: bool,
    looked_at: u32,
    /// The connection closed: the shrinker must not touch the ring.
    closed: bool,
    /// `crate::fork::forks()` when this end was made, `u64::MAX` for an end taken over across
    /// `exec`: an end another process may hold too never shrinks (that process could be writing
    /// at the old size while the ring shrinks).
    born: u64,
    pages: quiet::TxPages,
}

impl TxHalf {
    /// After the ring was resumed from the segment's words: the bound and the limit again.
    fn bounds_again(&mut self) {
        if let Some(bound) = self.bound {
            self.ring.set_bound(bound);
        }
        if let Some(limit) = self.limit {
            self.ring.set_limit(limit);
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
    /// Slots of the outgoing pool never loaned: `fresh..slot_count` are free.
    fresh: u32,
    /// Slots taken back (released by the peer, or loaned and not sent), free to loan again: no
    /// more than the slots loaned so far, so its size follows the pool's use, not its size.
    free_slots: Vec<u32>,
    /// Slots loaned or sent and not yet released by the peer, a bit a slot. Sized by the peer's
    /// choice of `slot_count` (up to 65536: 8 KiB), it is made at the first loan
    /// (`Shm::take_slot`), so that a connection whose program never loans (every one of the
    /// shim's) costs none of it.
    in_flight: Vec<u64>,
    spinner: Spinner,
    /// Loans and sends so far, wrapping (see `Shm::notice_hangup`).
    writes: u32,
}

/// Zero-copy messages, both ways: boxed, as a byte stream (every connection of the LD_PRELOAD
/// shim) has no pool and pays a pointer for them.
struct Messages {
    rx: ForkableMutex<MsgRx>,
    tx: ForkableMutex<MsgTx>,
    releases: ForkableMutex<QueueSender<1>>,
    /// Slots of the incoming pool the application holds (received, not yet released), a bit a
    /// slot; outside the reading half's lock, so a release never waits for a blocked reader.
    /// Made at the first receive, as `MsgTx::in_flight` at the first loan.
    held: std::sync::OnceLock<Box<[std::sync::atomic::AtomicU64]>>,
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
    /// The control socket: our doorbell (we wait on it; a one-byte datagram sent on it rings
    /// the peer) and the peer's liveness (its hang-up).
    pub control: OwnedFd,
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


/// One side of an established shared-memory connection.
pub struct Shm {
    /// The most bytes the outgoing ring holds unread (its producer's limit: a server's bound,
    /// a program's `SO_SNDBUF`), for readiness without the writing half's lock
    /// ([`Shm::send_room`]).
    out_room: AtomicU64,
    /// A program's `SO_SNDBUF` (`Shm::set_send_buffer`) not yet applied to the writing half,
    /// whose lock a write held (0: none). A call that asks for it never waits for that lock: a
    /// blocking write holds it while it waits for room, which may come only after the asker's
    /// read. The write applies it once it holds the lock. (32 bits: the ring's capacity bounds
    /// it far below.)
    send_buffer_asked: AtomicU32,
    rx: ForkableMutex<RxHalf>,
    /// Shared with the shrinker (`crate::shrink`) once the ring grows.
    tx: std::sync::Arc<ForkableMutex<TxHalf>>,
    /// The message halves; `None` without a pool.
    msgs: Option<Box<Messages>>,
    role: Role,
    state: AtomicU32,
    /// A word outside the segment that every process holding this side shares (the LD_PRELOAD
    /// shim's holders page, kept by fork copies) and the bit in it that says one of them shut
    /// down reading (`Shm::share_read_shut`); null: none.
    shared_read_shut: std::sync::atomic::AtomicPtr<AtomicU32>,
    shared_read_shut_bit: AtomicU32,
    nonblocking: AtomicBool,
    /// `SO_PEEK_OFF`: where the next peek starts, past the first unread byte (-1: at it, and
    /// peeks move nothing). Peeks move it on, reads back (`Shm::recv`), under the reading half's
    /// lock; `SO_PEEK_OFF` sets it without (`Shm::set_peek_off`): a read under way goes on from
    /// the offset it found (Relaxed).
    peek_off: AtomicI32,
    /// A non-blocking operation drained a ring that may have been meant for the other half.
    swallowed: AtomicBool,
    /// This process rang the self bell to keep it readable and no drain of this process has
    /// emptied it since (`Shm::keep_self_rung`, `Shm::drain_doorbell`).
    kept_rung: AtomicBool,
    /// Wake-up eventfds (`crate::wake`) of the threads asleep on this side's doorbell (this
    /// crate's blocking calls; the shim's `poll`, `select` and `epoll_wait`), with their pids
    /// and counts (`WAKER_COUNT`): a drain of the doorbell rings them (see `drain_doorbell`).
    /// The pid keeps a forked child, which inherits this memory, from ringing its parent's.
    wakers: [AtomicU64; WAKERS],
    read_timeout: AtomicU64,
    write_timeout: AtomicU64,
    waiters: ForkableMutex<Waiters>,
    woken: Condvar,
    /// Wakes a futex sleep when the control socket becomes readable (see `hangup`).
    hangup: crate::hangup::Watch,
    /// Created on first use: blocking waits poll the two fds directly.
    readiness: std::sync::OnceLock<Readiness>,
    /// Dropped by hand in `drop`, where the self bell may be parked for reuse.
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

pub use tcp::{continues_blocking_call, interrupted_ends_wait, set_interrupt_policy, signals_end_waits};

/// Has the incoming ring read through the segment's memfd when the peer is another user, or
/// cannot be told (`Segment::read_through_memfd`: what a peer of another user could make us
/// hold otherwise). A peer of our own user could make us hold memory as well by allocating it
/// itself.
fn read_through_if_foreign(seg: &mut Segment, fds: &Fds) {
    let foreign = colo_sys::pathsock::peer_cred_any(&fds.control).map_or(true, |(_, uid)| uid != colo_sys::host::uid());
    if foreign {
        seg.read_through_memfd();
    }
}

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
        let mut seg = seg;
        read_through_if_foreign(&mut seg, &fds);
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
        let mut seg = seg;
        read_through_if_foreign(&mut seg, &fds);
        // SAFETY: as in `new`; the earlier image that used these ends is gone (exec replaced it).
        let views = unsafe { (seg.resumed_consumer(role), seg.resumed_producer(role), None) };
        let shm = Shm::build(seg, views, role, fds, local, peer, peer_pid, spin)?;
        lock(&shm.tx).born = u64::MAX;
        // The flags as each half would see them outside its lock (`RingState`: the peer's with
        // Acquire, our own as their producer), and our `read_flags` (`RingWords::read_flags`).
        let out_flags = RingState::producer_view(&shm.out_words).flags;
        let in_flags = RingState::consumer_view(&shm.in_words).flags;
        let in_read = shm.in_words.read_flags();
        if out_flags & FLAG_FIN != 0 {
            shm.set(WRITE_SHUT);
        }
        if in_read & FLAG_READ_CLOSED != 0 {
            shm.set(READ_SHUT | READ_TOLD);
            // An exec between the two stores of `shutdown` leaves READ_CLOSED without its mirror.
            if out_flags & FLAG_NOT_READING == 0 {
                shm.signal(FLAG_NOT_READING);
            }
        }
        if (out_flags | in_flags) & FLAG_RESET != 0 {
            shm.set(RESET);
        }
        Ok(shm)
    }

    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn build(
        mut seg: Segment,
        views: (
            Consumer<InBytes>,
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
        let (ring_in, mut ring_out, queues) = views;
        seg.close_memfd_unless_kept();
        let g = seg.layout().geometry;
        // The client chose the geometry, `ring_capacity` included (up to 64 MiB a direction):
        // a server's outgoing ring grows no further than what its own TCP socket would buffer
        // (`default_ring`), so that a client that never reads holds no more of the server's
        // memory than over TCP (the pages a ring grows into are the server's, which writes them
        // first), nor holds more unread whatever size the client wrote in the ring's shared
        // word. A program's `SO_SNDBUF` (`set_send_buffer`) still sets the bound.
        let limit = (role == Role::Server && g.ring_capacity > crate::options::default_ring()).then(|| {
            let bound = crate::options::default_ring() as usize;
            ring_out.set_bound(bound);
            bound
        });
        let spin = if spin != SpinMode::Always && colo_sys::host::share_one_cpu(peer_pid) { SpinMode::Never } else { spin };
        let msgs = queues.map(|((msgs, frees), (incoming, releases))| {
            Box::new(Messages {
                rx: ForkableMutex::new(MsgRx { msgs: incoming, spinner: spinner(spin) }),
                tx: ForkableMutex::new(MsgTx {
                    msgs,
                    frees,
                    fresh: 0,
                    free_slots: Vec::new(),
                    in_flight: Vec::new(),
                    spinner: spinner(spin),
                    writes: 0,
                }),
                releases: ForkableMutex::new(releases),
                held: std::sync::OnceLock::new(),
            })
        });
        let out_room = AtomicU64::new(ring_out.bound() as u64);
        Ok(Shm {
            out_room,
            send_buffer_asked: AtomicU32::new(0),
            rx: ForkableMutex::new(RxHalf { ring: ring_in, spinner: spinner(spin) }),
            tx: std::sync::Arc::new(ForkableMutex::new(TxHalf {
                pages: quiet::TxPages::new(&seg, role),
                ring: ring_out,
                spinner: spinner(spin),
                writes: 0,
                limit,
                bound: limit,
                watched: false,
                looked_at: 0,
                closed: false,
                born: {
                    crate::shrink::count_forks();
                    crate::fork::forks()
                },
            })),
            msgs,
            role,
            state: AtomicU32::new(0),
            shared_read_shut: std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()),
            shared_read_shut_bit: AtomicU32::new(0),
            nonblocking: AtomicBool::new(false),
            peek_off: AtomicI32::new(-1),
            swallowed: AtomicBool::new(false),
            kept_rung: AtomicBool::new(false),
            wakers: [const { AtomicU64::new(0) }; WAKERS],
            read_timeout: AtomicU64::new(0),
            write_timeout: AtomicU64::new(0),
            waiters: ForkableMutex::new(Waiters::default()),
            woken: Condvar::new(),
            hangup: crate::hangup::Watch::new(),
            readiness: std::sync::OnceLock::new(),
            fds: std::mem::ManuallyDrop::new(fds),
            recycle: None,
            local,
            peer,
            peer_pid,
            rendezvous: None,
            // SAFETY: stored beside `seg`, which is dropped after them (declared last).
            out_words: unsafe { seg.ring_words(role == Role::Client) },
            // SAFETY: as above.
            in_words: unsafe { seg.ring_words(role == Role::Server) },
            seg,
        })
    }

    fn has(&self, bits: u32) -> bool {
        // SYNC POINT with the read-modify-writes of `state` (`set`, `poll_control`): a thread that
        // sees a bit sees what its setter did before (the control socket read, the flag stored).
        self.state.load(Ordering::Acquire) & bits != 0
    }

    fn set(&self, bits: u32) {
        // SYNC POINT with the Acquire load in `has`.
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
        self.wake_with(notify::peer_needs_space_wake(peer, || rx.ring.space_wake_crossed(before)));
    }

    /// Whether the peer has announced a sleep since our last progress woke it (it paused:
    /// spec/WIRE.md section 6, "Waiting for space"). A read-modify-write that leaves the word
    /// as it is: SYNC POINT with the peer's announcement and its `release_space_waiter`, so that
    /// of the peer pausing after our announcement and us sleeping after its look, one sees the
    /// other.
    /// Whether a sleep of this side stands announced (a sleep bit of our own `waiting` word is
    /// set, if stale: a spurious yes only costs a locked operation in `peer_paused`).
    pub(super) fn announced(&self) -> bool {
        self.own_waiting().load(Ordering::Relaxed) & (notify::SLEEP_DOORBELL | notify::SLEEP_FUTEX) != 0
    }

    pub(super) fn peer_paused(&self) -> bool {
        self.seg.waiting(self.other()).fetch_or(0, Ordering::AcqRel) & (notify::SLEEP_DOORBELL | notify::SLEEP_FUTEX) != 0
    }

    /// Called right after this side announced a sleep (it pauses): wakes a peer that waits for
    /// space our reads freed but did not wake it for, as they stayed above its mark
    /// (`RingWords::space_wake_owed`). Plain loads unless something is owed: if our
    /// announcement comes before the producer's `peer_paused` in our word's order, the producer
    /// sees our bit and takes the space itself; otherwise our announcement read its
    /// read-modify-write (SYNC POINT), and the loads see the head and mark it stored before.
    /// The peer's `waiting` word is looked at first, as it changes only when the peer
    /// announces: a peer that announced before its `peer_paused` shows its bit to us in the
    /// second case above, and the ring's words, which a busy producer keeps writing, are loaded
    /// only then.
    pub(super) fn release_space_waiter(&self) {
        let peer = self.seg.waiting(self.other());
        if peer.load(Ordering::Relaxed) & (notify::SLEEP_DOORBELL | notify::SLEEP_FUTEX) != 0
            && self.in_words().space_wake_owed()
        {
            // SYNC POINT with the RMW in the peer's `notify::announce_sleep`.
            self.wake_with(notify::peer_needs_wake(peer));
        }
    }

    fn wake_with(&self, bits: u32) {
        let peer = self.seg.waiting(self.other());
        if bits & notify::SLEEP_FUTEX != 0 {
            colo_sys::futex::wake_all(peer);
        }
        if bits & notify::SLEEP_DOORBELL != 0 {
            doorbell::ring_peer(&self.fds.control);
        }
    }

    fn other(&self) -> Role {
        if self.role == Role::Client { Role::Server } else { Role::Client }
    }

    fn in_words(&self) -> RingWords {
        self.in_words
    }

    /// Sets bits of our outgoing ring's flags without taking a half's lock (a blocked reader or
    /// writer may hold it), then wakes the peer as any progress does (spec section 6): a sleeper
    /// that announced before the exchange is woken by the bits it returns; one that announces
    /// after it sees the flag in its re-check. A close wakes no one who is not asleep (a
    /// connection per request pays no system call for it).
    fn signal(&self, bits: u32) {
        // Release (`RingWords::raise_flags`): what this side published before the flag (its last
        // bytes before FIN) is visible to the peer's Acquire loads of it.
        self.out_words.raise_flags(bits);
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
            self.signal(FLAG_RESET);
            self.wake_self();
        }
        eproto(c)
    }

    /// A look at the rings from outside the halves (the shim's readiness, which loads the
    /// shared words, this side's own counters and flags among them, since other holders of this
    /// end move them too) found them `corrupt` or a RESET bit in either direction's flags: the
    /// connection is reset as a read or write that found that would reset it (RESET, and
    /// CORRUPT with the peer told), so that the calls that look said were ready fail rather than
    /// find nothing to do. A peer that wrote our own words could otherwise leave a poller told
    /// "readable" whose reads would block, at every wait, for as long as it liked.
    pub fn found_in_view(&self, corrupt: bool) {
        if corrupt {
            let _ = self.corrupt(Corrupt("ring counters out of range"));
        } else if !self.has(RESET) {
            self.set(RESET);
            self.wake_self();
        }
    }

    /// The server claimed a CARRIER offer and its answer has not come yet: it is taken off the
    /// control socket, as the first datagram, whenever it comes (as a pending connection's,
    /// `expect_welcome`), so that nothing waits for it: the claim word, which the server can
    /// write at any time, is its word that it took the connection.
    pub fn answer_due(&self) {
        self.set(AWAITING_WELCOME);
    }

    /// Parks the segment in `r` when the connection closes cleanly.
    pub(crate) fn recycle_into(&mut self, r: Recycle) {
        self.recycle = Some(r);
    }

    /// The listener (rendezvous `name`, remembered as answering DIRECT once its WELCOME comes)
    /// has not answered the HELLO yet: its answer will come on the control socket.
    pub(crate) fn expect_welcome(&mut self, name: Option<String>) {
        self.rendezvous = name;
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

    /// Whether the hang-up watcher watches this connection's control socket (registers it at
    /// the first call in this process image; see `hangup::Watch::armed`).
    pub(crate) fn watched(&self) -> bool {
        self.hangup.armed(&self.fds.control, &self.fds.self_bell, self.own_waiting())
    }

    /// Whether the control socket is known not to have hung up since it was last looked at,
    /// without a system call: the hang-up watcher watches it and has not seen it hang up. False
    /// when that cannot be vouched for: no watcher here, the first call (which registers the
    /// connection: the watcher has not looked yet), an answer to the HELLO still due, the peer
    /// known gone, or the watcher's mark set. A set mark is taken and the control socket read
    /// now (the caller then sees `PEER_GONE` if the peer hung up), and watching resumes if the
    /// peer is still there. The watcher rings our self bell when it sets the mark, so a waiter
    /// on the readiness fd that saw a hang-up before the watcher did, and whose read was told
    /// "silent", is woken again to read once more.
    pub fn control_silent(&self) -> bool {
        if self.has(PEER_GONE | AWAITING_WELCOME) {
            return false;
        }
        if !self.hangup.watching() {
            self.watched();
            return false;
        }
        !self.take_hangup_mark()
    }

    /// If the hang-up watcher marked this connection: takes the mark, reads the control socket,
    /// and either wakes our own sleepers (the peer is gone) or watches again; returns whether
    /// there was a mark.
    pub(super) fn take_hangup_mark(&self) -> bool {
        if !self.hangup.take_fired() {
            return false;
        }
        self.poll_control();
        if self.has(PEER_GONE) {
            // The mark was a futex sleeper's too (one the watcher woke may not have looked yet):
            // woken whatever the shared word holds, as the peer may have cleared its bit.
            self.wake_self();
            colo_sys::futex::wake_all(self.own_waiting());
        } else {
            self.hangup.rearm(&self.fds.control);
        }
        true
    }

    /// Stops the background threads' looks at this connection, for a caller that closes its
    /// descriptors and unmaps its segment without dropping it (the shim, when a forked process
    /// still holds the connection): the hang-up watcher holds the address of our `waiting` word
    /// and the number of our self bell until then, and the shrinker, which holds the writing
    /// half, would read the unmapped ring at its next look (a `SIGSEGV` in its thread).
    pub fn let_go_unmapped(&self) {
        // The shrinker looks no more (it holds this lock while it looks), as in `drop`.
        lock(&self.tx).closed = true;
        self.hangup.release();
    }

    /// For the connection's last holder that ends it and then exits without dropping it (the
    /// shim's relay): gives back the segment's pages as the drop would, and waits (blocking)
    /// while bytes we wrote that a peer of another user has yet to read would be kept after the
    /// drop, until it read them or lost them (`Segment::let_go_before_exit`). Call it after the
    /// close's flags are set and before the exit; the connection is not used afterwards.
    pub fn let_go_before_exit(&self) {
        let out_size = {
            let mut tx = lock(&self.tx);
            tx.closed = true;
            tx.ring.size()
        };
        let out = RingState::producer_view(&self.out_words);
        let held = out.head != out.tail || self.seg.peer_holds_messages(self.role);
        let gone = self.has(PEER_GONE) || (held && doorbell::hung_up(&self.fds.control));
        self.hangup.release();
        self.seg.let_go_before_exit(self.role, gone, out_size, || doorbell::hung_up(&self.fds.control));
    }

    /// Whether the peer's hang-up (or a reset of the handshake) is known here, however it was
    /// learned (a drain of the doorbell, the hang-up watcher's mark, a look at the control
    /// socket): no system call.
    pub fn known_hung_up(&self) -> bool {
        self.has(PEER_GONE)
    }

    /// Looks at the control socket now, for a caller that learned of a hang-up by other means (the
    /// shim's `poll`): the next read or write reports it, without waiting for the hang-up
    /// watcher's mark (`control_silent`).
    pub fn read_control(&self) {
        self.poll_control();
    }

    /// Looks at the control socket without blocking: for the answer to the HELLO while it is
    /// due (the first datagram), else for the peer's hang-up, without reading (rings queued
    /// before it are the drains'; `doorbell::hung_up`). One system call.
    fn poll_control(&self) {
        if self.has(PEER_GONE) {
            return;
        }
        if self.has(AWAITING_WELCOME) {
            self.on_datagram(doorbell::take_one(&self.fds.control));
        } else if doorbell::hung_up(&self.fds.control) {
            self.set(PEER_GONE);
        }
    }

    /// Acts on a datagram of the control socket that is not a ring (spec section 6): the answer
    /// to the HELLO while it is due, the peer's hang-up, or a protocol error (a reset).
    pub(super) fn on_datagram(&self, d: doorbell::Datagram) {
        use doorbell::Datagram;
        match d {
            Datagram::Nothing => {}
            Datagram::HungUp => self.set(PEER_GONE),
            Datagram::Message(m) if self.has(AWAITING_WELCOME) => {
                // SYNC POINT with the Acquire load in `has`, as in `set`.
                self.state.fetch_and(!AWAITING_WELCOME, Ordering::AcqRel);
                match crate::wire::Message::decode(&m) {
                    Ok(crate::wire::Message::Welcome { version: crate::wire::VERSION }) => {
                        if let Some(name) = &self.rendezvous {
                            crate::known::remember_direct(name.clone(), self.peer_pid);
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
            // Taken by a look at the control socket while the answer seemed due (another thread
            // had just taken the answer): passed on to our sleepers, whose drain of the self
            // bell hands it to every registered one (`drain_doorbell`).
            Datagram::Ring => doorbell::ring(&self.fds.self_bell),
            Datagram::Message(_) | Datagram::Garbage => {
                // A second answer, anything else: spec section 8, a reset (ECONNRESET), not a
                // corruption of the segment.
                self.set(PEER_GONE);
                if !self.has(RESET) {
                    self.set(RESET);
                    self.signal(FLAG_RESET);
                    self.wake_self();
                }
            }
        }
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
        // The shrinker looks no more (it holds this lock while it looks); the size our writes
        // reached is what the give-back below looks at.
        let out_size = {
            let mut tx = lock(&self.tx);
            tx.closed = true;
            tx.ring.size()
        };
        let mut seg = std::mem::replace(&mut self.seg, Segment::placeholder());
        // SAFETY: `fds` is not used after this point (this is the last use of `self` that reads
        // it; the remaining fields never refer to it).
        let Fds { control, self_bell } = unsafe { std::mem::ManuallyDrop::take(&mut self.fds) };
        // Bytes we wrote that the peer has not read, and messages of ours it holds, are nobody's
        // once it hung up (one look at the control socket, only then), as they are once its
        // hang-up is known.
        let out = RingState::producer_view(&self.out_words);
        let held = out.head != out.tail || seg.peer_holds_messages(self.role);
        seg.give_back_incoming(self.role, self.has(PEER_GONE) || (held && doorbell::hung_up(&control)), out_size);
        // Before the segment can be unmapped: the watcher holds the address of our word.
        self.hangup.release();
        // Descriptors the peer queued are closed disarmed now, not released by the close (a
        // lingering socket's release would wait here: `colo_sys::gift`).
        doorbell::empty_before_close(&control);
        drop(seg.keep_control(control));
        let parked = |seg| crate::recycle::Parked::new(seg, self_bell);
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
    crate::reaper::retire(seg);
}
