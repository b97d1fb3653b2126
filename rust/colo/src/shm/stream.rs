//! The byte stream (spec/WIRE.md sections 5 and 8): reads, writes and shutdown.

use super::{lock, RxHalf, Shm, TxHalf, PEER_GONE, READ_SHUT, READ_TOLD, RESET, WRITE_SHUT};
use colo_ring::layout::{FLAG_FIN, FLAG_NOT_READING, FLAG_READ_CLOSED, FLAG_RESET};
use colo_ring::ring::{Producer, RawBytes};
use colo_ring::snapshot::RingState;
use colo_ring::Corrupt;
use colo_ring::sync::Ordering;
use std::io;
use std::time::Instant;

/// Writes from memory are published in pieces of at most this many bytes (spec/WIRE.md
/// section 5).
const PUBLISH_CHUNK: usize = 16 * 1024;

/// [`Shm::write_with_since`] publishes in pieces of at most this many bytes: each piece is a
/// `pread` of its own of the file `sendfile` reads into the ring, so a piece this large takes
/// an eighth of the system calls [`PUBLISH_CHUNK`] would; the reader of a large file still
/// copies out each piece while the next is read in.
const FILL_CHUNK: usize = 128 * 1024;

/// One write in this many on a half looks for the hang-up watcher's mark (`Shm::notice_hangup`).
const WATCH_EVERY: u32 = 64;

impl Shm {
    /// Another process that shares this end of the connection (the LD_PRELOAD shim: a fork or
    /// an exec'd child holding a copy of the socket, taking turns with us as processes sharing a
    /// TCP socket do) may have written since we last did: continue from the shared `ring_head`,
    /// as a resumed end does. It looks at this end's `written` copy, not at `ring_head` itself:
    /// the peer spins on `ring_head`'s line, and loading it just before the write that stores
    /// it cost a cache-line transfer on every write (measured in docs/ARCHITECTURE.md).
    /// The copy's line is this end's alone. A write marks the copy stale before it publishes
    /// (see `write`), so a holder that dies mid-write leaves a copy no head equals. A peer can
    /// scribble over the copy as over anything in the segment: that can only cost a resume or
    /// garble the stream it receives itself; the resumed producer validates `ring_head`.
    fn adopt_tx(&self, tx: &mut TxHalf) {
        let written = self.seg.written(self.role).load(Ordering::Relaxed);
        if written != tx.ring.written() {
            // SAFETY: the view lives in `self` next to `seg`; the stale one it replaces is dropped.
            tx.ring = unsafe { self.seg.resumed_producer(self.role) };
            tx.bounds_again();
        }
    }

    /// As [`Shm::adopt_tx`], for reading: another holder may have consumed (`ring_tail` moved).
    pub(super) fn adopt_rx(&self, rx: &mut RxHalf) {
        // Relaxed (`RingState::relaxed`): only compared with our own count to learn whether to
        // take the ring over again; the consumer `resume` builds loads it afresh.
        let tail = RingState::relaxed(&self.in_words()).tail;
        if tail != rx.ring.consumed() {
            // SAFETY: as in `adopt_tx`.
            rx.ring = unsafe { self.seg.resumed_consumer(self.role) };
        }
    }

    /// In a fork child, before it has a second thread (the LD_PRELOAD shim's `pthread_atfork`
    /// child handler): a thread of the parent may have been inside a read or a write of this
    /// side (waiting for bytes or room, its half locked) or asleep as the side's leader, and
    /// would never let go here. Each half it held is let go and its view taken over afresh
    /// from the segment's words (as a resumed end does), and the waiters forget the parent's
    /// threads, so this process's own reads and writes work as its copy of a TCP socket would
    /// (once the parent's call is done with the ring: the shim's turns see to that). The
    /// message halves, which the shim's connections do not have, are only let go.
    ///
    /// # Safety
    /// The calling process has one thread and no reference into this side's halves.
    pub unsafe fn forked_child(&self) {
        // SAFETY: the caller's promise is `let_go_in_child`'s.
        unsafe {
            if self.rx.let_go_in_child() {
                // SAFETY: as in `adopt_tx`.
                lock(&self.rx).ring = self.seg.resumed_consumer(self.role);
            }
            if self.tx.let_go_in_child() {
                let mut tx = lock(&self.tx);
                // SAFETY: as in `adopt_tx`.
                tx.ring = self.seg.resumed_producer(self.role);
                tx.bounds_again();
            }
            self.waiters.let_go_in_child();
            if let Some(m) = &self.msgs {
                m.rx.let_go_in_child();
                m.tx.let_go_in_child();
                m.releases.let_go_in_child();
            }
        }
        let mut w = lock(&self.waiters);
        w.leader = false;
        w.followers = 0;
        w.epoch = w.epoch.wrapping_add(1);
    }

