//! Claims of docs/SAFETY.md and spec/WIRE.md, each checked here by what it promises. Each test
//! here fails if the code behind its claim is removed:
//!
//! - a memfd whose size differs from its header's `segment_size` is refused (REJECT(BAD_SEGMENT));
//! - the control socket carries only rings after the handshake: another datagram or a descriptor on it resets the
//!   connection (ECONNRESET, RESET set in the segment); a zero-length datagram is a hang-up;
//! - a rendezvous client that sends no HELLO is dropped after `HELLO_TIMEOUT`, and at most
//!   `MAX_PENDING_PER_UID` such clients of one uid are kept;
//! - exactly one of CLAIMED and ABANDONED wins a CARRIER race; the bytes the client wrote first
//!   are delivered once, by the winner's path;
//! - a RECYCLE HELLO from another process than the parked connection's client is refused;
//! - an out-of-range message entry (`slot`, `len`) and the release of a slot that is not in
//!   flight are corruption (EPROTO).
//!
//! Raw clients here build HELLOs by hand: a HELLO carries the segment memfd alone.
mod common;

use colo_ring::layout::{Geometry, Layout};
use colo::wire::{self, claim, Header, Message, Mode, Reason, HEADER_FIELDS};
use colo::{Listener, Options, SpinMode, Stream, Transport};
use colo_ring::layout::{block, CLIENT_PARKED, FLAG_FIN, FLAG_RESET, PARKED, SERVER_PARKED, TICKET};
use colo_sys::segment::Mapping;
use colo_sys::{seqpacket, AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

/// The listener's limits on rendezvous clients that send no HELLO (`HELLO_TIMEOUT` and
/// `MAX_HALF_OPEN_PER_UID` in rust/colo/src/halfopen.rs, spec/WIRE.md section 3 "Bounds"):
/// change them together. All the clients here are of one uid, so the per-uid bound is the one met.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_PENDING_PER_UID: usize = 256;

const EPROTO: i32 = 71;

/// Child processes enter here; in a normal run this test does nothing.
#[test]
fn child_entry() {
    let Some((role, arg)) = common::role() else { return };
    colo::internal::segment::keep_memfds(true);
    // SAFETY: prctl with PR_SET_PDEATHSIG takes a signal number and no pointers.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let code = match role.as_str() {
        "recycle_hello" => {
            let (addr, ticket) = arg.split_once(' ').unwrap();
            let c = raw_connect(addr.parse().unwrap());
            seqpacket::send(&c, &Message::Recycle { version: wire::VERSION, ticket: ticket.parse().unwrap() }.encode(), &[])
                .unwrap();
            println!("ANSWER {:?}", answer(&c));
            0
        }
        _ => 2,
    };
    std::process::exit(code);
}

// ---- raw clients -------------------------------------------------------------------------------

fn raw_connect(addr: SocketAddr) -> OwnedFd {
    seqpacket::connect(wire::rendezvous_name(addr).as_bytes()).unwrap()
}

fn answer(fd: &OwnedFd) -> Option<Message> {
    seqpacket::set_recv_timeout(fd, Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 64];
    let r = seqpacket::recv(fd, &mut buf, false).ok()?;
    Message::decode(&buf[..r.len]).ok()
}

/// A client's side of a DIRECT connection made by hand.
struct RawClient {
    control: OwnedFd,
    map: Mapping,
    layout: Layout,
    _memfd: OwnedFd,
}

