//! Abstract names used as flags (spec/WIRE.md section 2, the short-lived marker): a datagram
//! socket bound to the name raises it for as long as the socket is open, and any process in the
//! network namespace can test it with one `connect`, without waking the one that raised it.

use rustix::fd::OwnedFd;
use rustix::net::{self, AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
use std::io;

fn socket() -> io::Result<OwnedFd> {
    Ok(net::socket_with(AddressFamily::UNIX, SocketType::DGRAM, SocketFlags::CLOEXEC, None)?)
}

/// Raises the abstract name `name` (without the leading NUL) until the returned socket is
/// closed; the socket's number is moved to `floor` or above (see `preload::move_above`).
/// `AddrInUse` if it is raised already (by this process or another).
pub fn raise(name: &[u8], floor: i32) -> io::Result<OwnedFd> {
    let addr = SocketAddrUnix::new_abstract_name(name)?;
    let fd = crate::preload::move_above(socket()?, floor)?;
    net::bind(&fd, &addr)?;
    Ok(fd)
}

/// The first of `names` that is raised, if any: one socket, and one `connect` per name tried.
pub fn first_raised<'a>(names: impl IntoIterator<Item = &'a [u8]>) -> Option<usize> {
    let fd = socket().ok()?;
    for (i, name) in names.into_iter().enumerate() {
        let Ok(addr) = SocketAddrUnix::new_abstract_name(name) else { continue };
        // A datagram connect only records the peer: nothing is sent, nobody is woken.
        if net::connect(&fd, &addr).is_ok() {
            return Some(i);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_raised_while_its_socket_is_open() {
        let name = format!("colo-test/marker/{}", std::process::id());
        let other = format!("{name}/other");
        assert_eq!(first_raised([name.as_bytes()]), None);
        let held = raise(name.as_bytes(), 0).unwrap();
        assert_eq!(raise(name.as_bytes(), 0).unwrap_err().kind(), io::ErrorKind::AddrInUse);
        assert_eq!(first_raised([other.as_bytes(), name.as_bytes()]), Some(1));
        drop(held);
        assert_eq!(first_raised([name.as_bytes()]), None);
    }
}
