//! Descriptor accounting; its own test binary, so no other test's descriptors interfere.
mod common;

use colo::{Listener, Stream};
use std::io::{Read, Write};
use std::sync::{Mutex, MutexGuard};

/// The tests here count this process's descriptors: one at a time, so that no other test's
/// connections come and go between a count and the next.
fn alone() -> MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn many_connections_no_fd_leak() {
    let _alone = alone();
    let _w = common::watchdog(60);
    // Warm up: the first dial starts the segment preparer, which keeps a few segments ready;
    // those are a fixed cache, not a leak. Measure once it is full. Segments of closed
    // connections stay parked for reuse for at most a second (spec/WIRE.md, "Recycling"): after
    // that they must be gone too.
    let settle = || {
        std::thread::sleep(std::time::Duration::from_millis(1600));
        let mut last = usize::MAX;
        for _ in 0..50 {
            std::thread::sleep(std::time::Duration::from_millis(40));
            let now = common::open_fds().len();
            if now == last {
                break;
            }
            last = now;
        }
    };
    {
        let l = Listener::bind("127.0.0.1:0").unwrap();
        let c = Stream::connect(l.local_addr().unwrap()).unwrap();
        drop(l.accept().unwrap());
        drop(c);
    }
    settle();
    let before = common::open_fds().len();
    let memfds_before = common::count_memfds();
    {
        let l = Listener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let acceptor = std::thread::spawn(move || (0..200).map(|_| l.accept().unwrap().0).collect::<Vec<_>>());
        let clients: Vec<Stream> = (0..200u32)
            .map(|i| {
                let c = Stream::connect(addr).unwrap();
                (&c).write_all(&i.to_le_bytes()).unwrap();
                c
            })
            .collect();
        let conns: Vec<(Stream, Stream)> = clients.into_iter().zip(acceptor.join().unwrap()).collect();
        // Accept order may differ from connect order; every value arrives exactly once.
        let mut seen: Vec<u32> = conns
            .iter()
            .map(|(_, s)| {
                let mut b = [0u8; 4];
                (&*s).read_exact(&mut b).unwrap();
                u32::from_le_bytes(b)
            })
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..200).collect::<Vec<u32>>());
    }
    settle();
    assert_eq!(common::open_fds().len(), before, "every descriptor is closed");
    assert_eq!(common::count_memfds(), memfds_before);
}

/// The hang-up watcher's epoll set and eventfd belong to its thread, which a forked child does
/// not have: the child lets its copies go at once (a child that neither watches nor execs kept
/// them for life).
#[test]
fn fork_child_keeps_no_copy_of_the_hangup_watcher() {
    use colo::{Options, SpinMode};
    let _alone = alone();
    let _w = common::watchdog(60);
    let watcher_running = || {
        let tasks = std::fs::read_dir("/proc/self/task").unwrap();
        tasks.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok()).any(|c| c.trim() == "colo-hangup")
    };
    // (epoll sets, eventfds) open in this process.
    let kinds = || {
        let fds = common::open_fds();
        let n = |k: &str| fds.iter().filter(|l| l.as_str() == k).count();
        (n("anon_inode:[eventpoll]"), n("anon_inode:[eventfd]"))
    };
    // Never spinning: the reader sleeps on its futex at once, watched for a hang-up.
    let opts = Options::new().spin(SpinMode::Never);
    let l = Listener::bind_with("127.0.0.1:0", opts.clone()).unwrap();
    let mut c = Stream::connect_with(l.local_addr().unwrap(), &opts).unwrap();
    let (mut s, _) = l.accept().unwrap();
    let reader = std::thread::spawn(move || {
        let mut b = [0u8; 1];
        s.read_exact(&mut b).unwrap();
        s
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !watcher_running() {
        assert!(std::time::Instant::now() < deadline, "the reader's sleep started no watcher");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let (epolls, eventfds) = kinds();
    // SAFETY: the child only reads /proc and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let (e, f) = kinds();
        let code = if e + 1 == epolls && f + 1 == eventfds { 0 } else { 1 + (e.min(15) * 16 + f.min(15)) as i32 % 250 };
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    assert!(pid > 0);
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child status {status}");
    assert_eq!(libc::WEXITSTATUS(status), 0, "the child kept the watcher's descriptors (parent: {epolls} epoll sets, {eventfds} eventfds)");
    c.write_all(b"x").unwrap();
    drop(reader.join().unwrap());
}

/// Non-blocking misses register their connections with the hang-up watcher (so that a miss
/// costs no system call): once the connections close, every descriptor is closed and the
/// watcher's thread ends (idle), as after futex sleeps.
#[test]
fn non_blocking_misses_leave_no_descriptor_or_watcher_behind() {
    let _alone = alone();
    let _w = common::watchdog(60);
    let watcher_running = || {
        let tasks = std::fs::read_dir("/proc/self/task").unwrap();
        tasks.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok()).any(|c| c.trim() == "colo-hangup")
    };
    let settle = |want_watcher_gone: bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut last = usize::MAX;
        loop {
            std::thread::sleep(std::time::Duration::from_millis(1600));
            let now = common::open_fds().len();
            if now == last && !(want_watcher_gone && watcher_running()) {
                return now;
            }
            assert!(std::time::Instant::now() < deadline, "descriptors or the watcher never settled");
            last = now;
        }
    };
    // Warm up (the segment preparer's cache), then count.
    {
        let l = Listener::bind("127.0.0.1:0").unwrap();
        let c = Stream::connect(l.local_addr().unwrap()).unwrap();
        drop(l.accept().unwrap());
        drop(c);
    }
    let before = settle(true);
    {
        let l = Listener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mut conns = Vec::new();
        for i in 0..50u8 {
            let c = Stream::connect(addr).unwrap();
            let (s, _) = l.accept().unwrap();
            for x in [&c, &s] {
                x.set_nonblocking(true).unwrap();
                let mut b = [0u8; 1];
                for _ in 0..3 {
                    assert_eq!((&*x).read(&mut b).unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
                }
            }
            (&c).write_all(&[i]).unwrap();
            let mut b = [0u8; 1];
            (&s).read_exact(&mut b).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(b[0], i);
            conns.push((c, s));
        }
        // A miss registers only a connection whose HELLO was answered (under load a client's
        // answer may not have been read by its first misses): miss again until one has.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !watcher_running() {
            assert!(std::time::Instant::now() < deadline, "the misses registered with the watcher");
            for x in conns.iter().flat_map(|(c, s)| [c, s]) {
                let mut b = [0u8; 1];
                assert_eq!((&*x).read(&mut b).unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    assert_eq!(settle(true), before, "every descriptor is closed");
    assert!(!watcher_running(), "the watcher ended once idle");
}
