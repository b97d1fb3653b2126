//! Diagnostics on stderr, chosen by `COLO_LOG` (`info` or `debug`); silent by default.

use std::sync::OnceLock;

fn level() -> u8 {
    static LEVEL: OnceLock<u8> = OnceLock::new();
    *LEVEL.get_or_init(|| match std::env::var("COLO_LOG").as_deref() {
        Ok("debug") => 2,
        Ok("info") => 1,
        _ => 0,
    })
}

/// Logs a line at `info`: why a connection is or is not on shared memory.
pub fn info(args: std::fmt::Arguments<'_>) {
    if level() >= 1 && !colo_sys::host::stderr_is_network() {
        eprintln!("colo[{}]: {args}", colo_sys::host::pid());
    }
}
