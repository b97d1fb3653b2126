//! Socket semantics of colo::Stream and colo::Listener over shared memory and TCP.
mod common;

use colo::{Listener, Options, SpinMode, Stream, Transport};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

fn pair_with(opts: Options) -> (Stream, Stream) {
    let l = Listener::bind_with("127.0.0.1:0", opts.clone()).unwrap();
    let addr = l.local_addr().unwrap();
    let t = thread::spawn(move || l.accept().unwrap().0);
    let c = Stream::connect_with(addr, &opts).unwrap();
    let s = t.join().unwrap();
    assert_eq!(c.transport(), Transport::SharedMemory);
    assert_eq!(s.transport(), Transport::SharedMemory);
    (c, s)
}

fn pair() -> (Stream, Stream) {
    pair_with(Options::new())
}

#[test]
fn echo_and_eof() {
    let _w = common::watchdog(30);
    let (mut c, mut s) = pair();
    c.write_all(b"ping").unwrap();
    let mut b = [0u8; 4];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"ping");
    s.write_all(b"pong").unwrap();
    c.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"pong");
    drop(c);
    assert_eq!(s.read(&mut b).unwrap(), 0, "clean close reads as EOF");
    assert_eq!(s.write(b"x").unwrap_err().kind(), ErrorKind::BrokenPipe);
}

#[test]
fn half_close_each_way() {
    let _w = common::watchdog(30);
    let (mut c, mut s) = pair();
    c.write_all(b"request").unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"request");
    s.write_all(b"response after peer's FIN").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let mut back = Vec::new();
    c.read_to_end(&mut back).unwrap();
    assert_eq!(back, b"response after peer's FIN");
    assert_eq!(c.write(b"x").unwrap_err().kind(), ErrorKind::BrokenPipe);
}

#[test]
fn read_shutdown_breaks_peer_writes() {
    let _w = common::watchdog(30);
    let (c, s) = pair();
    s.shutdown(Shutdown::Read).unwrap();
    let mut b = [0u8; 1];
    assert_eq!((&s).read(&mut b).unwrap(), 0);
    assert_eq!((&c).write(b"x").unwrap_err().kind(), ErrorKind::BrokenPipe);
    // Messages too (spec section 8), as in the Go package.
    let (c, s) = pair_with(Options::new().pool(4096, 2));
    s.shutdown(Shutdown::Read).unwrap();
    assert_eq!(c.loan(8).err().map(|e| e.kind()), Some(ErrorKind::BrokenPipe));
}

#[test]
fn large_transfer_in_order_with_concurrent_halves() {
    let _w = common::watchdog(60);
    let (c, s) = pair_with(Options::new().ring_capacity(64 * 1024));
    const TOTAL: u64 = 64 << 20;
    let echo = thread::spawn(move || {
        let mut buf = vec![0u8; 100_000];
        loop {
            let n = (&s).read(&mut buf).unwrap();
            if n == 0 {
                s.shutdown(Shutdown::Write).unwrap();
                return;
            }
            (&s).write_all(&buf[..n]).unwrap();
        }
    });
    let reader = c.try_clone().unwrap();
    let check = thread::spawn(move || {
        let mut buf = vec![0u8; 77_777];
        let mut at = 0u64;
        loop {
            let n = (&reader).read(&mut buf).unwrap();
            if n == 0 {
                return at;
            }
            for (i, b) in buf[..n].iter().enumerate() {
                assert_eq!(*b, common::pattern(at + i as u64), "byte {}", at + i as u64);
            }
            at += n as u64;
        }
    });
    let mut sent = 0u64;
    let mut chunk = vec![0u8; 50_000];
    while sent < TOTAL {
        let n = chunk.len().min((TOTAL - sent) as usize);
        for (i, b) in chunk[..n].iter_mut().enumerate() {
            *b = common::pattern(sent + i as u64);
        }
        (&c).write_all(&chunk[..n]).unwrap();
        sent += n as u64;
    }
    c.shutdown(Shutdown::Write).unwrap();
    assert_eq!(check.join().unwrap(), TOTAL);
    echo.join().unwrap();
}

