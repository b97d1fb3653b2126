//! Abstract names used as flags (spec/WIRE.md section 2, the short-lived marker): a datagram
//! socket bound to the name raises it for as long as the socket is open, and any process in the
//! network namespace can test it with one `connect`, without waking the one that raised it.

use rustix::fd::OwnedFd;
use rustix::net::{self, AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
use std::io;

fn socket() -> io::Result<OwnedFd> {
    Ok(net::socket_with(AddressFamily::UNIX, SocketType::DGRAM, SocketFlags::CLOEXEC, None)?)
}

/// A socket to raise a name with ([`raise`]), its number moved to `floor` or above (see
/// `preload::move_above`).
pub fn unraised(floor: i32) -> io::Result<OwnedFd> {
    crate::preload::move_above(socket()?, floor)
}

/// Raises the abstract name `name` (without the leading NUL) with `fd` (from [`unraised`]) until
/// it is closed. `AddrInUse` if it is raised already (by this process or another). One system
/// call, no allocation.
pub fn raise(fd: &OwnedFd, name: &[u8]) -> io::Result<()> {
    net::bind(fd, &SocketAddrUnix::new_abstract_name(name)?)?;
    Ok(())
}

/// Whether any of `names` is raised: one socket, and one `connect` per name tried.
pub fn any_raised<'a>(names: impl IntoIterator<Item = &'a [u8]>) -> bool {
    let Ok(fd) = socket() else { return false };
    names.into_iter().any(|name| {
        // A datagram connect only records the peer: nothing is sent, nobody is woken.
        SocketAddrUnix::new_abstract_name(name).is_ok_and(|addr| net::connect(&fd, &addr).is_ok())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_raised_while_its_socket_is_open() {
        let name = format!("colo-test/marker/{}", std::process::id());
        let other = format!("{name}/other");
        assert!(!any_raised([name.as_bytes()]));
        let held = unraised(0).unwrap();
        raise(&held, name.as_bytes()).unwrap();
        assert_eq!(raise(&unraised(0).unwrap(), name.as_bytes()).unwrap_err().kind(), io::ErrorKind::AddrInUse);
        assert!(any_raised([other.as_bytes(), name.as_bytes()]));
        assert!(!any_raised([other.as_bytes()]));
        drop(held);
        assert!(!any_raised([name.as_bytes()]));
    }
}
