//! The 16-byte handshake message (spec/WIRE.md section 3), which a server reads from any
//! process that connects to its rendezvous name and a client reads from the listener it dialled.
//! Any bytes: a clear error or a message, never a panic; a decoded message encodes to bytes that
//! decode to it again (unknown flag bits are dropped, as the spec says they are ignored). The
//! same bytes read as an ASK (the rendezvous's one longer message): its text is the bytes after
//! the header, and it encodes back to them.
#![no_main]

use colo::wire::{decode_ask, encode_ask, Message, MESSAGE_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((version, key)) = decode_ask(data) {
        assert_eq!(key, &data[MESSAGE_LEN..]);
        if version == colo::wire::VERSION && data[6..MESSAGE_LEN].iter().all(|&b| b == 0) {
            assert_eq!(encode_ask(key).as_deref(), Some(data));
        }
    }
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