#[test]
fn timeouts_and_nonblocking() {
    let _w = common::watchdog(30);
    for spin in [SpinMode::Never, SpinMode::Always, colo_ring_default()] {
        let (c, s) = pair_with(Options::new().spin(spin));
        c.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut b = [0u8; 1];
        assert_eq!((&c).read(&mut b).unwrap_err().kind(), ErrorKind::WouldBlock);
        c.set_nonblocking(true).unwrap();
        assert_eq!((&c).read(&mut b).unwrap_err().kind(), ErrorKind::WouldBlock);
        (&s).write_all(b"z").unwrap();
        // The readiness fd becomes readable; poll(2) on it, then read.
        let mut pfd = [libc::pollfd { fd: std::os::fd::AsRawFd::as_raw_fd(&c), events: libc::POLLIN, revents: 0 }];
        // SAFETY: one valid pollfd.
        assert_eq!(unsafe { libc::poll(pfd.as_mut_ptr(), 1, 5000) }, 1);
        assert_eq!((&c).read(&mut b).unwrap(), 1);
        assert_eq!(&b, b"z");
        assert!(c.set_read_timeout(Some(Duration::ZERO)).is_err());
    }
}

fn colo_ring_default() -> SpinMode {
    SpinMode::For(Duration::from_micros(5))
}

#[test]
fn writer_blocks_when_full_then_times_out() {
    let _w = common::watchdog(30);
    let (c, _s) = pair_with(Options::new().ring_capacity(4096));
    c.set_write_timeout(Some(Duration::from_millis(50))).unwrap();
    let big = vec![1u8; 10_000];
    let err = (&c).write_all(&big).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WouldBlock);
}

#[test]
fn zero_copy_messages() {
    let _w = common::watchdog(30);
    let (c, s) = pair_with(Options::new().pool(1 << 20, 4));
    for round in 0..20u8 {
        let mut loan = c.loan(1 << 20).unwrap();
        assert!(loan.is_zero_copy());
        loan.fill(round);
        loan.send().unwrap();
        let m = s.recv_message().unwrap().unwrap();
        assert!(m.is_zero_copy());
        assert_eq!(m.len(), 1 << 20);
        assert!(m.iter().all(|b| *b == round));
        // Read in place: the view lies inside a mapping of a colo segment, not in private memory.
        assert!(in_colo_segment(m.as_ptr() as usize, m.len()), "the message view is not in a segment");
        drop(m);
    }
    // More loans than slots: the fifth waits until a release.
    let held: Vec<_> = (0..4).map(|_| c.loan(10).unwrap()).collect();
    c.set_write_timeout(Some(Duration::from_millis(30))).unwrap();
    assert_eq!(c.loan(10).err().unwrap().kind(), ErrorKind::WouldBlock);
    drop(held);
    assert!(c.loan(10).is_ok());
    assert_eq!(c.loan((1 << 20) + 1).err().unwrap().raw_os_error(), Some(90), "EMSGSIZE");
    // End of stream ends the message stream too.
    drop(c);
    assert!(s.recv_message().unwrap().is_none());
}

/// Every slot of a pool of several bitset words (130 slots) loaned, sent and held at once, then
/// the pool used again from the slots taken back: each message arrives in its own slot, intact,
/// and a slot comes back only once released.
#[test]
fn every_slot_of_a_pool_in_use_at_once() {
    let _w = common::watchdog(30);
    let (c, s) = pair_with(Options::new().pool(64, 130));
    c.set_write_timeout(Some(Duration::from_millis(30))).unwrap();
    for round in 0..3u8 {
        for i in 0..130u8 {
            let mut loan = c.loan(1).unwrap();
            loan.fill(i ^ round);
            loan.send().unwrap();
        }
        assert_eq!(c.loan(1).err().unwrap().kind(), ErrorKind::WouldBlock, "round {round}: all 130 slots in flight");
        let held: Vec<_> = (0..130u8).map(|i| (i, s.recv_message().unwrap().unwrap())).collect();
        let mut at: Vec<_> = held.iter().map(|(_, m)| m.as_ptr() as usize).collect();
        for (i, m) in &held {
            assert_eq!(m[..], [i ^ round], "round {round}: message {i}");
        }
        at.sort_unstable();
        at.dedup();
        assert_eq!(at.len(), 130, "round {round}: a slot carried two held messages");
        drop(held);
    }
}

