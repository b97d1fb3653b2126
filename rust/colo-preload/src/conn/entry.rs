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
    /// The process that dialed (a fork child inherits the value with the descriptor).
    pub pid: u32,
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
    /// This process's forks before the listen (`server::forks`): a process that forked since
    /// may have children that hold the listening socket after this process closes it.
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
