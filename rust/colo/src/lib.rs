//! Same-host connections through shared memory, with socket semantics and a TCP fallback.
//!
//! Two processes on one host that talk over TCP loopback pay for the whole TCP/IP stack on every
//! message. colo moves that traffic onto lock-free shared-memory rings while keeping the socket
//! interface: a [`Listener`] accepts colo clients through shared memory and ordinary clients over
//! TCP on the same address; a [`Stream`] dials shared memory when the listener is a colo listener
//! on this host and plain TCP otherwise.
//!
//! ```no_run
//! use std::io::{Read, Write};
//! let listener = colo::Listener::bind("127.0.0.1:0")?;
//! let addr = listener.local_addr()?;
//! let server = std::thread::spawn(move || -> std::io::Result<()> {
//!     let (mut s, _) = listener.accept()?;
//!     let mut buf = [0u8; 4];
//!     s.read_exact(&mut buf)?;
//!     s.write_all(&buf)
//! });
//! let mut stream = colo::Stream::connect(addr)?;
//! stream.write_all(b"ping")?;
//! let mut reply = [0u8; 4];
//! stream.read_exact(&mut reply)?;
//! assert_eq!(&reply, b"ping");
//! assert_eq!(stream.transport(), colo::Transport::SharedMemory);
//! server.join().unwrap()?;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! The wire is defined in `spec/WIRE.md`; the Go package and the C and Python bindings speak it
//! too. Zero-copy messages: [`Stream::loan`] and [`Stream::recv_message`]. Spinning before sleeping
//! is set by [`Options::spin`] or `COLO_SPIN_US`; diagnostics by `COLO_LOG=info`.

/// README.md's Rust example, compiled and run as a doctest so that the front door cannot go stale
/// (its other languages' examples: tests/install/t_6_readme.sh).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeExamples;

mod budget;
mod carrier;
mod error;
mod floor;
mod fork;
mod framed;
mod halfopen;
mod handshake;
mod hangup;
mod known;
mod listener;
mod netns;
mod netns_accept;
mod netns_keeper;
mod log;
mod message;
mod options;
mod orphan;
mod owed;
mod raw;
mod reaper;
mod recycle;
mod segment;
mod shm;
mod shrink;
mod stream;
mod trust;
mod wake;

/// Building blocks of the LD_PRELOAD shim and colo's tools: not a stable API (see its page).
#[doc(hidden)]
pub mod internal;
#[cfg(feature = "tokio")]
pub mod tokio;
pub mod wire;

pub use colo_ring::spin::SpinMode;
pub use error::{errno_of, ProtocolError};
pub use listener::Listener;
pub use message::{Loan, Message};
pub use options::{default_ring, Options};
pub use raw::{RawLoan, RawMessage};
pub use stream::{Stream, Transport};