/// The raw calls bindings build on (`loan_raw` .. `release_raw`): a loan filled in full and sent
/// short, a cancelled loan whose slot comes back, a message read in place and released. Over
/// shared memory (pool slots) and over a TCP fallback (heap buffers).
#[test]
fn raw_loans_and_messages_over_both_transports() {
    let _w = common::watchdog(30);
    let (c, s) = pair_with(Options::new().pool(4096, 1));
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let echo = {
        let addr = l.local_addr().unwrap();
        let t = thread::spawn(move || {
            // Echo the framed messages back, byte for byte, until the client hangs up.
            let (mut sock, _) = l.accept().unwrap();
            let mut buf = vec![0u8; 1 << 16];
            loop {
                match sock.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => sock.write_all(&buf[..n]).unwrap(),
                }
            }
        });
        (Stream::connect(addr).unwrap(), t)
    };
    for (tx, rx, zero_copy) in [(&c, &s, true), (&echo.0, &echo.0, false)] {
        for round in 0..3u8 {
            // The only slot of the pool comes back after a cancel (a second loan would wait).
            let cancelled = tx.loan_raw(100).unwrap();
            // SAFETY: this stream's live loan, ended once.
            unsafe { tx.cancel_raw(cancelled) };
            // Sending more than the capacity gives the loan back too (else the next would wait).
            let too_long = tx.loan_raw(100).unwrap();
            let over = too_long.capacity() + 1;
            // SAFETY: this stream's live loan, ended once.
            let e = unsafe { tx.send_raw(too_long, over) }.unwrap_err();
            assert_eq!(e.raw_os_error(), Some(90), "EMSGSIZE");
            let loan = tx.loan_raw(100).unwrap();
            assert_eq!(loan.is_zero_copy(), zero_copy);
            assert!(loan.capacity() >= 100);
            // SAFETY: the loan's buffer holds `capacity` writable bytes until it is sent.
            unsafe { std::ptr::write_bytes(loan.as_mut_ptr(), round, loan.capacity()) };
            // SAFETY: this stream's live loan, sent once, 60 <= capacity.
            unsafe { tx.send_raw(loan, 60) }.unwrap();
            let m = rx.recv_raw().unwrap().unwrap();
            assert_eq!(m.is_zero_copy(), zero_copy);
            assert_eq!(m.len(), 60, "sent short: only the first 60 bytes");
            // SAFETY: the message's bytes stay readable until it is released.
            let bytes = unsafe { std::slice::from_raw_parts(m.as_ptr(), m.len()) };
            assert!(bytes.iter().all(|b| *b == round));
            // SAFETY: this stream's message, released once.
            unsafe { rx.release_raw(m) };
        }
    }
    drop(echo.0);
    echo.1.join().unwrap();
}

/// Whether `addr..addr + len` lies inside one mapping of a `colo-seg` memfd (/proc/self/maps).
fn in_colo_segment(addr: usize, len: usize) -> bool {
    std::fs::read_to_string("/proc/self/maps").unwrap().lines().filter(|l| l.contains("memfd:colo-seg")).any(|l| {
        let range = l.split_whitespace().next().unwrap();
        let (a, b) = range.split_once('-').unwrap();
        let (a, b) = (usize::from_str_radix(a, 16).unwrap(), usize::from_str_radix(b, 16).unwrap());
        addr >= a && addr + len <= b
    })
}

#[test]
fn no_pool_is_enobufs() {
    let _w = common::watchdog(30);
    let (c, _s) = pair_with(Options::new().pool(0, 0));
    assert_eq!(c.loan(1).err().unwrap().raw_os_error(), Some(105));
}

