//! The segment header and the geometry it carries (spec/WIRE.md section 4), which the server
//! reads from a memfd the client wrote. Any bytes: an error or a header whose layout is
//! consistent (every region inside the segment, nothing overlapping), never a panic or an
//! overflow; a decoded header encodes to the same fields.
#![no_main]

use colo::wire::{Header, HEADER_FIELDS};
use colo_ring::layout::{block, Geometry, HEADER_SIZE};
use libfuzzer_sys::fuzz_target;
use std::net::SocketAddr;

fuzz_target!(|data: &[u8]| {
    // The geometry alone, from the first 12 bytes (what a hostile header carries at 24..36).
    if data.len() >= 12 {
        let w = |i: usize| u32::from_le_bytes(data[i..i + 4].try_into().unwrap());
        if let Ok(l) = (Geometry { ring_capacity: w(0), slot_size: w(4), slot_count: w(8) }).layout() {
            check_layout(&l);
        }
    }
    let Ok((h, l)) = Header::decode(data) else { return };
    check_layout(&l);
    assert_eq!(l.geometry, h.geometry);
    let mut again = [0u8; HEADER_FIELDS];
    assert_eq!(h.encode(&mut again), Ok(l));
    let (h2, l2) = Header::decode(&again).expect("an encoded header decodes");
    // An IPv4-mapped IPv6 record is written back as IPv4, the form every consumer of the
    // addresses compares (`colo_sys::host::canonical`).
    let canonical = |a: Option<SocketAddr>| a.map(|a| SocketAddr::new(colo_sys::host::canonical(a.ip()), a.port()));
    let h = Header { client_addr: canonical(h.client_addr), server_addr: canonical(h.server_addr), ..h };
    assert_eq!((h2, l2), (h, l));
});

fn check_layout(l: &colo_ring::layout::Layout) {
    let g = l.geometry;
    let n = g.slot_count as usize;
    assert!(g.ring_capacity.is_power_of_two());
    // Inside a block: the message entries, then the free entries, then the data, then the pool.
    assert!(block::MSG_ENTRIES + 8 * n <= l.free_entries);
    assert!(l.free_entries + 4 * n <= l.data_off);
    assert_eq!(l.data_off % 1024, 0);
    assert_eq!(l.pool_off % 4096, 0);
    assert!(l.pool_off >= l.data_off + g.ring_capacity as usize);
    assert!(l.pool_off + n * g.slot_size as usize <= l.block_size);
    assert_eq!(l.block_size % 4096, 0);
    assert_eq!(l.segment_size, HEADER_SIZE + 2 * l.block_size);
    assert_eq!(l.block_offset(true), HEADER_SIZE);
    assert_eq!(l.block_offset(false) + l.block_size, l.segment_size);
}
