//! Zero-copy messages (spec/WIRE.md section 7): loaning and sending slots of the outgoing pool,
//! receiving and releasing slots of the incoming one.

use super::{libc_errno, lock, Messages, MsgRx, MsgTx, Shm, PEER_GONE, READ_SHUT, RESET};
use crate::segment::Role;
use colo_ring::layout::{FLAG_FIN, FLAG_RESET};
use colo_ring::sync::Ordering;
use colo_ring::Corrupt;
use std::io;
use std::sync::atomic::AtomicU64;

/// A slot's word in a bitset (`MsgTx::in_flight`, `Messages::held`) and its bit there.
fn bit(slot: u32) -> (usize, u64) {
    ((slot / 64) as usize, 1 << (slot % 64))
}

impl MsgTx {
    /// A loaned slot that was not sent, or one the peer released, returns to the pool.
    fn give_back(&mut self, slot: u32) {
        let (w, b) = bit(slot);
        self.in_flight[w] &= !b;
        self.free_slots.push(slot);
    }

    fn is_in_flight(&self, slot: u32) -> bool {
        let (w, b) = bit(slot);
        self.in_flight.get(w).is_some_and(|&x| x & b != 0)
    }
}

impl Shm {
    fn take_slot(&self, tx: &mut MsgTx) -> io::Result<Option<u32>> {
        self.may_send(&mut tx.writes)?;
        let n = self.geometry().slot_count;
        if tx.in_flight.is_empty() {
            // The first loan: every slot is fresh (`MsgTx::fresh`), none in flight.
            tx.in_flight = vec![0; n.div_ceil(64) as usize];
        }
        // Slots the peer released are taken back, all at once, only when none is left here: the
        // free queue's `free_head` line is the peer's, and loading it on every loan would cost a
        // cache-line transfer per message.
        if tx.free_slots.is_empty() && tx.fresh == n {
            while let Some([slot]) = tx.frees.pop().map_err(|c| self.corrupt(c))? {
                if slot >= n || !tx.is_in_flight(slot) {
                    return Err(self.corrupt(Corrupt("released a slot that was not in flight")));
                }
                tx.give_back(slot);
            }
        }
        let slot = match tx.free_slots.pop() {
            Some(slot) => slot,
            None if tx.fresh < n => {
                tx.fresh += 1;
                tx.fresh - 1
            }
            None => return Ok(None),
        };
        let (w, b) = bit(slot);
        tx.in_flight[w] |= b;
        Ok(Some(slot))
    }

    /// The message halves of a side that loaned or received a slot (so has a pool).
    fn messages(&self) -> &Messages {
        self.msgs.as_deref().expect("a slot implies a pool")
    }

    pub(super) fn geometry(&self) -> colo_ring::layout::Geometry {
        self.seg.layout().geometry
    }

    /// Loans a slot of the outgoing pool; waits while all are in flight.
    pub(crate) fn loan(&self, len: usize) -> io::Result<(u32, *mut u8)> {
        let g = self.geometry();
        let Some(m) = &self.msgs else {
            // No pool (or one not carried over by `resume`).
            return Err(io::Error::from_raw_os_error(libc_errno::ENOBUFS));
        };
        if len > g.slot_size as usize {
            return Err(io::Error::from_raw_os_error(libc_errno::EMSGSIZE));
        }
        let mut tx = lock(&m.tx);
        let slot = self.look_then_wait(&mut tx, |h| &mut h.spinner, &self.write_timeout, None, |tx| self.take_slot(tx))?;
        Ok((slot, self.seg.slot(self.role == Role::Client, slot)))
    }

    /// Gives back a loaned slot that was not sent.
    pub(crate) fn unloan(&self, slot: u32) {
        lock(&self.messages().tx).give_back(slot);
    }

    /// Sends a loaned slot holding `len` bytes.
    pub(crate) fn send_slot(&self, slot: u32, len: usize) -> io::Result<()> {
        let mut tx = lock(&self.messages().tx);
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
                // An OR, not a load and a store: `release` clears other slots' bits of the same
                // word without our lock. SYNC POINT with the Release AND in `release`: a slot it
                // cleared before handing it back to the peer reads as free here.
                let words = g.slot_count.div_ceil(64) as usize;
                let held = self.messages().held.get_or_init(|| (0..words).map(|_| AtomicU64::new(0)).collect());
                let (w, b) = bit(slot);
                if held[w].fetch_or(b, Ordering::Acquire) & b != 0 {
                    return Err(self.corrupt(Corrupt("message in a slot we still hold")));
                }
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
        let Some(m) = &self.msgs else {
            return Err(io::Error::from_raw_os_error(libc_errno::ENOBUFS));
        };
        let mut rx = lock(&m.rx);
        let r = self.look_then_wait(&mut rx, |h| &mut h.spinner, &self.read_timeout, None, |rx| self.take_message(rx))?;
        Ok(r.map(|(slot, len)| (slot, self.seg.slot(self.role == Role::Server, slot) as *const u8, len)))
    }

    /// Returns a received slot to the peer.
    pub(crate) fn release(&self, slot: u32) {
        // SYNC POINT with the Acquire OR in `take_message`: the slot reads as free there once
        // the peer, which this release hands it to, can send it again. An AND, as other slots'
        // bits of the word may be set or cleared meanwhile.
        let m = self.messages();
        // Made by the receive that handed out `slot`.
        if let Some(held) = m.held.get() {
            let (w, b) = bit(slot);
            held[w].fetch_and(!b, Ordering::Release);
        }
        let mut releases = lock(&m.releases);
        if let Err(c) = releases.push([slot]) {
            drop(releases);
            let _ = self.corrupt(c);
            return;
        }
        drop(releases);
        self.wake_peer();
    }
}
