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

/// Writes `peer` at `addr` as the kernel's `accept` and `getpeername` do: at most `*len` bytes of
/// it, and its full size to `*len`.
///
/// # Safety
/// `addr` and `len` are null, or `*len` writable bytes at `addr` and a writable `*len`.
pub unsafe fn write_sockaddr(peer: std::net::SocketAddr, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) {
    if addr.is_null() || len.is_null() {
        return;
    }
    // SAFETY: all-zero bytes are a valid sockaddr_storage.
    let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let size = match peer {
        std::net::SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for any sockaddr.
            let sin = unsafe { &mut *(&mut st as *mut libc::sockaddr_storage as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
            std::mem::size_of::<libc::sockaddr_in>()
        }
        std::net::SocketAddr::V6(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for any sockaddr.
            let sin6 = unsafe { &mut *(&mut st as *mut libc::sockaddr_storage as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_scope_id = a.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    // SAFETY: the caller's contract: `*len` is readable and writable, and `*len` bytes at `addr`
    // writable; at most that many are copied.
    unsafe {
        let room = (*len as usize).min(size);
        std::ptr::copy_nonoverlapping(&st as *const libc::sockaddr_storage as *const u8, addr as *mut u8, room);
        *len = size as libc::socklen_t;
    }
}
