//! Encoding of the wire (spec/WIRE.md sections 2 to 4): rendezvous names, handshake messages and
//! the segment header. Pure functions over bytes; the golden vectors in `spec/vectors/` test them.

use colo_ring::layout::{Geometry, Layout, HEADER_SIZE, SEGMENT_MAGIC, VERSION as SEGMENT_VERSION};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The bytes "COLO" read as a little-endian u32.
pub const MAGIC: u32 = 0x4F4C_4F43;
/// The protocol version this crate speaks.
pub const VERSION: u8 = 1;
/// Every handshake message is exactly this long.
pub const MESSAGE_LEN: usize = 16;

/// How a client attaches a segment to a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The control socket is the connection (API to API).
    Direct = 1,
    /// A loopback TCP connection carries the 4-tuple (an unmodified program's side).
    Carrier = 2,
}

/// Why a server refused a HELLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Malformed message or wrong descriptors.
    BadMessage = 1,
    /// Version not spoken.
    BadVersion = 2,
    /// Segment header, size or seals invalid.
    BadSegment = 3,
    /// This server accepts only CARRIER mode.
    NeedCarrier = 4,
    /// No TCP connection with that 4-tuple was accepted.
    NotClaimed = 5,
    /// Out of descriptors or memory.
    NoResources = 6,
    /// This listener's TCP socket does not take connections to the address the client dialed
    /// (an IPv4 address, and an IPv6 socket with `IPV6_V6ONLY`).
    NotServed = 7,
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Reason::BadMessage => "a malformed message",
            Reason::BadVersion => "a wire version it does not speak",
            Reason::BadSegment => "an invalid segment",
            Reason::NeedCarrier => "it takes CARRIER offers only",
            Reason::NotClaimed => "the connection was accepted without the offer (another process took it, or its program passed it on)",
            Reason::NoResources => "out of descriptors or memory",
            Reason::NotServed => "its TCP socket does not take connections to that address",
        })
    }
}

impl Reason {
    fn from_u8(v: u8) -> Option<Reason> {
        Some(match v {
            1 => Reason::BadMessage,
            2 => Reason::BadVersion,
            3 => Reason::BadSegment,
            4 => Reason::NeedCarrier,
            5 => Reason::NotClaimed,
            6 => Reason::NoResources,
            7 => Reason::NotServed,
            _ => return None,
        })
    }
}

/// HELLO `flags` bit: reuse a parked segment (no descriptors; the ticket in bytes 12..16).
pub const FLAG_RECYCLE: u32 = 1;
/// HELLO flag: a CARRIER offer across network namespaces, whose segment header carries the
/// proof at [`PROOF_OFFSET`] (spec/WIRE.md section 11).
pub const FLAG_NETNS: u32 = 2;
/// Offset of the cross-namespace proof in the segment header (client nonce, then server nonce;
/// zero in every other segment).
pub const PROOF_OFFSET: usize = 104;
/// Length of the cross-namespace proof: an 8-byte client nonce and a 16-byte server nonce.
pub const PROOF_LEN: usize = 24;

/// The type of ASK: a process listening on an address with `SO_REUSEPORT` whose rendezvous another
/// process of the same user holds asks that process for the offer of a connection it accepted
/// (spec/WIRE.md section 3, "Offers for another process's listener").
pub const ASK: u8 = 4;
/// The longest connection text an ASK carries after its header.
pub const ASK_KEY_MAX: usize = 128;

/// An ASK for the connection named `key` (`client|server`, section 2's address texts).
///
/// ```
/// let key = b"127.0.0.1:40001|127.0.0.1:6379";
/// let m = colo::wire::encode_ask(key).unwrap();
/// assert_eq!(colo::wire::decode_ask(&m), Some((colo::wire::VERSION, &key[..])));
/// assert_eq!(colo::wire::decode_ask(&m[..colo::wire::MESSAGE_LEN]), None);
/// assert!(colo::wire::encode_ask(&[b'x'; 129]).is_none());
/// ```
pub fn encode_ask(key: &[u8]) -> Option<Vec<u8>> {
    if key.is_empty() || key.len() > ASK_KEY_MAX {
        return None;
    }
    let mut b = vec![0u8; MESSAGE_LEN];
    b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    b[4] = ASK;
    b[5] = VERSION;
    b.extend_from_slice(key);
    Some(b)
}

/// The version and connection text of an ASK; `None` if `b` is not one (a HELLO, say).
pub fn decode_ask(b: &[u8]) -> Option<(u8, &[u8])> {
    let key = b.get(MESSAGE_LEN..).filter(|k| !k.is_empty() && k.len() <= ASK_KEY_MAX)?;
    (b[0..4] == MAGIC.to_le_bytes() && b[4] == ASK).then_some((b[5], key))
}

/// A decoded handshake message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message {
    /// Client → server, with the segment memfd attached.
    Hello { version: u8, mode: Mode },
    /// Client → server, without descriptors: a DIRECT HELLO that reuses the segment the server
    /// parked under `ticket` (flag [`FLAG_RECYCLE`]; spec/WIRE.md section 3, "Recycling").
    Recycle { version: u8, ticket: u32 },
    /// Server → client: accepted.
    Welcome { version: u8 },
    /// Server → client: refused; `version` is the highest the server speaks.
    Reject { version: u8, reason: Reason },
}

