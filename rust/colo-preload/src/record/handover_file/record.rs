//! The handover file's record format (see `super`): one inheritable connection in 32
//! little-endian bytes (bytes 20 to 23 unused: written zero, not read; byte 24 the role; byte 25 says whether bytes 28 to 31 name the page of
//! the holders file that holds the connection's holders page). Its bytes come from an earlier
//! program image (which hands on a read-only descriptor of a file only its uid may open for
//! writing); still, `decode` accepts any 32 bytes without panicking and returns `None` for a
//! role it does not know, and the caller checks the descriptors and pages it names.

use colo::internal::segment::Role;
use colo_sys::RawFd;

/// One inheritable connection, as stored in the handover file (little-endian, 32 bytes).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Record {
    /// Inode of the application's socket (the same for all its duplicates).
    pub(crate) sock_ino: u64,
    pub(crate) memfd: RawFd,
    pub(crate) control: RawFd,
    pub(crate) self_bell: RawFd,
    pub(crate) role: Role,
    /// The index of the connection's holders page in the holders file handed over beside the
    /// handover file (`conn::holders_file`), if it has one there.
    pub(crate) holders: Option<u32>,
}

pub(crate) const RECORD_LEN: usize = 32;

impl Record {
    pub(crate) fn encode(&self) -> [u8; RECORD_LEN] {
        let mut b = [0u8; RECORD_LEN];
        b[0..8].copy_from_slice(&self.sock_ino.to_le_bytes());
        for (i, fd) in [self.memfd, self.control, self.self_bell].into_iter().enumerate() {
            b[8 + 4 * i..12 + 4 * i].copy_from_slice(&fd.to_le_bytes());
        }
        b[24] = if self.role == Role::Client { 1 } else { 2 };
        if let Some(index) = self.holders {
            b[25] = 1;
            b[28..32].copy_from_slice(&index.to_le_bytes());
        }
        b
    }

    /// Parses one record; `b` is [`RECORD_LEN`] bytes (a chunk of the file).
    pub(crate) fn decode(b: &[u8]) -> Option<Record> {
        let fd = |i: usize| i32::from_le_bytes(b[8 + 4 * i..12 + 4 * i].try_into().expect("4 bytes"));
        let role = match b[24] {
            1 => Role::Client,
            2 => Role::Server,
            _ => return None,
        };
        Some(Record {
            sock_ino: u64::from_le_bytes(b[0..8].try_into().expect("8 bytes")),
            memfd: fd(0),
            control: fd(1),
            self_bell: fd(2),
            role,
            holders: (b[25] == 1).then(|| fd(5) as u32),
        })
    }
}

