//! The shim's offer requests (rust/colo-preload/src/service/offer_key.rs), which the serving thread reads
//! from another process of the lineage: any bytes give `None` or a 4-tuple that encodes to a
//! request naming the same 4-tuple, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

// The shim is a cdylib (it cannot be linked here): compile its request module itself.
#[allow(dead_code)]
#[path = "../../colo-preload/src/service/offer_key.rs"]
mod offer_key;

fuzz_target!(|data: &[u8]| {
    if let Some(k) = offer_key::decode(data) {
        assert_eq!(offer_key::decode(&offer_key::encode(&k)), Some(k));
    }
});
