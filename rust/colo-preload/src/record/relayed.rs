//! The addresses of connections relayed as standard I/O (`service::stdio`): the loopback TCP
//! socket a relayed connection's descriptors now name has the relay's addresses, and
//! `getsockname`/`getpeername` on it answer the connection's own (its carrier's), as they did
//! before the relay. inetd-style servers and sshd read them (sshd's log, `SSH_CONNECTION`,
//! `Match LocalPort`).
//!
//! Recorded once, by the constructor of an image (before `main`, one thread), and only read
//! afterwards: a `OnceLock`, so no lock a fork could leave held. Keyed by the socket's inode,
//! which every duplicate of it and every forked copy shares. The records go on across `exec`
//! (a wrapper script, `env`, or pyenv's shim before the program itself) in an inheritable memfd
//! named `colo-relayed`, [`RECORD_LEN`] bytes a record; the next image keeps those whose socket
//! it still has open. Only this uid may write it (the next image inherits a read-only descriptor
//! of a file of mode 0600: `super::inheritable_memfd`); still, `decode` accepts any bytes
//! without panicking, and only an IPv4 or IPv6 address of its exact length.

use colo_sys::{BorrowedFd, OwnedFd};
use std::sync::OnceLock;

pub const FILE_NAME: &str = "colo-relayed";
/// A record: the inode (8 bytes, little-endian), then the local and the peer address, each its
/// length (4 bytes, little-endian) and 28 bytes.
pub const RECORD_LEN: usize = 72;

/// A socket address as the kernel writes it (`sockaddr_in` or `sockaddr_in6`).
#[derive(Clone, Copy)]
pub struct Raw {
    bytes: [u8; 28],
    len: usize,
}

impl Raw {
    /// `a`'s bytes as the kernel gave them; `None` for an address longer than `sockaddr_in6`.
    pub fn of(a: &rustix::net::SocketAddrAny) -> Option<Raw> {
        let len = a.addr_len() as usize;
        let mut bytes = [0u8; 28];
        if len > bytes.len() {
            return None;
        }
        // SAFETY: `a` holds `len` initialized bytes of its address at `as_ptr`.
        bytes[..len].copy_from_slice(unsafe { std::slice::from_raw_parts(a.as_ptr().cast::<u8>(), len) });
        Some(Raw { bytes, len })
    }

    fn encode(&self, out: &mut [u8]) {
        out[..4].copy_from_slice(&(self.len as u32).to_le_bytes());
        out[4..32].copy_from_slice(&self.bytes);
    }

    /// 32 bytes as `encode` writes them: `None` unless a whole `sockaddr_in` or `sockaddr_in6`.
    fn decode(b: &[u8]) -> Option<Raw> {
        let len = u32::from_le_bytes(b.get(..4)?.try_into().ok()?) as usize;
        let bytes: [u8; 28] = b.get(4..32)?.try_into().ok()?;
        let family = u16::from_ne_bytes([bytes[0], bytes[1]]) as i32;
        let want = match family {
            libc::AF_INET => std::mem::size_of::<libc::sockaddr_in>(),
            libc::AF_INET6 => std::mem::size_of::<libc::sockaddr_in6>(),
            _ => return None,
        };
        (len == want).then_some(Raw { bytes, len })
    }
}

/// One relayed connection: the inode of the socket that stands in for it, and its addresses.
pub struct Names {
    pub ino: u64,
    pub local: Raw,
    pub peer: Raw,
}

impl Names {
    fn encode(&self) -> [u8; RECORD_LEN] {
        let mut out = [0u8; RECORD_LEN];
        out[..8].copy_from_slice(&self.ino.to_le_bytes());
        self.local.encode(&mut out[8..40]);
        self.peer.encode(&mut out[40..72]);
        out
    }

    fn decode(b: &[u8]) -> Option<Names> {
        let ino = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
        Some(Names { ino, local: Raw::decode(b.get(8..40)?)?, peer: Raw::decode(b.get(40..72)?)? })
    }
}

static NAMES: OnceLock<Vec<Names>> = OnceLock::new();

