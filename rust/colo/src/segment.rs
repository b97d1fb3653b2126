//! A mapped segment and the views each side takes of it (spec/WIRE.md section 4). All pointers
//! handed out here point into the mapping this value owns, at offsets derived from a validated
//! private copy of the geometry; none is derived from a value the peer can change later.

pub use colo_ring::layout::{Geometry, Layout};
use colo_ring::layout::{block, CLIENT_WAITING, CLIENT_WRITTEN, PARKED, SERVER_WAITING, SERVER_WRITTEN, TICKET};
use colo_ring::queue::{QueueReceiver, QueueSender, QueueWords};
use colo_ring::ring::{Consumer, Producer, RawBytes, RingWords};
use colo_ring::sync::{AtomicU32, AtomicU64, Ordering};
use colo_sys::segment::Mapping;
use colo_sys::{AsRawFd, OwnedFd, RawFd};
use crate::orphan::Unread;

mod give_back;

/// Which end of the connection we are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The side that dialed and created the segment.
    Client,
    /// The side that accepted.
    Server,
}

/// Whether segments keep their memfd open once mapped (see [`keep_memfds`]).
static KEEP_MEMFDS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Segments made from now on keep their memfd open for as long as they are mapped. The
/// LD_PRELOAD shim asks for it: a connection it hands over across `exec` is mapped again from
/// its memfd (the mapping does not survive the `exec`). Otherwise the memfd is closed once the
/// connection is set up (the mapping holds the memory), one descriptor less per connection,
/// unless its peer is another user ([`Segment::read_through_memfd`]). `colo stat` finds such a
/// segment through `/proc/PID/maps`.
pub fn keep_memfds(on: bool) {
    KEEP_MEMFDS.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// [`Segment`]'s `out_size` bit: the peer is gone.
const PEER_GONE: u8 = 1 << 7;
/// [`Segment`]'s `out_size` bit: `memfd` holds the connection's control socket instead
/// (`Segment::keep_control`), which a segment let go of needs no more than its memfd.
const CONTROL_KEPT: u8 = 1 << 6;

/// A segment mapped by this process.
#[derive(Debug)]
pub struct Segment {
    map: Option<Mapping>,
    layout: Layout,
    /// Open until [`Segment::close_memfd`].
    memfd: Option<OwnedFd>,
    /// The incoming ring is read through `memfd` ([`Segment::read_through_memfd`]).
    through_memfd: bool,
    /// Where it is: its first [`MAPPED_WINDOW`] bytes are read through the mapping all the same.
    window: Option<WindowSlot>,
    /// For a peer's segment: its bytes in this process's budgets, given back when the mapping
    /// goes (with this value).
    _lease: Option<crate::budget::Lease>,
    /// Give back the pages of the direction this role reads when unmapped
    /// ([`Segment::give_back_incoming`]).
    let_go: Option<LetGo>,
}

/// How a side that let go of its connection for good gives back the pages of its segment.
/// Two bytes: a shimmed connection's heap is counted (`a_connection_is_one_kilobyte_of_heap`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LetGo {
    role: Role,
    /// The size our producer last knew its ring at, a power of two, as its log2 (no page above
    /// it was ours to touch: a shrink gave back those above the new size), and `PEER_GONE` (the
    /// whole outgoing ring and the pool go at the give-back: nobody reads them; also set on a
    /// segment `orphan` let go of, which nothing keeps again).
    out_size: u8,
}

impl LetGo {
    fn new(role: Role, peer_gone: bool, out_size: usize) -> LetGo {
        // A ring is at most 2^30 bytes (spec/WIRE.md section 4): its log2 is below `PEER_GONE`.
        let log2 = out_size.min(1 << 30).next_power_of_two().trailing_zeros() as u8;
        LetGo { role, out_size: log2 | if peer_gone { PEER_GONE } else { 0 } }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        let Some(lg) = self.let_go else { return };
        let left = self.give_back_pages(lg);
        // Unread bytes, and messages, a peer of another user holds (we read its ring through
        // the memfd for that reason) stay charged to us while it keeps the memfd: kept mapped
        // until it reads or releases them or lets them lie too long (`orphan`), as TCP drops
        // an orphaned socket's unsent bytes on a timer.
        // Kept exactly when the give-back left something (from the same look at the peer's
        // words): else the segment is unmapped with nothing of ours in it.
        if self.through_memfd && left {
            let orphan = Segment {
                map: self.map.take(),
                layout: self.layout,
                memfd: self.memfd.take(),
                through_memfd: true,
                // No consumer outlives its segment: nothing reads the incoming ring any more.
                window: None,
                _lease: self._lease.take(),
                let_go: self.let_go,
            };
            let progress = orphan.progress(lg);
            crate::orphan::keep(Box::new(orphan), progress);
        }
        if let Some(control) = self.control() {
            // Descriptors the peer queued are closed disarmed (`doorbell::empty_before_close`).
            colo_sys::doorbell::empty_before_close(control);
        }
    }
}

