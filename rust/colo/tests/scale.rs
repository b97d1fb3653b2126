//! Many concurrent connections: every one of them on shared memory, and few descriptors each.
//! The clients are a separate process (this test binary re-run with `COLO_CHILD` set), dialing
//! all at once from as many threads, as a load generator does.
mod common;

use colo::{Listener, Stream, Transport};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::Child;
use std::sync::{Arc, Barrier};

/// Child processes enter here; in a normal run this test does nothing.
#[test]
fn child_entry() {
    let Some((role, arg)) = common::role() else { return };
    // SAFETY: prctl with PR_SET_PDEATHSIG takes a signal number and no pointers.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let code = match role.as_str() {
        "dialer" => dialer(&arg),
        _ => 2,
    };
    std::process::exit(code);
}

fn say(line: &str) {
    println!("{line}");
    std::io::stdout().flush().unwrap();
}

/// Dials `n` connections to `addr` at once (one thread each, released together), says how many
/// are on shared memory and how many descriptors they added, echoes one byte on each, and holds
/// them until its stdin closes.
fn dialer(arg: &str) -> i32 {
    let (addr, n) = arg.split_once(' ').unwrap();
    let addr: SocketAddr = addr.parse().unwrap();
    let n: usize = n.parse().unwrap();
    // One connection first: the process-wide threads and caches it starts are not per connection.
    let warm = Stream::connect(addr).unwrap();
    (&warm).write_all(&[0]).unwrap();
    let mut b = [0u8; 1];
    (&warm).read_exact(&mut b).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let before = common::open_fds().len();
    let go = Arc::new(Barrier::new(n));
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let go = go.clone();
            std::thread::Builder::new()
                .stack_size(128 * 1024)
                .spawn(move || {
                    go.wait();
                    Stream::connect(addr).unwrap()
                })
                .unwrap()
        })
        .collect();
    let conns: Vec<Stream> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    // Every byte out before any is read back: the server accepts in its own order.
    for (i, c) in conns.iter().enumerate() {
        (&*c).write_all(&[i as u8]).unwrap();
    }
    for (i, c) in conns.iter().enumerate() {
        (&*c).read_exact(&mut b).unwrap();
        assert_eq!(b[0], i as u8, "connection {i}: echo");
    }
    let shm = conns.iter().filter(|c| c.transport() == Transport::SharedMemory).count();
    let fds = common::open_fds().len() - before;
    say(&format!("DIALED {shm} {fds}"));
    let mut rest = String::new();
    let _ = std::io::stdin().read_line(&mut rest);
    drop(conns);
    drop(warm);
    0
}

/// The first line the child itself printed that starts with `key`.
fn wait_line(c: &mut Child, key: &str) -> String {
    let mut r = BufReader::new(c.stdout.as_mut().unwrap());
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap() == 0 {
            return String::new();
        }
        if let Some(at) = line.find(key) {
            return line[at..].trim().to_string();
        }
    }
}

/// Accepts `n` concurrent dials (plus the dialer's first) and echoes a byte on each; returns
/// (connections on shared memory, descriptors they added) for (server, client).
/// The tests of this file count this process's descriptors: one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn concurrent(n: usize) -> ((usize, usize), (usize, usize)) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let mut child = common::child("child_entry", "dialer", &format!("{addr} {n}"));
    let (warm, _) = l.accept().unwrap();
    let mut b = [0u8; 1];
    (&warm).read_exact(&mut b).unwrap();
    (&warm).write_all(&b).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let before = common::open_fds().len();
    // Every connection accepted before any is echoed: the dialer writes only once all its dials
    // returned, and a dial whose answer the accept would give is not left waiting behind an
    // echo (after its wait it goes on pending, read through its memfd: one descriptor more).
    let conns: Vec<Stream> = (0..n).map(|_| l.accept().unwrap().0).collect();
    for s in &conns {
        (&*s).read_exact(&mut b).unwrap();
        (&*s).write_all(&b).unwrap();
    }
    let line = wait_line(&mut child, "DIALED");
    let server = (conns.iter().filter(|c| c.transport() == Transport::SharedMemory).count(), common::open_fds().len() - before);
    let nums: Vec<usize> = line.split_whitespace().skip(1).map(|x| x.parse().unwrap()).collect();
    assert_eq!(nums.len(), 2, "dialer said {line:?}");
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    (server, (nums[0], nums[1]))
}

fn all_on_shared_memory_few_descriptors(n: usize) {
    let _w = common::watchdog(120);
    let ((shm_s, fds_s), (shm_c, fds_c)) = concurrent(n);
    eprintln!("{n} concurrent: server {shm_s} on shared memory, {fds_s} descriptors; client {shm_c}, {fds_c}");
    assert_eq!(shm_s, n, "server: every connection on shared memory");
    assert_eq!(shm_c, n, "client: every connection on shared memory");
    // At most 2 per connection (the control socket, which is the doorbell, and the self bell:
    // the segment's memfd is closed once mapped), plus a few process-wide ones (the hang-up
    // watcher's, and on the client the segments its preparer keeps ready for the next dials).
    assert!(fds_s <= 2 * n + 16, "server: {fds_s} descriptors for {n} connections");
    assert!(fds_c <= 2 * n + 16, "client: {fds_c} descriptors for {n} connections");
}

#[test]
fn sixteen_concurrent_dials_all_on_shared_memory() {
    all_on_shared_memory_few_descriptors(16);
}

#[test]
fn sixty_four_concurrent_dials_all_on_shared_memory() {
    all_on_shared_memory_few_descriptors(64);
}

#[test]
fn a_thousand_concurrent_dials_all_on_shared_memory() {
    all_on_shared_memory_few_descriptors(1000);
}
