//! The server side: at `listen(2)` the shim binds the rendezvous `colo/1/<addr>` next to the
//! kernel listening socket (which stays pure kernel), and a background thread (the *offer
//! service*) collects CARRIER offers keyed by 4-tuple. `accept(2)` looks up the accepted
//! connection's 4-tuple and claims the offer. A process forked from the one that listens (a
//! multi-worker server accepting after fork) asks the service for the offer over the socket pair
//! of its *lineage* (`crate::record::lineage`: inherited, never named), and gets the descriptors with
//! SCM_RIGHTS. When the serving process is gone (a daemonized master), one of the processes
//! forked from it takes the service over (the lineage's owner word decides which).
//!
//! Pending offers are bounded (`offers::MAX_PENDING`; beyond, REJECT(NO_RESOURCES)) and each
//! expires `offers::PENDING_TTL` after it arrived, on the service thread's own timer.
//!
//! A connection from a listed peer of another network namespace (spec/WIRE.md section 11) is
//! held aside by `accept` until its handshake is decided, never waited for there (`held`).
//!
//! A file a job, bottom up: `offers` (what a service holds, under its lock) and `markers` (the
//! short-lived markers), then `thread` (the service thread), then `listen` and `forked` (the
//! processes forked from the serving one), then `held` (connections from other namespaces) and
//! `sleepers` (threads asleep in the kernel's accept meanwhile), then `accept`, then `guest`
//! (a listener whose rendezvous another process holds asks it for its offers).

mod accept;
mod forked;
mod guest;
pub mod held;
mod listen;
mod markers;
mod offers;
mod sleepers;
mod thread;

pub use accept::{hand_out, netns_accepted, on_accept, Accepted};
pub use forked::{atfork_child, before_fork, serving_elsewhere};
pub use guest::{look_for_vacancy, on_accept as on_guest_accept};
pub use listen::{adopt_inherited, may_accept, note_passed_on, on_close_guest, on_close_listen, on_listen};
pub use markers::{marker_child, marker_parent, marker_prepare};
