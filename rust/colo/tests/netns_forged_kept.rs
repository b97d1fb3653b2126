//! The rendezvous of a listener under the LD_PRELOAD shim (`netns::serving`, which `colo run`
//! binds at `listen`) is answered while no handshake is under way there: nothing of the
//! server's reads it then but its keeper thread.

mod common;

/// A HELLO that proves no nonce sent to a served rendezvous with no connection from another
/// namespace under way is answered (REJECT) within the forger's 10 s wait.
#[test]
fn a_forged_hello_is_answered_with_no_handshake_under_way() {
    let dir = std::env::temp_dir().join(format!("colo-netns-kept-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Read once, at the first rendezvous: this file's only test sets it first.
    std::env::set_var("COLO_NETNS_DIR", &dir);
    let port = 7;
    assert!(colo::internal::netns::serving(port).is_some(), "the rendezvous was bound");
    assert!(common::forged_hello_answered(&dir, port), "no answer to a forged HELLO within 10 s");
    std::fs::remove_dir_all(&dir).unwrap();
}
