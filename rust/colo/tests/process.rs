//! Multi-process behaviour and faults: every peer here is a separate process (this test binary
//! re-run with `COLO_CHILD` set), killed, corrupting or misbehaving for real.
mod common;

use colo::{Listener, Options, Stream, Transport};
use colo_sys::{seqpacket, AsFd};
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::process::Child;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

/// Child processes enter here; in a normal run this test does nothing.
#[test]
fn child_entry() {
    let Some((role, arg)) = common::role() else { return };
    // A corrupting child finds its segment through the memfd (the API closes it once mapped).
    colo::internal::segment::keep_memfds(true);
    // Die with the parent test, so a failed test leaves no process behind.
    // SAFETY: prctl with PR_SET_PDEATHSIG takes a signal number and no pointers.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let code = match role.as_str() {
        "writer" => writer(&arg),
        "exit_after" => exit_after(&arg),
        "idle_reader" => idle_reader(&arg),
        "corrupter" => corrupter(&arg),
        "many" => many(&arg),
        "sleeping_server" => sleeping_server(),
        "dropping_server" => dropping_server(&arg),
        "draining_server" => draining_server(),
        "out_of_fds" => out_of_fds(),
        _ => 2,
    };
    std::process::exit(code);
}

fn say(line: &str) {
    println!("{line}");
    std::io::stdout().flush().unwrap();
}

fn writer(addr: &str) -> i32 {
    let s = Stream::connect(addr).unwrap();
    assert_eq!(s.transport(), Transport::SharedMemory);
    let mut at = 0u64;
    let mut buf = vec![0u8; 8192];
    loop {
        for (i, b) in buf.iter_mut().enumerate() {
            *b = common::pattern(at + i as u64);
        }
        (&s).write_all(&buf).unwrap();
        at += buf.len() as u64;
    }
}

fn exit_after(addr: &str) -> i32 {
    let s = Stream::connect(addr).unwrap();
    let buf: Vec<u8> = (0..1_000_000u64).map(common::pattern).collect();
    (&s).write_all(&buf).unwrap();
    0 // exits without shutdown: dropping the stream is a clean close.
}

fn idle_reader(addr: &str) -> i32 {
    let mut s = Stream::connect(addr).unwrap();
    say("CONNECTED");
    let mut b = [0u8; 1];
    s.read_exact(&mut b).unwrap();
    0
}

fn sleeping_server() -> i32 {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    say(&format!("READY {}", l.local_addr().unwrap()));
    let (_s, _) = l.accept().unwrap();
    thread::sleep(Duration::from_secs(60));
    0
}

