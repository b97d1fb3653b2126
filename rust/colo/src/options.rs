//! Per-connection settings.

use colo_ring::layout::Geometry;
use colo_ring::spin::{SpinMode, DEFAULT_SPIN};
use std::time::Duration;

/// Settings for new connections: ring and pool sizes, spinning, timeouts.
///
/// ```
/// let opts = colo::Options::new().ring_capacity(1 << 20).pool(1 << 20, 8);
/// assert_eq!(opts.geometry().slot_count, 8);
/// ```
#[derive(Debug, Clone)]
pub struct Options {
    geometry: Geometry,
    spin: Option<SpinMode>,
    connect_timeout: Duration,
    tcp_connect_timeout: Option<Duration>,
    direct_any_uid: Option<bool>,
}

/// Default largest byte ring per direction when the kernel's TCP send buffer maximum cannot be
/// read (see [`default_ring`]).
pub const DEFAULT_RING: u32 = 8 << 20;

/// The largest size a connection's byte rings grow to by default: what one direction of a TCP
/// connection buffers at most, the sender's send buffer (`net.ipv4.tcp_wmem`'s maximum) and about
/// as much again in the receiver's, so twice that maximum rounded up to a power of two, from
/// 256 KiB to 64 MiB. Every ring starts at 2 KiB and grows only while its reader falls behind
/// (spec/WIRE.md section 5), so the size costs address space, not memory.
pub fn default_ring() -> u32 {
    static RING: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *RING.get_or_init(|| {
        let max = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_wmem")
            .ok()
            .and_then(|v| v.split_whitespace().nth(2).and_then(|m| m.parse::<u32>().ok()));
        max.map_or(DEFAULT_RING, |m| m.clamp(128 << 10, 32 << 20).next_power_of_two() * 2)
    })
}
/// Default pool: 16 slots of 64 KiB per direction (memory is only used when touched).
pub const DEFAULT_SLOT_SIZE: u32 = 64 * 1024;
/// Default number of pool slots.
pub const DEFAULT_SLOTS: u32 = 16;

impl Default for Options {
    fn default() -> Self {
        Options::new()
    }
}

impl Options {
    /// The defaults: rings that grow up to [`default_ring`] bytes, 16 x 64 KiB pool, spin from `COLO_SPIN_US` or 5 us adaptive.
    pub fn new() -> Options {
        Options {
            geometry: Geometry { ring_capacity: default_ring(), slot_size: DEFAULT_SLOT_SIZE, slot_count: DEFAULT_SLOTS },
            spin: None,
            connect_timeout: Duration::from_millis(200),
            tcp_connect_timeout: None,
            direct_any_uid: None,
        }
    }

    /// The largest size each direction's byte ring may grow to (a power of two, 4 KiB to 1 GiB).
    /// A ring starts at 2 KiB and grows when a write does not fit beside what the reader has not
    /// caught up (up to this size: a writer ahead of its reader blocks no sooner than over TCP),
    /// and gives its memory back after a second with nothing in flight. Listeners refuse a
    /// segment over 256 MiB (both directions' rings and pools; `colo_sys::segment::MAX_SEGMENT`),
    /// and the connection then uses TCP: rings of up to 64 MiB fit.
    pub fn ring_capacity(mut self, bytes: u32) -> Options {
        self.geometry.ring_capacity = bytes;
        self
    }

    /// Zero-copy pool per direction: `count` slots of `slot_size` bytes (0, 0 for none).
    pub fn pool(mut self, slot_size: u32, count: u32) -> Options {
        self.geometry.slot_size = slot_size.div_ceil(64) * 64;
        self.geometry.slot_count = count;
        self
    }

    /// Spin policy; overrides `COLO_SPIN_US`.
    pub fn spin(mut self, mode: SpinMode) -> Options {
        self.spin = Some(mode);
        self
    }

    /// How long the first `connect` to a listener waits for its answer before it returns a
    /// pending connection (bytes written meanwhile wait in the ring, as in a TCP backlog). Later
    /// connects to a listener that answered do not wait at all. Default 200 ms: a server under
    /// `colo run` answers from its own thread, which a loaded machine may not run for a while, and
    /// its REJECT(NEED_CARRIER) must arrive before we write (or the dial cannot fall back).
    pub fn connect_timeout(mut self, t: Duration) -> Options {
        self.connect_timeout = t;
        self
    }

    /// The longest a plain TCP connect (the fallback) may take before it fails with `TimedOut`
    /// (by default, or with zero, the kernel's own limit: about two minutes for an unanswered SYN).
    pub fn tcp_connect_timeout(mut self, t: Duration) -> Options {
        self.tcp_connect_timeout = Some(t).filter(|t| !t.is_zero());
        self
    }

    /// A listener's opt-in: take DIRECT connections (no TCP handshake) from clients of any uid,
    /// not only of its own. A DIRECT connection passes no firewall (netfilter), cgroup BPF or
    /// Landlock rule; so by default a client of another uid is told NEED_CARRIER and connects
    /// with a CARRIER offer over a real TCP connection, which those rules admit or refuse
    /// (docs/ARCHITECTURE.md, "Trust comes from the admitted connection"). Opt in only where no
    /// such rule must hold between local users. Default: `COLO_DIRECT_ANY_UID=1` in the
    /// environment, else off.
    pub fn direct_from_any_uid(mut self, on: bool) -> Options {
        self.direct_any_uid = Some(on);
        self
    }

    /// Whether a listener takes DIRECT connections from any uid: [`Options::direct_from_any_uid`],
    /// else `COLO_DIRECT_ANY_UID=1`.
    pub fn direct_any_uid(&self) -> bool {
        self.direct_any_uid.unwrap_or_else(|| std::env::var("COLO_DIRECT_ANY_UID").is_ok_and(|v| v == "1"))
    }

    /// The TCP connect limit, if one was set.
    pub fn tcp_connect_limit(&self) -> Option<Duration> {
        self.tcp_connect_timeout
    }

    /// The geometry new connections get.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// The handshake timeout.
    pub fn handshake_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The spin policy in effect: this setting, else `COLO_SPIN_US`, else the default.
    pub fn spin_mode(&self) -> SpinMode {
        self.spin.unwrap_or_else(|| {
            std::env::var("COLO_SPIN_US").ok().and_then(|v| SpinMode::parse(&v)).unwrap_or(DEFAULT_SPIN)
        })
    }
}
