//! How a side that let go of its connection for good (`Segment::give_back_incoming`) gives back
//! the pages of its segment, and what it keeps for a peer of another user (`crate::orphan`).
//! Every decision reads the peer's words (`ring_tail`, `free_head`) once: a peer may change
//! them between two reads, and two reads that disagreed could give back less than is left to
//! keep (a segment unmapped with pages still charged to us) or keep what was given back.

use super::{LetGo, Role, Segment, CONTROL_KEPT, PEER_GONE};
use colo_ring::layout::{block, FLAG_DROPPED, FLAG_RESET};
use colo_ring::sync::Ordering;

impl Segment {
    /// For a segment let go of (`give_back_incoming`): gives back the pages of the ring it read
    /// and those of the ring it wrote but for the unread bytes, and the pool we sent messages
    /// from unless the peer holds some. Returns whether it left any for the peer to read (unread
    /// bytes or held messages), from the same look at the peer's words as what it gave back:
    /// then `orphan` may keep the segment; else nothing of ours is left in it.
    pub(super) fn give_back_pages(&self, lg: LetGo) -> bool {
        let role = lg.role;
        let Some(map) = &self.map else { return false };
        // The block this role read from its ring data on (data, padding, pool), in whole
        // pages: the direction's words, in the block's first page, stay (the peer may
        // still look at them). Best effort: pages left in place cost memory, not correctness.
        let off = self.layout.block_offset(role == Role::Server) + self.layout.data_off;
        let end = self.layout.block_offset(role == Role::Server) + self.layout.block_size;
        // From the first page the file holds there on, where the memfd is at hand (the
        // shim keeps it): a hole punch through the whole block reaches into every mapping
        // of the file, and a connection of small messages never left the block's first
        // page. Pages no one allocated cost nothing to leave alone.
        let from = match &self.memfd {
            Some(fd) => colo_sys::segment::first_data(fd, off.next_multiple_of(4096) as u64).map(|d| d.map(|d| (d as usize).max(off))),
            None => Ok(Some(off)),
        };
        match from {
            Ok(Some(from)) if from < end => {
                let _ = map.release(from, end - from);
            }
            Ok(_) => {}
            Err(_) => {
                let _ = map.release(off, end - off);
            }
        }
        // The ring this role wrote: its pages hold no unread byte but where the bytes
        // between the peer's `ring_tail` and our `ring_head` lie (all of them, once the
        // peer is gone), so the rest goes, as a closed TCP socket holds only its unsent
        // bytes. The pages this role first touched there are charged to its memory cgroup
        // for as long as the peer keeps its memfd, after the connection is gone.
        let out = self.layout.block_offset(role == Role::Client) + self.layout.data_off;
        let cap = self.layout.geometry.ring_capacity as u64;
        // With the padding after the data, up to the pool (whose slots may hold messages
        // in flight), which starts on a page of its own.
        let spare = (self.layout.pool_off - self.layout.data_off) as u64;
        let free = self.outgoing_free(role == Role::Client, cap, lg.out_size);
        // Every byte of the written ring is free but the unread ones: more than one range.
        let partial = free.len() > 1;
        for (from, to) in free {
            let to = if to == cap { spare } else { to };
            let _ = map.release(out + from as usize, (to - from) as usize);
        }
        // The pool we sent messages from: its slots are the peer's to read until it
        // releases them, so it goes once every slot sent came back, or the peer is gone
        // (it hung up, or lost them: `drop_unread`). Else the caller keeps the segment for
        // `orphan` while a peer of another user holds some.
        let held = self.pool_held(lg);
        if !held {
            let pool = self.layout.block_offset(role == Role::Client) + self.layout.pool_off;
            let _ = map.release(pool, self.layout.block_size - self.layout.pool_off);
        }
        partial || held
    }

    /// Whether the peer of a segment let go of may still read a message of the pool we send
    /// from: not once it is gone ([`Segment::messages_held`]).
    fn pool_held(&self, lg: LetGo) -> bool {
        lg.out_size & PEER_GONE == 0 && self.messages_held(lg.role == Role::Client)
    }

    /// Whether the peer may still read a message of the pool of direction `c2s`, which we
    /// send: more sent (our `msg_head`) than it released (its `free_head`), by at most the
    /// slot count (more, or more released than sent, is a peer's scribble: the slots hold
    /// nothing it may read, as a reset would). Without a pool, never.
    pub(super) fn messages_held(&self, c2s: bool) -> bool {
        if self.layout.geometry.slot_count == 0 || self.map.is_none() {
            return false;
        }
        let b = self.block(c2s);
        // SAFETY: aligned words inside our mapping (present: checked above); atomics only.
        let (sent, released) = unsafe { (&*self.u64_at(b + block::MSG_HEAD), &*self.u64_at(b + block::FREE_HEAD)) };
        // Acquire partners the peer's Release store of `free_head` after its last read of the
        // slots it released. `msg_head` is our own, last stored before the close.
        let out = sent.load(Ordering::Relaxed).wrapping_sub(released.load(Ordering::Acquire));
        out != 0 && out <= self.layout.geometry.slot_count as u64
    }

