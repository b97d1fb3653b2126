//! The services: offers (a client's dial, the offer service and a server's accept), the
//! hand-over of connections across `exec`, the relay of connections made inheritable after
//! their memfd was closed, the standard-I/O relay, the loop both relays carry the peer's bytes
//! toward the program with, and a client's connect to another network namespace.

pub mod client;
pub mod downward;
pub mod elsewhere;
pub mod handover;
pub mod offer_key;
pub mod prepared;
pub mod relay;
pub mod server;
pub mod stdio;
