//! A listener that serves other namespaces (`COLO_NETNS_DIR`) answers what arrives at its
//! rendezvous while its accept waits, not at its next connection from another namespace.

mod common;

/// A HELLO that proves no nonce sent to the rendezvous of a listener blocked in `accept`, with no
/// connection from another namespace coming, is answered (REJECT) within the forger's 10 s wait.
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
    assert!(common::forged_hello_answered(&dir, port), "no answer to a forged HELLO within 10 s");
    std::fs::remove_dir_all(&dir).unwrap();
}