#[test]
fn listener_serves_plain_tcp_clients() {
    let _w = common::watchdog(30);
    let l = Listener::bind("127.0.0.1:0").unwrap();
    assert!(l.is_colo());
    let addr = l.local_addr().unwrap();
    let t = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        assert_eq!(s.transport(), Transport::Tcp);
        let mut b = [0u8; 5];
        s.read_exact(&mut b).unwrap();
        s.write_all(&b).unwrap();
    });
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.write_all(b"hello").unwrap();
    let mut b = [0u8; 5];
    tcp.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"hello");
    t.join().unwrap();
}

/// A non-blocking listener reports WouldBlock only when nothing is queued, and then finds every
/// connection that arrives: colo and plain TCP clients, one at a time and several at once (the
/// listener tries only the sockets its poller reported; a stale hint must never hide one).
#[test]
fn nonblocking_accept_finds_every_connection() {
    let _w = common::watchdog(60);
    let l = Listener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap();
    let accept_one = || loop {
        match l.accept() {
            Ok((s, _)) => return s,
            Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(1)),
            Err(e) => panic!("accept: {e}"),
        }
    };
    assert_eq!(l.accept().err().map(|e| e.kind()), Some(ErrorKind::WouldBlock));
    let mut kept = Vec::new();
    for round in 0..8 {
        let n = 1 + round % 4;
        let clients: Vec<Box<dyn std::any::Any>> = (0..n)
            .map(|i| -> Box<dyn std::any::Any> {
                if (round + i) % 2 == 0 {
                    Box::new(Stream::connect(addr).unwrap())
                } else {
                    Box::new(TcpStream::connect(addr).unwrap())
                }
            })
            .collect();
        let (mut colo, mut tcp) = (0, 0);
        for _ in 0..n {
            match accept_one().transport() {
                Transport::SharedMemory => colo += 1,
                Transport::Tcp => tcp += 1,
            }
        }
        assert_eq!(colo + tcp, n);
        assert_eq!(colo, (0..n).filter(|i| (round + i) % 2 == 0).count(), "round {round}");
        assert_eq!(l.accept().err().map(|e| e.kind()), Some(ErrorKind::WouldBlock), "round {round}: nothing left");
        kept.push(clients);
    }
}

#[test]
fn falls_back_to_tcp_for_plain_servers() {
    let _w = common::watchdog(30);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut b = [0u8; 3];
        s.read_exact(&mut b).unwrap();
        s.write_all(&b).unwrap();
    });
    let mut c = Stream::connect(addr).unwrap();
    assert_eq!(c.transport(), Transport::Tcp);
    c.write_all(b"abc").unwrap();
    let mut b = [0u8; 3];
    c.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"abc");
    // Messages still work over the fallback, framed on the stream.
    t.join().unwrap();
}

#[test]
fn messages_over_tcp_fallback() {
    let _w = common::watchdog(30);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut b = [0u8; 9];
        s.read_exact(&mut b).unwrap();
        s.write_all(&b).unwrap();
    });
    let c = Stream::connect(addr).unwrap();
    let mut loan = c.loan(5).unwrap();
    assert!(!loan.is_zero_copy());
    loan.copy_from_slice(b"frame");
    loan.send().unwrap();
    let m = c.recv_message().unwrap().unwrap();
    assert_eq!(&m[..], b"frame");
    drop(m);
    t.join().unwrap();
}