/// Listens as root, then serves as nobody (a master that runs its workers as another user):
/// accepts one connection (`late`: after its client stopped waiting for the answer), reads a
/// byte, claims a whole ring of bytes toward its client that it never wrote (holes) with FIN,
/// and holds the connection.
fn dropping_server(arg: &str) -> i32 {
    // Late, it takes DIRECT from root as nobody (a taker of its descriptors would answer
    // WELCOME, whatever this opt-in).
    let l = Listener::bind_with("127.0.0.1:0", Options::new().direct_from_any_uid(arg == "late")).unwrap();
    // SAFETY: plain system calls on integers; PDEATHSIG again, as a change of uid clears it.
    unsafe {
        assert!(libc::setgroups(0, std::ptr::null()) == 0 && libc::setgid(65534) == 0 && libc::setuid(65534) == 0);
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
    say(&format!("READY {}", l.local_addr().unwrap()));
    if arg == "late" {
        // Past the client's wait for the answer (the handshake timeout): it goes on pending.
        thread::sleep(Duration::from_secs(1));
    }
    let (s, _) = l.accept().unwrap();
    (&s).read_exact(&mut [0u8; 1]).unwrap();
    let base = map_own_segment();
    // SAFETY: the header's u64 segment_size and u32 ring_capacity, read once.
    let (size, cap) = unsafe { (*(base.add(16) as *const u64) as usize, *(base.add(24) as *const u32)) };
    let s2c = colo_ring::layout::HEADER_SIZE + (size - colo_ring::layout::HEADER_SIZE) / 2;
    // SAFETY: ring_head (u64 at 0) and ring_size (u32 at 12) of the server→client block, aligned
    // words of our own mapping of the segment.
    unsafe {
        std::ptr::write_volatile(base.add(s2c + 12) as *mut u32, cap);
        let head = base.add(s2c) as *mut u64;
        std::ptr::write_volatile(head, std::ptr::read_volatile(head) + u64::from(cap));
    }
    s.shutdown(Shutdown::Write).unwrap(); // FIN, and rings the client
    thread::sleep(Duration::from_secs(60));
    0
}

/// Accepts one connection and reads everything from it.
fn draining_server() -> i32 {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    say(&format!("READY {}", l.local_addr().unwrap()));
    let (mut s, _) = l.accept().unwrap();
    let mut buf = vec![0u8; 65536];
    while s.read(&mut buf).is_ok_and(|n| n > 0) {}
    0
}

/// With no descriptor left, `accept` reports EMFILE (it must not spin or hang), and serves the
/// waiting client once descriptors are back.
fn out_of_fds() -> i32 {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let c = Stream::connect(addr).unwrap();
    (&c).write_all(b"hi").unwrap();
    let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    let mut old = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut old) };
    let low = libc::rlimit { rlim_cur: open.saturating_sub(2), rlim_max: old.rlim_max };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &low) }, 0);
    let e = l.accept().map(|_| ()).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EMFILE), "{e}");
    // SAFETY: as above.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &old) }, 0);
    let (mut s, _) = l.accept().unwrap();
    let mut b = [0u8; 2];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"hi");
    say("OK");
    0
}

/// Maps our only connected colo segment read-write, behind the library's back (segments the
/// library prepared ahead have no header yet).
fn map_own_segment() -> *mut u8 {
    let in_use = |p: &std::path::Path| {
        let mut magic = [0u8; 8];
        std::fs::File::open(p).and_then(|f| std::os::unix::fs::FileExt::read_exact_at(&f, &mut magic, 0)).is_ok()
            && &magic == b"COLOSEG\0"
    };
    let fds: Vec<_> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().contains("colo-seg")))
        .filter(|e| in_use(&e.path()))
        .collect();
    assert_eq!(fds.len(), 1);
    let f = std::fs::OpenOptions::new().read(true).write(true).open(fds[0].path()).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    // SAFETY: a fresh shared mapping of the whole file; we only write plain integers into it.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, std::os::fd::AsRawFd::as_raw_fd(&f), 0) };
    assert_ne!(p, libc::MAP_FAILED);
    p as *mut u8
}

fn corrupter(addr: &str) -> i32 {
    let opts = Options::new().pool(4096, 4);
    let bad = Stream::connect_with(addr, &opts).unwrap();
    let base = map_own_segment();
    // SAFETY: offset HEADER_SIZE is ring_head of the client→server block: an aligned u64 we
    // scribble on.
    unsafe { std::ptr::write_volatile(base.add(colo_ring::layout::HEADER_SIZE) as *mut u64, 0xdead_beef_0000_0000) };
    bad.shutdown(Shutdown::Write).unwrap(); // rings the server's doorbell
    let good = Stream::connect_with(addr, &opts).unwrap();
    (&good).write_all(b"still served").unwrap();
    let mut b = [0u8; 12];
    (&good).read_exact(&mut b).unwrap();
    assert_eq!(&b, b"still served");
    // The corrupted connection was reset by the server.
    let mut x = [0u8; 1];
    let e = (&bad).read(&mut x).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::ConnectionReset) || colo::errno_of(&e) == 71, "{e:?}");
    0
}