/// A segment let go of (`give_back_incoming`) whose ring we wrote still holds bytes a peer of
/// another user has yet to read, as `orphan` keeps it.
impl Unread for Segment {
    /// The peer's progress (`unread_tail`: moves as the peer reads them).
    fn outgoing_tail(&self) -> Option<u64> {
        self.unread_tail(self.let_go?)
    }

    /// Whether its peer hung up (then nobody reads its bytes: they go, with DROPPED set for any
    /// holder of the peer's end that is left: `drop_unread`).
    fn peer_hung_up(&self) -> bool {
        self.control().is_some_and(colo_sys::doorbell::hung_up)
    }

    /// Gives back its pages as its drop would, without unmapping it (those of bytes the peer
    /// read since).
    fn give_back_read(&self) {
        if let Some(lg) = self.let_go {
            self.give_back_pages(lg);
        }
    }

    /// `orphan` let go of it: its last look found nothing left to read, so its drop gives back
    /// every page and keeps nothing (a peer that moves its words back after that look gains no
    /// fresh timers).
    fn let_go_final(&mut self) {
        if let Some(lg) = &mut self.let_go {
            lg.out_size |= PEER_GONE;
        }
    }

    /// RESET and DROPPED in its `ring_flags`, so that the peer reads no zero where their pages
    /// were, and every page of that ring goes when it is dropped.
    fn drop_unread(&mut self) {
        let Some(mut lg) = self.let_go else { return };
        self.mark_dropped(lg.role);
        lg.out_size |= PEER_GONE;
        self.let_go = Some(lg);
    }

    fn holds_descriptor(&self) -> bool {
        self.memfd.is_some()
    }

    /// Its pages go back through the mapping from then on (`give_back_pages` without a memfd).
    fn close_descriptor(&mut self) {
        if let Some(fd) = self.memfd.take() {
            if let Some(lg) = &mut self.let_go {
                lg.out_size &= !CONTROL_KEPT;
            }
            // A kept control socket refuses descriptors (`keep_control`): none is queued on it.
            drop(fd);
        }
    }

    /// Unmapped, its descriptor closed and its lease given back, with nothing given back to
    /// the system and no flag set: a fork child's copy of a segment its parent keeps (the
    /// child's drop would give back pages the parent still watches).
    fn let_go_in_child(&mut self) {
        self.let_go = None;
        self.map = None;
        self.memfd = None;
        self._lease = None;
        // This process's count (a copy of the parent's at the fork) loses the slot; the
        // parent's keeps it for its own copy.
        self.window = None;
    }
}

impl Segment {
    /// # Safety
    /// `map` is at least `layout.segment_size` bytes and was validated against `layout`.
    pub unsafe fn new(map: Mapping, layout: Layout, memfd: OwnedFd) -> Segment {
        assert!(map.len() >= layout.segment_size);
        Segment { map: Some(map), layout, memfd: Some(memfd), through_memfd: false, window: None, _lease: None, let_go: None }
    }

    /// An empty stand-in left behind when a closed connection hands its segment to the reaper.
    pub(crate) fn placeholder() -> Segment {
        let layout = Geometry { ring_capacity: colo_ring::layout::MIN_RING, slot_size: 0, slot_count: 0 }
            .layout()
            .expect("valid");
        Segment { map: None, layout, memfd: None, through_memfd: false, window: None, _lease: None, let_go: None }
    }

    /// Closes the memfd (the mapping holds the memory): for a connection that will never be
    /// mapped again from it. Kept where the incoming ring is read through it. Returns whether it
    /// is closed now.
    pub fn close_memfd(&mut self) -> bool {
        if !self.through_memfd {
            self.memfd = None;
        }
        self.memfd.is_none()
    }

    /// Closes the memfd unless [`keep_memfds`] asked to keep it (see [`Segment::close_memfd`]).
    pub(crate) fn close_memfd_unless_kept(&mut self) {
        if !KEEP_MEMFDS.load(std::sync::atomic::Ordering::Relaxed) {
            self.close_memfd();
        }
    }

    /// Whether the memfd is still open (so that [`Segment::read_through_memfd`] can take effect).
    pub fn has_memfd(&self) -> bool {
        self.memfd.is_some()
    }

    /// Makes the consumers taken from now on read the incoming ring with `pread` of the memfd
    /// instead of through the mapping, for a peer of another user. A page of the ring the
    /// producer never wrote (a hole: it claimed bytes it never wrote) is allocated by whoever
    /// first touches it through a mapping, and charged to that process's memory cgroup for as
    /// long as the memfd lives; a read of the file gives zeros for a hole and allocates nothing.
    /// So a peer that claims bytes it never wrote makes us read zeros and holds nothing of ours,
    /// where reading through the mapping would leave every page read charged to us while the
    /// connection stays open. The cost is a system call per read, but for the bytes in the
    /// ring's first [`MAPPED_WINDOW`], read through the mapping (at most the window's pages
    /// allocated by us) while one of this process's [`FOREIGN_WINDOWS`] is free; past them, all
    /// of the ring is read with `pread`. Without a memfd (closed already) nothing changes.
    pub fn read_through_memfd(&mut self) {
        self.through_memfd = self.memfd.is_some();
        if self.through_memfd && self.window.is_none() {
            self.window = WindowSlot::take();
        }
    }

