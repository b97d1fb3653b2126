//! The golden vectors of spec/vectors/ against colo::wire.

use colo::wire::{lookup_names, rendezvous_name, Header, Message, Mode, Reason};
use std::net::SocketAddr;

fn vectors(name: &str) -> serde_json::Value {
    let path = format!("{}/../../spec/vectors/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

#[test]
fn handshake_messages() {
    for v in vectors("handshake.json").as_array().unwrap() {
        let bytes = unhex(v["hex"].as_str().unwrap());
        let decoded = Message::decode(&bytes);
        if !v["valid"].as_bool().unwrap() {
            assert!(decoded.is_err(), "{v}");
            continue;
        }
        let m = decoded.unwrap_or_else(|e| panic!("{v}: {e}"));
        let (ty, version, arg) = match m {
            Message::Hello { version, mode } => (1, version, mode as u8),
            Message::Recycle { version, ticket } => {
                assert_eq!(u64::from(ticket), v["ticket"].as_u64().unwrap(), "{v}");
                (1, version, 1)
            }
            Message::Welcome { version } => (2, version, 0),
            Message::Reject { version, reason } => (3, version, reason as u8),
        };
        assert_eq!((ty, version, arg), (v["type"].as_u64().unwrap() as u8, v["version"].as_u64().unwrap() as u8, v["arg"].as_u64().unwrap() as u8), "{v}");
        if v["name"] != "hello_unknown_flags_ignored" {
            assert_eq!(m.encode().to_vec(), bytes, "{v}");
        }
    }
    assert_eq!(Message::decode(&Message::Hello { version: 1, mode: Mode::Carrier }.encode()).unwrap(), Message::Hello { version: 1, mode: Mode::Carrier });
    assert_eq!(Message::Reject { version: 1, reason: Reason::NeedCarrier }.encode()[6], 4);
}

#[test]
fn segment_headers() {
    for v in vectors("header.json").as_array().unwrap() {
        let bytes = unhex(v["hex"].as_str().unwrap());
        let (h, layout) = Header::decode(&bytes).unwrap_or_else(|e| panic!("{v}: {e}"));
        assert_eq!(h.geometry.ring_capacity as u64, v["ring_capacity"].as_u64().unwrap());
        assert_eq!(h.geometry.slot_size as u64, v["slot_size"].as_u64().unwrap());
        assert_eq!(h.geometry.slot_count as u64, v["slot_count"].as_u64().unwrap());
        assert_eq!(h.claim as u64, v["claim"].as_u64().unwrap());
        assert_eq!(h.client_pid as u64, v["client_pid"].as_u64().unwrap());
        assert_eq!(h.server_pid as u64, v["server_pid"].as_u64().unwrap());
        assert_eq!(h.client_addr.unwrap().to_string(), v["client_addr"].as_str().unwrap());
        assert_eq!(h.server_addr.unwrap().to_string(), v["server_addr"].as_str().unwrap());
        assert_eq!(layout.segment_size as u64, v["segment_size"].as_u64().unwrap());
        let mut out = vec![0u8; 128];
        h.encode(&mut out).unwrap();
        assert_eq!(out, bytes, "{}", v["name"]);
    }
    for v in vectors("header_invalid.json").as_array().unwrap() {
        assert!(Header::decode(&unhex(v["hex"].as_str().unwrap())).is_err(), "{}", v["name"]);
    }
}

#[test]
fn rendezvous_names() {
    for v in vectors("names.json").as_array().unwrap() {
        let addr: SocketAddr = v["addr"].as_str().unwrap().parse().unwrap();
        assert_eq!(rendezvous_name(addr), v["name"].as_str().unwrap());
        if let Some(list) = v["lookup"].as_array() {
            let want: Vec<&str> = list.iter().map(|x| x.as_str().unwrap()).collect();
            assert_eq!(lookup_names(addr), want);
        }
    }
}
