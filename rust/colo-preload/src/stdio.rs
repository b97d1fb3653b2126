//! A connection handed over by `exec` as standard input, output or error.
//!
//! glibc's stdio (`getchar`, `fgets`, `printf`, `fflush`) reads and writes descriptors 0, 1 and 2
//! through calls internal to libc that no preloaded library sees: an accelerated connection
//! there would be read and written as its carrier TCP socket, which carries no payload after the
//! claim (spec/WIRE.md section 3), so every byte would be lost in both directions. A claimed
//! connection cannot go back to its carrier without its peer (the peer's bytes wait in the
//! ring; only the peer could write them into the carrier's other end).
//!
//! So when a new image takes back a connection one of whose descriptors is 0, 1 or 2, it gives
//! every such descriptor a loopback TCP connection of its own instead, and a relay process
//! carries the bytes between that connection and the rings, in order, both ways: the bytes
//! already in the ring toward this side first, then everything the peer writes later; and all
//! the program writes, after the bytes this side's earlier image had written. A FIN goes each
//! way as the other side's end of file. The program sees a TCP socket with the same file
//! status flags and close-on-exec flags on the same numbers; what differs is its addresses
//! (`getpeername` names the relay's loopback end) and a reset from the peer, which arrives as
//! an end of file.
//!
//! The relay is a grandchild of the program, orphaned at once (the program never sees a child
//! it did not make, nor its exit status), in a session of its own (a terminal's signals for the
//! program's group do not end it). It holds the connection, and the carrier TCP socket, until
//! both directions have ended, then closes them, which ends the connection for the peer.

use crate::conn::Conn;
use crate::table;
use colo::carrier::Established;
use colo_sys::{AsRawFd, BorrowedFd, OwnedFd};
use rustix::net::{self, AddressFamily, SocketAddrAny, SocketType};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

/// True if one of `socks` (the descriptors of one connection's application socket) is a
/// standard stream.
pub fn is_stdio(socks: &[i32]) -> bool {
    socks.iter().any(|&fd| (0..=2).contains(&fd))
}

/// Gives each of `socks` a loopback TCP connection whose other end a relay process joins to the
/// connection `est` (see the module's comment). On failure nothing has changed, and the caller
/// keeps the connection as it would have.
pub fn relay(est: Established, socks: &[i32]) -> Result<(), Box<(Established, String)>> {
    relay_for(est, socks, None)
}