    /// Whether the incoming ring is read through the memfd ([`Segment::read_through_memfd`]).
    pub fn reads_through_memfd(&self) -> bool {
        self.through_memfd
    }

    /// A side (`role`) that closed its connection for good: when unmapped (by the reaper), the
    /// pages of the direction it read are given back. Reading a page the peer never wrote (a
    /// hole: the peer claimed bytes it never wrote) makes the kernel allocate it, charged to the
    /// reader, and the page lives as long as the peer keeps the memfd (a server holds its
    /// client's, a client created it): a peer of another user could leave any amount of memory
    /// charged to our memory cgroup, at no cost of its own. Only at the connection's last close:
    /// unread bytes of a connection someone still holds, or of an offer never claimed (its
    /// client copies them into TCP), must stay.
    /// The ring this side wrote (at `out_size`, as its producer knew it) is given back as well,
    /// but for the pages of its unread bytes (`peer_gone`: all of it).
    pub(crate) fn give_back_incoming(&mut self, role: Role, peer_gone: bool, out_size: usize) {
        self.let_go = Some(LetGo::new(role, peer_gone, out_size));
    }

    /// Whether the peer holds messages of the pool `role` sends from ([`Segment::messages_held`]).
    pub(crate) fn peer_holds_messages(&self, role: Role) -> bool {
        self.messages_held(role == Role::Client)
    }

    /// Takes the connection's control socket at its last close, if `orphan` may keep this
    /// segment (its peer is another user and has bytes of ours to read), to watch for the
    /// peer's hang-up; it is shut down for writing, which the peer sees as our hang-up. Else
    /// gives it back.
    pub(crate) fn keep_control(&mut self, control: OwnedFd) -> Option<OwnedFd> {
        let Some(lg) = self.let_go else { return Some(control) };
        if !self.through_memfd || lg.out_size & PEER_GONE != 0 {
            return Some(control);
        }
        if self.outgoing_tail().is_none() {
            // Nothing left for the peer to read at this look: final, so that a later look
            // that read the peer's words otherwise keeps nothing unwatched (`let_go_final`).
            self.let_go_final();
            return Some(control);
        }
        // A socket that takes descriptors was shut down both ways to be emptied
        // (`doorbell::empty_before_close`): it shows a hang-up of its own.
        if colo_sys::gift::rights_on(&control) {
            return Some(control);
        }
        // SAFETY: shutdown(2) of a socket we own; no memory is passed.
        unsafe { libc::shutdown(control.as_raw_fd(), libc::SHUT_WR) };
        if let Some(lg) = &mut self.let_go {
            lg.out_size |= CONTROL_KEPT;
        }
        self.memfd = Some(control);
        None
    }

    /// The control socket `keep_control` kept.
    fn control(&self) -> Option<&OwnedFd> {
        let kept = self.let_go.is_some_and(|lg| lg.out_size & CONTROL_KEPT != 0);
        self.memfd.as_ref().filter(|_| kept)
    }

    /// As a segment let go of (`give_back_incoming`) is dropped, without unmapping it, for a
    /// process that is about to exit as the connection's last holder (the shim's relay): the
    /// pages go back, and bytes a peer of another user has yet to read are waited for, as
    /// `orphan` keeps them, until it read them or lost them. Blocks meanwhile.
    /// `hung_up` says whether the peer has gone since (then nobody reads the bytes: all go).
    pub(crate) fn let_go_before_exit(&self, role: Role, peer_gone: bool, out_size: usize, hung_up: impl Fn() -> bool) {
        let mut lg = LetGo::new(role, peer_gone, out_size);
        // Waits exactly when the give-back left something (from the same look at the peer's
        // words), as the drop keeps the segment.
        if !self.give_back_pages(lg) || !self.through_memfd {
            return;
        }
        let mut watch = crate::orphan::Watch::new(self.progress(lg));
        loop {
            std::thread::sleep(crate::orphan::LOOK);
            if hung_up() {
                break;
            }
            match watch.look(self.unread_tail(lg)) {
                crate::orphan::Look::Keep => {}
                crate::orphan::Look::Moved => {
                    self.give_back_pages(lg);
                }
                crate::orphan::Look::Done => break,
                crate::orphan::Look::Expired => {
                    self.mark_dropped(role);
                    break;
                }
            }
        }
        // Whatever ended the wait (read, hung up, expired), nothing is left to keep: every
        // page goes, however the peer's words read now.
        lg.out_size |= PEER_GONE;
        self.give_back_pages(lg);
    }

    /// This segment, counted in the budgets by `lease` until it is unmapped.
    pub(crate) fn leased(mut self, lease: crate::budget::Lease) -> Segment {
        self._lease = Some(lease);
        self
    }

    fn mapping(&self) -> &Mapping {
        self.map.as_ref().expect("a live connection has its mapping")
    }

    /// The layout (private copy).
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The base address of the mapping.
    pub fn base(&self) -> *mut u8 {
        self.mapping().as_ptr()
    }