impl Message {
    /// The 16 bytes of this message.
    pub fn encode(self) -> [u8; MESSAGE_LEN] {
        let (kind, version, arg, flags, ticket) = match self {
            Message::Hello { version, mode } => (1, version, mode as u8, 0, 0),
            Message::Recycle { version, ticket } => (1, version, Mode::Direct as u8, FLAG_RECYCLE, ticket),
            Message::Welcome { version } => (2, version, 0, 0, 0),
            Message::Reject { version, reason } => (3, version, reason as u8, 0, 0),
        };
        let mut b = [0u8; MESSAGE_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = kind;
        b[5] = version;
        b[6] = arg;
        b[8..12].copy_from_slice(&flags.to_le_bytes());
        b[12..16].copy_from_slice(&ticket.to_le_bytes());
        b
    }

    /// Parses a message; unknown `flags` bits are ignored.
    pub fn decode(b: &[u8]) -> Result<Message, &'static str> {
        if b.len() != MESSAGE_LEN {
            return Err("handshake message is not 16 bytes");
        }
        if b[0..4] != MAGIC.to_le_bytes() {
            return Err("bad magic");
        }
        let (version, arg) = (b[5], b[6]);
        match b[4] {
            1 => {
                let mode = match arg {
                    1 => Mode::Direct,
                    2 => Mode::Carrier,
                    _ => return Err("unknown mode"),
                };
                let flags = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
                if mode == Mode::Direct && flags & FLAG_RECYCLE != 0 {
                    return Ok(Message::Recycle { version, ticket: u32::from_le_bytes(b[12..16].try_into().expect("4 bytes")) });
                }
                Ok(Message::Hello { version, mode })
            }
            2 => Ok(Message::Welcome { version }),
            3 => Ok(Message::Reject { version, reason: Reason::from_u8(arg).ok_or("unknown reason")? }),
            _ => Err("unknown message type"),
        }
    }
}

/// The rendezvous name (without the leading NUL) of a listener on `addr`.
///
/// ```
/// let a: std::net::SocketAddr = "[::ffff:127.0.0.1]:9000".parse().unwrap();
/// assert_eq!(colo::wire::rendezvous_name(a), "colo/1/127.0.0.1:9000");
/// ```
pub fn rendezvous_name(addr: SocketAddr) -> String {
    match colo_sys::host::canonical(addr.ip()) {
        IpAddr::V4(ip) => format!("colo/1/{ip}:{}", addr.port()),
        IpAddr::V6(ip) => format!("colo/1/[{ip}]:{}", addr.port()),
    }
}

/// How many bytes of a command line its program tag hashes (spec/WIRE.md section 2).
pub const TAG_BYTES: usize = 4096;

/// The tag of a program run a certain way (spec/WIRE.md section 2): the top 48 bits of the
/// FNV-1a 64-bit hash of the first [`TAG_BYTES`] (or fewer) of its `/proc/<pid>/cmdline` bytes.
///
/// ```
/// assert_eq!(colo::wire::program_tag(b""), 0xcbf2_9ce4_8422_2325 >> 16);
/// assert_ne!(colo::wire::program_tag(b"wrk\0-c50\0"), colo::wire::program_tag(b"wrk\0-c51\0"));
/// let long = vec![b'a'; 2 * colo::wire::TAG_BYTES];
/// assert_eq!(colo::wire::program_tag(&long), colo::wire::program_tag(&long[..colo::wire::TAG_BYTES]));
/// ```
pub fn program_tag(cmdline: &[u8]) -> u64 {
    let h = cmdline[..cmdline.len().min(TAG_BYTES)].iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3));
    h >> 16
}

/// The short-lived marker, for clients with program tag `tag`, of the listener on `addr`
/// (spec/WIRE.md section 2): `colo/1/short/<A>/<tag>` where its rendezvous is `colo/1/<A>`,
/// the tag in 12 lowercase hex digits.
///
/// ```
/// let a: std::net::SocketAddr = "[::]:80".parse().unwrap();
/// assert_eq!(colo::wire::short_lived_marker(a, 0xab), "colo/1/short/[::]:80/0000000000ab");
/// ```
pub fn short_lived_marker(addr: SocketAddr, tag: u64) -> String {
    let name = rendezvous_name(addr);
    format!("colo/1/short/{}/{tag:012x}", &name["colo/1/".len()..])
}

/// The names a client dialing `addr` tries, in order (spec/WIRE.md section 2).
pub fn lookup_names(addr: SocketAddr) -> Vec<String> {
    lookup_addrs(addr).into_iter().map(rendezvous_name).collect()
}

