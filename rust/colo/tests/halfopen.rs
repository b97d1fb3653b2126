//! Half-open handshakes (docs/SAFETY.md item 14): silent rendezvous clients beyond a uid's share
//! are refused at once, and the rest are dropped on the listener's timer, which wakes whoever
//! polls the listener even though no connection arrives.

use colo::wire::{self, Message, Reason};
use colo::Listener;
use colo_sys::{seqpacket, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

fn silent_clients(l: &Listener, n: usize) -> Vec<OwnedFd> {
    let name = wire::rendezvous_name(l.local_addr().unwrap());
    (0..n).map(|_| seqpacket::connect(name.as_bytes()).unwrap()).collect()
}

/// What the listener said to a client so far: Some(None) for a hang-up, Some(Some(m)) for a
/// message, None for nothing yet.
fn heard(fd: &OwnedFd) -> Option<Option<Message>> {
    let mut buf = [0u8; 64];
    match seqpacket::recv(fd, &mut buf, true) {
        Ok(r) if r.len == 0 => Some(None),
        Ok(r) => Some(Message::decode(&buf[..r.len]).ok()),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
        Err(_) => Some(None),
    }
}

#[test]
fn silent_clients_beyond_a_uids_share_are_refused_and_the_rest_expire_without_a_connection() {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let clients = silent_clients(&l, 300);
    // Non-blocking accepts read the rendezvous backlog: nothing to accept.
    let start = Instant::now();
    for _ in 0..50 {
        assert_eq!(l.accept().unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
    }
    let refused = clients
        .iter()
        .filter(|c| matches!(heard(c), Some(Some(Message::Reject { reason: Reason::NoResources, .. }))))
        .count();
    assert_eq!(refused, 300 - 256, "the uid's share is 256 silent clients");
    assert!(clients.iter().filter(|c| heard(c).is_none()).count() == 256, "the rest are held");
    // No connection arrives: the listener's descriptor becomes readable by its timer, and the
    // accept that follows drops the silent clients.
    let mut p = [libc::pollfd { fd: l.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
    loop {
        // SAFETY: `p` is a valid array of one pollfd for the call.
        let n = unsafe { libc::poll(p.as_mut_ptr(), 1, 10_000) };
        assert_eq!(n, 1, "the listener woke by itself");
        assert_eq!(l.accept().unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
        if clients.iter().all(|c| heard(c).is_some()) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(9), "silent clients still held");
    }
    assert!(start.elapsed() >= Duration::from_secs(4), "dropped before their 5 s");
}