    fn at(&self, offset: usize, len: usize) -> *mut u8 {
        assert!(offset + len <= self.layout.segment_size);
        // SAFETY: in bounds of the mapping by the assert above.
        unsafe { self.mapping().as_ptr().add(offset) }
    }

    fn u32_at(&self, offset: usize) -> *const AtomicU32 {
        debug_assert_eq!(offset % 4, 0);
        self.at(offset, 4) as *const AtomicU32
    }

    fn u64_at(&self, offset: usize) -> *const AtomicU64 {
        debug_assert_eq!(offset % 8, 0);
        self.at(offset, 8) as *const AtomicU64
    }

    /// The `waiting` flag of `role`.
    pub fn waiting(&self, role: Role) -> &AtomicU32 {
        let off = if role == Role::Client { CLIENT_WAITING } else { SERVER_WAITING };
        // SAFETY: an aligned u32 inside the mapping, which lives as long as `self`; only ever
        // accessed atomically.
        unsafe { &*self.u32_at(off) }
    }

    /// The `written` word of `role`: its own copy of the `ring_head` it produces, which no peer
    /// reads (spec/WIRE.md section 5, "Shared ends").
    pub fn written(&self, role: Role) -> &AtomicU64 {
        let off = if role == Role::Client { CLIENT_WRITTEN } else { SERVER_WRITTEN };
        // SAFETY: an aligned u64 inside the mapping, which lives as long as `self`; only ever
        // accessed atomically.
        unsafe { &*self.u64_at(off) }
    }

    /// The header's `parked` word (spec/WIRE.md section 3, "Recycling").
    pub fn parked(&self) -> &AtomicU32 {
        // SAFETY: an aligned u32 inside the mapping, alive as long as `self`; only ever accessed
        // atomically.
        unsafe { &*self.u32_at(PARKED) }
    }

    /// The header's recycling `ticket` (written by the server before it parks).
    pub fn ticket(&self) -> &AtomicU32 {
        // SAFETY: as in `parked`.
        unsafe { &*self.u32_at(TICKET) }
    }

    /// Makes both byte rings of a segment we created start small (spec/WIRE.md section 5,
    /// "Growing and shrinking"), before HELLO publishes it.
    pub fn start_rings(map: &Mapping, layout: &Layout) {
        for c2s in [true, false] {
            let b = layout.block_offset(c2s);
            // SAFETY: an aligned u32 word inside the mapping (offset of the validated layout),
            // only ever accessed atomically.
            let size = unsafe { &*(map.as_ptr().add(b + block::RING_SIZE) as *const AtomicU32) };
            size.store(colo_ring::layout::MIN_RING_SIZE, Ordering::Relaxed);
        }
    }

    /// Gives back the pages of the data of the ring of direction `c2s` in `range` (offsets in the
    /// ring's data), after the ring shrank below them.
    fn release_ring_pages(&self, c2s: bool, range: core::ops::Range<usize>) {
        let off = self.block(c2s) + self.layout.data_off;
        // Best effort: pages left in place cost memory, not correctness.
        let _ = self.mapping().release(off + range.start, range.len());
    }

    /// Makes a segment that both sides parked new again: every counter and flag of both direction
    /// blocks, both `written` copies and both `waiting` words back to 0, the rings small again and
    /// their pages given back. Only the client calls it, after its
    /// compare-and-swap of `parked` from both bits to 0 proved that neither side uses it.
    pub fn reset_for_reuse(&self) {
        for c2s in [true, false] {
            let b = self.block(c2s);
            let counters = [block::RING_HEAD, block::RING_TAIL, block::MSG_HEAD, block::MSG_TAIL, block::FREE_HEAD, block::FREE_TAIL];
            for off in counters {
                // SAFETY: an aligned u64 inside the mapping (offsets of the validated layout).
                unsafe { &*self.u64_at(b + off) }.store(0, Ordering::Relaxed);
            }
            for off in [block::RING_FLAGS, block::READ_FLAGS] {
                // SAFETY: an aligned u32 inside the mapping.
                unsafe { &*self.u32_at(b + off) }.store(0, Ordering::Relaxed);
            }
        }
        // Only as far as each ring grew (its `ring_size` before the reset): a ring that stayed
        // at its first size lies in the page of its words, and a connection per request, which
        // recycles its segment each time, then pays no system call for pages it never wrote. A
        // peer that lied about the size only keeps pages of a segment we hold anyway.
        let cap = self.layout.geometry.ring_capacity as usize;
        let grown = [true, false].map(|c2s| {
            // SAFETY: an aligned u32 inside the mapping (the validated layout's block offset).
            let size = unsafe { &*self.u32_at(self.block(c2s) + block::RING_SIZE) }.load(Ordering::Relaxed);
            (size as usize).min(cap)
        });
        Segment::start_rings(self.mapping(), &self.layout);
        self.release_ring_pages(true, 0..grown[0]);
        self.release_ring_pages(false, 0..grown[1]);
        for role in [Role::Client, Role::Server] {
            self.written(role).store(0, Ordering::Relaxed);
        }
        // `waiting` words are only ever written by read-modify-writes (section 6).
        self.waiting(Role::Client).swap(0, Ordering::Relaxed);
        self.waiting(Role::Server).swap(0, Ordering::Relaxed);
        // The HELLO that follows (a system call on the control socket) publishes these stores to
        // the server, which reads the segment only after receiving it.
    }