impl RawClient {
    /// Sends HELLO(DIRECT) to the listener on `addr` with a sealed segment of `file_size`
    /// bytes whose header describes `geometry`; returns the client and the answer.
    fn hello(addr: SocketAddr, geometry: Geometry, file_size: usize) -> (RawClient, Option<Message>) {
        let (memfd, map) = colo_sys::segment::create(file_size).unwrap();
        let header = Header {
            geometry,
            claim: claim::DIRECT,
            client_pid: std::process::id(),
            server_pid: 0,
            client_addr: Some(SocketAddr::new(addr.ip(), 0)),
            server_addr: Some(addr),
        };
        // SAFETY: our own fresh mapping of at least a header; nobody else has it yet.
        let head = unsafe { std::slice::from_raw_parts_mut(map.as_ptr(), HEADER_FIELDS) };
        let layout = header.encode(head).unwrap();
        if file_size >= layout.segment_size {
            colo::internal::segment::Segment::start_rings(&map, &layout);
        }
        let control = raw_connect(addr);
        let hello = Message::Hello { version: wire::VERSION, mode: Mode::Direct }.encode();
        seqpacket::send(&control, &hello, &[memfd.as_fd()]).unwrap();
        let a = answer(&control);
        (RawClient { control, map, layout, _memfd: memfd }, a)
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        assert!(off + 8 <= self.layout.segment_size && off.is_multiple_of(8));
        // SAFETY: an aligned u64 inside our live mapping (asserted above).
        unsafe { &*(self.map.as_ptr().add(off) as *const AtomicU64) }
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        assert!(off + 4 <= self.layout.segment_size && off.is_multiple_of(4));
        // SAFETY: as in `u64_at`.
        unsafe { &*(self.map.as_ptr().add(off) as *const AtomicU32) }
    }

    /// Writes `bytes` into the client→server ring as a producer (a fresh ring, once).
    fn produce(&self, bytes: &[u8]) {
        let b = self.layout.block_offset(true);
        // SAFETY: the first `bytes.len()` bytes of the ring data, inside our mapping.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.map.as_ptr().add(b + self.layout.data_off), bytes.len()) };
        self.u64_at(b + block::RING_HEAD).store(bytes.len() as u64, Ordering::Release);
    }

    /// The server's `ring_flags` (server→client direction).
    fn server_flags(&self) -> u32 {
        self.u32_at(self.layout.block_offset(false) + block::RING_FLAGS).load(Ordering::Acquire)
    }
}

const SMALL: Geometry = Geometry { ring_capacity: 4096, slot_size: 0, slot_count: 0 };

fn listener() -> (Listener, SocketAddr) {
    // The tests find their segments through the memfds (the API closes them once mapped).
    colo::internal::segment::keep_memfds(true);
    let l = Listener::bind("127.0.0.1:0").unwrap();
    assert!(l.is_colo());
    let a = l.local_addr().unwrap();
    (l, a)
}

// ---- a memfd whose size differs from its header ---------------------------------------------

#[test]
fn a_segment_whose_size_differs_from_its_header_is_refused() {
    let _w = common::watchdog(60);
    let (l, addr) = listener();
    let server = thread::spawn(move || l.accept().map(|_| ()));
    let size = SMALL.layout().unwrap().segment_size;
    for (what, file) in [("one page larger", size + 4096), ("one page smaller", size - 4096), ("header only", colo_ring::layout::HEADER_SIZE)] {
        let (_c, a) = RawClient::hello(addr, SMALL, file);
        assert_eq!(
            a,
            Some(Message::Reject { version: wire::VERSION, reason: Reason::BadSegment }),
            "a memfd {what} than its header says"
        );
    }
    // The same segment at its header's size is accepted: the size alone was refused.
    let (_c, a) = RawClient::hello(addr, SMALL, size);
    assert_eq!(a, Some(Message::Welcome { version: wire::VERSION }));
    server.join().unwrap().unwrap();
}

// ---- the control socket carries only rings ----------------------------------------------------

/// A DIRECT connection from a raw client, and the server's stream.
fn raw_connection() -> (RawClient, Stream) {
    let (l, addr) = listener();
    let server = thread::spawn(move || l.accept().unwrap().0);
    let (c, a) = RawClient::hello(addr, SMALL, SMALL.layout().unwrap().segment_size);
    assert_eq!(a, Some(Message::Welcome { version: wire::VERSION }));
    let s = server.join().unwrap();
    assert_eq!(s.transport(), Transport::SharedMemory);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    (c, s)
}

