//! The errors colo reports and the errno values they map to (Linux numbering), for the C ABI,
//! the LD_PRELOAD shim and logs.

use std::io;

pub(crate) fn eproto(what: impl std::fmt::Display) -> io::Error {
    io::Error::other(ProtocolError(what.to_string()))
}

/// A peer broke the protocol (`EPROTO`): corrupted shared memory or a bad control message.
#[derive(Debug)]
pub struct ProtocolError(pub String);

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "colo protocol error (EPROTO): {}", self.0)
    }
}
impl std::error::Error for ProtocolError {}

/// The errno of an error produced by colo (for the C ABI and logs).
pub fn errno_of(e: &io::Error) -> i32 {
    if let Some(code) = e.raw_os_error() {
        return code;
    }
    if e.get_ref().is_some_and(|inner| inner.is::<ProtocolError>()) {
        return libc_errno::EPROTO;
    }
    match e.kind() {
        io::ErrorKind::WouldBlock => libc_errno::EAGAIN,
        io::ErrorKind::TimedOut => libc_errno::ETIMEDOUT,
        io::ErrorKind::ConnectionReset => libc_errno::ECONNRESET,
        io::ErrorKind::BrokenPipe => libc_errno::EPIPE,
        io::ErrorKind::ConnectionRefused => libc_errno::ECONNREFUSED,
        io::ErrorKind::NotConnected => libc_errno::ENOTCONN,
        io::ErrorKind::InvalidInput => libc_errno::EINVAL,
        io::ErrorKind::OutOfMemory => libc_errno::ENOMEM,
        _ => libc_errno::EIO,
    }
}

/// The errno values colo reports (Linux numbering).
pub mod libc_errno {
    #![allow(missing_docs)]
    pub const EINTR: i32 = 4;
    pub const EIO: i32 = 5;
    pub const EAGAIN: i32 = 11;
    pub const ENOMEM: i32 = 12;
    pub const EINVAL: i32 = 22;
    pub const ENFILE: i32 = 23;
    pub const EMFILE: i32 = 24;
    pub const EPIPE: i32 = 32;
    pub const EPROTO: i32 = 71;
    pub const EMSGSIZE: i32 = 90;
    pub const ENOBUFS: i32 = 105;
    pub const ENOTCONN: i32 = 107;
    pub const ECONNRESET: i32 = 104;
    pub const ETIMEDOUT: i32 = 110;
    pub const ECONNREFUSED: i32 = 111;
}
