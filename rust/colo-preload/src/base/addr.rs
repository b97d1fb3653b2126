//! Socket addresses: the application's `sockaddr`, rustix's, and whether a socket is TCP.

use libc::{c_int, sockaddr, socklen_t};
use std::net::SocketAddr;

pub fn sockaddr_of(a: &rustix::net::SocketAddrAny) -> Option<SocketAddr> {
    match a.address_family() {
        rustix::net::AddressFamily::INET => rustix::net::SocketAddrV4::try_from(a.clone()).ok().map(SocketAddr::V4),
        rustix::net::AddressFamily::INET6 => rustix::net::SocketAddrV6::try_from(a.clone()).ok().map(SocketAddr::V6),
        _ => None,
    }
}

/// The IPv4 or IPv6 address of `len` bytes at `addr`; `None` for another family or a length
/// too short for its struct.
///
/// # Safety
/// `addr` points to at least a `sa_family` field and to `len` readable bytes.
pub unsafe fn parse_sockaddr(addr: *const sockaddr, len: socklen_t) -> Option<SocketAddr> {
    // SAFETY: the caller's contract: at least a family field (as connect(2) requires).
    let family = unsafe { (*addr).sa_family } as c_int;
    if family == libc::AF_INET && len as usize >= std::mem::size_of::<libc::sockaddr_in>() {
        // SAFETY: the family says sockaddr_in, and `len` covers one.
        let a = unsafe { &*(addr as *const libc::sockaddr_in) };
        Some(SocketAddr::new(u32::from_be(a.sin_addr.s_addr).to_be_bytes().into(), u16::from_be(a.sin_port)))
    } else if family == libc::AF_INET6 && len as usize >= std::mem::size_of::<libc::sockaddr_in6>() {
        // SAFETY: the family says sockaddr_in6, and `len` covers one.
        let a = unsafe { &*(addr as *const libc::sockaddr_in6) };
        Some(SocketAddr::new(a.sin6_addr.s6_addr.into(), u16::from_be(a.sin6_port)))
    } else {
        None
    }
}

pub fn is_tcp_stream(fd: colo_sys::BorrowedFd<'_>) -> bool {
    use rustix::net::sockopt;
    matches!(sockopt::socket_type(fd), Ok(rustix::net::SocketType::STREAM))
        && matches!(
            sockopt::socket_domain(fd),
            Ok(rustix::net::AddressFamily::INET) | Ok(rustix::net::AddressFamily::INET6)
        )
}