#[test]
fn a_ring_on_the_control_socket_is_only_a_ring() {
    let _w = common::watchdog(60);
    let (c, mut s) = raw_connection();
    for _ in 0..100 {
        seqpacket::send(&c.control, b"x", &[]).unwrap();
    }
    s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let e = s.read(&mut [0u8; 8]).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut), "{e}");
    assert_eq!(c.server_flags() & FLAG_RESET, 0, "a ring reset the connection");
    s.write_all(b"y").unwrap();
}

#[test]
fn a_datagram_other_than_a_ring_on_the_control_socket_resets_the_connection() {
    let _w = common::watchdog(60);
    let (c, mut s) = raw_connection();
    seqpacket::send(&c.control, b"xy", &[]).unwrap();
    let e = s.read(&mut [0u8; 8]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
    assert_ne!(c.server_flags() & FLAG_RESET, 0, "the server sent a reset through the segment");
    let e = s.write(b"y").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
}

#[test]
fn a_descriptor_on_the_control_socket_resets_the_connection() {
    let _w = common::watchdog(60);
    let (c, mut s) = raw_connection();
    // A descriptor with no bytes: not to be taken for a hang-up.
    let extra = colo_sys::doorbell::create().unwrap();
    match seqpacket::send(&c.control, &[], &[extra.as_fd()]) {
        // Where the kernel has SO_PASSRIGHTS the server's control socket refuses descriptors
        // once the HELLO is read (colo_sys::gift): none can arrive at all.
        Err(e) if e.kind() == ErrorKind::PermissionDenied => return,
        r => r.unwrap(),
    }
    let e = s.read(&mut [0u8; 8]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
    assert_ne!(c.server_flags() & FLAG_RESET, 0, "the server sent a reset through the segment");
    let e = s.write(b"y").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
}

#[test]
fn a_zero_length_datagram_on_the_control_socket_is_a_hang_up() {
    let _w = common::watchdog(60);
    // Without FIN: the bytes already in the ring, then ECONNRESET (the peer died); writes EPIPE;
    // no reset is sent (a reset would drop the bytes).
    let (c, mut s) = raw_connection();
    c.produce(b"abc");
    seqpacket::send(&c.control, &[], &[]).unwrap();
    let mut b = [0u8; 8];
    let mut got = Vec::new();
    let e = loop {
        match s.read(&mut b) {
            Ok(0) => panic!("EOF without FIN"),
            Ok(n) => got.extend_from_slice(&b[..n]),
            Err(e) => break e,
        }
    };
    assert_eq!(got, b"abc", "the bytes before the hang-up are delivered");
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
    assert_eq!(s.write(b"y").unwrap_err().kind(), ErrorKind::BrokenPipe);
    assert_eq!(c.server_flags() & FLAG_RESET, 0, "a hang-up is not answered with a reset");
    // With FIN (a clean close): the bytes, then end of stream.
    let (c, mut s) = raw_connection();
    c.produce(b"abc");
    c.u32_at(c.layout.block_offset(true) + block::RING_FLAGS).fetch_or(FLAG_FIN, Ordering::Release);
    seqpacket::send(&c.control, &[], &[]).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"abc");
    assert_eq!(c.server_flags() & FLAG_RESET, 0, "a hang-up is not answered with a reset");
}

// ---- silent rendezvous clients ----------------------------------------------------------------

/// Whether the server has closed (or answered) the raw rendezvous connection `fd`.
fn dropped(fd: &OwnedFd) -> bool {
    let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN | libc::POLLRDHUP, revents: 0 };
    // SAFETY: one valid pollfd, no waiting.
    assert!(unsafe { libc::poll(&mut p, 1, 0) } >= 0);
    p.revents != 0
}

