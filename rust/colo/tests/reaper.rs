//! The thread that unmaps closed segments ends once it has had nothing to do for a moment, so a
//! process whose connections are gone is single-threaded again (a server whose clients' short
//! connections went plain TCP), and the next close starts it again. Its own test binary: it
//! counts the process's threads by name.
mod common;

use colo::{Listener, Stream, Transport};
use std::time::{Duration, Instant};

fn reapers() -> usize {
    let tasks = std::fs::read_dir("/proc/self/task").unwrap();
    tasks.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok()).filter(|c| c.trim() == "colo-reaper").count()
}

/// Whether `cond` holds within 5 s.
fn becomes(cond: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

#[test]
fn the_reaper_ends_when_idle_and_comes_back_for_the_next_close() {
    let _w = common::watchdog(60);
    let l = Listener::bind("127.0.0.1:0").unwrap();
    for round in 0..2 {
        let mut c = Stream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        assert_eq!(c.transport(), Transport::SharedMemory, "round {round}");
        std::io::Write::write_all(&mut c, b"x").unwrap();
        let mut b = [0u8; 1];
        std::io::Read::read_exact(&mut s, &mut b).unwrap();
        drop((c, s));
        // The closed segments are parked for reuse and given up by the sweeper after a second,
        // onto the reaper, which then idles 250 ms before it ends: polled every 5 ms, seen.
        assert!(becomes(|| reapers() == 1), "round {round}: a closed segment is unmapped by the reaper");
        assert!(becomes(|| reapers() == 0), "round {round}: the reaper ended once idle");
    }
}
