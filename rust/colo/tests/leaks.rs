//! Descriptor accounting; its own test binary, so no other test's descriptors interfere.
mod common;

use colo::{Listener, Stream};
use std::io::{Read, Write};

#[test]
fn many_connections_no_fd_leak() {
    let _w = common::watchdog(60);
    // Warm up: the first dial starts the segment preparer, which keeps a few segments ready;
    // those are a fixed cache, not a leak. Measure once it is full.
    let settle = || {
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
        let mut conns = Vec::new();
        for i in 0..200u32 {
            let c = Stream::connect(addr).unwrap();
            let (s, _) = l.accept().unwrap();
            (&c).write_all(&i.to_le_bytes()).unwrap();
            conns.push((c, s));
        }
        for (i, (_, s)) in conns.iter().enumerate() {
            let mut b = [0u8; 4];
            (&*s).read_exact(&mut b).unwrap();
            assert_eq!(u32::from_le_bytes(b), i as u32);
        }
    }
    settle();
    assert_eq!(common::open_fds().len(), before, "every descriptor is closed");
    assert_eq!(common::count_memfds(), memfds_before);
}