    fn block(&self, c2s: bool) -> usize {
        self.layout.block_offset(c2s)
    }

    /// The words of the byte ring of direction `c2s`.
    ///
    /// # Safety
    /// The returned words, and every copy of them, are used only while this segment stays
    /// mapped (while `self` lives).
    pub unsafe fn ring_words(&self, c2s: bool) -> RingWords {
        let b = self.block(c2s);
        // SAFETY: atomics inside our mapping (`at` checks the bounds; the layout's block offsets
        // are aligned for their width), used only while it is mapped by the caller's contract.
        unsafe {
            RingWords::new(
                self.u64_at(b + block::RING_HEAD),
                self.u32_at(b + block::RING_FLAGS),
                self.u32_at(b + block::RING_SIZE),
                self.u32_at(b + block::SPACE_WAKE),
                self.u64_at(b + block::RING_TAIL),
                self.u32_at(b + block::READ_FLAGS),
            )
        }
    }

    /// The first byte of the data of the ring of direction `c2s`.
    pub fn ring_data_ptr(&self, c2s: bool) -> *mut u8 {
        self.ring_data(c2s).as_ptr()
    }

    /// How far past the data of the ring of direction `c2s` its pages may be given back: to the
    /// pool, which starts on the page after the data (what lies between is padding).
    pub fn ring_release_end(&self, c2s: bool) -> *mut u8 {
        let end = self.layout.pool_off;
        self.at(self.block(c2s), end).wrapping_add(end)
    }

    fn ring_data(&self, c2s: bool) -> RawBytes {
        let cap = self.layout.geometry.ring_capacity as usize;
        let p = self.at(self.block(c2s) + self.layout.data_off, cap);
        // SAFETY: `cap` bytes inside the mapping (checked by `at`), alive as long as `self`.
        unsafe { RawBytes::new(p, cap) }
    }

    /// The producer of the direction `role` sends on.
    ///
    /// # Safety
    /// Called once per segment and role; the result must not outlive `self`.
    pub unsafe fn producer(&self, role: Role) -> Producer<RawBytes> {
        let c2s = role == Role::Client;
        // SAFETY: words and data live in the mapping; fresh ring; the caller keeps `self` alive.
        unsafe { Producer::new(self.ring_words(c2s), self.ring_data(c2s)) }
    }

    /// The producer of the direction `role` sends on, continuing a ring already in use.
    ///
    /// # Safety
    /// As for [`Segment::producer`]; no other producer of that direction exists any more.
    pub unsafe fn resumed_producer(&self, role: Role) -> Producer<RawBytes> {
        let c2s = role == Role::Client;
        // SAFETY: words and data live in the mapping; the caller keeps `self` alive.
        unsafe { Producer::resume(self.ring_words(c2s), self.ring_data(c2s)) }
    }

    /// The consumer of the direction `role` receives on, continuing a ring already in use.
    ///
    /// # Safety
    /// As for [`Segment::resumed_producer`].
    pub unsafe fn resumed_consumer(&self, role: Role) -> Consumer<InBytes> {
        let c2s = role == Role::Server;
        // SAFETY: as in `resumed_producer`.
        unsafe { Consumer::resume(self.ring_words(c2s), self.incoming_data(c2s)) }
    }

    /// The consumer of the direction `role` receives on.
    ///
    /// # Safety
    /// As for [`Segment::producer`].
    pub unsafe fn consumer(&self, role: Role) -> Consumer<InBytes> {
        let c2s = role == Role::Server;
        // SAFETY: as in `producer`.
        unsafe { Consumer::new(self.ring_words(c2s), self.incoming_data(c2s)) }
    }

    /// The data of the ring of direction `c2s`, as its consumer reads it: through the memfd
    /// once [`Segment::read_through_memfd`] asked for it.
    fn incoming_data(&self, c2s: bool) -> InBytes {
        let mapped = self.ring_data(c2s);
        let file = match (&self.memfd, self.through_memfd) {
            (Some(fd), true) => {
                let window = if self.window.is_some() { MAPPED_WINDOW as u32 } else { 0 };
                Some((fd.as_raw_fd(), window, (self.block(c2s) + self.layout.data_off) as u64))
            }
            _ => None,
        };
        InBytes { mapped, file }
    }

    fn msg_words(&self, c2s: bool) -> QueueWords {
        let b = self.block(c2s);
        QueueWords {
            head: self.u64_at(b + block::MSG_HEAD),
            tail: self.u64_at(b + block::MSG_TAIL),
            entries: self.u32_at(b + block::MSG_ENTRIES),
            len: self.layout.geometry.slot_count,
        }
    }

    fn free_words(&self, c2s: bool) -> QueueWords {
        let b = self.block(c2s);
        QueueWords {
            head: self.u64_at(b + block::FREE_HEAD),
            tail: self.u64_at(b + block::FREE_TAIL),
            entries: self.u32_at(b + self.layout.free_entries),
            len: self.layout.geometry.slot_count,
        }
    }

