//! A side's settings (non-blocking mode, timeouts, spinning) and facts (role, addresses, pid,
//! descriptors, pool size).

use super::{from_nanos, lock, nanos, spinner, Shm};
use crate::segment::Role;
use colo_ring::ring::RingWords;
use colo_ring::spin::SpinMode;
use colo_sys::doorbell::Readiness;
use colo_sys::OwnedFd;
use colo_ring::sync::Ordering;
use std::net::SocketAddr;
use std::time::Duration;

impl Shm {
    /// Whether a non-blocking operation has drained a ring since the last call. The doorbell is
    /// shared by the reading and the writing half: a poller whose read half drained it must wake
    /// its write half too (and the reverse), or that half may miss its wake-up.
    pub fn take_swallowed(&self) -> bool {
        // SYNC POINT with the Release store in `wait_for`: a caller told of a drain sees it done.
        self.swallowed.swap(false, Ordering::AcqRel)
    }

    /// Bounds how far writes grow the outgoing ring (a program's `SO_SNDBUF`): `bytes` rounded
    /// up to a power of two, from 4 KiB to the segment's `ring_capacity`. Never waits: while a
    /// write holds the writing half (a blocking one, waiting for room), that write or the next
    /// applies it (`send_buffer_asked`).
    pub fn set_send_buffer(&self, bytes: usize) {
        // SeqCst (and the load in `apply_asked_send_buffer_if_free`): with the writing half's
        // lock, a store made while a write held it is seen by that write once it lets go.
        self.send_buffer_asked.store(u32::try_from(bytes).unwrap_or(u32::MAX).max(1), Ordering::SeqCst);
        self.apply_asked_send_buffer_if_free();
    }

    /// Applies an asked `SO_SNDBUF` (`set_send_buffer`) if the writing half is free; if a
    /// write holds it, that write applies it (`apply_send_buffer`, when it begins; this, when
    /// it ends).
    pub(super) fn apply_asked_send_buffer_if_free(&self) {
        if self.send_buffer_asked.load(Ordering::SeqCst) == 0 {
            return;
        }
        match self.tx.try_lock() {
            Ok(mut tx) => self.apply_send_buffer(&mut tx),
            Err(std::sync::TryLockError::Poisoned(e)) => self.apply_send_buffer(&mut e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => {}
        }
    }

    /// Under the writing half's lock: the asked `SO_SNDBUF`, if any, bounds the ring.
    pub(super) fn apply_send_buffer(&self, tx: &mut super::TxHalf) {
        // SeqCst: as the store in `set_send_buffer`. A load first: every write comes here, and
        // a plain load, unlike the swap, takes the cache line in no exclusive state.
        if self.send_buffer_asked.load(Ordering::SeqCst) == 0 {
            return;
        }
        let bytes = self.send_buffer_asked.swap(0, Ordering::SeqCst);
        if bytes == 0 {
            return;
        }
        let bytes = bytes as usize;
        tx.limit = Some(bytes);
        tx.ring.set_limit(bytes);
        if tx.bound.is_some() {
            tx.bound = Some(tx.ring.bound());
        }
        self.out_room.store(tx.ring.bound() as u64, Ordering::Relaxed);
    }

    /// The most bytes the outgoing ring holds unread (its producer's bound): a poller is told
    /// the connection is writable only below it (a write there would take nothing). Changes
    /// with a `SO_SNDBUF` of this process or, in the shim, of another holder of the connection
    /// (once applied: `set_send_buffer`). Relaxed: it orders nothing else.
    pub fn send_room(&self) -> u64 {
        self.out_room.load(Ordering::Relaxed)
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
        if let Some(m) = &self.msgs {
            lock(&m.rx).spinner = spinner(mode);
            lock(&m.tx).spinner = spinner(mode);
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
    /// ours rang the self bell (an epoll fd holding the control socket and the self bell, created
    /// on first use). If it cannot be created (out of descriptors), the control socket stands in:
    /// the peer's progress and hang-up are still reported, the rest when the next operation looks.
    pub fn readiness_fd(&self) -> &OwnedFd {
        if self.readiness.get().is_none() {
            match Readiness::new(&self.fds.control, &self.fds.self_bell, crate::floor::fd_floor()) {
                Ok(r) => {
                    let _ = self.readiness.set(r);
                }
                Err(e) => {
                    crate::log::info(format_args!("readiness fd: {e}; using the control socket"));
                    return &self.fds.control;
                }
            }
        }
        self.readiness.get().map_or(&self.fds.control, |r| r.fd())
    }
    /// The readiness fd if [`Shm::readiness_fd`] made one (not the doorbell standing in).
    pub fn readiness_made(&self) -> Option<&OwnedFd> {
        self.readiness.get().map(|r| r.fd())
    }
    /// The control socket.
    pub fn control_fd(&self) -> &OwnedFd {
        &self.fds.control
    }
    /// The shared words of our incoming and outgoing rings, for looks that take no lock
    /// (`colo_ring::snapshot::RingState`): valid while this side lives.
    pub fn ring_words(&self) -> (&RingWords, &RingWords) {
        (&self.in_words, &self.out_words)
    }

    /// Size of each ring's data region: the most a ring grows to (spec/WIRE.md section 5).
    pub fn ring_capacity(&self) -> u64 {
        u64::from(self.geometry().ring_capacity)
    }

    /// The segment's mapping, its address and length: for a copy that lets go of it without
    /// dropping this value (the LD_PRELOAD shim's fork copies).
    pub fn mapping(&self) -> (*mut u8, usize) {
        (self.seg.base(), self.seg.layout().segment_size)
    }

    /// Closes the segment's memfd unless the incoming ring is read through it (a peer of another
    /// user: `Segment::read_through_memfd`); returns whether it is closed.
    pub fn close_memfd(&mut self) -> bool {
        self.seg.close_memfd()
    }

    /// Bytes a zero-copy message may hold (0: no pool).
    pub fn pool_slot_size(&self) -> usize {
        if self.msgs.is_none() { 0 } else { self.geometry().slot_size as usize }
    }
}