#[test]
fn silent_rendezvous_clients_are_dropped_on_time_and_bounded() {
    let _w = common::watchdog(120);
    const EXTRA: usize = 16;
    // Room for both ends of every silent client in this one process.
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit write and read the struct we pass.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max.min(65536);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    assert!(lim.rlim_cur as usize > 2 * (MAX_PENDING_PER_UID + EXTRA) + 200, "RLIMIT_NOFILE too low: {}", lim.rlim_max);
    let (l, addr) = listener();
    let server = common::echo_two_bytes(l);
    let start = Instant::now();
    let clients: Vec<OwnedFd> = (0..MAX_PENDING_PER_UID + EXTRA).map(|_| raw_connect(addr)).collect();
    // The listener takes them in; beyond MAX_PENDING_PER_UID it refuses each newcomer.
    let count = || clients.iter().filter(|c| dropped(c)).count();
    let settle = Instant::now() + Duration::from_secs(3);
    while count() < EXTRA && Instant::now() < settle {
        thread::sleep(Duration::from_millis(20));
    }
    thread::sleep(Duration::from_millis(200));
    let early = count();
    assert!(start.elapsed() < HELLO_TIMEOUT - Duration::from_secs(1), "too slow to tell the bound from the timeout");
    assert_eq!(early, EXTRA, "at most {MAX_PENDING_PER_UID} silent clients of one uid are kept");
    // The rest are kept until their time is up, not earlier...
    thread::sleep((start + HELLO_TIMEOUT - Duration::from_millis(700)).saturating_duration_since(Instant::now()));
    assert_eq!(count(), EXTRA, "a silent client was dropped before {HELLO_TIMEOUT:?}");
    // ...and then dropped, with no other connection arriving to prompt it.
    let deadline = start + HELLO_TIMEOUT + Duration::from_secs(5);
    while count() < clients.len() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(count(), clients.len(), "every silent client is dropped after {HELLO_TIMEOUT:?}");
    // The listener still serves.
    let mut s = Stream::connect(addr).unwrap();
    assert_eq!(s.transport(), Transport::SharedMemory);
    s.write_all(b"ok").unwrap();
    let mut b = [0u8; 2];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"ok");
    server.join().unwrap();
}

// ---- the CARRIER race -------------------------------------------------------------------------

fn seqpacket_pair() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: socketpair writes two descriptors into the array, which we then own.
    assert_eq!(unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) }, 0);
    // SAFETY: both are fresh descriptors owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

