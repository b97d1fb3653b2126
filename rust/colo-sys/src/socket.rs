//! A TCP socket as the kernel reports it ([`TcpSocket`], from `sock_diag` or `/proc/net/tcp`),
//! and the canonical form its addresses are kept in. Shared by `diag` and `host`, which re-exports
//! both.

use std::net::{IpAddr, SocketAddr};

/// IPv4-mapped IPv6 addresses as IPv4; everything else unchanged.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// One socket of `/proc/net/tcp` or `/proc/net/tcp6`, its addresses canonical (IPv4-mapped
/// IPv6 addresses as IPv4, as the kernel delivers IPv4 connections to such sockets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpSocket {
    /// The bound (local) address; unspecified for a wildcard listener.
    pub local: SocketAddr,
    /// The remote address (unspecified, port 0, for a listener).
    pub remote: SocketAddr,
    /// State `0A`, LISTEN.
    pub listening: bool,
    /// The uid that created the socket (the `uid` column).
    pub uid: u32,
    /// Whether it is bound to a network device (`SO_BINDTODEVICE`, which any user may set): it
    /// then takes only connections that come in on that device, and none over loopback unless
    /// the device is `lo`. `None`: the table does not say (`/proc/net/tcp` does not).
    pub device: Option<bool>,
    /// Whether an IPv6 socket is `IPV6_V6ONLY` (it then takes no IPv4 connection); false for an
    /// IPv4 one. `None`: the table does not say (`/proc/net/tcp6` does not).
    pub v6only: Option<bool>,
}
