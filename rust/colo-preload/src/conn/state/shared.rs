//! What every process holding a connection shares, as a kernel socket's state is one for all of
//! them: the turns of its readers and writers (`turns`), and the socket's `SO_RCVLOWAT` and
//! `SO_SNDBUF`, kept in the holders page (`holders`).

use super::{Conn, IN, OUT, READING, WRITING};
use crate::conn::holders::{millis, LOWAT, READ_TURN, READ_TURN_WAITERS, SNDBUF, TURN, TURN_WAITERS};
use crate::conn::turns;
use colo::internal::shm::Drainer;
use colo_ring::sync::Ordering;
use std::sync::atomic::AtomicU32;

/// How long a non-blocking write waits for the turn while the ring has room (`try_write_turn`).
const NB_TURN_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

impl Conn {
    /// A turn to write (`turns`), for a connection another process has held (a fork copy);
    /// `None` (no cost) for one only this process ever held. Waited for as a blocking write
    /// waits for room: at most the socket's `SO_SNDTIMEO` (`EAGAIN`), ended by a signal as the
    /// shim's policy says (`EINTR`: `turns::take_for_call`).
    pub fn write_turn(&self) -> std::io::Result<Option<turns::Turn<'_>>> {
        if let Some(alone) = self.alone(WRITING) {
            return Ok(Some(alone));
        }
        self.adopt_shared();
        // Bytes a relayed program wrote before it exited go first (`holders::wait_forwarded`).
        self.holders.wait_forwarded();
        turns::take_for_call(self.holders.word(TURN), self.holders.word(TURN_WAITERS), self.shm().write_timeout()).map(Some)
    }

    /// The readers' turn, for a read that consumes (`turns`): taken only once a second process
    /// held the connection, for the whole call, so that two processes reading at once take
    /// disjoint bytes, as from a kernel socket. A blocking read waits for it as for bytes: at
    /// most the socket's `SO_RCVTIMEO`, ended by a signal as the shim's policy says
    /// (`turns::take_for_call`). A read that must not wait (`nonblocking`) waits for it only
    /// while the ring holds bytes (its holder is reading them, and done soon), at most
    /// `NB_TURN_WAIT`; while the holder waits for bytes, as this read would, `EAGAIN`.
    pub fn read_turn(&self, nonblocking: bool) -> std::io::Result<Option<turns::Turn<'_>>> {
        if let Some(alone) = self.alone(READING) {
            return Ok(Some(alone));
        }
        self.adopt_shared();
        let (word, waiters) = (self.holders.word(READ_TURN), self.holders.word(READ_TURN_WAITERS));
        if !nonblocking {
            return turns::take_for_call(word, waiters, self.shm().read_timeout()).map(Some);
        }
        self.nonblocking_turn(word, waiters, IN)
    }

    /// [`Conn::write_turn`] for a write that must not wait while the turn's holder waits for
    /// room in the ring, as it would: `Err` (`WouldBlock`) then. It waits for the turn only
    /// while the ring has room (its holder is writing, and done soon), at most `NB_TURN_WAIT`,
    /// and leaves a wake-up armed when it gives up, so that readiness reports the room.
    pub fn try_write_turn(&self) -> std::io::Result<Option<turns::Turn<'_>>> {
        if let Some(alone) = self.alone(WRITING) {
            return Ok(Some(alone));
        }
        self.adopt_shared();
        self.holders.wait_forwarded();
        let (word, waiters) = (self.holders.word(TURN), self.holders.word(TURN_WAITERS));
        self.nonblocking_turn(word, waiters, OUT)
    }

    /// Before `fork`: the child must not take a ring over while a call of this process that
    /// began without a turn (the connection was not shared then) is still inside it, or both
    /// would consume (or produce) one ring at once. Marks the connection shared, so that calls
    /// that begin from now on take turns, and takes the turn of each direction such a call is
    /// under way in, on its behalf: [reading, writing], as taken. `give_back_turns` releases
    /// them once those calls have ended.
    pub fn lend_turns(&self) -> [bool; 2] {
        self.holders.mark_shared();
        // SYNC POINT: SeqCst, with `turns::alone` (see there).
        let under_way = |d: usize| self.alone[d].0.load(Ordering::SeqCst) > 0;
        [under_way(READING) && turns::lend(self.holders.word(READ_TURN)), under_way(WRITING) && turns::lend(self.holders.word(TURN))]
    }

    /// Releases the turns `lend_turns` took, once the calls they were taken for have ended
    /// (`wait`; else at once). Marked shared, the connection starts no call without a turn.
    pub fn give_back_turns(&self, lent: [bool; 2], wait: bool) {
        let me = colo_sys::host::pid();
        for (d, turn, waiters) in [(READING, READ_TURN, READ_TURN_WAITERS), (WRITING, TURN, TURN_WAITERS)] {
            if !lent[d] {
                continue;
            }
            // Acquire: pairs with the Release of each call's end (`turns::Turn`'s drop).
            while wait && self.alone[d].0.load(Ordering::Acquire) > 0 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            turns::give_back(self.holders.word(turn), self.holders.word(waiters), me);
        }
    }

    /// A call in direction `d` of a connection no other process has held: counted, with no turn
    /// (`turns::alone`); `None` once it is shared.
    pub(super) fn alone(&self, d: usize) -> Option<turns::Turn<'_>> {
        if self.holders.ever_shared() {
            return None;
        }
        turns::alone(&self.alone[d].0, self.holders.shared_word())
    }

    /// A call begins on a connection another process has held: what another holder changed
    /// of the socket (a write shutdown, its timeouts, its `SO_SNDBUF`) is taken on, as a kernel
    /// socket's state is one for every process holding it.
    fn adopt_shared(&self) {
        self.shm.adopt_write_shut();
        // Timeouts another holder set (`options::set_timeout`), for this copy only.
        for write in [false, true] {
            let (ms, own) = (self.holders.timeout_ms(write), if write { self.shm.write_timeout() } else { self.shm.read_timeout() });
            if ms != millis(own) {
                let t = (ms != 0).then(|| std::time::Duration::from_millis(ms.into()));
                if write { self.shm.set_write_timeout(t) } else { self.shm.set_read_timeout(t) }
            }
        }
        // Relaxed: the word is the whole message (see `send_limit_now`).
        let room = self.holders.word(SNDBUF).load(Ordering::Relaxed);
        if room != 0 && room != self.send_limit.load(Ordering::Relaxed) {
            self.limit_sends(room);
        }
    }

    /// The turn in `word` for a call that must not wait while its holder waits as the call
    /// would: taken if free; waited for only while the ring is `ready` for the call (its holder
    /// is moving bytes, and done soon), at most `NB_TURN_WAIT`; else `EAGAIN`, with a wake-up
    /// armed (`arm`) so that readiness reports the change.
    fn nonblocking_turn<'a>(&'a self, word: &'a AtomicU32, waiters: &'a AtomicU32, ready: u32) -> std::io::Result<Option<turns::Turn<'a>>> {
        turns::take_while(word, waiters, NB_TURN_WAIT, || self.arm(Drainer::Awake, true) & ready != 0)
            .map(Some)
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EAGAIN))
    }

    /// `SO_RCVLOWAT` (`n` >= 1): readable from this many bytes on. The socket's, in the holders page: one for every process holding it, as the kernel's.
    pub fn set_lowat(&self, n: u32) {
        // Relaxed (and the loads): each word is the whole message.
        self.holders.word(LOWAT).store(n.max(1), Ordering::Relaxed);
        self.lowat.store(n.max(1), Ordering::Relaxed);
    }

    /// `SO_RCVLOWAT` (0 in a fresh page and a fresh copy: the default, 1): this copy's, or once
    /// another process held the connection, the socket's in the holders page (as `nonblocking`).
    pub fn lowat(&self) -> usize {
        let word = if self.holders.ever_shared() { self.holders.word(LOWAT) } else { &self.lowat };
        word.load(Ordering::Relaxed).max(1) as usize
    }

    /// Bytes the outgoing ring takes now without waiting (it only grows until we write), within
    /// a small `SO_SNDBUF`'s bound.
    pub fn space(&self) -> usize {
        // Corrupt counters: no room (the write that follows reports the corruption).
        self.outgoing().used(self.shm.ring_capacity()).map_or(0, |used| self.send_room().saturating_sub(used)) as usize
    }

    /// How many bytes may wait in the outgoing ring: its limit (a server's ring grows no
    /// further than its own bound, whatever capacity the client chose: a poller told the
    /// connection is writable beyond it would find its write taking nothing, and poll again at
    /// once, a full core), or less after a small `SO_SNDBUF` (`set_send_limit`).
    pub(super) fn send_room(&self) -> u64 {
        match self.send_limit_now() {
            0 => self.shm.send_room(),
            l => l.min(self.shm.send_room()),
        }
    }

    /// What a small `SO_SNDBUF` lets a non-blocking writer queue (0: the ring): this copy's, or
    /// once another process held the connection, the socket's in the holders page (as `lowat`).
    fn send_limit_now(&self) -> u64 {
        if self.holders.ever_shared() {
            // Relaxed (and the store in `set_send_limit`): the word is the whole message.
            return self.holders.word(SNDBUF).load(Ordering::Relaxed).into();
        }
        self.send_limit.load(Ordering::Relaxed).into()
    }

    /// `SO_SNDBUF` of `n` bytes: a non-blocking writer queues about what kernel TCP would before
    /// `EAGAIN` (the kernel doubles the value, and the peer's receive queue takes about as much
    /// again), and poll reports writable below that. Blocking writes still fill the ring.
    pub fn set_send_limit(&self, n: usize) {
        let room = u32::try_from((n as u64).saturating_mul(4).max(4096)).unwrap_or(u32::MAX);
        self.holders.word(SNDBUF).store(room, Ordering::Relaxed);
        self.limit_sends(room);
    }

    /// This copy's part of `set_send_limit`: its ring, and what it lets a writer queue.
    fn limit_sends(&self, room: u32) {
        // The ring's bound and `space_wake` mark first (now, or by the write that holds the
        // writing half: `Shm::set_send_buffer` never waits for it), then the room; then a poke:
        // a poller that slept against the old room looks again (as a kernel socket's pollers are
        // woken when its send buffer changes).
        self.shm.set_send_buffer(room as usize);
        self.send_limit.store(room, Ordering::Relaxed);
        self.poke();
    }

    /// Whether a small `SO_SNDBUF` bounds the ring (see `set_send_limit`).
    pub fn send_limited(&self) -> bool {
        self.send_limit_now() != 0
    }
}