fn spin_for(micros: u64) {
    let until = Instant::now() + Duration::from_micros(micros);
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

#[test]
fn exactly_one_of_claim_and_abandon_wins_and_no_byte_is_lost_or_doubled() {
    use colo::internal::carrier::{self, Abandon, Answer, HelloRead};
    let _w = common::watchdog(240);
    const ROUNDS: u64 = 600;
    let client: SocketAddr = "127.0.0.1:40000".parse().unwrap();
    let server: SocketAddr = "127.0.0.1:7000".parse().unwrap();
    let layout = SMALL.layout().unwrap();
    let (mut claimed, mut abandoned) = (0, 0);
    for round in 0..ROUNDS {
        let (client_end, server_end) = seqpacket_pair();
        let offer = carrier::offer(client_end, std::process::id(), client, server, SMALL).unwrap();
        let HelloRead::Hello(hello) = carrier::read_hello(server_end) else { panic!("the offer was not read") };
        // The client wrote before the race was decided (a pending connection): these bytes
        // must come out exactly once, through the segment or through TCP.
        let payload: Vec<u8> = (0..100u64).map(|i| common::pattern(i + round)).collect();
        // SAFETY: a shared mapping of the offered memfd, its whole size, unmapped below.
        let base = unsafe {
            libc::mmap(std::ptr::null_mut(), layout.segment_size, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, hello.memfd().as_raw_fd(), 0)
        };
        assert_ne!(base, libc::MAP_FAILED);
        let b = layout.block_offset(true);
        // SAFETY: ring data and ring_head of the client→server block, inside the mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(payload.as_ptr(), (base as *mut u8).add(b + layout.data_off), payload.len());
            (*((base as *mut u8).add(b + block::RING_HEAD) as *const AtomicU64)).store(payload.len() as u64, Ordering::Release);
        }
        // Both sides start together; one of them later by a varying number of microseconds (the
        // client by up to more than a claim takes, so that both orders happen).
        let go = Arc::new(Barrier::new(2));
        let (server_delay, client_delay) = if round % 2 == 0 { ((round * 7919) % 80, 0) } else { (0, (round * 7919) % 400) };
        let g = go.clone();
        let server_side = thread::spawn(move || {
            g.wait();
            spin_for(server_delay);
            hello.claim()
        });
        go.wait();
        spin_for(client_delay);
        let won = offer.abandon();
        let claim = server_side.join().unwrap();
        // SAFETY: `base` is the mapping made above, no longer used.
        let claim_word = unsafe { (*((base as *mut u8).add(36) as *const AtomicU32)).load(Ordering::Acquire) };
        // SAFETY: as above.
        unsafe { libc::munmap(base, layout.segment_size) };
        match (won, claim) {
            (Abandon::Claimed, Ok(est)) => {
                claimed += 1;
                assert_eq!(claim_word, claim::CLAIMED);
                assert_eq!(offer.wait_answer(Duration::from_secs(5)), Answer::Welcome);
                // The server reads the bytes from the segment; the client sends nothing on TCP.
                let shm = est.into_shm(SpinMode::Never).unwrap();
                let mut got = vec![0u8; payload.len()];
                let mut n = 0;
                while n < got.len() {
                    n += shm.read(&mut got[n..]).unwrap();
                }
                assert_eq!(got, payload);
                assert_eq!(shm.readable().unwrap(), 0, "no byte doubled");
            }
            (Abandon::Abandoned, Err(_)) => {
                abandoned += 1;
                assert_eq!(claim_word, claim::ABANDONED);
                assert_eq!(offer.wait_answer(Duration::from_secs(5)), Answer::Reject(Reason::NotClaimed));
                // The client moves the bytes to its TCP connection, once.
                let (tx, mut rx) = std::os::unix::net::UnixStream::pair().unwrap();
                assert_eq!(offer.flush_into(tx.as_fd()).unwrap(), payload.len());
                drop(tx);
                let mut got = Vec::new();
                rx.read_to_end(&mut got).unwrap();
                assert_eq!(got, payload);
            }
            (won, claim) => panic!("round {round}: the client says {won:?}, the server's claim {claim:?}"),
        }
    }
    eprintln!("CARRIER race: {claimed} claimed, {abandoned} abandoned of {ROUNDS}");
    assert!(claimed > 0 && abandoned > 0, "the race was not run both ways: {claimed} claimed, {abandoned} abandoned");
}

// ---- RECYCLE from another process -------------------------------------------------------------

/// The segments open in this process whose header names `port` as the server's: by inode, a
/// descriptor path to each.
/// The inode of the file at `path` (a `/proc/self/fd` entry; 0 once it is closed).
fn inode(path: &std::path::Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| std::os::unix::fs::MetadataExt::ino(&m))
}

fn segments_for(port: u16) -> Vec<std::path::PathBuf> {
    let mut seen = std::collections::HashSet::new();
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        if !std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().contains("colo-seg")) {
            continue;
        }
        let Ok(f) = std::fs::File::open(e.path()) else { continue };
        let mut head = [0u8; HEADER_FIELDS];
        if f.read_exact_at(&mut head, 0).is_err() {
            continue;
        }
        let Ok((h, _)) = Header::decode(&head) else { continue };
        let ino = std::os::unix::fs::MetadataExt::ino(&f.metadata().unwrap());
        if h.server_addr.map(|a| a.port()) == Some(port) && seen.insert(ino) {
            v.push(e.path());
        }
    }
    v
}

