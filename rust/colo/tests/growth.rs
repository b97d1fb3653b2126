//! Rings grow while the reader falls behind and give their memory back when quiet (spec/WIRE.md
//! section 5, "Growing and shrinking"): a writer ahead of its reader blocks no sooner than over
//! TCP, and an idle connection holds a few pages whatever it carried.
mod common;

use colo::{Listener, Options, Stream, Transport};
use std::io::{Read, Write};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

/// Held by every test here: `a_ring_that_carried_megabytes_gives_its_pages_back_when_quiet`
/// counts the resident pages of every segment in the process, which another test's
/// connection running beside it would add to.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

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
    let _s = serial();
    let _w = common::watchdog(60);
    write_before_read(4 << 20);
}

#[test]
fn eight_mebibytes_written_before_reading_come_back() {
    let _s = serial();
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
    let _s = serial();
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
    // One page a direction: its words and its 2 KiB ring (the header shares the first). The
    // shrinker takes a ring quiet for two of its looks; a loaded host runs it late, so look for a
    // while.
    for _ in 0..100 {
        thread::sleep(Duration::from_millis(100));
        if segment_rss().iter().all(|&rss| rss <= 2 * 4096) {
            break;
        }
    }
    for rss in segment_rss() {
        assert!(rss <= 2 * 4096, "{rss} bytes resident once quiet (looked for 10 s)");
    }
    // Still a working connection, and growing again, without the reader's help: over TCP one
    // thread can write this much to a socket whose other end it reads later.
    let (mut c, mut s) = (c, s);
    c.write_all(&[1u8; 100_000]).unwrap();
    let mut b = vec![0u8; 100_000];
    s.read_exact(&mut b).unwrap();
    assert!(b.iter().all(|&x| x == 1));
}

/// An echo server with a reading thread and a writing thread joined by a bounded channel (the
/// shape of a tokio `split` echo, or any proxy): once its answers fill the client's ring, the
/// writer blocks (announces), and the reader reads on until the channel is full, then waits on
/// the channel, not on colo. A client that writes everything before it reads must get as far as
/// over TCP: the server's two rings, its channel, and what the reader freed.
#[test]
fn a_split_echo_server_that_stops_reading_on_its_own_does_not_strand_its_client() {
    let _s = serial();
    let _w = common::watchdog(30);
    let (mut c, s) = pair(Options::new().ring_capacity(4 << 20));
    let mut sr = s.try_clone().unwrap();
    let mut sw = s;
    let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(24);
    let reader = thread::spawn(move || {
        let mut total = 0usize;
        loop {
            if total >= 4 << 20 {
                // Slow once the answers fill the client's ring: the client fills ours first.
                thread::sleep(Duration::from_millis(50));
            }
            let mut b = vec![0u8; 64 << 10];
            let k = sr.read(&mut b).unwrap();
            if k == 0 {
                break;
            }
            total += k;
            b.truncate(k);
            if tx.send(b).is_err() {
                break;
            }
        }
    });
    let writer = thread::spawn(move || {
        for b in rx {
            sw.write_all(&b).unwrap();
        }
        sw.shutdown(std::net::Shutdown::Write).unwrap();
    });
    // 4 MiB each way, a 24-deep channel of 64 KiB, one chunk in each server thread: about
    // 8 MiB + 1.6 MiB fit. The reader frees 1.5 MiB of the client's 4 MiB ring before it stops:
    // TCP (a 2 MiB send buffer and a 2 MiB receive buffer each way, which is what a 4 MiB ring
    // stands for) would have woken the writer (a third of its buffer free); the mark is 3.5 MiB
    // unread. Write 8 MiB + 1 MiB.
    let n = (8 << 20) + (1 << 20);
    let data: Vec<u8> = (0..n as u64).map(common::pattern).collect();
    c.write_all(&data).unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let mut back = Vec::with_capacity(n);
    c.read_to_end(&mut back).unwrap();
    assert!(back == data, "{} bytes back of {n}, in order", back.len());
    reader.join().unwrap();
    writer.join().unwrap();
}

/// A thousand connections, each of which carried 256 KiB (its ring grew to hold them), then went
/// quiet: each holds at most 16 KiB of memory, both sides together, whatever it carried before
/// (the segment's header page and a page a direction stay; issue 23's bound is 16 KiB a side).
#[test]
fn a_thousand_quiet_connections_hold_at_most_16_kib_each() {
    let _s = serial();
    let _w = common::watchdog(120);
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let acceptor = thread::spawn(move || (0..1000).map(|_| l.accept().unwrap().0).collect::<Vec<_>>());
    let burst = vec![5u8; 256 << 10];
    let mut back = vec![0u8; 256 << 10];
    let clients: Vec<Stream> = (0..1000).map(|_| Stream::connect(addr).unwrap()).collect();
    let servers = acceptor.join().unwrap();
    let mut kept: Vec<(Stream, Stream)> = clients.into_iter().zip(servers).collect();
    for (c, s) in kept.iter_mut() {
        assert_eq!(c.transport(), Transport::SharedMemory);
        assert_eq!(s.transport(), Transport::SharedMemory);
        // Written before it is read: the ring grows to hold it, as a TCP socket's buffers would.
        c.write_all(&burst).unwrap();
        s.read_exact(&mut back).unwrap();
        assert!(back == burst);
    }
    let over = || segment_rss().into_iter().filter(|&rss| rss > 16 << 10).count();
    for _ in 0..300 {
        if over() == 0 {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    let rss = segment_rss();
    assert!(rss.len() >= 2000, "both ends of each connection map its segment (and segments made ahead): {}", rss.len());
    assert_eq!(over(), 0, "mappings over 16 KiB resident once quiet (looked for 30 s): largest {:?} bytes", rss.iter().max());
    // They still work, and grow again.
    for (c, s) in kept.iter_mut().take(10) {
        c.write_all(&burst).unwrap();
        s.read_exact(&mut back).unwrap();
        assert!(back == burst);
    }
}