/// The listener addresses whose rendezvous a client dialing `addr` tries, in order: the exact
/// one, then the wildcards that would take the connection.
pub fn lookup_addrs(addr: SocketAddr) -> Vec<SocketAddr> {
    let port = addr.port();
    let ip = colo_sys::host::canonical(addr.ip());
    let mut addrs = vec![SocketAddr::new(ip, port)];
    match ip {
        IpAddr::V4(_) => {
            addrs.push(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port));
            addrs.push(SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port));
        }
        IpAddr::V6(_) => addrs.push(SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port)),
    }
    addrs.dedup();
    addrs
}

/// `claim` values of the segment header.
pub mod claim {
    /// DIRECT mode: no carrier.
    pub const DIRECT: u32 = 0;
    /// CARRIER mode, not yet claimed.
    pub const OFFERED: u32 = 1;
    /// CARRIER mode, claimed by the server.
    pub const CLAIMED: u32 = 2;
    /// CARRIER mode, abandoned by the client.
    pub const ABANDONED: u32 = 3;
}

/// The fixed fields of a segment header (offsets 0..96).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Ring and pool sizes.
    pub geometry: Geometry,
    /// `claim` word.
    pub claim: u32,
    /// Client's pid.
    pub client_pid: u32,
    /// Server's pid (0 until accepted).
    pub server_pid: u32,
    /// Client address record.
    pub client_addr: Option<SocketAddr>,
    /// Server address record.
    pub server_addr: Option<SocketAddr>,
}

/// Bytes of the header that `Header` covers (the rest of its 1024 are flags and padding).
pub const HEADER_FIELDS: usize = 128;

fn put_addr(b: &mut [u8], addr: Option<SocketAddr>) {
    b[..24].fill(0);
    let Some(addr) = addr else { return };
    b[2..4].copy_from_slice(&addr.port().to_le_bytes());
    match colo_sys::host::canonical(addr.ip()) {
        IpAddr::V4(ip) => {
            b[0..2].copy_from_slice(&4u16.to_le_bytes());
            b[4..8].copy_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            b[0..2].copy_from_slice(&6u16.to_le_bytes());
            b[4..20].copy_from_slice(&ip.octets());
        }
    }
}

fn get_addr(b: &[u8]) -> Result<Option<SocketAddr>, &'static str> {
    let family = u16::from_le_bytes([b[0], b[1]]);
    let port = u16::from_le_bytes([b[2], b[3]]);
    let ip: IpAddr = match family {
        0 => return Ok(None),
        4 => Ipv4Addr::new(b[4], b[5], b[6], b[7]).into(),
        6 => Ipv6Addr::from(<[u8; 16]>::try_from(&b[4..20]).expect("16 bytes")).into(),
        _ => return Err("bad address family"),
    };
    Ok(Some(SocketAddr::new(ip, port)))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

impl Header {
    /// Writes the header fields into `b` (at least [`HEADER_FIELDS`] bytes).
    pub fn encode(&self, b: &mut [u8]) -> Result<Layout, &'static str> {
        let layout = self.geometry.layout()?;
        b[..HEADER_FIELDS].fill(0);
        b[0..8].copy_from_slice(&SEGMENT_MAGIC);
        b[8..12].copy_from_slice(&SEGMENT_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(HEADER_SIZE as u32).to_le_bytes());
        b[16..24].copy_from_slice(&(layout.segment_size as u64).to_le_bytes());
        b[24..28].copy_from_slice(&self.geometry.ring_capacity.to_le_bytes());
        b[28..32].copy_from_slice(&self.geometry.slot_size.to_le_bytes());
        b[32..36].copy_from_slice(&self.geometry.slot_count.to_le_bytes());
        b[36..40].copy_from_slice(&self.claim.to_le_bytes());
        b[40..44].copy_from_slice(&self.client_pid.to_le_bytes());
        b[44..48].copy_from_slice(&self.server_pid.to_le_bytes());
        put_addr(&mut b[48..72], self.client_addr);
        put_addr(&mut b[72..96], self.server_addr);
        Ok(layout)
    }

    /// Parses and validates header fields read from a segment (spec/WIRE.md section 3).
    pub fn decode(b: &[u8]) -> Result<(Header, Layout), &'static str> {
        if b.len() < HEADER_FIELDS {
            return Err("header too short");
        }
        if b[0..8] != SEGMENT_MAGIC {
            return Err("bad segment magic");
        }
        if u32_at(b, 8) != SEGMENT_VERSION {
            return Err("unsupported segment version");
        }
        if u32_at(b, 12) as usize != HEADER_SIZE {
            return Err("bad header size");
        }
        let geometry = Geometry { ring_capacity: u32_at(b, 24), slot_size: u32_at(b, 28), slot_count: u32_at(b, 32) };
        let layout = geometry.layout()?;
        if u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")) != layout.segment_size as u64 {
            return Err("segment size does not match the geometry");
        }
        let claim = u32_at(b, 36);
        if claim > claim::ABANDONED {
            return Err("bad claim value");
        }
        let header = Header {
            geometry,
            claim,
            client_pid: u32_at(b, 40),
            server_pid: u32_at(b, 44),
            client_addr: get_addr(&b[48..72])?,
            server_addr: get_addr(&b[72..96])?,
        };
        Ok((header, layout))
    }
}
