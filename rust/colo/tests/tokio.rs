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