    /// One look: `skip` (with `peek`) is how many unread bytes to look past.
    fn try_read(&self, rx: &mut RxHalf, buf: &mut [u8], peek: bool, skip: usize) -> io::Result<Option<usize>> {
        if self.has(READ_SHUT) || self.adopt_shared_read_shut() {
            return self.read_after_shutdown(rx, buf, peek, skip).map(Some);
        }
        self.adopt_rx(rx);
        let before = rx.ring.consumed();
        let got = if peek { rx.ring.peek_at(skip, buf) } else { rx.ring.read(buf) };
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
        // Everything published before FIN, a reset or the hang-up is visible now; deliver it
        // first, as kernel TCP delivers what it queued before a RST.
        let n = if peek { rx.ring.peek_at(skip, buf) } else { rx.ring.read(buf) }.map_err(|c| self.corrupt(c))?;
        if n > 0 {
            if !peek {
                self.wake_for_space(rx, before);
            }
            return Ok(Some(n));
        }
        if flags & FLAG_RESET != 0 {
            self.set(RESET);
            return Err(io::ErrorKind::ConnectionReset.into());
        }
        if flags & FLAG_FIN != 0 {
            return Ok(Some(0));
        }
        // Hung up without FIN: the peer died.
        Err(io::ErrorKind::ConnectionReset.into())
    }