/// The records of an inherited `colo-relayed` file (closed here).
pub fn read_inherited(f: OwnedFd) -> Vec<Names> {
    // From offset 0 (pread): the file description is shared with every process that inherited it.
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while let Ok(n) = rustix::io::pread(&f, &mut chunk, buf.len() as u64) {
        if n == 0 || buf.len() >= 64 * RECORD_LEN {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    buf.chunks_exact(RECORD_LEN).filter_map(Names::decode).collect()
}

/// Records the relayed connections of this image (once; later calls are ignored), and writes
/// them to an inheritable `colo-relayed` file for the next image (left open for it: nothing here
/// reads or closes it again).
pub fn publish(names: Vec<Names>) {
    if names.is_empty() {
        return;
    }
    let file = || -> Option<()> {
        // Read-only for the next image, in a file no other uid may open for writing
        // (`super::inheritable_memfd`): the addresses are what its `getpeername` answers.
        let (fd, inherited) = super::inheritable_memfd(FILE_NAME)?;
        let bytes: Vec<u8> = names.iter().flat_map(|n| n.encode()).collect();
        let n = rustix::io::pwrite(&fd, &bytes, 0).ok()?;
        (n == bytes.len()).then_some(())?;
        // Inheritable only once complete: the point of the file is to survive exec.
        super::let_inherit(&inherited).then_some(())?;
        std::mem::forget(inherited);
        Some(())
    };
    let _ = file();
    let _ = NAMES.set(names);
}

/// The recorded address of `fd` (`peer`: its peer's, else its own), if `fd` is a socket that
/// stands in for a relayed connection. Costs one load in an image that relayed nothing, and an
/// `fstat` in one that did.
pub fn lookup(fd: i32, peer: bool) -> Option<Raw> {
    let names = NAMES.get()?;
    if fd < 0 {
        return None;
    }
    // SAFETY: only asks the kernel about the number; a closed one gives EBADF.
    let st = rustix::fs::fstat(unsafe { BorrowedFd::borrow_raw(fd) }).ok()?;
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return None;
    }
    names.iter().find(|n| n.ino == st.st_ino).map(|n| if peer { n.peer } else { n.local })
}

/// Writes `raw` for the application as `getsockname(2)` does: at most `*len` bytes at `addr`,
/// and the address's full length in `*len`.
///
/// # Safety
/// `addr` and `len` are the application's arguments, non-null: `*len` bytes writable at `addr`.
pub unsafe fn write(raw: &Raw, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) {
    // SAFETY: the caller's contract: `len` is valid.
    let room = unsafe { *len } as usize;
    let n = room.min(raw.len);
    // SAFETY: `n` <= `*len` bytes writable at `addr` (the caller's contract); ours do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(raw.bytes.as_ptr(), addr.cast::<u8>(), n) };
    // SAFETY: as above.
    unsafe { *len = raw.len as libc::socklen_t };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(a: std::net::SocketAddr) -> Raw {
        Raw::of(&rustix::net::SocketAddrAny::from(a)).expect("an IP address fits")
    }

    #[test]
    fn records_round_trip() {
        let n = Names { ino: 0x1234_5678_9abc, local: raw("127.0.0.1:22".parse().unwrap()), peer: raw("[::1]:40000".parse().unwrap()) };
        let back = Names::decode(&n.encode()).expect("its own encoding decodes");
        assert_eq!(back.ino, n.ino);
        assert_eq!((back.local.len, back.local.bytes), (16, n.local.bytes));
        assert_eq!((back.peer.len, back.peer.bytes), (28, n.peer.bytes));
    }

    #[test]
    fn any_other_bytes_decode_to_nothing_or_an_ip_address() {
        let n = Names { ino: 7, local: raw("127.0.0.1:22".parse().unwrap()), peer: raw("127.0.0.1:9".parse().unwrap()) };
        let mut b = n.encode();
        b[8] = 15; // a length that is not sockaddr_in's
        assert!(Names::decode(&b).is_none());
        let mut b = n.encode();
        b[12..14].copy_from_slice(&(libc::AF_UNIX as u16).to_ne_bytes());
        assert!(Names::decode(&b).is_none());
        assert!(Names::decode(&[0u8; RECORD_LEN]).is_none());
        assert!(Names::decode(&[0xffu8; 10]).is_none());
        for seed in 0..2000u32 {
            let b: Vec<u8> = (0..RECORD_LEN as u32).map(|i| (seed.wrapping_mul(2654435761).wrapping_add(i * 40503) >> 7) as u8).collect();
            if let Some(n) = Names::decode(&b) {
                assert!(n.local.len == 16 || n.local.len == 28);
            }
        }
    }

    #[test]
    fn write_truncates_as_the_kernel_and_says_the_full_length() {
        let r = raw("[::1]:443".parse().unwrap());
        let mut buf = [0u8; 28];
        let mut len: libc::socklen_t = 16;
        // SAFETY: 16 writable bytes at `buf`, `len` valid.
        unsafe { write(&r, buf.as_mut_ptr().cast(), &mut len) };
        assert_eq!(len, 28);
        assert_eq!(buf[..16], r.bytes[..16]);
        assert_eq!(buf[16..], [0u8; 12]);
    }
}