#[test]
fn a_tcp_message_cut_by_a_timeout_is_finished_by_the_next_receive() {
    let _w = common::watchdog(30);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (go_on, wait) = std::sync::mpsc::channel::<()>();
    let t = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let body: Vec<u8> = (0..2000u32).map(|i| i as u8).collect();
        s.write_all(&2000u32.to_le_bytes()[..2]).unwrap();
        wait.recv().unwrap();
        s.write_all(&2000u32.to_le_bytes()[2..]).unwrap();
        s.write_all(&body[..700]).unwrap();
        wait.recv().unwrap();
        s.write_all(&body[700..]).unwrap();
        s.write_all(&5u32.to_le_bytes()).unwrap();
        s.write_all(b"hello").unwrap();
        s.write_all(&3u32.to_le_bytes()).unwrap(); // then the stream ends inside this one
    });
    let c = Stream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    // A receive that times out inside the header, then inside the body, keeps what it read.
    assert_eq!(c.recv_message().err().map(|e| e.kind()), Some(ErrorKind::WouldBlock));
    go_on.send(()).unwrap();
    thread::sleep(Duration::from_millis(100));
    assert_eq!(c.recv_message().err().map(|e| e.kind()), Some(ErrorKind::WouldBlock));
    go_on.send(()).unwrap();
    c.set_read_timeout(None).unwrap();
    let m = c.recv_message().unwrap().unwrap();
    assert_eq!(m.len(), 2000);
    assert!(m.iter().enumerate().all(|(i, &b)| b == i as u8), "the message arrives intact");
    drop(m);
    assert_eq!(&c.recv_message().unwrap().unwrap()[..], b"hello");
    t.join().unwrap();
    let e = c.recv_message().err().expect("the stream ended inside a message");
    assert_eq!(e.kind(), ErrorKind::UnexpectedEof);
}

#[test]
fn a_tcp_message_is_sent_whole_or_not_at_all() {
    let _w = common::watchdog(60);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let c = Stream::connect(addr).unwrap();
    let (s, _) = l.accept().unwrap();
    // The peer is plain TCP: it reads the frames (spec/WIRE.md section 7) itself, after a while.
    let reader = thread::spawn(move || {
        let mut s = s;
        thread::sleep(Duration::from_millis(300));
        let mut got = Vec::new();
        loop {
            let mut len = [0u8; 4];
            s.read_exact(&mut len).unwrap();
            let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
            s.read_exact(&mut body).unwrap();
            if body == b"end" {
                return got;
            }
            assert_eq!(body.len(), 1000, "message {} whole", got.len());
            assert!(body.iter().all(|&b| b == got.len() as u8), "message {} intact", got.len());
            got.push(body.len());
        }
    });
    // Non-blocking, 3 MB of messages against a reader that starts late: a message the socket
    // took none of is refused (and sent again here), one it took part of is finished once the
    // reader makes room. Either way whole messages only reach the wire.
    c.set_nonblocking(true).unwrap();
    let mut sent = 0u32;
    while sent < 3000 {
        let mut loan = c.loan(1000).unwrap();
        loan.fill(sent as u8);
        match loan.send() {
            Ok(()) => sent += 1,
            Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(1)),
            Err(e) => panic!("send: {e}"),
        }
    }
    c.set_nonblocking(false).unwrap();
    let mut loan = c.loan(3).unwrap();
    loan.copy_from_slice(b"end");
    loan.send().unwrap();
    assert_eq!(reader.join().unwrap().len(), 3000, "every message arrived once, nothing of a refused one");
}

#[test]
fn messages_end_like_the_byte_stream() {
    let _w = common::watchdog(30);
    // Our own read shutdown ends receiving; a send after our write shutdown is refused.
    let (c, s) = pair();
    let loan = c.loan(4).unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    assert_eq!(loan.send().unwrap_err().kind(), ErrorKind::BrokenPipe);
    s.shutdown(Shutdown::Read).unwrap();
    assert!(s.recv_message().unwrap().is_none(), "end of stream after our read shutdown");
    // A loan taken before the peer closed cannot be sent into the void.
    let (c, s) = pair();
    let loan = c.loan(4).unwrap();
    drop(s);
    assert_eq!(loan.send().unwrap_err().kind(), ErrorKind::BrokenPipe);
}