/// [`relay`], for a connection `live` in this image: the relay process keeps `live`'s control
/// socket under its number and is recorded as a holder, so that dropping `live` here afterwards
/// releases this process's copy only (the peer sees no end).
fn relay_for(est: Established, socks: &[i32], live: Option<&Conn>) -> Result<(), Box<(Established, String)>> {
    let Some(&first) = socks.first() else { return Err(Box::new((est, "no socket".into()))) };
    let (app, relay_end) = match loopback_pair(est.local.is_ipv6()) {
        Ok(p) => p,
        Err(e) => return Err(Box::new((est, format!("no loopback pair: {e}")))),
    };
    // SAFETY: the application's socket, open (listed in /proc/self/fd by the caller).
    let orig = unsafe { BorrowedFd::borrow_raw(first) };
    // The carrier stays open in the relay for as long as the connection (spec/WIRE.md 3.4).
    let carrier = match rustix::io::fcntl_dupfd_cloexec(orig, 3) {
        Ok(c) => c,
        Err(e) => return Err(Box::new((est, format!("no copy of the carrier: {e}")))),
    };
    let status = rustix::fs::fcntl_getfl(orig).unwrap_or(rustix::fs::OFlags::empty());
    let _ = rustix::fs::fcntl_setfl(&app, status & rustix::fs::OFlags::NONBLOCK);
    // SAFETY: the libc `fork` the shim wraps, in the constructor of a new image, before the
    // program's `main`: its atfork handlers are the shim's and libc's own.
    let child = unsafe { crate::real::fork() };
    if child < 0 {
        return Err(Box::new((est, format!("fork: {}", std::io::Error::last_os_error()))));
    }
    if child == 0 {
        // SAFETY: as above; in the child of a single-threaded constructor.
        let relay_pid = unsafe { crate::real::fork() };
        if relay_pid == 0 {
            run(est, relay_end, carrier, live.map(|c| c.fds()[0]));
        }
        if let (Some(c), true) = (live, relay_pid > 0) {
            // Through the holders page this process shares with its parent (fork).
            c.add_holder(relay_pid as u32);
        }
        // SAFETY: ends the intermediate child at once, without running the image's exit code.
        unsafe { libc::_exit(if relay_pid > 0 { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: reaps the intermediate child made just above (it exits at once).
    let reaped = unsafe { libc::waitpid(child, &mut status, 0) } == child;
    if !reaped || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        return Err(Box::new((est, "the relay process could not be started".into())));
    }
    for &fd in socks {
        // SAFETY: the application's descriptor, open.
        let cloexec = rustix::io::fcntl_getfd(unsafe { BorrowedFd::borrow_raw(fd) })
            .map(|f| f.contains(rustix::io::FdFlags::CLOEXEC))
            .unwrap_or(false);
        let flags = if cloexec { libc::O_CLOEXEC } else { 0 };
        if live.is_some() {
            crate::shim::forget(fd);
        }
        // SAFETY: replaces the application's descriptor by the loopback connection, atomically
        // (the number never refers to anything else in between).
        unsafe { libc::syscall(libc::SYS_dup3, app.as_raw_fd(), fd, flags) };
    }
    drop((est, app, relay_end, carrier));
    Ok(())
}

/// A connected loopback TCP pair: (the program's end, the relay's end), both close-on-exec.
fn loopback_pair(v6: bool) -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (family, addr) = if v6 {
        (AddressFamily::INET6, SocketAddr::from((Ipv6Addr::LOCALHOST, 0)))
    } else {
        (AddressFamily::INET, SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
    };
    let ty = SocketType::STREAM;
    let listener = net::socket_with(family, ty, net::SocketFlags::CLOEXEC, None)?;
    net::bind(&listener, &addr)?;
    net::listen(&listener, 1)?;
    let name = net::getsockname(&listener)?;
    let app = net::socket_with(family, ty, net::SocketFlags::CLOEXEC, None)?;
    net::connect(&app, &name)?;
    let relay_end = net::accept_with(&listener, net::SocketFlags::CLOEXEC)?;
    let mine: SocketAddrAny = net::getsockname(&app)?;
    // Only the connection just made, never another process's that raced to the listener.
    if net::getpeername(&relay_end)?.as_ref() != Some(&mine) {
        return Err(std::io::Error::other("a stranger connected to the loopback listener"));
    }
    let _ = net::sockopt::set_tcp_nodelay(&app, true);
    let _ = net::sockopt::set_tcp_nodelay(&relay_end, true);
    Ok((app, relay_end))
}

/// The relay process: never returns.
fn run(est: Established, tcp: OwnedFd, carrier: OwnedFd, control: Option<i32>) -> ! {
    let _ = rustix::process::setsid();
    // Nothing of the program's but the connection: its other descriptors (pipes, sockets,
    // files) must close when the program closes them.
    let keep = [
        tcp.as_raw_fd(),
        carrier.as_raw_fd(),
        est.fds.control.as_raw_fd(),
        est.fds.own_bell.as_raw_fd(),
        est.fds.self_bell.as_raw_fd(),
        est.memfd,
        // The live connection's control socket under its own number: what makes this process a
        // holder of it (`Conn::others_hold`).
        control.unwrap_or(-1),
    ];
    close_all_but(&keep);
    let shm = match est.into_resumed_shm(crate::spin()) {
        Ok(s) => s,
        // SAFETY: ends this process; the kernel closes the connection's descriptors.
        Err(_) => unsafe { libc::_exit(1) },
    };
    std::thread::scope(|s| {
        // The program's bytes toward the peer, its FIN as the connection's.
        s.spawn(|| {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match rustix::io::read(&tcp, &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if shm.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                }
            }
            shm.shutdown(false, true);
        });
        // The peer's bytes toward the program, from the first one this side has not read.
        let mut buf = vec![0u8; 64 * 1024];
        'down: loop {
            match shm.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let mut rest = &buf[..n];
                    while !rest.is_empty() {
                        match net::send(&tcp, rest, net::SendFlags::NOSIGNAL) {
                            Ok(k) => rest = &rest[k..],
                            Err(rustix::io::Errno::INTR) => {}
                            Err(_) => break 'down,
                        }
                    }
                }
            }
        }
        let _ = net::shutdown(&tcp, net::Shutdown::Write);
    });
    drop(shm);
    drop((tcp, carrier));
    // SAFETY: ends the relay without running the program's exit handlers.
    unsafe { libc::_exit(0) }
}

