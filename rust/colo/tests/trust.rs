//! Refusals a client must turn into plain TCP (spec/WIRE.md section 3).

use colo::{Stream, Transport};
use colo_sys::seqpacket;
use std::io::{Read, Write};
use std::net::TcpListener;

/// A REJECT with a reason the client does not know is a refusal like any other: it dials plain
/// TCP, and reaches the same address.
#[test]
fn an_unknown_reject_reason_dials_tcp() {
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap();
    let rendezvous = seqpacket::listen(colo::wire::rendezvous_name(addr).as_bytes()).unwrap();
    let fake = std::thread::spawn(move || {
        let control = loop {
            match seqpacket::accept(&rendezvous) {
                Ok(c) => break c,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(std::time::Duration::from_millis(1)),
                Err(e) => panic!("{e}"),
            }
        };
        // The accepted socket is non-blocking: wait for the HELLO (sent right after connect).
        let mut buf = [0u8; 64];
        let hello = loop {
            match seqpacket::recv(&control, &mut buf, true) {
                Ok(r) => break r,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(std::time::Duration::from_millis(1)),
                Err(e) => panic!("{e}"),
            }
        };
        assert_eq!(hello.len, 16);
        // REJECT, version 1, reason 99.
        let mut reject = colo::wire::Message::Reject { version: 1, reason: colo::wire::Reason::NotServed }.encode();
        reject[6] = 99;
        seqpacket::send(&control, &reject, &[]).unwrap();
        let (mut s, _) = tcp.accept().unwrap();
        let mut b = [0u8; 4];
        s.read_exact(&mut b).unwrap();
        s.write_all(&b).unwrap();
    });
    let mut s = Stream::connect(addr).unwrap();
    assert_eq!(s.transport(), Transport::Tcp);
    s.write_all(b"ping").unwrap();
    let mut b = [0u8; 4];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"ping");
    fake.join().unwrap();
}
