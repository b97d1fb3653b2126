//! What a client's `connect` is told to do once the offer step (`client`) or the proposal to
//! another namespace (`elsewhere`) is made, and the two knobs both dial with.

use crate::conn::entry::Pending;
use crate::conn::table::Entry;
use colo_ring::layout::Geometry;
use std::net::SocketAddr;
use std::time::Duration;

/// How long a client waits for a server's answer (`COLO_CARRIER_TIMEOUT_MS`, 500 ms).
pub(crate) fn timeout() -> Duration {
    static T: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *T.get_or_init(|| {
        let ms = std::env::var("COLO_CARRIER_TIMEOUT_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(500u64);
        Duration::from_millis(ms)
    })
}

/// The rings a client offers (`COLO_RING_KB`, else the default), read once per process image.
pub(crate) fn geometry() -> Geometry {
    static G: std::sync::OnceLock<Geometry> = std::sync::OnceLock::new();
    *G.get_or_init(|| {
        // At most 64 MiB: a larger segment is refused by every listener (`colo_sys::segment::MAX_SEGMENT`).
        let kb = std::env::var("COLO_RING_KB").ok().and_then(|v| v.parse::<u32>().ok()).filter(|kb| (4..=1 << 16).contains(kb));
        let cap = kb.map_or_else(colo::default_ring, |kb| (kb * 1024).next_power_of_two());
        Geometry { ring_capacity: cap, slot_size: 0, slot_count: 0 }
    })
}

/// What `connect` should do after the offer step.
pub enum Prepared {
    /// Not a colo destination: do a plain connect.
    Plain,
    /// A local destination where no colo listener answered: do a plain connect, and if a TCP
    /// listener took it, let `adapt` remember that there is no colo listener there
    /// (`client::note_no_listener`).
    NoListener(SocketAddr),
    /// An offer is out: connect, then record it.
    Offered(Box<Pending>),
    /// Connected, or connecting with the PROPOSAL out (a listener in another network namespace,
    /// spec/WIRE.md section 11: `service::elsewhere`): record `later` unless it is
    /// `Entry::None`; `connect` returns `errno` (0: success).
    Connected { later: Entry, errno: i32 },
}
