//! Where everything lives in a segment (spec/WIRE.md section 4): the geometry a client chooses and
//! the offsets every implementation derives from it.

/// Size of the segment header: the client→server block follows it on its first page, so a quiet
/// connection touches two pages (spec/WIRE.md section 4).
pub const HEADER_SIZE: usize = 1024;
/// Magic at offset 0 of the segment header.
pub const SEGMENT_MAGIC: [u8; 8] = *b"COLOSEG\0";
/// The wire version this crate speaks.
pub const VERSION: u32 = 1;
/// Offset of the `parked` word in the header (recycling, spec/WIRE.md section 3).
pub const PARKED: usize = 96;
/// Offset of the server's recycling `ticket` in the header.
pub const TICKET: usize = 100;
/// `parked` bit: the client closed the connection and keeps the segment for reuse.
pub const CLIENT_PARKED: u32 = 1;
/// `parked` bit: the server closed the connection and keeps the segment for reuse.
pub const SERVER_PARKED: u32 = 2;
/// Offset of the client's `waiting` flag in the header.
pub const CLIENT_WAITING: usize = 128;
/// Offset of the server's `waiting` flag in the header.
pub const SERVER_WAITING: usize = 256;
/// Offset of the client's `c2s_written` word in the header: its own copy of the C2S `ring_head`,
/// for the processes that hold the client's end (spec/WIRE.md section 5, "Shared ends").
pub const CLIENT_WRITTEN: usize = 384;
/// Offset of the server's `s2c_written` word in the header (its copy of the S2C `ring_head`).
pub const SERVER_WRITTEN: usize = 512;

/// Offsets inside a direction block.
pub mod block {
    /// `ring_head` (producer).
    pub const RING_HEAD: usize = 0;
    /// `ring_flags` (producer): FIN, RESET, NOT_READING.
    pub const RING_FLAGS: usize = 8;
    /// `ring_size` (producer): the ring's current size (spec/WIRE.md section 5, "Growing and
    /// shrinking").
    pub const RING_SIZE: usize = 12;
    /// `space_wake` (producer): a producer waiting for space is woken once at most this many
    /// bytes are unread (spec/WIRE.md section 6, "Waiting for space"); 0: once any byte is free.
    pub const SPACE_WAKE: usize = 16;
    /// `ring_tail` (consumer).
    pub const RING_TAIL: usize = 128;
    /// `read_flags` (consumer): READ_CLOSED.
    pub const READ_FLAGS: usize = 136;
    /// `msg_head` (producer).
    pub const MSG_HEAD: usize = 256;
    /// `msg_tail` (consumer).
    pub const MSG_TAIL: usize = 384;
    /// `free_head` (consumer).
    pub const FREE_HEAD: usize = 512;
    /// `free_tail` (producer).
    pub const FREE_TAIL: usize = 640;
    /// The message entries.
    pub const MSG_ENTRIES: usize = 768;
}

/// `ring_flags`: the producer shut down its write side.
pub const FLAG_FIN: u32 = 1;
/// `ring_flags`: the producer reset the connection.
pub const FLAG_RESET: u32 = 2;
/// `ring_flags`: the producer of this ring no longer reads the opposite ring (it shut down its
/// read side or closed, and set `READ_CLOSED` there): the opposite ring's producer fails its
/// writes with EPIPE. It stands in this word because every write reads it anyway (for RESET);
/// reading `read_flags` instead would pull the consumer's `ring_tail` line across CPUs on every
/// write (spec/WIRE.md section 8).
pub const FLAG_NOT_READING: u32 = 4;
/// `ring_flags`, set with `RESET`: the producer gave back the pages of its unread bytes (a side
/// that closed with bytes its peer of another user left unread for too long, spec/WIRE.md
/// section 8, "Orphaned bytes"). A consumer that sees it after a copy drops what it copied: the
/// copy may hold zeros where those pages were.
pub const FLAG_DROPPED: u32 = 8;
/// Every bit a `ring_flags` word may hold.
pub const RING_FLAGS: u32 = FLAG_FIN | FLAG_RESET | FLAG_NOT_READING | FLAG_DROPPED;
/// `read_flags`: the consumer shut down its read side.
pub const FLAG_READ_CLOSED: u32 = 1;

/// Smallest byte-ring capacity (`ring_capacity`).
pub const MIN_RING: u32 = 4096;
/// The size every ring starts at and shrinks back to, and the smallest `ring_size`: with the ring
/// data 1024 bytes into its block, a quiet ring and its words share one page.
pub const MIN_RING_SIZE: u32 = 2048;

/// Largest byte-ring capacity.
pub const MAX_RING: u32 = 1 << 30;
/// Largest number of pool slots.
pub const MAX_SLOTS: u32 = 65536;
/// Largest pool slot.
pub const MAX_SLOT_SIZE: u32 = 1 << 30;

/// The sizes a client chooses for a connection; identical for both directions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes of each byte ring (a power of two).
    pub ring_capacity: u32,
    /// Bytes of each pool slot (a multiple of 64; 0 for no pool).
    pub slot_size: u32,
    /// Number of pool slots per direction (0 for no pool).
    pub slot_count: u32,
}

/// Offsets derived from a [`Geometry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// The geometry these offsets come from.
    pub geometry: Geometry,
    /// Offset of the free-queue entries inside a block.
    pub free_entries: usize,
    /// Offset of the ring data inside a block.
    pub data_off: usize,
    /// Offset of the pool inside a block.
    pub pool_off: usize,
    /// Size of one direction block.
    pub block_size: usize,
    /// Size of the whole segment.
    pub segment_size: usize,
}

fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

impl Geometry {
    /// Checks the limits of spec/WIRE.md section 4 and derives the offsets.
    ///
    /// ```
    /// use colo_ring::layout::Geometry;
    /// let l = Geometry { ring_capacity: 65536, slot_size: 0, slot_count: 0 }.layout().unwrap();
    /// assert_eq!(l.segment_size, 1024 + 2 * (4096 + 65536));
    /// ```
    pub fn layout(self) -> Result<Layout, &'static str> {
        let Geometry { ring_capacity: cap, slot_size, slot_count } = self;
        if !cap.is_power_of_two() || !(MIN_RING..=MAX_RING).contains(&cap) {
            return Err("ring capacity must be a power of two from 4 KiB to 1 GiB");
        }
        if slot_size % 64 != 0 || slot_size > MAX_SLOT_SIZE {
            return Err("slot size must be a multiple of 64, at most 1 GiB");
        }
        if slot_count > MAX_SLOTS || (slot_count == 0) != (slot_size == 0) {
            return Err("slot count must be 1..=65536 with a slot size, 0 without");
        }
        let n = slot_count as usize;
        let free_entries = block::MSG_ENTRIES + 8 * n;
        let data_off = round_up(free_entries + 4 * n, 1024);
        let pool_off = round_up(data_off + cap as usize, 4096);
        let block_size = round_up(pool_off + n * slot_size as usize, 4096);
        Ok(Layout {
            geometry: self,
            free_entries,
            data_off,
            pool_off,
            block_size,
            segment_size: HEADER_SIZE + 2 * block_size,
        })
    }
}

impl Layout {
    /// Offset of the client→server block (`c2s == true`) or the server→client block.
    pub fn block_offset(&self, c2s: bool) -> usize {
        if c2s {
            HEADER_SIZE
        } else {
            HEADER_SIZE + self.block_size
        }
    }
}