#[test]
fn connect_to_nothing_is_refused() {
    let _w = common::watchdog(30);
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let err = Stream::connect(("127.0.0.1", port)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
    assert!(Stream::connect("not an address").is_err());
}

#[test]
fn addresses() {
    let _w = common::watchdog(30);
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = thread::spawn(move || l.accept().unwrap());
    let c = Stream::connect(addr).unwrap();
    let (s, peer) = t.join().unwrap();
    assert_eq!(c.peer_addr().unwrap(), addr);
    assert_eq!(s.local_addr().unwrap(), addr);
    assert_eq!(peer.ip(), addr.ip());
    assert_eq!(c.peer_pid(), Some(std::process::id()));
}


#[test]
fn shutdown_from_another_thread_unblocks_a_reader() {
    let _w = common::watchdog(30);
    let (c, _s) = pair();
    let c = std::sync::Arc::new(c);
    let c2 = c.clone();
    let reader = thread::spawn(move || {
        let mut b = [0u8; 8];
        (&*c2).read(&mut b)
    });
    thread::sleep(Duration::from_millis(100));
    c.shutdown(Shutdown::Read).unwrap();
    assert_eq!(reader.join().unwrap().unwrap(), 0, "a read-shut stream reads end of stream");
}

#[test]
fn releasing_a_message_while_another_thread_blocks_reading() {
    let _w = common::watchdog(30);
    let (c, s) = pair_with(Options::new().pool(4096, 2));
    let mut l = c.loan(3).unwrap();
    l.copy_from_slice(b"msg");
    l.send().unwrap();
    let s = std::sync::Arc::new(s);
    let m = s.recv_message().unwrap().unwrap();
    let s2 = s.clone();
    let reader = thread::spawn(move || {
        let mut b = [0u8; 4];
        (&*s2).read_exact(&mut b).map(|_| b)
    });
    thread::sleep(Duration::from_millis(100));
    drop(m); // must not wait for the blocked reader
    (&c).write_all(b"done").unwrap();
    assert_eq!(&reader.join().unwrap().unwrap(), b"done");
}

#[test]
fn messages_and_the_byte_stream_never_wait_for_each_other() {
    let _w = common::watchdog(30);
    let (c, s) = pair_with(Options::new().pool(4096, 1));
    let (c, s) = (std::sync::Arc::new(c), std::sync::Arc::new(s));
    // Sending side: the only slot is in flight, so a second loan waits for its release; the
    // server releases it only after the byte stream brought "stream". A loan that held up the
    // stream's writers would deadlock here.
    let mut l = c.loan(5).unwrap();
    l.copy_from_slice(b"first");
    l.send().unwrap();
    let c2 = c.clone();
    let loaner = thread::spawn(move || {
        let mut l = c2.loan(6)?;
        l.copy_from_slice(b"second");
        l.send()
    });
    let s2 = s.clone();
    let server = thread::spawn(move || {
        let first = s2.recv_message()?.expect("a message");
        let mut b = [0u8; 6];
        (&*s2).read_exact(&mut b)?;
        assert_eq!(&b, b"stream");
        drop(first);
        let second = s2.recv_message()?.map(|m| m.to_vec());
        Ok::<_, std::io::Error>(second)
    });
    thread::sleep(Duration::from_millis(100));
    (&*c).write_all(b"stream").unwrap();
    loaner.join().unwrap().unwrap();
    assert_eq!(server.join().unwrap().unwrap().as_deref(), Some(&b"second"[..]));

    // Receiving side: a thread waits for a message that the peer sends only after the byte
    // stream answered. A message wait that held up the stream's readers would deadlock here.
    let s2 = s.clone();
    let waiter = thread::spawn(move || s2.recv_message().map(|m| m.map(|m| m.to_vec())));
    thread::sleep(Duration::from_millis(100));
    (&*c).write_all(b"ping").unwrap();
    let mut b = [0u8; 4];
    (&*s).read_exact(&mut b).unwrap();
    (&*s).write_all(b"pong").unwrap();
    (&*c).read_exact(&mut b).unwrap();
    assert_eq!(&b, b"pong");
    let mut l = c.loan(5).unwrap();
    l.copy_from_slice(b"third");
    l.send().unwrap();
    assert_eq!(waiter.join().unwrap().unwrap().as_deref(), Some(&b"third"[..]));
}
