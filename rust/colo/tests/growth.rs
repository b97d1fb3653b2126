//! Rings grow while the reader falls behind and give their memory back when quiet (spec/WIRE.md
//! section 5, "Growing and shrinking"): a writer ahead of its reader blocks no sooner than over
//! TCP, and an idle connection holds a few pages whatever it carried.
mod common;

use colo::{Listener, Options, Stream, Transport};
use std::io::{Read, Write};
use std::thread;
use std::time::Duration;

fn pair(opts: Options) -> (Stream, Stream) {
    let l = Listener::bind_with("127.0.0.1:0", opts.clone()).unwrap();
    let addr = l.local_addr().unwrap();
    let t = thread::spawn(move || l.accept().unwrap().0);
    let c = Stream::connect_with(addr, &opts).unwrap();
    let s = t.join().unwrap();
    assert_eq!(c.transport(), Transport::SharedMemory);
    assert_eq!(s.transport(), Transport::SharedMemory);
    (c, s)
}

/// A client that writes `n` bytes to an echo server before it reads anything: the bytes must
/// fit in the two rings (and the server's buffer), as they fit in two TCP sockets' buffers.
fn write_before_read(n: usize) {
    let (mut c, mut s) = pair(Options::new().ring_capacity(4 << 20));
    let echo = thread::spawn(move || {
        let mut b = vec![0u8; 64 << 10];
        loop {
            let k = s.read(&mut b).unwrap();
            if k == 0 {
                break;
            }
            s.write_all(&b[..k]).unwrap();
        }
    });
    let data: Vec<u8> = (0..n as u64).map(common::pattern).collect();
    c.write_all(&data).unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let mut back = Vec::with_capacity(n);
    c.read_to_end(&mut back).unwrap();
    assert!(back == data, "{} bytes back of {n}, in order", back.len());
    echo.join().unwrap();
}

#[test]
fn four_mebibytes_written_before_reading_come_back() {
    let _w = common::watchdog(60);
    write_before_read(4 << 20);
}

#[test]
fn eight_mebibytes_written_before_reading_come_back() {
    let _w = common::watchdog(60);
    write_before_read((8 << 20) - (64 << 10));
}

/// Resident bytes of this process's mappings of colo segments (`/proc/self/smaps`).
fn segment_rss() -> Vec<usize> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut out = Vec::new();
    let mut in_seg = false;
    for line in smaps.lines() {
        if line.contains("-") && line.split_whitespace().count() >= 5 && !line.ends_with(" kB") {
            in_seg = line.contains("colo-seg");
        } else if in_seg && line.starts_with("Rss:") {
            out.push(line.split_whitespace().nth(1).unwrap().parse::<usize>().unwrap() * 1024);
        }
    }
    out
}

#[test]
fn a_ring_that_carried_megabytes_gives_its_pages_back_when_quiet() {
    let _w = common::watchdog(60);
    let (mut c, mut s) = pair(Options::new().ring_capacity(4 << 20).pool(0, 0));
    let reader = thread::spawn(move || {
        let mut b = vec![0u8; 1 << 20];
        let mut total = 0;
        while total < 32 << 20 {
            total += s.read(&mut b).unwrap();
            // A slow reader: the writer finds the ring full and it grows.
            thread::sleep(Duration::from_micros(50));
        }
        s
    });
    let chunk = vec![7u8; 1 << 20];
    for _ in 0..32 {
        c.write_all(&chunk).unwrap();
    }
    let s = reader.join().unwrap();
    let grown: usize = segment_rss().iter().max().copied().unwrap();
    assert!(grown > 64 << 10, "the ring grew and its pages were written ({grown} bytes resident)");
    thread::sleep(Duration::from_millis(1600));
    // The header page, and one page a direction: its words and its 2 KiB ring.
    for rss in segment_rss() {
        assert!(rss <= 3 * 4096, "{rss} bytes resident after a quiet second");
    }
    // Still a working connection, and growing again, without the reader's help: over TCP one
    // thread can write this much to a socket whose other end it reads later.
    let (mut c, mut s) = (c, s);
    c.write_all(&[1u8; 100_000]).unwrap();
    let mut b = vec![0u8; 100_000];
    s.read_exact(&mut b).unwrap();
    assert!(b.iter().all(|&x| x == 1));
}
