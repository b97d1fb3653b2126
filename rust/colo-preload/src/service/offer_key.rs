//! The request a process of the lineage sends for an accepted connection's offer
//! (`lineage.rs`): the connection's 4-tuple as text, `client|server`. The serving thread decodes
//! what another process of the lineage wrote, so any bytes give an answer or `None`, never a
//! panic (the fuzz target `offer_key` in rust/fuzz compiles this file on its own).

use std::net::SocketAddr;

/// A connection's (client, server) addresses, as `colo::internal::carrier::Key`.
pub(crate) type Key = (SocketAddr, SocketAddr);

/// The request's bytes for `k`.
pub(crate) fn encode(k: &Key) -> Vec<u8> {
    format!("{}|{}", k.0, k.1).into_bytes()
}

/// The 4-tuple a request names, or `None` if the bytes are not a request.
pub(crate) fn decode(b: &[u8]) -> Option<Key> {
    let s = std::str::from_utf8(b).ok()?;
    let (a, c) = s.split_once('|')?;
    Some((a.parse().ok()?, c.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let k: Key = ("127.0.0.1:40001".parse().unwrap(), "[::1]:6379".parse().unwrap());
        assert_eq!(decode(&encode(&k)), Some(k));
        assert_eq!(decode(b"127.0.0.1:1"), None);
        assert_eq!(decode(b"\xff|x"), None);
    }
}