    /// Message queues of a pool, if the geometry has one: (sending msg queue, receiving free
    /// queue) for our outgoing direction, and (receiving msg queue, sending free queue) for the
    /// incoming one.
    ///
    /// # Safety
    /// As for [`Segment::producer`].
    #[allow(clippy::type_complexity)]
    pub unsafe fn queues(
        &self,
        role: Role,
    ) -> Option<((QueueSender<2>, QueueReceiver<1>), (QueueReceiver<2>, QueueSender<1>))> {
        if self.layout.geometry.slot_count == 0 {
            return None;
        }
        let out = role == Role::Client;
        // SAFETY: the queue words lie inside the mapping (offsets from the validated layout),
        // the queues are fresh, and the caller keeps `self` alive.
        unsafe {
            Some((
                (QueueSender::new(self.msg_words(out)), QueueReceiver::new(self.free_words(out))),
                (QueueReceiver::new(self.msg_words(!out)), QueueSender::new(self.free_words(!out))),
            ))
        }
    }

    /// Address of slot `slot` of the pool of direction `c2s`.
    pub fn slot(&self, c2s: bool, slot: u32) -> *mut u8 {
        let g = self.layout.geometry;
        assert!(slot < g.slot_count);
        let off = self.block(c2s) + self.layout.pool_off + slot as usize * g.slot_size as usize;
        self.at(off, g.slot_size as usize)
    }
}

/// How much of an incoming ring read through the memfd ([`Segment::read_through_memfd`]) is read
/// through the mapping all the same, by a segment holding one of the [`FOREIGN_WINDOWS`]: the
/// bytes at `0..MAPPED_WINDOW` of its data. A `pread` of shared memory costs a system call and a
/// page-cache lookup a page, which a copy from the mapping does not; a residency check
/// (`mincore`) before a copy costs a system call as well, and proves nothing once made (the
/// producer can punch the page before the copy touches it).
/// So the reads below the window are not checked at all: whatever the peer does, the pages our
/// reads can allocate, charged to us, are those under the window's bytes (at most 33 pages: 31
/// whole ones and two partial), at most one each at a time (a page exists once in the file; one
/// the peer punches again is uncharged; the mapping refuses huge pages), given back at our last
/// close with the rest of the ring we read ([`Segment::give_back_incoming`]). TCP lets a peer make us hold as much (its default receive
/// buffer, `tcp_rmem`'s middle value, 128 KiB) for as long as we do not read, and up to
/// `tcp_rmem`'s maximum once autotuning grew the buffer. An answer that fits the window is read
/// at the mapping's cost: a ring grows to the smallest power of two that holds its unread bytes,
/// 128 KiB for one answer of up to 128 KiB.
pub const MAPPED_WINDOW: usize = 128 << 10;

/// How many segments of this process read a [`MAPPED_WINDOW`] of their incoming ring through
/// the mapping at once: 64, so that all peers of other users together can make us allocate at
/// most 64 windows' pages (33 pages each: 8.25 MiB) through mappings, where the budgets
/// of mapped bytes (`colo::budget`) let one user hold thousands of segments. A segment past
/// them reads all of its incoming ring with `pread` (window 0).
pub const FOREIGN_WINDOWS: usize = 64;

