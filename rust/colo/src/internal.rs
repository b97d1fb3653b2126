//! What the LD_PRELOAD shim (rust/colo-preload) and colo's own tools build on, beneath the API:
//! CARRIER mode's building blocks, one side of a connection as a value, the segment, the
//! wake-up eventfds and the descriptor floor.
//!
//! **Not a stable API.** Anything here may change or go in any release, without notice;
//! applications and bindings use the items at the crate root ([`Listener`](crate::Listener),
//! [`Stream`](crate::Stream), [`Options`](crate::Options), [`Loan`](crate::Loan),
//! [`Message`](crate::Message), `colo::tokio`) and the wire codec (`colo::wire`).

pub use crate::floor::{fd_floor, set_fd_floor};

/// Taking process-wide locks around `fork` (the shim registers its own at [`fork::Rank::Shim`]).
pub mod fork {
    pub use crate::fork::{protect, Held, Locks, Rank};
}

/// CARRIER mode (spec/WIRE.md section 3): a loopback TCP connection whose payload moves into a
/// segment the client offers before its TCP handshake (see the crate's `carrier` module).
pub mod carrier {
    pub use crate::carrier::*;
}

/// The hang-up watcher's thread, ended before the application changes its credentials.
pub mod hangup {
    pub use crate::hangup::{give_up, resume, retire};
}

/// One side of an established shared-memory connection, and how its blocking waits sleep.
pub mod shm {
    pub use crate::shm::{continues_blocking_call, interrupted_ends_wait, set_interrupt_policy, signals_end_waits, spinner, Drainer, Fds, Shm, UNPASSED_SLEEP};
}

/// A mapped segment and the role a side plays in it.
pub mod segment {
    pub use crate::segment::{keep_memfds, Geometry, Layout, Role, Segment, MAPPED_WINDOW};
}

/// The wake-up eventfds of threads asleep on a side's doorbell.
pub mod wake {
    pub use crate::wake::{forget_own, give_back, give_up, own_fd, take};
}

pub mod netns {
    pub use crate::netns::*;
}

/// A listener's connections from other namespaces, resolved off its accept path.
pub mod netns_accept {
    pub use crate::netns_accept::{NetnsAccepts, Resolved, MAX_WAITING};
}