    /// Reads into `buf`; 0 is end of stream. Blocks (spin, then sleep) unless non-blocking.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv(buf, false, None)
    }

    /// [`Shm::read`] for a call that began to wait before it (the LD_PRELOAD shim's turn between
    /// processes sharing the connection): the read timeout counts from `since` (`None`: from
    /// the start of this wait), so that the whole call waits at most the timeout.
    pub fn read_since(&self, buf: &mut [u8], since: Option<Instant>) -> io::Result<usize> {
        self.recv(buf, false, since)
    }

    /// Like [`Shm::read`] but leaves the bytes in the ring (`MSG_PEEK`).
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv(buf, true, None)
    }

    fn recv(&self, buf: &mut [u8], peek: bool, since: Option<Instant>) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut rx = lock(&self.rx);
        let off = self.peek_off.load(Ordering::Relaxed);
        if off < 0 {
            return self.look_then_wait(&mut rx, |h| &mut h.spinner, &self.read_timeout, since, |rx| self.try_read(rx, buf, peek, 0));
        }
        let skip = if peek { off as usize } else { 0 };
        let n = self.look_then_wait(&mut rx, |h| &mut h.spinner, &self.read_timeout, since, |rx| self.try_read(rx, buf, peek, skip))?;
        self.peek_off.store(if peek { off.saturating_add(n as i32) } else { off.saturating_sub(n as i32).max(0) }, Ordering::Relaxed);
        Ok(n)
    }

    /// [`Shm::peek`] that waits until `want` bytes (at most `buf.len()`) are unread, or fewer
    /// with the stream ended, reset or shut down for reading, as kernel TCP's peek waits for its
    /// target (`MSG_WAITALL`, `SO_RCVLOWAT`). A timeout with bytes unread returns them, and so
    /// does a signal under a policy (`set_interrupt_policy`), whatever its `SA_RESTART`: kernel
    /// TCP restarts only a call that has no bytes (`signals_end_waits`).
    pub fn peek_least(&self, buf: &mut [u8], want: usize) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let want = want.clamp(1, buf.len());
        let mut rx = lock(&self.rx);
        let off = self.peek_off.load(Ordering::Relaxed);
        let skip = off.max(0) as usize;
        let mut ends = None;
        let r = self.look_then_wait(&mut rx, |h| &mut h.spinner, &self.read_timeout, None, |rx| match self.try_read(rx, buf, true, skip)? {
            Some(n) if n > 0 && n < want && !self.read_ended(rx)? => {
                // Bytes to return: from now on any signal ends the wait with them.
                ends.get_or_insert_with(super::tcp::EndWaits::begin);
                Ok(None)
            }
            got => Ok(got),
        });
        drop(ends);
        let r = match r {
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => match self.try_read(&mut rx, buf, true, skip)? {
                Some(n) if n > 0 => Ok(n),
                _ => Err(e),
            },
            r => r,
        };
        if let (Ok(n), true) = (&r, off >= 0) {
            self.peek_off.store(off.saturating_add(*n as i32), Ordering::Relaxed);
        }
        r
    }

    /// [`Shm::peek`] that never waits (`MSG_DONTWAIT`): `WouldBlock` when nothing is there past
    /// the peek offset.
    pub fn try_peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut rx = lock(&self.rx);
        let off = self.peek_off.load(Ordering::Relaxed);
        let n = self.try_read(&mut rx, buf, true, off.max(0) as usize)?.ok_or(io::ErrorKind::WouldBlock)?;
        if off >= 0 {
            self.peek_off.store(off.saturating_add(n as i32), Ordering::Relaxed);
        }
        Ok(n)
    }

    /// Waits until something is readable (bytes, end of stream, or an error, which is returned),
    /// taking nothing and moving no peek offset: a blocking read of zero bytes.
    pub fn wait_readable(&self) -> io::Result<()> {
        let mut b = [0u8; 1];
        let mut rx = lock(&self.rx);
        self.look_then_wait(&mut rx, |h| &mut h.spinner, &self.read_timeout, None, |rx| self.try_read(rx, &mut b, true, 0)).map(|_| ())
    }

    /// `SO_PEEK_OFF`: `off` (negative: none) is where the next peek starts.
    pub fn set_peek_off(&self, off: i32) {
        // Not under the reading half's lock, which a blocking read holds through its sleep (the
        // kernel lets the socket go while a reader waits): a read under way uses the offset it
        // found.
        self.peek_off.store(off.max(-1), Ordering::Relaxed);
    }

    /// The `SO_PEEK_OFF` in force (-1: none).
    pub fn peek_off(&self) -> i32 {
        self.peek_off.load(Ordering::Relaxed)
    }

    /// Whether no byte will come after those unread: the peer's FIN or reset, its hang-up, or
    /// our read shutdown.
    fn read_ended(&self, rx: &mut RxHalf) -> io::Result<bool> {
        if self.has(READ_SHUT | PEER_GONE | RESET) {
            return Ok(true);
        }
        let flags = rx.ring.flags().map_err(|c| self.corrupt(c))?;
        Ok(flags & (FLAG_FIN | FLAG_RESET) != 0)
    }

    /// One look at the incoming bytes from `skip` past the first unread one, never waiting
    /// (a relay that hands bytes on before the reader it hands them to has taken them, and
    /// releases them only then, `release_peeked`): `Some(n)`, `n` bytes copied; `Some(0)`, end of
    /// stream with no byte past `skip`; `None`, none yet. A reset is reported as `read`
    /// reports it.
    pub fn peek_at(&self, skip: usize, buf: &mut [u8]) -> io::Result<Option<usize>> {
        if buf.is_empty() {
            return Ok(Some(0));
        }
        let mut rx = lock(&self.rx);
        self.try_read(&mut rx, buf, true, skip)
    }

    /// Takes up to `n` of the unread bytes off the incoming ring without copying them (bytes
    /// peeked with `peek_at` before), waking a writer that waits for space as a read does;
    /// returns the count, less than `n` only if fewer are unread (another holder read them).
    pub fn release_peeked(&self, n: usize) -> io::Result<usize> {
        let mut rx = lock(&self.rx);
        self.adopt_rx(&mut rx);
        let before = rx.ring.consumed();
        let n = rx.ring.release(n).map_err(|c| self.corrupt(c))?;
        if n > 0 {
            self.wake_for_space(&rx, before);
        }
        Ok(n)
    }

    /// Takes the `n` bytes peeked (`peek_at` with no skip) at ring position `from` (counted as
    /// `incoming_consumed` counts) off the incoming ring, waking a writer that waits for space,
    /// only if no other holder took bytes off it since (`Consumer::release_from`): `Ok(false)`,
    /// nothing taken, and the peeked bytes are not this reader's to hand on.
    pub fn take_peeked_at(&self, from: u64, n: usize) -> io::Result<bool> {
        let mut rx = lock(&self.rx);
        self.adopt_rx(&mut rx);
        let taken = rx.ring.release_from(from, n).map_err(|c| self.corrupt(c))?;
        if taken {
            self.wake_for_space(&rx, from);
        }
        Ok(taken)
    }

    /// How many incoming bytes this side has ever taken off the ring (`ring_tail`), by any of
    /// the processes holding it: a reader that releases later (`release_peeked`) counts from
    /// it, so that bytes another holder read meanwhile are not taken twice.
    pub fn incoming_consumed(&self) -> u64 {
        // Relaxed (`RingState::relaxed`): only this side's holders write it, and the release
        // that follows loads it afresh under the reading half's lock (`adopt_rx`).
        RingState::relaxed(&self.in_words()).tail
    }

    /// Whether the incoming ring is full at its current size: a writer of the peer's at its
    /// limit waits until we release bytes.
    pub fn incoming_full(&self) -> bool {
        let mut rx = lock(&self.rx);
        self.adopt_rx(&mut rx);
        rx.ring.full().unwrap_or(false)
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
    pub(super) fn may_send(&self, writes: &mut u32) -> io::Result<()> {
        self.notice_hangup(writes);
        self.send_refused()
    }

    /// [`Shm::may_send`] without its look for a hang-up every so many writes (`writes`, under
    /// the writing half's lock): for a send of nothing, which kernel TCP answers from the
    /// socket's state alone, also while another thread waits in a send for room.
    pub fn send_refused(&self) -> io::Result<()> {
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

    /// A writer waits only when the ring is full, so it would never look at the control socket,
    /// and a peer killed mid-stream would go unnoticed by a process that only writes to it (over
    /// TCP the second write fails). The hang-up watcher watches for it, and one write in
    /// `WATCH_EVERY` (`writes`, the half's count) looks for its mark and, if set, reads the
    /// control socket, so that a later write fails with `EPIPE`. The first look sets up the
    /// watch (a system call and the watcher's lock, twice): a short-lived connection never pays
    /// for it. One write in `WATCH_EVERY`, not every write, keeps the look off the hot path
    /// (docs/ARCHITECTURE.md, "A writer notices a killed peer").
    fn notice_hangup(&self, writes: &mut u32) {
        *writes = writes.wrapping_add(1);
        if !(*writes).is_multiple_of(WATCH_EVERY) {
            return;
        }
        if self.watched() {
            self.take_hangup_mark();
        }
    }

    /// The free space a write may use now, if any. `waited`: whether this write already found
    /// the ring full; it then waits until the consumer has taken the unread bytes down to the
    /// ring's `space_wake` mark (an eighth of what it may fill free), which is when the consumer wakes it
    /// (spec/WIRE.md section 6), rather than going back to sleep after every small read, or
    /// until the consumer pauses (announces a sleep of its own), which wakes it too.
    fn write_blocked(&self, tx: &mut TxHalf, waited: &mut bool) -> io::Result<Option<usize>> {
        self.may_send(&mut tx.writes)?;
        self.adopt_tx(tx);
        let mut space = if *waited { tx.ring.space_past_mark() } else { tx.ring.space() }.map_err(|c| self.corrupt(c))?;
        // Only once we announced a sleep of our own (a re-check; a spin needs no answer): the
        // read-modify-write on the peer's word is what orders it against the peer's pause.
        if space == 0 && *waited && self.announced() && self.peer_paused() {
            // The consumer stopped reading before our mark: take what it freed (as a TCP
            // receiver that stops reading still advertises the window its reads opened).
            space = tx.ring.space().map_err(|c| self.corrupt(c))?;
        }
        *waited = space == 0;
        Ok((space > 0).then_some(space))
    }

    /// Writes as much of `buf` as the ring takes, waiting only while nothing could be written;
    /// publishes in pieces so the reader starts early.
    pub fn write(&self, buf: &[u8]) -> io::Result<usize> {
        self.write_since(buf, None)
    }

    /// [`Shm::write`] with the write timeout counted from `since`, as [`Shm::read_since`].
    pub fn write_since(&self, buf: &[u8], since: Option<Instant>) -> io::Result<usize> {
        self.write_pieces(buf.len(), PUBLISH_CHUNK, since, |ring, done, end| Ok((ring.write(&buf[done..end])?, false)))
    }

    /// [`Shm::write_since`] of up to `len` bytes that `fill` stores in the ring itself
    /// (`Producer::write_with`: `fill(dst, n)` stores at most `n` bytes at `dst` and returns how
    /// many). A `fill` that stores fewer than it was given (its source ended, or failed: it
    /// keeps the reason) ends the call with what it stored.
    ///
    /// # Safety
    /// As for `Producer::write_with`: `fill` stores only inside the range it is given.
    pub unsafe fn write_with_since(&self, len: usize, since: Option<Instant>, mut fill: impl FnMut(*mut u8, usize) -> usize) -> io::Result<usize> {
        self.write_pieces(len, FILL_CHUNK, since, |ring, done, end| {
            let mut given = 0;
            // SAFETY: the caller's contract for `fill`, passed on.
            let n = unsafe {
                ring.write_with(end - done, |dst, n| {
                    given += n;
                    fill(dst, n)
                })
            }?;
            Ok((n, n < given))
        })
    }

    /// Writes up to `len` bytes, `put(ring, done, end)` storing and publishing those from `done`
    /// to `end` (a piece of at most `piece` bytes) and saying how many, and whether its source
    /// ended; waits for space first, as a write does.
    fn write_pieces(
        &self,
        len: usize,
        piece: usize,
        since: Option<Instant>,
        mut put: impl FnMut(&mut Producer<RawBytes>, usize, usize) -> Result<(usize, bool), Corrupt>,
    ) -> io::Result<usize> {
        if len == 0 {
            return Ok(0);
        }
        let mut guard = lock(&self.tx);
        let tx = &mut *guard;
        self.apply_send_buffer(tx);
        let mut waited = false;
        self.look_then_wait(tx, |h| &mut h.spinner, &self.write_timeout, since, |tx| self.write_blocked(tx, &mut waited))?;
        // For the other holders of this end (`adopt_tx`): stale while we publish, so that one
        // that takes over after we died mid-write resumes from `ring_head`; our head once done.
        // They take turns with us, so once per call is enough.
        let written = self.seg.written(self.role);
        written.store(!tx.ring.written(), Ordering::Relaxed);
        let mut done = 0;
        while done < len {
            let end = len.min(done + piece);
            let (n, ended) = put(&mut tx.ring, done, end).map_err(|c| self.corrupt(c))?;
            if n > 0 {
                done += n;
                self.wake_peer();
            }
            if n == 0 || ended {
                break;
            }
        }
        written.store(tx.ring.written(), Ordering::Relaxed);
        if !tx.watched && tx.ring.size() > colo_ring::layout::MIN_RING_SIZE as usize {
            tx.watched = true;
            let ring: std::sync::Weak<dyn crate::shrink::Shrink> = std::sync::Arc::downgrade(&self.tx) as _;
            crate::shrink::watch(ring);
        }
        drop(guard);
        // An `SO_SNDBUF` asked while we held the writing half (see `Shm::set_send_buffer`).
        self.apply_asked_send_buffer_if_free();
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
            // Release (`RingWords::close_reading`): seen by a later program image of this side,
            // after `exec`, in `Shm::resume`.
            self.in_words().close_reading(FLAG_READ_CLOSED);
            ours |= FLAG_NOT_READING;
        }
        if ours != 0 {
            self.signal(ours);
        }
        // A thread of ours blocked in read or write must see the shutdown now.
        self.wake_self();
    }
}
