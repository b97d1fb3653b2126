//! The tokio feature: async echo over shared memory, split halves, TCP fallback.
#![cfg(feature = "tokio")]
mod common;

use colo::tokio::{Listener, Stream};
use colo::Transport;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_echo_with_split_halves() {
    let _w = common::watchdog(60);
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        assert_eq!(s.transport(), Transport::SharedMemory);
        let (mut r, mut w) = tokio::io::split(s);
        tokio::io::copy(&mut r, &mut w).await.unwrap();
        w.shutdown().await.unwrap();
    });
    let c = Stream::connect(addr).await.unwrap();
    assert_eq!(c.transport(), Transport::SharedMemory);
    let (mut r, mut w) = tokio::io::split(c);
    const TOTAL: usize = 8 << 20;
    let writer = tokio::spawn(async move {
        let data: Vec<u8> = (0..TOTAL as u64).map(common::pattern).collect();
        w.write_all(&data).await.unwrap();
        w.shutdown().await.unwrap();
    });
    let mut got = Vec::new();
    r.read_to_end(&mut got).await.unwrap();
    assert_eq!(got.len(), TOTAL);
    assert!(got.iter().enumerate().all(|(i, b)| *b == common::pattern(i as u64)));
    writer.await.unwrap();
    server.await.unwrap();
}

#[tokio::test]
async fn async_falls_back_to_tcp() {
    let _w = common::watchdog(30);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut b = [0u8; 2];
        s.read_exact(&mut b).await.unwrap();
        s.write_all(&b).await.unwrap();
    });
    let mut c = Stream::connect(addr).await.unwrap();
    assert_eq!(c.transport(), Transport::Tcp);
    c.write_all(b"hi").await.unwrap();
    let mut b = [0u8; 2];
    c.read_exact(&mut b).await.unwrap();
    assert_eq!(&b, b"hi");
}

/// Rendezvous clients that give up (connect, then close without a HELLO) queued ahead of a real
/// one, all behind one readiness edge: the async accept must still find the real one (a
/// non-blocking accept drains what it tries before it says WouldBlock; tokio sees no new edge
/// for connections already queued).
#[tokio::test]
async fn async_accept_finds_a_client_queued_behind_silent_ones() {
    let _w = common::watchdog(60);
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let accepted = tokio::spawn(async move { l.accept().await.map(|(s, _)| s.transport()) });
    // Let the accept consume the listener's readiness and wait for the next edge.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let client = std::thread::spawn(move || {
        let name = colo::wire::rendezvous_name(addr);
        for _ in 0..20 {
            drop(colo_sys::seqpacket::connect(name.as_bytes()).unwrap());
        }
        colo::Stream::connect(addr).unwrap()
    });
    let got = tokio::time::timeout(std::time::Duration::from_secs(20), accepted).await;
    assert!(matches!(got, Ok(Ok(Ok(Transport::SharedMemory)))), "the real client was not accepted: {got:?}");
    drop(client.join().unwrap());
}
