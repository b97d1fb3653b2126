//! The lock-free heart of colo: single-producer/single-consumer byte rings and slot queues over a
//! raw shared region, the sleep/wake protocol that lets a side block without losing a wake-up, and
//! the spin policy. No OS calls live here (see `colo-sys`); everything is offsets and atomics, so the
//! same code runs over a memfd mapping in production and over heap memory under [loom] in tests.
//!
//! The layout and every ordering rule are defined in `spec/WIRE.md`; the sections are cited inline.
//! Every value read from shared memory is untrusted: the functions here return [`Corrupt`] instead
//! of trusting it, and never index outside the region whatever the peer writes.
//!
//! [loom]: https://docs.rs/loom

pub mod copy;
pub mod layout;
pub mod notify;
pub mod queue;
pub mod ring;
pub mod snapshot;
pub mod spin;
pub mod sync;

/// The peer broke an invariant of the shared segment (spec/WIRE.md sections 5 and 7). The
/// connection must be reset (`EPROTO`); nothing was read from or written to memory out of bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Corrupt(pub &'static str);

impl core::fmt::Display for Corrupt {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "peer corrupted the shared segment: {}", self.0)
    }
}

impl std::error::Error for Corrupt {}
