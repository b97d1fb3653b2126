//! The shim's exec hand-over records (rust/colo-preload/src/record/handover_file/record.rs), read from an
//! inherited memfd whose bytes an earlier program image (or anyone holding the file) wrote. Any
//! bytes, cut into records as the shim cuts them: `None` or a record that encodes to the same
//! bytes in the fields it uses, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

// The shim is a cdylib (it cannot be linked here): compile its record module itself.
#[allow(dead_code)]
#[path = "../../colo-preload/src/record/handover_file/record.rs"]
mod record;

use record::{Record, RECORD_LEN};

fuzz_target!(|data: &[u8]| {
    for chunk in data.chunks_exact(RECORD_LEN) {
        let Some(r) = Record::decode(chunk) else {
            assert!(chunk[24] != 1 && chunk[24] != 2);
            continue;
        };
        let again = r.encode();
        // Bytes 20 to 23 are not used (written zero).
        assert_eq!(again[..20], chunk[..20]);
        assert_eq!(again[24], chunk[24]);
        assert_eq!(Record::decode(&again), Some(r));
    }
});
