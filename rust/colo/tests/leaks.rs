//! Descriptor accounting; its own test binary, so no other test's descriptors interfere.
mod common;

use colo::{Listener, Stream};
use std::io::{Read, Write};

#[test]
fn many_connections_no_fd_leak() {
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
