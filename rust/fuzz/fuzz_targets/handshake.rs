//! The 16-byte handshake message (spec/WIRE.md section 3), which a server reads from any
//! process that connects to its rendezvous name and a client reads from the listener it dialled.
//! Any bytes: a clear error or a message, never a panic; a decoded message encodes to bytes that
//! decode to it again (unknown flag bits are dropped, as the spec says they are ignored).
#![no_main]

use colo::wire::{Message, MESSAGE_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(m) = Message::decode(data) else { return };
    assert_eq!(data.len(), MESSAGE_LEN);
    let again = m.encode();
    assert_eq!(Message::decode(&again), Ok(m));
    // The fields the decoder reads are the bytes it was given (WELCOME ignores its argument).
    assert_eq!(again[..6], data[..6]);
    if !matches!(m, Message::Welcome { .. }) {
        assert_eq!(again[6], data[6]);
    }
});