fn many(addr: &str) -> i32 {
    const CONNS: usize = 1000;
    const BYTES: usize = 32 * 1024;
    let addr: SocketAddr = addr.parse().unwrap();
    let conns: Vec<Stream> = (0..CONNS)
        .map(|_| {
            let s = Stream::connect(addr).unwrap();
            assert_eq!(s.transport(), Transport::SharedMemory);
            s
        })
        .collect();
    say("CONNECTED");
    let conns = std::sync::Arc::new(conns);
    let workers: Vec<_> = (0..8)
        .map(|w| {
            let conns = conns.clone();
            thread::spawn(move || {
                for id in (w..CONNS).step_by(8) {
                    let s = &conns[id];
                    let data: Vec<u8> = (0..BYTES as u64).map(|i| common::pattern(i + id as u64 * 7919)).collect();
                    (&*s).write_all(&data).unwrap();
                    let mut back = vec![0u8; BYTES];
                    (&*s).read_exact(&mut back).unwrap();
                    assert!(back == data, "connection {id}: echo differs");
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    0
}

/// The first line the child itself printed (the test harness prints its own lines first).
fn wait_line(c: &mut Child) -> String {
    let mut r = BufReader::new(c.stdout.as_mut().unwrap());
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap() == 0 {
            return String::new();
        }
        // The harness's "test child_entry ... " has no newline, so our line may follow it.
        for key in ["READY", "CONNECTED", "OK"] {
            if let Some(at) = line.find(key) {
                return line[at..].trim().to_string();
            }
        }
    }
}

fn listener() -> (Listener, String) {
    let l = Listener::bind_with("127.0.0.1:0", Options::new().pool(4096, 4)).unwrap();
    let a = l.local_addr().unwrap().to_string();
    (l, a)
}

#[test]
fn peer_killed_mid_transfer_drains_then_resets() {
    let _w = common::watchdog(60);
    let (l, addr) = listener();
    let child = common::child("child_entry", "writer", &addr);
    let (s, _) = l.accept().unwrap();
    let mut at = 0u64;
    let mut buf = vec![0u8; 65536];
    while at < 4 << 20 {
        let n = (&s).read(&mut buf).unwrap();
        for (i, b) in buf[..n].iter().enumerate() {
            assert_eq!(*b, common::pattern(at + i as u64));
        }
        at += n as u64;
    }
    kill(child);
    let err = loop {
        match (&s).read(&mut buf) {
            Ok(0) => panic!("a killed peer must not look like a clean close"),
            Ok(n) => {
                for (i, b) in buf[..n].iter().enumerate() {
                    assert_eq!(*b, common::pattern(at + i as u64), "data after the kill stays intact");
                }
                at += n as u64;
            }
            Err(e) => break e,
        }
    };
    assert_eq!(err.kind(), ErrorKind::ConnectionReset);
    assert_eq!((&s).write(b"x").unwrap_err().kind(), ErrorKind::BrokenPipe);
}

#[test]
fn peer_exit_delivers_everything_then_eof() {
    let _w = common::watchdog(60);
    let (l, addr) = listener();
    let mut child = common::child("child_entry", "exit_after", &addr);
    let (mut s, _) = l.accept().unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    assert_eq!(got.len(), 1_000_000);
    assert!(got.iter().enumerate().all(|(i, b)| *b == common::pattern(i as u64)));
    assert!(child.wait().unwrap().success());
}

#[test]
fn accept_reports_emfile_and_serves_the_client_afterwards() {
    let _w = common::watchdog(60);
    let mut child = common::child("child_entry", "out_of_fds", "");
    assert_eq!(wait_line(&mut child), "OK");
    assert!(child.wait().unwrap().success());
}

/// A server child in `role` (`sleeping_server`: accepts one connection, then sleeps;
/// `draining_server`: reads and discards) and its address.
fn start_server(role: &str) -> (Child, String) {
    let mut child = common::child("child_entry", role, "");
    let line = wait_line(&mut child);
    let addr = line.strip_prefix("READY ").unwrap().to_string();
    (child, addr)
}

/// A connection to `addr` that must be over shared memory.
fn dial_shm(addr: &str, opts: &Options) -> Stream {
    let s = Stream::connect_with(addr, opts).unwrap();
    assert_eq!(s.transport(), Transport::SharedMemory);
    s
}

/// Kills a child and reaps it.
fn kill(mut child: Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A server that listened as root and serves as nobody is nobody's (it may take the server's
/// descriptors): root's client must read its ring through the memfd, where a ring of holes
/// allocates nothing, not through its mapping, where reading them allocates them, charged to
/// the client for as long as the server keeps the memfd: but for the ring's first
/// `MAPPED_WINDOW` bytes, read through the mapping (their pages at most, none above). The
/// rendezvous's SO_PEERCRED says root (taken at the listen); the WELCOME's credentials say nobody (spec/WIRE.md section 3,
/// "Who answers"). An answer that comes after the client stopped waiting for it (the connection
/// went on pending) carries no credentials: judged the same.
#[test]
fn a_server_that_dropped_to_another_user_is_read_through_the_memfd() {
    let _w = common::watchdog(60);
    // SAFETY: getuid has no arguments.
    if unsafe { libc::getuid() } != 0 {
        eprintln!("needs root (a server that changes its uid): not run");
        return;
    }
    for when in ["", "late"] {
        let (below, above, pages) = dropped_server_holes_read(when);
        assert_eq!(above, 0, "answer {when:?}: root's client allocated {above} bytes of nobody's holes above the window");
        assert!(below <= pages, "answer {when:?}: root's client allocated {below} bytes of nobody's holes under the window, whose pages are {pages}");
    }
}

/// Bytes of a `dropping_server`'s (`when`) ring of holes that its client's reads allocated: in
/// the whole pages under the data's first `MAPPED_WINDOW` bytes (from the first page boundary
/// of the data: its first page holds the ring's words too), in the pages above them, and the
/// size of the former.
fn dropped_server_holes_read(when: &str) -> (i64, i64, i64) {
    let mut child = common::child("child_entry", "dropping_server", when);
    let addr = wait_line(&mut child).strip_prefix("READY ").unwrap().to_string();
    let opts = Options::new().ring_capacity(1 << 20);
    let layout = opts.geometry().layout().unwrap();
    let s = dial_shm(&addr, &opts);
    (&s).write_all(b"x").unwrap();
    let mut got = 0;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = (&s).read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        got += n;
    }
    assert_eq!(got, 1 << 20, "the client read the claimed ring");
    // What the client's reads allocated of the server→client ring, seen through the server's
    // descriptor of the segment (root may open it).
    let dir = format!("/proc/{}/fd", child.id());
    let seg = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .find(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().contains("colo-seg")))
        .expect("the server holds the segment's memfd");
    let f = std::fs::File::open(seg.path()).unwrap();
    assert_eq!(f.metadata().unwrap().len(), layout.segment_size as u64, "the segment of the client's geometry");
    let data = layout.block_offset(false) + layout.data_off;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    let first = data.next_multiple_of(4096) as i64;
    let cut = (data + colo::internal::segment::MAPPED_WINDOW).next_multiple_of(4096) as i64;
    let (mut at, mut below, mut above) = (first, 0, 0);
    // SAFETY: lseek on a file we opened.
    while let Ok(data) = usize::try_from(unsafe { libc::lseek(fd, at, libc::SEEK_DATA) }) {
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data as i64, libc::SEEK_HOLE) };
        let data = data as i64;
        below += hole.min(cut) - data.min(cut);
        above += hole.max(cut) - data.max(cut);
        at = hole;
    }
    kill(child);
    (below, above, cut - first)
}

#[test]
fn server_killed_client_sees_reset() {
    let _w = common::watchdog(60);
    let (child, addr) = start_server("sleeping_server");
    let s = dial_shm(&addr, &Options::new());
    (&s).write_all(b"before").unwrap();
    kill(child);
    let mut b = [0u8; 4];
    assert_eq!((&s).read(&mut b).unwrap_err().kind(), ErrorKind::ConnectionReset);
}

/// A reader and a writer asleep on their futex (no spin, no timeout: the hang-up watcher wakes
/// them) when the peer is killed: the reader sees the reset, the writer a broken pipe.
#[test]
fn futex_sleepers_see_a_killed_peer() {
    let _w = common::watchdog(60);
    let (child, addr) = start_server("sleeping_server");
    let s = std::sync::Arc::new(dial_shm(&addr, &Options::new().spin(colo::SpinMode::Never).ring_capacity(4096)));
    let reader = {
        let s = s.clone();
        thread::spawn(move || (&*s).read(&mut [0u8; 4]).unwrap_err().kind())
    };
    // Fill the ring, so the writer sleeps too (the server never reads).
    let writer = {
        let s = s.clone();
        thread::spawn(move || loop {
            if let Err(e) = (&*s).write(&[7u8; 1024]) {
                break e.kind();
            }
        })
    };
    thread::sleep(Duration::from_millis(200));
    kill(child);
    assert_eq!(reader.join().unwrap(), ErrorKind::ConnectionReset);
    assert_eq!(writer.join().unwrap(), ErrorKind::BrokenPipe);
}

/// A process that only writes, a little at a time, to a peer that is killed: the ring never
/// fills, so no write waits, and none looked at the control socket (it wrote on for as long as
/// it ran). Over TCP the second write after the peer's death fails; here the writes must fail
/// soon too.
#[test]
fn a_writer_whose_ring_never_fills_sees_a_killed_peer() {
    let _w = common::watchdog(60);
    let (child, addr) = start_server("sleeping_server");
    let s = dial_shm(&addr, &Options::new());
    (&s).write_all(b"alive").unwrap();
    kill(child);
    let mut writes = 0;
    let err = loop {
        match (&s).write(b"x") {
            Ok(_) => writes += 1,
            Err(e) => break e,
        }
        // 30 s of writes, 60 KB: far from filling the ring.
        assert!(writes < 15_000, "the writer never noticed that its peer was killed");
        thread::sleep(Duration::from_millis(2));
    };
    assert_eq!(err.kind(), ErrorKind::BrokenPipe);
}

/// A reader thread asleep on its futex and a writer thread writing to a peer that drains, when
/// the peer is killed: the writer may take the hang-up watcher's mark first (see
/// `Shm::notice_hangup`), and the reader must still be woken: the writer that takes the mark
/// wakes it, or it would sleep for good.
#[test]
fn a_writer_taking_the_hang_up_leaves_none_of_its_readers_asleep() {
    let _w = common::watchdog(120);
    for _ in 0..20 {
        let (child, addr) = start_server("draining_server");
        let s = std::sync::Arc::new(dial_shm(&addr, &Options::new().spin(colo::SpinMode::Never)));
        let reader = {
            let s = s.clone();
            thread::spawn(move || (&*s).read(&mut [0u8; 64]).map_err(|e| e.kind()))
        };
        thread::sleep(Duration::from_millis(20));
        let writer = {
            let s = s.clone();
            thread::spawn(move || loop {
                if let Err(e) = (&*s).write(b"abcdefgh") {
                    break e.kind();
                }
            })
        };
        thread::sleep(Duration::from_millis(5));
        kill(child);
        assert_eq!(reader.join().unwrap(), Err(ErrorKind::ConnectionReset));
        assert_eq!(writer.join().unwrap(), ErrorKind::BrokenPipe);
    }
}

#[test]
fn corrupted_segment_resets_only_that_connection() {
    let _w = common::watchdog(60);
    let (l, addr) = listener();
    let mut child = common::child("child_entry", "corrupter", &addr);
    let (tx, rx) = mpsc::channel();
    let server = thread::spawn(move || {
        for _ in 0..2 {
            let (s, _) = l.accept().unwrap();
            let tx = tx.clone();
            thread::spawn(move || {
                let mut buf = [0u8; 64];
                let r = loop {
                    match (&s).read(&mut buf) {
                        Ok(0) => break Ok(()),
                        Ok(n) => (&s).write_all(&buf[..n]).unwrap(),
                        Err(e) => break Err(e),
                    }
                };
                tx.send(r.map_err(|e| colo::errno_of(&e))).unwrap();
            });
        }
    });
    assert!(child.wait().unwrap().success(), "the healthy connection was served");
    let results: Vec<_> = (0..2).map(|_| rx.recv_timeout(Duration::from_secs(20)).unwrap()).collect();
    assert!(results.contains(&Err(71)), "the corrupted connection failed with EPROTO: {results:?}");
    assert!(results.contains(&Ok(())), "the healthy one ended cleanly: {results:?}");
    server.join().unwrap();
}

fn raw_client(addr: &str) -> colo_sys::OwnedFd {
    seqpacket::connect(colo::wire::rendezvous_name(addr.parse().unwrap()).as_bytes()).unwrap()
}

fn answer(fd: &colo_sys::OwnedFd) -> Option<colo::wire::Message> {
    seqpacket::set_recv_timeout(fd, Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 64];
    let r = seqpacket::recv(fd, &mut buf, false).ok()?;
    colo::wire::Message::decode(&buf[..r.len]).ok()
}

#[test]
fn garbage_on_the_rendezvous_is_refused_and_the_listener_keeps_serving() {
    use colo::wire::{Message, Mode, Reason};
    let _w = common::watchdog(60);
    let (l, addr) = listener();
    // Garbage never yields a connection; the one good client below does.
    let server = common::echo_two_bytes(l);
    let hello = |v: u8| Message::Hello { version: v, mode: Mode::Direct }.encode();
    let reject = |r: Reason| Some(Message::Reject { version: 1, reason: r });
    // Bytes that are not a message.
    let c = raw_client(&addr);
    seqpacket::send(&c, b"GET / HTTP/1.1\r\n", &[]).unwrap();
    assert_eq!(answer(&c), reject(Reason::BadMessage));
    // A HELLO without descriptors.
    let c = raw_client(&addr);
    seqpacket::send(&c, &hello(1), &[]).unwrap();
    assert_eq!(answer(&c), reject(Reason::BadMessage));
    // A future version.
    let c = raw_client(&addr);
    seqpacket::send(&c, &hello(9), &[]).unwrap();
    assert_eq!(answer(&c), reject(Reason::BadVersion));
    // A descriptor that is not a segment.
    let (p1, _p2) = rustix_pipe();
    let c = raw_client(&addr);
    seqpacket::send(&c, &hello(1), &[p1.as_fd()]).unwrap();
    assert_eq!(answer(&c), reject(Reason::BadSegment));
    // Not exactly one descriptor: the old HELLO (a segment and a doorbell pair's end in two
    // slots) and two segments.
    let memfd = unsealed_memfd();
    let (_ours, b1) = std::os::unix::net::UnixStream::pair().unwrap();
    for extra in [[b1.as_fd(), b1.as_fd()], [memfd.as_fd(), memfd.as_fd()]] {
        let c = raw_client(&addr);
        seqpacket::send(&c, &hello(1), &[memfd.as_fd(), extra[0], extra[1]]).unwrap();
        assert_eq!(answer(&c), reject(Reason::BadMessage));
    }
    let c = raw_client(&addr);
    seqpacket::send(&c, &hello(1), &[memfd.as_fd(), memfd.as_fd()]).unwrap();
    assert_eq!(answer(&c), reject(Reason::BadMessage));
    // A real memfd that is not sealed.
    let c = raw_client(&addr);
    seqpacket::send(&c, &hello(1), &[memfd.as_fd()]).unwrap();
    assert_eq!(answer(&c), reject(Reason::BadSegment));
    // A recycling HELLO naming a segment this listener never parked, and one with descriptors.
    let c = raw_client(&addr);
    seqpacket::send(&c, &Message::Recycle { version: 1, ticket: 77 }.encode(), &[]).unwrap();
    assert_eq!(answer(&c), reject(Reason::BadSegment));
    let c = raw_client(&addr);
    seqpacket::send(&c, &Message::Recycle { version: 1, ticket: 1 }.encode(), &[b1.as_fd()]).unwrap();
    assert_eq!(answer(&c), reject(Reason::BadMessage));
    // A client that says nothing and one that hangs up at once.
    let silent = raw_client(&addr);
    drop(raw_client(&addr));
    // A good client is still served.
    let mut s = Stream::connect(addr.as_str()).unwrap();
    assert_eq!(s.transport(), Transport::SharedMemory);
    s.write_all(b"ok").unwrap();
    let mut b = [0u8; 2];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"ok");
    server.join().unwrap();
    drop(silent);
}

