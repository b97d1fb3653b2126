//! Short-lived connections stay on plain TCP.
//!
//! Setting up a segment costs a shim client and server a few dozen system calls and a
//! cross-process round trip for the claim; a connection that moves a few bytes and closes gains
//! less than that (redis-benchmark `-k 0`, HTTP without keep-alive). So the client side watches
//! how its accelerated connections to each destination end: after a run of short ones it dials
//! that destination over plain TCP for a while, then offers shared memory again (the load may
//! have changed). Long-lived connections are never affected. `COLO_SHORT_LIVED=accelerate`
//! turns this off.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A connection that lived less than this and moved less than `SHORT_BYTES` was short.
const SHORT_LIFE: Duration = Duration::from_millis(20);
const SHORT_BYTES: u64 = 64 * 1024;
/// This many short connections in a row to one destination...
const RUN: u32 = 8;
/// ...send the next ones there over plain TCP for this long.
const PLAIN_FOR: Duration = Duration::from_secs(1);
/// Destinations remembered (a bound on memory; the table starts over when full).
const MAX_DESTS: usize = 4096;

#[derive(Default)]
struct Dest {
    short_run: u32,
    plain_until: Option<Instant>,
}

static DESTS: Mutex<Option<HashMap<SocketAddr, Dest>>> = Mutex::new(None);

fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("COLO_SHORT_LIVED").map_or(true, |v| v != "accelerate"))
}

/// Whether a new connection to `dest` should be offered shared memory.
pub fn accelerate(dest: SocketAddr) -> bool {
    if !enabled() {
        return true;
    }
    let mut g = DESTS.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = g.get_or_insert_with(HashMap::new).get_mut(&dest) else { return true };
    match d.plain_until {
        Some(t) if Instant::now() < t => false,
        Some(_) => {
            d.plain_until = None;
            d.short_run = 0;
            true
        }
        None => true,
    }
}

/// An accelerated connection to `dest` ended after `lived`, having moved `bytes` both ways.
pub fn ended(dest: SocketAddr, lived: Duration, bytes: u64) {
    if !enabled() {
        return;
    }
    let short = lived < SHORT_LIFE && bytes < SHORT_BYTES;
    let mut g = DESTS.lock().unwrap_or_else(|e| e.into_inner());
    let map = g.get_or_insert_with(HashMap::new);
    if map.len() >= MAX_DESTS && !map.contains_key(&dest) {
        map.clear();
    }
    let d = map.entry(dest).or_default();
    if !short {
        d.short_run = 0;
        return;
    }
    d.short_run += 1;
    if d.short_run >= RUN && d.plain_until.is_none() {
        d.plain_until = Some(Instant::now() + PLAIN_FOR);
        crate::log_info(format_args!(
            "connect {dest}: {RUN} short-lived connections in a row; plain TCP there for {PLAIN_FOR:?} (COLO_SHORT_LIVED=accelerate keeps shared memory)"
        ));
    }
}
