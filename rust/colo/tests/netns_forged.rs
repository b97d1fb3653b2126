//! A listener that serves other namespaces (`COLO_NETNS_DIR`) answers what arrives at its
//! rendezvous while its accept waits, not at its next connection from another namespace.

use colo_sys::{pathsock, seqpacket};
use std::time::Duration;

/// A HELLO that proves no nonce (here: one with none of its descriptors) sent to the rendezvous
/// of a listener blocked in `accept`, with no connection from another namespace coming: it is
/// answered (REJECT) within the forger's 10 s watchdog. Before, it sat unread until the
/// listener's next connection from another namespace.
#[test]
fn a_forged_hello_is_answered_while_accept_waits() {
    let dir = std::env::temp_dir().join(format!("colo-netns-forged-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Read once, at the first listener: this file's only test sets it first.
    std::env::set_var("COLO_NETNS_DIR", &dir);
    let listener = colo::Listener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // Blocked in accept for the rest of the test (no connection comes).
    std::thread::spawn(move || {
        let _ = listener.accept();
    });
    let name = format!("colo-{}-{port}", std::process::id());
    let (d, _) = pathsock::open_dir(&dir).unwrap();
    let control = pathsock::connect_at(std::os::fd::AsFd::as_fd(&d), name.as_bytes(), Duration::from_secs(5)).unwrap();
    // Give the listener's thread time to be in its wait: an answer must not need the accept
    // to start again.
    std::thread::sleep(Duration::from_millis(100));
    seqpacket::send(&control, &[0u8; 64], &[]).unwrap();
    seqpacket::set_recv_timeout(&control, Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 64];
    let got = seqpacket::recv(&control, &mut buf, false);
    assert!(got.as_ref().is_ok_and(|r| r.len > 0), "no answer to a forged HELLO within 10 s: {got:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
