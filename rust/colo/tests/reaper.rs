//! The threads that unmap closed segments, that drop segments parked too long and that watch
//! futex sleepers for hang-ups end once they have had nothing to do for a moment, so a process
//! whose connections are gone is single-threaded again (a server whose clients' short
//! connections went plain TCP), and the next close or sleep starts them again. Its own test
//! binary: it counts the process's threads by name.
mod common;

use colo::{Listener, Options, SpinMode, Stream, Transport};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

fn threads(name: &str) -> usize {
    let tasks = std::fs::read_dir("/proc/self/task").unwrap();
    tasks.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok()).filter(|c| c.trim() == name).count()
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
fn background_threads_end_when_idle_and_come_back() {
    let _w = common::watchdog(60);
    // Never spinning (whatever COLO_SPIN_US says): the reader sleeps on its futex at once.
    let opts = Options::new().spin(SpinMode::Never);
    let l = Listener::bind_with("127.0.0.1:0", opts.clone()).unwrap();
    for round in 0..2 {
        let mut c = Stream::connect_with(l.local_addr().unwrap(), &opts).unwrap();
        let (mut s, _) = l.accept().unwrap();
        assert_eq!(c.transport(), Transport::SharedMemory, "round {round}");
        let writer = std::thread::spawn(move || {
            // Nothing to read until the reader sleeps on its futex, watched for a hang-up.
            let watched = becomes(|| threads("colo-hangup") == 1);
            c.write_all(b"x").unwrap();
            (c, watched)
        });
        let mut b = [0u8; 1];
        s.read_exact(&mut b).unwrap();
        let (c, watched) = writer.join().unwrap();
        assert!(watched, "round {round}: a futex sleeper is watched");
        drop((c, s));
        assert!(becomes(|| threads("colo-sweeper") == 1), "round {round}: the closed segments are parked");
        // The closed segments are parked for reuse and given up by the sweeper after a second,
        // onto the reaper, which then idles 250 ms before it ends: polled every 5 ms, seen.
        assert!(becomes(|| threads("colo-reaper") == 1), "round {round}: a closed segment is unmapped by the reaper");
        assert!(becomes(|| threads("colo-reaper") == 0), "round {round}: the reaper ended once idle");
        assert!(becomes(|| threads("colo-hangup") == 0), "round {round}: the watcher ended with nothing to watch");
        assert!(becomes(|| threads("colo-sweeper") == 0), "round {round}: the sweeper ended with nothing parked");
    }
}