/// How many [`WindowSlot`]s this process holds. A fork child starts with its parent's count and
/// copies of its segments: each copy gives its slot back to the child's count when dropped or let
/// go of (`let_go_in_child`); a copy never dropped (its thread is not in the child) leaves the
/// child fewer windows, never more.
static WINDOWS_HELD: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One of the [`FOREIGN_WINDOWS`], given back when dropped (once: it is neither `Clone` nor
/// `Copy`).
#[derive(Debug)]
struct WindowSlot(());

impl WindowSlot {
    /// A free slot, if there is one.
    fn take() -> Option<WindowSlot> {
        // A count alone: it publishes no memory.
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        let took = WINDOWS_HELD.fetch_update(relaxed, relaxed, |n| (n < FOREIGN_WINDOWS).then_some(n + 1));
        took.ok().map(|_| WindowSlot(()))
    }
}

impl Drop for WindowSlot {
    fn drop(&mut self) {
        WINDOWS_HELD.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The data of an incoming ring: read through the mapping, or with `pread` of the segment's
/// memfd (see [`Segment::read_through_memfd`]) beyond its window.
#[derive(Debug, Clone, Copy)]
pub struct InBytes {
    mapped: RawBytes,
    /// The memfd (owned by the segment, open while the segment lives); the window: the bytes at
    /// `0..window` are read through the mapping ([`MAPPED_WINDOW`] for a segment holding one of
    /// the [`FOREIGN_WINDOWS`], else 0); and the data's offset in the memfd. The window sits in
    /// the tuple's padding: a connection's state stays within its kilobyte.
    file: Option<(RawFd, u32, u64)>,
}

// SAFETY: `store` and `load` stay inside `mapped` (its own contract) or read the same range of the
// file that is mapped there.
unsafe impl colo_ring::ring::Bytes for InBytes {
    fn capacity(&self) -> usize {
        self.mapped.capacity()
    }
    unsafe fn store(&self, at: usize, src: &[u8]) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.mapped.store(at, src) }
    }
    unsafe fn load(&self, at: usize, dst: &mut [u8]) {
        let Some((fd, window, off)) = self.file else {
            // SAFETY: the caller's contract, passed on.
            return unsafe { self.mapped.load(at, dst) };
        };
        // The bytes below the window through the mapping: the most a peer can make us allocate
        // there is the pages under it (see `MAPPED_WINDOW`).
        let mut done = (window as usize).saturating_sub(at).min(dst.len());
        // SAFETY: the caller's contract: `at + done <= at + dst.len()` is inside the region.
        unsafe { self.mapped.load(at, &mut dst[..done]) };
        while done < dst.len() {
            // SAFETY: the segment's memfd, open while the segment (which outlives this value's
            // users) lives.
            let file = unsafe { colo_sys::BorrowedFd::borrow_raw(fd) };
            match colo_sys::segment::read_at_checked(file, &mut dst[done..], off + (at + done) as u64) {
                Ok(n) if n > 0 => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // The file is sealed at the segment's size, so neither happens; should one, the
                // mapping gives the same bytes (at the cost the file read avoids).
                Ok(_) | Err(_) => {
                    // SAFETY: the caller's contract: `at + dst.len()` is inside the region.
                    return unsafe { self.mapped.load(at + done, &mut dst[done..]) };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A segment of our own with 256 KiB rings, its memfd kept, and the offset and length of the
    /// client-to-server ring's data in the file.
    fn segment() -> (Segment, usize, usize) {
        let layout = Geometry { ring_capacity: 256 << 10, slot_size: 0, slot_count: 0 }.layout().unwrap();
        let (memfd, map) = colo_sys::segment::create(layout.segment_size).unwrap();
        Segment::start_rings(&map, &layout);
        // SAFETY: `create` mapped exactly `layout.segment_size` bytes, laid out by `layout`.
        let seg = unsafe { Segment::new(map, layout, memfd) };
        let (off, cap) = (seg.block(true) + seg.layout.data_off, seg.layout.geometry.ring_capacity as usize);
        (seg, off, cap)
    }

    /// Bytes of the file in `off..off + len` that hold pages (`SEEK_DATA`/`SEEK_HOLE`).
    fn allocated(seg: &Segment, off: usize, len: usize) -> usize {
        let fd = seg.memfd.as_ref().unwrap().as_raw_fd();
        let (mut at, end, mut total) = (off as i64, (off + len) as i64, 0);
        while at < end {
            // SAFETY: lseek on our own memfd.
            let data = unsafe { libc::lseek(fd, at, libc::SEEK_DATA) };
            if data < 0 || data >= end {
                break;
            }
            // SAFETY: as above.
            let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) }.min(end);
            total += (hole - data) as usize;
            at = hole;
        }
        total
    }

    /// A side that lets go of its connection gives back the pages of the ring it wrote but those
    /// of the bytes its peer has yet to read (all of them once the peer is gone): the peer keeps
    /// the memfd, and every page left there stays charged to the writer.
    #[test]
    fn letting_go_gives_back_the_written_ring_but_its_unread_bytes() {
        for gone in [false, true] {
            let (seg, off, cap) = segment();
            let memfd = seg.memfd.as_ref().unwrap().try_clone().unwrap();
            // SAFETY: one producer and one consumer of this direction, not used once `seg` is dropped.
            let (mut tx, mut rx) = unsafe { (seg.producer(Role::Client), seg.consumer(Role::Server)) };
            let mut buf = vec![0xabu8; cap - 50];
            let mut wrote = 0;
            while wrote < buf.len() {
                wrote += tx.write(&buf[wrote..]).unwrap();
            }
            let mut read = 0;
            while read < buf.len() {
                read += rx.read(&mut buf[read..]).unwrap();
            }
            assert_eq!(tx.write(&[0xcd; 100]).unwrap(), 100, "unread bytes across the wrap");
            assert!(allocated(&seg, off, cap) >= cap - 4096, "the writer touched the whole ring");
            let mut seg = seg;
            seg.give_back_incoming(Role::Client, gone, cap);
            drop(seg);
            let mut left = seg_with(memfd);
            // The data's first page holds the direction's words too and stays; so do the pages of
            // the unread bytes while the peer may read them.
            let most = 4096 - off % 4096 + if gone { 0 } else { 4096 };
            let held = allocated(&left, off, cap);
            assert!(held <= most, "peer gone: {gone}: {held} bytes of the ring left allocated, at most {most}");
            left.memfd.take();
        }
    }

    /// A mapping of `memfd` (a segment of [`segment`]'s geometry) to look at its file.
    fn seg_with(memfd: OwnedFd) -> Segment {
        let layout = Geometry { ring_capacity: 256 << 10, slot_size: 0, slot_count: 0 }.layout().unwrap();
        let map = colo_sys::segment::attach(&memfd, layout.segment_size).unwrap();
        // SAFETY: `attach` mapped the segment's `layout.segment_size` bytes.
        unsafe { Segment::new(map, layout, memfd) }
    }

    /// Through the memfd, a consumer reads what the producer wrote, across the ring's wrap and
    /// its growth, and a region the producer claimed without writing (its pages punched after
    /// the write) reads as zeros and stays unallocated above [`MAPPED_WINDOW`]; through the
    /// mapping the same read allocates all of it.
    #[test]
    fn a_consumer_reading_through_the_memfd_allocates_no_hole() {
        for through in [true, false] {
            let (mut seg, off, cap) = segment();
            if through {
                seg.read_through_memfd();
            }
            // SAFETY: one producer and one consumer of this direction, dropped before `seg`.
            let (mut tx, mut rx) = unsafe { (seg.producer(Role::Client), seg.consumer(Role::Server)) };
            let pattern: Vec<u8> = (0..cap as u32 * 3).map(|i| (i * 7 % 251) as u8).collect();
            let (mut sent, mut got) = (0, Vec::new());
            while got.len() < pattern.len() {
                let wrote = tx.write(&pattern[sent..(sent + 5000).min(pattern.len())]).unwrap();
                sent += wrote;
                let mut buf = [0u8; 3000];
                let n = rx.read(&mut buf).unwrap();
                assert!(wrote + n > 0, "no progress: {sent} bytes sent, {} read", got.len());
                got.extend_from_slice(&buf[..n]);
            }
            assert_eq!(got, pattern, "every byte in order (through the memfd: {through})");
            let (from, to, kept) = read_holes(&seg, &mut tx, &mut rx, off, cap);
            if through {
                // The window is read through the mapping: its pages, and none above them.
                let cut = (off + MAPPED_WINDOW).next_multiple_of(4096);
                assert_eq!(allocated(&seg, cut, to - cut), 0, "reading holes through the memfd allocated pages above the window");
                assert!(kept <= cut - from, "reading holes allocated {kept} bytes, the window's pages are {}", cut - from);
            } else {
                assert_eq!(kept, to - from, "reading holes through the mapping allocates them");
            }
        }
    }

    /// Fills the client-to-server ring of `seg` (data at `off`, `cap` bytes) through `tx`, gives
    /// back the pages of its data (bytes claimed, never written: holes), reads them all through
    /// `rx` (as zeros), and returns the whole pages of the data (`from..to` in the file) and how
    /// many bytes of them the read left allocated.
    fn read_holes(seg: &Segment, tx: &mut Producer<RawBytes>, rx: &mut Consumer<InBytes>, off: usize, cap: usize) -> (usize, usize, usize) {
        let fill = vec![0x5au8; cap];
        let mut claimed = 0;
        while claimed < cap {
            let n = tx.write(&fill[..cap - claimed]).unwrap();
            assert!(n > 0, "the ring grows to its capacity ({claimed} bytes in it)");
            claimed += n;
        }
        // The whole pages of the data (its first page holds the ring's words too).
        let (from, to) = (off.next_multiple_of(4096), (off + cap) / 4096 * 4096);
        seg.mapping().release(from, to - from).unwrap();
        assert_eq!(allocated(seg, from, to - from), 0);
        let mut buf = vec![0xAAu8; cap];
        assert_eq!(rx.read(&mut buf).unwrap(), cap);
        assert!(buf[from - off..to - off].iter().all(|&b| b == 0), "a hole reads as zeros");
        (from, to, allocated(seg, from, to - from))
    }

    /// Past this process's [`FOREIGN_WINDOWS`], a segment read through the memfd reads all of its
    /// ring with `pread`: the holes it reads allocate nothing, not even under the window. Each of
    /// `FOREIGN_WINDOWS + 1` segments held at once reads a ring of holes: at least one allocates
    /// nothing, none more than a window's pages; a slot given back serves the next segment.
    #[test]
    fn segments_past_the_window_budget_allocate_nothing_through_the_mapping() {
        let mut held = Vec::new();
        let mut none = 0;
        for _ in 0..=FOREIGN_WINDOWS {
            let (mut seg, off, cap) = segment();
            seg.read_through_memfd();
            // SAFETY: one producer and one consumer of this direction, dropped before `seg`.
            let (mut tx, mut rx) = unsafe { (seg.producer(Role::Client), seg.consumer(Role::Server)) };
            let (from, _, kept) = read_holes(&seg, &mut tx, &mut rx, off, cap);
            let window = (off + MAPPED_WINDOW).next_multiple_of(4096) - from;
            assert!(kept <= window, "reading holes allocated {kept} bytes, a window's pages are {window}");
            none += usize::from(kept == 0);
            held.push(seg);
        }
        assert!(none >= 1, "all {} segments read holes through the mapping", FOREIGN_WINDOWS + 1);
        drop(held);
        let (mut seg, off, cap) = segment();
        seg.read_through_memfd();
        // SAFETY: as above.
        let (mut tx, mut rx) = unsafe { (seg.producer(Role::Client), seg.consumer(Role::Server)) };
        assert!(read_holes(&seg, &mut tx, &mut rx, off, cap).2 > 0, "the slots given back serve the next segment's window");
    }
}
