//! A CARRIER dial waits `COLO_CARRIER_TIMEOUT_MS` for its server's program to claim the offer, as
//! the shim and the Go package do: a server that claims after 900 ms, with the variable at 5000,
//! serves the connection over shared memory, and the bytes go through it intact; the client's
//! close resets the carrier, so its port is not held in TIME_WAIT. Its own test binary: the
//! variable is read once per process.

mod common;

use colo::internal::carrier::{self, HelloRead};
use colo::wire::{self, Reason};
use colo::{Stream, Transport};
use colo_sys::seqpacket;
use std::io::Write;
use std::time::Duration;

#[test]
fn a_carrier_dial_waits_colo_carrier_timeout_ms_for_the_claim() {
    let _w = common::watchdog(60);
    // Read once, at the first dial: this file's only test sets it first.
    std::env::set_var("COLO_CARRIER_TIMEOUT_MS", "5000");
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap();
    let rendezvous = seqpacket::listen(wire::rendezvous_name(addr).as_bytes()).unwrap();
    let server = std::thread::spawn(move || {
        // The DIRECT HELLO: a carrier is required.
        readable(&rendezvous);
        let direct = seqpacket::accept(&rendezvous).unwrap();
        readable(&direct);
        let mut buf = [0u8; 256];
        seqpacket::recv(&direct, &mut buf, false).unwrap();
        carrier::reject(&direct, Reason::NeedCarrier);
        // The CARRIER HELLO, claimed once the program "accepts", 900 ms later.
        readable(&rendezvous);
        let control = seqpacket::accept(&rendezvous).unwrap();
        readable(&control);
        let HelloRead::Hello(hello) = carrier::read_hello(control) else { panic!("no CARRIER HELLO") };
        std::thread::sleep(Duration::from_millis(900));
        let (tcp_end, _) = tcp.accept().unwrap();
        let est = hello.claim().expect("the offer is claimed");
        let shm = est.into_shm(colo::SpinMode::Never).unwrap();
        let mut got = [0u8; 4];
        let mut n = 0;
        while n < got.len() {
            n += shm.read(&mut got[n..]).unwrap();
        }
        assert_eq!(&got, b"ping");
        tcp_end
    });
    let mut s = Stream::connect(addr).unwrap();
    assert_eq!(s.transport(), Transport::SharedMemory, "claimed after 900 ms, within COLO_CARRIER_TIMEOUT_MS");
    s.write_all(b"ping").unwrap();
    let tcp_end = server.join().unwrap();
    let port = s.local_addr().unwrap().port();
    drop(s);
    // The server's end closes after ours: a FIN from us would leave our port in TIME_WAIT now.
    std::thread::sleep(Duration::from_millis(50));
    drop(tcp_end);
    std::thread::sleep(Duration::from_millis(50));
    assert!(!in_time_wait(port), "the client's carrier port {port} is left in TIME_WAIT: its close sent a FIN, not a reset");
}

/// Whether a TCP socket of this namespace bound to local `port` is in TIME_WAIT (state 06 of
/// `/proc/net/tcp`).
fn in_time_wait(port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let local = format!(":{port:04X} ");
    table.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 3 && format!("{} ", &f[1][f[1].len() - 5..]) == local && f[3] == "06"
    })
}

/// Waits (up to 10 s) until `fd`, a non-blocking socket, has a connection or a datagram.
fn readable(fd: &colo_sys::OwnedFd) {
    let mut p = [libc::pollfd { fd: colo_sys::AsRawFd::as_raw_fd(fd), events: libc::POLLIN, revents: 0 }];
    // SAFETY: one pollfd, valid for the call.
    assert_eq!(unsafe { libc::poll(p.as_mut_ptr(), 1, 10_000) }, 1, "nothing within 10 s");
}
