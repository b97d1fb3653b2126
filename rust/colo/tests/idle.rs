//! A listener blocked in accept costs no CPU, also while connections it handed out are half
//! dead (the client hung up; the server has not dropped its side yet). Its own test binary, so
//! the process's CPU time is this test's.
mod common;

use colo::{Listener, Stream};
use std::time::Duration;

fn cpu_time() -> Duration {
    // SAFETY: getrusage fills the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| Duration::from_micros(tv.tv_sec as u64 * 1_000_000 + tv.tv_usec as u64);
    t(ru.ru_utime) + t(ru.ru_stime)
}

#[test]
fn blocked_accept_is_idle_with_half_dead_connections() {
    let _w = common::watchdog(60);
    let l = std::sync::Arc::new(Listener::bind("127.0.0.1:0").unwrap());
    let addr = l.local_addr().unwrap();
    let mut kept = Vec::new();
    for _ in 0..3 {
        let c = Stream::connect(addr).unwrap();
        kept.push(l.accept().unwrap().0);
        drop(c); // the client hangs up; the server side stays open
    }
    let l2 = l.clone();
    std::thread::spawn(move || {
        let _ = l2.accept();
    });
    std::thread::sleep(Duration::from_millis(200));
    let before = cpu_time();
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_time() - before;
    assert!(used < Duration::from_millis(100), "a blocked accept used {used:?} of CPU in 2 s");
    drop(kept);
}
