//! What the table holds for a descriptor that is not an accelerated connection: a connect
//! awaiting its answer, a listening socket with its rendezvous, or one whose rendezvous another
//! process holds. The services fill them in.

use crate::record::lineage::Lineage;
use colo::internal::carrier::Offer;
use colo_sys::OwnedFd;
use std::net::SocketAddr;
use std::time::Instant;

/// A connect whose offer awaits the server's answer (`service::client`).
pub struct Pending {
    pub offer: Offer,
    pub deadline: Instant,
    pub peer: SocketAddr,
    /// This process listens on the destination: the thread that waits for the answer may be the
    /// one that has to accept (nginx proxying to itself), so it waits only `SELF_WAIT`, and
    /// if that runs out this process dials `target` over plain TCP from then on.
    pub self_served: Option<SocketAddr>,
    /// The server process, as `record::adapt::server_key` keys it (its uid and pid).
    pub server: u64,
    /// The process that dialed (a fork child inherits the value with the descriptor).
    pub pid: u32,
}

/// A non-blocking connect to a listener in another network namespace (spec/WIRE.md section 11)
/// whose PROPOSAL is out and whose answer has not been read (`service::elsewhere`): the
/// application's `connect` returned `EINPROGRESS`, and the first operation that needs to know
/// reads the answer.
pub struct Dialing {
    pub proposed: colo::internal::netns::Proposed,
    /// When the wait for the answer ends: the connection then goes on over plain TCP with the
    /// answer owed ([`Owed`]).
    pub deadline: Instant,
    pub peer: SocketAddr,
    /// The process that dialed (a fork child inherits the value with the descriptor).
    pub pid: u32,
}

/// A connection to another namespace that went on over plain TCP before its PROPOSAL was
/// answered: the answer is still to come at the head of the stream, and is taken off it before
/// the application reads (`service::elsewhere`).
pub struct Owed {
    pub peer: SocketAddr,
    /// When the stream was first seen holding part of an answer and no more (an answer comes
    /// whole, one write of the server's: a part that stays is not one).
    pub partial_since: Option<std::time::Instant>,
}

/// A kernel listening socket that also has a rendezvous (`service::server`).
#[derive(Debug)]
pub struct Listen {
    pub rendezvous: OwnedFd,
    /// The address it listens on.
    pub addr: std::net::SocketAddr,
    /// Names it among this process's listeners, for as long as the process lives (its markers
    /// are recorded by it).
    pub id: u64,
    /// The lineage whose service collects this listener's offers.
    pub lineage: &'static Lineage,
    /// `colo_sys::host::forks()` at the listen: a process that has another value since (it
    /// forked, or is a fork child) may have children that hold the listening socket after this
    /// process closes it.
    pub forks: u64,
    /// The process that listened (a process it forks inherits the value with the listener).
    pub pid: u32,
}

/// A kernel listening socket on an address whose rendezvous another process holds (an unrelated
/// `SO_REUSEPORT` listener of the same user): the offers of the connections it accepts are asked
/// of that process (`service::server::guest`).
#[derive(Debug)]
pub struct Guest {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// That address's rendezvous name.
    pub name: String,
    /// The holder is another user's, or does not answer ASKs: plain TCP from now on.
    pub refused: std::sync::atomic::AtomicBool,
    /// When (`marker::now_ms`) an accept last looked whether the rendezvous is free.
    pub looked: std::sync::atomic::AtomicU64,
}