fn rustix_pipe() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe writes two descriptors into the array, which we then own.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both are fresh descriptors owned by nobody else.
    unsafe { (std::os::fd::FromRawFd::from_raw_fd(fds[0]), std::os::fd::FromRawFd::from_raw_fd(fds[1])) }
}

fn unsealed_memfd() -> std::os::fd::OwnedFd {
    // SAFETY: a valid NUL-terminated name; the result is a fresh descriptor.
    let fd = unsafe { libc::memfd_create(c"colo-seg".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: fresh descriptor, owned by the returned value.
    let fd: std::os::fd::OwnedFd = unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) };
    let mut header = vec![0u8; 4096];
    let geometry = colo_ring::layout::Geometry { ring_capacity: 4096, slot_size: 0, slot_count: 0 };
    let h = colo::wire::Header { geometry, claim: 0, client_pid: 1, server_pid: 0, client_addr: None, server_addr: None };
    let layout = h.encode(&mut header).unwrap();
    let f = std::fs::File::from(fd);
    f.set_len(layout.segment_size as u64).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &header, 0).unwrap();
    f.into()
}

#[test]
fn a_thousand_concurrent_connections_move_checksummed_data() {
    let _w = common::watchdog(240);
    colo_sys::preload::raise_fd_limit();
    let l = Listener::bind_with("127.0.0.1:0", Options::new().ring_capacity(16 * 1024).pool(0, 0)).unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let mut child = common::child("child_entry", "many", &addr);
    let mut handlers = Vec::new();
    for _ in 0..1000 {
        let (s, _) = l.accept().unwrap();
        assert_eq!(s.transport(), Transport::SharedMemory);
        handlers.push(thread::Builder::new().stack_size(64 * 1024).spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                let n = (&s).read(&mut buf).unwrap();
                if n == 0 {
                    return;
                }
                (&s).write_all(&buf[..n]).unwrap();
            }
        }).unwrap());
    }
    assert_eq!(wait_line(&mut child), "CONNECTED");
    assert!(child.wait().unwrap().success(), "every connection echoed intact");
    for h in handlers {
        h.join().unwrap();
    }
}

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