/// A connection of this process, closed and parked by both sides, taken back as this process's
/// client would take it (the CAS of `parked` from both bits to 0): its listener's address, the
/// listener's thread (it accepts one connection more) and the server's ticket. None when the
/// segment was not parked by both sides in time; the listener is then let go.
fn parked_and_taken_back() -> Option<(SocketAddr, thread::JoinHandle<()>, u32)> {
    let (l, addr) = listener();
    // A segment of an earlier test's listener on the same port (ports come round) may still be
    // let go of: only the one this dial makes counts.
    let before: Vec<u64> = segments_for(addr.port()).iter().map(|p| inode(p)).collect();
    let server = thread::spawn(move || {
        // The honest connection, then the raw RECYCLE of this process (or a plain connection
        // that lets the thread go).
        for _ in 0..2 {
            let (mut s, _) = l.accept().unwrap();
            let mut b = Vec::new();
            let _ = s.read_to_end(&mut b);
        }
    });
    // Parked only if the listener's WELCOME came within the dial's wait (an answer that comes
    // later leaves the connection to be read through its memfd, never recycled): a wait no
    // loaded host outlasts.
    let patient = Options::new().connect_timeout(Duration::from_secs(10));
    let mut c = Stream::connect_with(addr, &patient).unwrap();
    assert_eq!(c.transport(), Transport::SharedMemory);
    c.write_all(b"x").unwrap();
    drop(c);
    // Both sides park the segment once they see the close; the server writes its ticket into
    // the header.
    let path = (0..400)
        .find_map(|_| {
            let p = segments_for(addr.port()).into_iter().find(|p| !before.contains(&inode(p)));
            if p.is_none() {
                thread::sleep(Duration::from_millis(5));
            }
            p
        })
        .expect("the segment is still open");
    let f = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    // SAFETY: a shared mapping of the segment's header page, never unmapped (the test's life).
    let head = unsafe { libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, f.as_raw_fd(), 0) };
    assert_ne!(head, libc::MAP_FAILED);
    let (parked, ticket) = (u32_at(head as *mut u8, PARKED), u32_at(head as *mut u8, TICKET));
    let both = CLIENT_PARKED | SERVER_PARKED;
    let until = Instant::now() + Duration::from_secs(3);
    while parked.compare_exchange(both, 0, Ordering::AcqRel, Ordering::Acquire).is_err() {
        if Instant::now() > until {
            eprintln!("the segment was not parked by both sides (parked = {}): once more", parked.load(Ordering::Relaxed));
            drop(std::net::TcpStream::connect(addr));
            server.join().unwrap();
            return None;
        }
        thread::sleep(Duration::from_millis(1));
    }
    Some((addr, server, ticket.load(Ordering::Acquire)))
}

#[test]
fn a_recycle_hello_from_another_process_is_refused() {
    let _w = common::watchdog(60);
    // Whether both sides park is up to timing (a recycling pool other tests of this process
    // share): the refusal is what is tested, on the first segment both parked.
    let (addr, server, ticket) = (0..5).find_map(|_| parked_and_taken_back()).expect("a segment parked by both sides in 5 tries");
    // Another process (this test binary again) names the ticket: refused.
    let child = common::child("child_entry", "recycle_hello", &format!("{addr} {ticket}"));
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let said = String::from_utf8_lossy(&out.stdout);
    let refused = format!("{:?}", Some(Message::Reject { version: wire::VERSION, reason: Reason::BadSegment }));
    assert!(said.contains(&format!("ANSWER {refused}\n")), "the other process got: {said}");
    // The ticket itself was good: the process that parked it is welcome.
    let c = raw_connect(addr);
    seqpacket::send(&c, &Message::Recycle { version: wire::VERSION, ticket }.encode(), &[]).unwrap();
    assert_eq!(answer(&c), Some(Message::Welcome { version: wire::VERSION }));
    drop(c);
    server.join().unwrap();
}

// ---- message entries and releases -------------------------------------------------------------