fn close_all_but(keep: &[i32]) {
    let mut keep: Vec<u32> = keep.iter().filter(|&&fd| fd >= 0).map(|&fd| fd as u32).collect();
    keep.sort_unstable();
    let mut from = 0u32;
    for k in keep {
        if k > from {
            // SAFETY: closes descriptors of this process that the relay does not use.
            unsafe { libc::syscall(libc::SYS_close_range, from, k - 1, 0) };
        }
        from = k + 1;
    }
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_close_range, from, u32::MAX, 0) };
}

/// After `dup2`/`dup3` made `nfd` a descriptor of an accelerated connection: if `nfd` is 0, 1 or
/// 2, glibc's stdio may read or write it past the shim without an `exec` (a forked child that
/// serves its connection with `printf`), so the connection is relayed now, as at `exec`. Only
/// when no other thread of the program runs (a forked child): a thread in the middle of a read
/// of the connection would race the relay for its bytes; and not in a `vfork` child, whose
/// `exec` relays instead. Called with the shim's guard held.
pub fn after_dup(nfd: i32) {
    if !(0..=2).contains(&nfd) {
        return;
    }
    let Some(conn) = table::conn(nfd) else { return };
    // A `vfork` child shares the table but not the descriptors: its `exec` relays instead.
    if crate::behind::borrowed_memory() {
        return;
    }
    if !alone() {
        crate::log_info(format_args!("dup onto fd {nfd}: an accelerated connection as standard I/O with other threads running: not relayed"));
        return;
    }
    let socks: Vec<i32> = table::fds_of_kind(table::CONN)
        .map(|fd| fd as i32)
        .filter(|&fd| table::conn(fd).is_some_and(|c| std::sync::Arc::ptr_eq(&c, &conn)))
        .collect();
    let [control, own_bell, self_bell, memfd] = conn.fds();
    let copy = |fd: i32| {
        // SAFETY: the connection's own descriptor, open while `conn` lives.
        rustix::io::fcntl_dupfd_cloexec(unsafe { BorrowedFd::borrow_raw(fd) }, 3)
    };
    let (Ok(m), Ok(c), Ok(o), Ok(b)) = (copy(memfd), copy(control), copy(own_bell), copy(self_bell)) else { return };
    let est = match colo::carrier::reattach(m, c, o, b, conn.shm().role()) {
        Ok(est) => est,
        Err(why) => {
            crate::log_info(format_args!("dup onto fd {nfd}: standard I/O, not relayed: {why}"));
            return;
        }
    };
    let peer = est.peer;
    // The table lets go first (this process's copy only: the relay now holds the connection),
    // then each number becomes the loopback connection.
    match relay_for(est, &socks, Some(&conn)) {
        Ok(()) => crate::log_info(format_args!("dup: connection to {peer} on fd {nfd} is standard I/O: relayed over loopback TCP")),
        Err(failed) => crate::log_info(format_args!("dup onto fd {nfd}: standard I/O, not relayed: {}", failed.1)),
    }
}

/// No thread of the program but this one (the shim's own, named `colo-*`, never touch a
/// connection's rings on its behalf).
fn alone() -> bool {
    let Ok(dir) = std::fs::read_dir("/proc/thread-self/..") else { return false };
    let me = rustix::thread::gettid().as_raw_nonzero().get().to_string();
    dir.flatten().all(|t| {
        t.file_name().to_str() == Some(me.as_str())
            || std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with("colo-"))
    })
}