#[test]
fn an_idle_connection_costs_no_cpu() {
    let _w = common::watchdog(60);
    let (l, addr) = listener();
    let mut child = common::child("child_entry", "idle_reader", &addr);
    let (mut s, _) = l.accept().unwrap();
    assert_eq!(wait_line(&mut child), "CONNECTED");
    thread::sleep(Duration::from_millis(300));
    let before = cpu_ticks(child.id());
    thread::sleep(Duration::from_secs(3));
    let used = cpu_ticks(child.id()) - before;
    s.write_all(b"!").unwrap();
    assert!(child.wait().unwrap().success());
    assert!(used <= 1, "a reader blocked for 3 s used {used} clock ticks of CPU");
}

#[test]
fn fork_while_other_threads_dial_leaves_no_lock_held_in_the_child() {
    let _w = common::watchdog(120);
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        for s in l.incoming() {
            let mut s = s.unwrap();
            let mut b = [0u8; 1];
            let _ = s.read_exact(&mut b);
        }
    });
    // Other threads dial and close all the time: the connection caches, the segment preparer and
    // the reaper take their locks constantly.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let busy: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let mut s = Stream::connect(addr).unwrap();
                    s.write_all(b"p").unwrap();
                }
            })
        })
        .collect();
    for _ in 0..40 {
        // SAFETY: the child only dials, writes and leaves with _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let ok = Stream::connect(addr).and_then(|mut s| s.write_all(b"c")).is_ok();
            // SAFETY: ends the child without running the parent's destructors.
            unsafe { libc::_exit(if ok { 0 } else { 3 }) };
        }
        assert!(pid > 0);
        let start = std::time::Instant::now();
        let mut status = 0;
        loop {
            // SAFETY: waiting for our own child.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                break;
            }
            if start.elapsed() > Duration::from_secs(10) {
                // SAFETY: killing our own child.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                panic!("a forked child hung (a lock held at fork time)");
            }
            thread::sleep(Duration::from_millis(2));
        }
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for b in busy {
        b.join().unwrap();
    }
}