/// A DIRECT pair with a pool of 4 slots of 256 bytes, on a listener of its own, and a shared
/// mapping of its segment (for scribbling as a hostile peer would).
fn pool_pair() -> (Stream, Stream, *mut u8, Layout) {
    let (l, addr) = listener();
    // A segment of an earlier test's listener on the same port (ports come round) may still be
    // let go of: only the one this dial makes counts.
    let before: Vec<u64> = segments_for(addr.port()).iter().map(|p| inode(p)).collect();
    let server = thread::spawn(move || l.accept().unwrap().0);
    let c = Stream::connect_with(addr, &Options::new().ring_capacity(4096).pool(256, 4)).unwrap();
    let s = server.join().unwrap();
    assert_eq!(c.transport(), Transport::SharedMemory);
    let paths: Vec<_> = segments_for(addr.port()).into_iter().filter(|p| !before.contains(&inode(p))).collect();
    assert_eq!(paths.len(), 1, "one segment made for this listener");
    let f = std::fs::OpenOptions::new().read(true).write(true).open(&paths[0]).unwrap();
    let mut head = [0u8; HEADER_FIELDS];
    f.read_exact_at(&mut head, 0).unwrap();
    let (_, layout) = Header::decode(&head).unwrap();
    // SAFETY: a fresh shared mapping of the whole segment, never unmapped (the test's life).
    let p = unsafe { libc::mmap(std::ptr::null_mut(), layout.segment_size, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, f.as_raw_fd(), 0) };
    assert_ne!(p, libc::MAP_FAILED);
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    (c, s, p as *mut u8, layout)
}

fn u32_at(base: *mut u8, off: usize) -> &'static AtomicU32 {
    // SAFETY: callers pass aligned offsets inside a mapping that is never unmapped.
    unsafe { &*(base.add(off) as *const AtomicU32) }
}

fn u64_at(base: *mut u8, off: usize) -> &'static AtomicU64 {
    // SAFETY: as in `u32_at`.
    unsafe { &*(base.add(off) as *const AtomicU64) }
}

#[test]
fn an_out_of_range_message_entry_is_corruption() {
    let _w = common::watchdog(60);
    for (slot, len) in [(4, 1), (u32::MAX, 1), (0, 257), (3, u32::MAX)] {
        let (c, s, base, layout) = pool_pair();
        // The client's message queue (client→server block): entry 0 = {slot, len}, then head.
        let b = layout.block_offset(true);
        u32_at(base, b + block::MSG_ENTRIES).store(slot, Ordering::Relaxed);
        u32_at(base, b + block::MSG_ENTRIES + 4).store(len, Ordering::Relaxed);
        u64_at(base, b + block::MSG_HEAD).store(1, Ordering::Release);
        let e = s.recv_message().map(|m| m.map(|m| m.len())).unwrap_err();
        assert_eq!(colo::errno_of(&e), EPROTO, "entry {{slot {slot}, len {len}}}: {e}");
        // The server reset the connection.
        assert_eq!((&c).read(&mut [0u8; 1]).unwrap_err().kind(), ErrorKind::ConnectionReset);
    }
    // An entry in range is a message (the scribbling above is what was refused).
    let (_c, s, base, layout) = pool_pair();
    let b = layout.block_offset(true);
    u32_at(base, b + block::MSG_ENTRIES).store(3, Ordering::Relaxed);
    u32_at(base, b + block::MSG_ENTRIES + 4).store(256, Ordering::Relaxed);
    u64_at(base, b + block::MSG_HEAD).store(1, Ordering::Release);
    assert_eq!(s.recv_message().unwrap().unwrap().len(), 256);
}

#[test]
fn releasing_a_slot_not_in_flight_is_corruption() {
    let _w = common::watchdog(60);
    // Every slot in flight, then the peer "releases" slot 0 twice, or a slot that does not exist.
    for frees in [&[0u32, 0][..], &[4], &[u32::MAX]] {
        let (c, _s, base, layout) = pool_pair();
        let loans: Vec<_> = (0..4).map(|_| c.loan(1).unwrap()).collect();
        // The server's free queue for the client's pool (client→server block).
        let b = layout.block_offset(true);
        for (i, &slot) in frees.iter().enumerate() {
            u32_at(base, b + layout.free_entries + 4 * i).store(slot, Ordering::Relaxed);
        }
        u64_at(base, b + block::FREE_HEAD).store(frees.len() as u64, Ordering::Release);
        c.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
        let e = c.loan(1).map(|l| l.len()).unwrap_err();
        assert_eq!(colo::errno_of(&e), EPROTO, "frees {frees:?}: {e}");
        drop(loans);
    }
}
