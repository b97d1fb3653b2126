//! The rendezvous of a listener under the LD_PRELOAD shim (`netns::serving`, which `colo run`
//! binds at `listen`) is answered while no handshake is under way there: nothing of the
//! server's reads it then but its keeper thread.

use colo_sys::{pathsock, seqpacket};
use std::time::Duration;

/// A HELLO that proves no nonce (here: one with none of its descriptors) sent to a served
/// rendezvous with no connection from another namespace under way: answered (REJECT) within
/// the forger's 10 s watchdog. Before, it sat unread until the server's next connection from
/// another namespace.
#[test]
fn a_forged_hello_is_answered_with_no_handshake_under_way() {
    let dir = std::env::temp_dir().join(format!("colo-netns-kept-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Read once, at the first rendezvous: this file's only test sets it first.
    std::env::set_var("COLO_NETNS_DIR", &dir);
    let port = 7;
    assert!(colo::internal::netns::serving(port).is_some(), "the rendezvous was bound");
    let name = format!("colo-{}-{port}", std::process::id());
    let (d, _) = pathsock::open_dir(&dir).unwrap();
    let control = pathsock::connect_at(std::os::fd::AsFd::as_fd(&d), name.as_bytes(), Duration::from_secs(5)).unwrap();
    // The connection first, the HELLO later: each arrival must be read without a look of the
    // server's.
    std::thread::sleep(Duration::from_millis(100));
    seqpacket::send(&control, &[0u8; 64], &[]).unwrap();
    seqpacket::set_recv_timeout(&control, Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 64];
    let got = seqpacket::recv(&control, &mut buf, false);
    assert!(got.as_ref().is_ok_and(|r| r.len > 0), "no answer to a forged HELLO within 10 s: {got:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