    /// The ranges of the ring data of direction `c2s` (offsets from its start, below the larger
    /// of `ring_size` and `out_size`, at most `cap`: where our writes went) that hold no byte
    /// its consumer has yet to read: outside `ring_tail..ring_head` at `ring_size`, as the
    /// consumer finds them. Words that break the ring's rules (a peer's scribble) leave nothing
    /// to read, as a reset would. A connection that never grew its ring past the first page
    /// has nothing to give back there (no system call).
    pub(super) fn outgoing_free(&self, c2s: bool, cap: u64, out_size: u8) -> Vec<(u64, u64)> {
        let b = self.block(c2s);
        // SAFETY: aligned words inside our mapping, which lives as long as `self`; atomics only.
        let (head, tail, size) = unsafe {
            (&*self.u64_at(b + block::RING_HEAD), &*self.u64_at(b + block::RING_TAIL), &*self.u32_at(b + block::RING_SIZE))
        };
        // Acquire partners the consumer's Release store of `ring_tail`: it read every byte
        // below it, so their pages are no longer its to read. Our own words (head, size) were
        // last stored by this process's producer, before the close that retired this segment.
        let tail = tail.load(Ordering::Acquire);
        let head = head.load(Ordering::Relaxed);
        let size = u64::from(size.load(Ordering::Relaxed));
        // SAFETY: as above; our own word (`mark_dropped` set DROPPED: the unread bytes are gone).
        let dropped = unsafe { &*self.u32_at(b + block::RING_FLAGS) }.load(Ordering::Relaxed) & FLAG_DROPPED != 0;
        let unread = head.wrapping_sub(tail);
        let valid = size.is_power_of_two() && size <= cap && unread <= size;
        let end = (1u64 << (out_size & !(PEER_GONE | CONTROL_KEPT))).max(if valid { size } else { 0 }).min(cap);
        if out_size & PEER_GONE != 0 || dropped || unread == 0 || !valid {
            return vec![(0, end)];
        }
        let (a, b) = (tail % size, head % size);
        if a < b {
            vec![(0, a), (b, end)]
        } else {
            // Wrapped (or a full ring, `a == b`): the bytes run from `a` to the end of the
            // ring and from its start to `b`.
            vec![(b, a), (size, end.max(size))]
        }
    }

    /// The peer's progress on what it has yet to read of ours (`progress`), or `None` if
    /// nothing: no unread byte and no message held ([`Segment::messages_held`]), or the peer
    /// is gone.
    pub(super) fn unread_tail(&self, lg: LetGo) -> Option<u64> {
        let cap = self.layout.geometry.ring_capacity as u64;
        self.map.as_ref()?;
        // Every byte of the written ring is free but the unread ones: more than one range.
        let partial = self.outgoing_free(lg.role == Role::Client, cap, lg.out_size).len() > 1;
        (partial || self.pool_held(lg)).then(|| self.progress(lg))
    }

    /// The peer's progress on what we sent: its `ring_tail` plus its `free_head` (either moves
    /// as it reads bytes or releases messages), for `orphan`'s timers.
    pub(super) fn progress(&self, lg: LetGo) -> u64 {
        if self.map.is_none() {
            return 0;
        }
        let b = self.block(lg.role == Role::Client);
        // SAFETY: aligned words inside our mapping (present: checked above); atomics only.
        let word = |at| unsafe { &*self.u64_at(b + at) }.load(Ordering::Relaxed);
        word(block::RING_TAIL).wrapping_add(word(block::FREE_HEAD))
    }

    /// RESET and DROPPED in the `ring_flags` of the ring `role` wrote (`drop_unread`).
    pub(super) fn mark_dropped(&self, role: Role) {
        if self.map.is_none() {
            return;
        }
        let flags = self.block(role == Role::Client) + block::RING_FLAGS;
        // SAFETY: an aligned word inside our mapping (present: checked above); atomics only.
        // SYNC POINT with the peer consumer's load of `ring_flags` after the fence that follows
        // its copy (`Consumer::copy_out_at`): stored before the pages go (the `MADV_REMOVE` of
        // the drop that follows, which takes them out of the peer's page tables and the file),
        // so a copy that saw a page gone sees the flag.
        unsafe { &*self.u32_at(flags) }.fetch_or(FLAG_RESET | FLAG_DROPPED, Ordering::SeqCst);
    }
}
