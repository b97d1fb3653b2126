//! The services: offers (a client's dial, the offer service and a server's accept), the
//! hand-over of connections across `exec`, the relay of connections made inheritable after
//! their memfd was closed, and the standard-I/O relay.

pub mod client;
pub mod elsewhere;
pub mod handover;
pub mod offer_key;
pub mod relay;
pub mod server;
pub mod stdio;
