//! The only code in colo that makes OS calls: memfd segments, control-socket doorbells, the readiness
//! epoll, abstract `SOCK_SEQPACKET` sockets with `SCM_RIGHTS`, abstract names raised as flags,
//! and facts about the host (local addresses, CPU affinity, who owns a TCP port). Everything else
//! in colo is platform-free logic over these calls. Linux only. Every function returns `std::io::Result` with the kernel's errno.

pub mod diag;
pub mod doorbell;
pub mod gift;
pub mod futex;
pub mod host;
pub mod marker;
pub mod pathsock;
pub mod placed;
pub mod preload;
pub mod segment;
pub mod seqpacket;
mod socket;
pub mod tcp;
pub mod timer;

pub use rustix::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
