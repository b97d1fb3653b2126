//! A connection born close-on-exec that the application makes inheritable later.
//!
//! Such a connection closed its segment memfd once mapped (`Conn::build`: one descriptor less),
//! so the handover across `exec` (`service::handover`), which maps the segment again in the new
//! image from the memfd, cannot take it. The moment to act is just before an `exec` that would
//! hand it on (`handover::relay_inheritable`, called by the shim's `exec` family, `posix_spawn`,
//! `system`, `popen` and `vfork`), or, in a child that shares its parent's memory, the one the
//! descriptor becomes inheritable (`dup`, `dup2`, `dup3` without `O_CLOEXEC`, `F_DUPFD`,
//! `F_SETFD`): every descriptor of the connection in this process gets a loopback TCP
//! connection of its own instead, on the same number with the same descriptor flags, and a relay
//! process, forked from this one (it keeps the mapping), carries the bytes between it and the
//! rings, both ways, in order, as the standard-I/O relay does after an `exec`
//! (`service::stdio`): the bytes already in the ring toward this side first, then the peer's
//! later ones; a FIN each way as the other side's end of file; a reset either way as a reset. The
//! application's epoll registrations of those descriptors move to the new socket. From then on
//! the connection is a plain socket in this image and in every image it `exec`s, which need not
//! be preloaded; what differs from the accelerated connection is the speed and the addresses the
//! kernel reports for the socket (the relay's loopback ones).
//!
//! The relay is a grandchild of the program, orphaned at once, in a session of its own; it is a
//! holder of the connection (`Conn::add_holder`, by the fork handlers) before this process lets
//! go of its copy, so the peer sees neither FIN nor hang-up. In a child that shares this
//! process's memory (`vfork`, `posix_spawn`'s child) the descriptors are replaced in the child's
//! own table, and the table of the shim, which is the parent's, is left alone.

use crate::base::vm::shares_memory;
use crate::conn::io::conn_send;
use crate::conn::regs;
use crate::conn::state::Conn;
use crate::conn::table::{self, Entry};
use crate::service::downward::{self, downward, program_closed, Hold};
use crate::service::stdio::{close_all_but, loopback_pair, start_relay};
use colo_sys::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Relays `conn`, whose application descriptors in this process are `socks` (see the module's
/// comment). `keep_unread`: the peer's bytes this process (and the programs it execs) leaves
/// unread stay in the ring for the connection's other holders (`service::downward`), as for a
/// connection made inheritable; not for one passed to another process over `SCM_RIGHTS`,
/// whose descriptor in flight no process lists. On failure nothing has changed.
pub fn hand_on(conn: &Arc<Conn>, socks: &[i32], keep_unread: bool) -> Result<(), String> {
    let Some(&first) = socks.first() else { return Err("no socket".into()) };
    let (app, relay_end) = loopback_pair(conn.shm().local_addr().is_ipv6()).map_err(|e| format!("no loopback pair: {e}"))?;
    // SAFETY: the application's socket, open during this call.
    let orig = unsafe { BorrowedFd::borrow_raw(first) };
    // The carrier stays open in the relay for as long as the connection (spec/WIRE.md 3.4).
    let carrier = rustix::io::fcntl_dupfd_cloexec(orig, 3).map_err(|e| format!("no copy of the carrier: {e}"))?;
    let status = rustix::fs::fcntl_getfl(orig).unwrap_or(rustix::fs::OFlags::empty());
    let _ = rustix::fs::fcntl_setfl(&app, status & rustix::fs::OFlags::NONBLOCK);
    // This process (a `vfork` child's own pid), which may exec a program that writes: a
    // holder's write made after it exited waits for the relay to forward what it wrote.
    let relayed = Relayed {
        program: rustix::process::getpid().as_raw_nonzero().get() as u32,
        app_ino: rustix::fs::fstat(&app).map_or(0, |st| st.st_ino),
        slot: None,
    };
    let relayed = Relayed { slot: conn.holders().claim_relay(relayed.program), ..relayed };
    let release = || {
        if let Some(slot) = relayed.slot {
            conn.holders().relay_done(slot, relayed.program);
            conn.holders().relay_read_done(slot, relayed.program);
        }
    };
    // The relay says it started once it is a recorded holder (its fork handler ran).
    let started = start_relay(|say| run(conn, relay_end, carrier, say, relayed, keep_unread.then_some(&app))).inspect_err(|_| release())?;
    if !started {
        release();
        return Err("the relay process could not be started".into());
    }
    let mine = !shares_memory();
    if !mine {
        conn.set_relayed_here();
    }
    for &fd in socks {
        let regs = if mine { regs::release_fd(fd) } else { Vec::new() };
        // SAFETY: the application's descriptor, open.
        let cloexec = rustix::io::fcntl_getfd(unsafe { BorrowedFd::borrow_raw(fd) })
            .map(|f| f.contains(rustix::io::FdFlags::CLOEXEC))
            .unwrap_or(false);
        let flags = if cloexec { libc::O_CLOEXEC } else { 0 };
        // SAFETY: replaces the application's descriptor by the loopback connection, atomically
        // (the number never refers to anything else in between).
        unsafe { libc::syscall(libc::SYS_dup3, app.as_raw_fd(), fd, flags) };
        if mine {
            if let Some(mut slot) = table::lock(fd) {
                slot.set(Entry::None);
            }
        }
        for (epfd, events, data) in regs {
            let mut ev = libc::epoll_event { events, u64: data };
            // SAFETY: registers the application's descriptor, now the loopback socket, in the
            // application's epoll set it was registered in, with its events and data.
            unsafe { crate::real::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) };
        }
    }
    drop(app);
    Ok(())
}

/// What the relay carries: whose writes, through which socket, in which slot of the holders
/// page (`holders::Page::claim_relay`).
#[derive(Clone, Copy)]
struct Relayed {
    /// The process whose descriptors the relay stands for (it may exec a program).
    program: u32,
    /// The inode of its end of the loopback connection.
    app_ino: u64,
    slot: Option<usize>,
}

/// The relay process (`app`: its copy of the program's end, if it keeps what the program
/// leaves unread): never returns.
fn run(conn: &Conn, tcp: OwnedFd, carrier: OwnedFd, say: OwnedFd, relayed: Relayed, app: Option<&OwnedFd>) -> ! {
    let _ = rustix::process::setsid();
    let me = colo_sys::host::pid();
    if let Some(slot) = relayed.slot {
        conn.holders().relay_started(slot, me);
    }
    // Before the program goes on (it waits for `say`): its pid is its own.
    let hold = app.and_then(|app| Hold::new(app, relayed.program));
    // This process's fork handler has made it a holder: the parent may let go of its copy now.
    let _ = rustix::io::write(&say, &[1]);
    drop(say);
    let [control, self_bell, _] = conn.fds();
    let held = hold.as_ref().map_or([-1, -1], |h| h.fds());
    // Nothing of the program's but the connection: its other descriptors must close when the
    // program closes them.
    let keep = [tcp.as_raw_fd(), carrier.as_raw_fd(), control, self_bell, held[0], held[1]];
    close_all_but(&keep);
    table::abandon_all_but(&keep);
    // 0, 1 and 2 taken by /dev/null (see `stdio::run`).
    for _ in 0..3 {
        let _ = rustix::fs::open("/dev/null", rustix::fs::OFlags::RDWR, rustix::fs::Mode::empty()).map(std::mem::forget);
    }
    crate::conn::holders::own_blocking();
    conn.set_nonblocking(false);
    let slot_done = || {
        if let Some(slot) = relayed.slot {
            conn.holders().relay_done(slot, relayed.program);
        }
    };
    // The program closed its end while another process holds the connection (a parent that
    // forked it, which writes next): the relay leaves the connection to it, with no FIN, and
    // the peer's bytes not yet taken stay in the ring for it.
    let leave = AtomicBool::new(false);
    let upward_ended = AtomicBool::new(false);
    let lost = AtomicBool::new(false);
    let mut kept = None;
    std::thread::scope(|s| {
        // The program's bytes toward the peer, its FIN as the connection's, its reset (a close
        // with `SO_LINGER {1, 0}`) as a reset.
        s.spawn(|| {
            let mut buf = vec![0u8; 64 * 1024];
            'up: loop {
                match rustix::io::read(&tcp, &mut buf) {
                    Err(rustix::io::Errno::INTR) => {}
                    Err(rustix::io::Errno::CONNRESET) => {
                        // The program's reset, not the one `downward` passed on for the peer's.
                        if !conn.peer_reset() {
                            conn.shm().abort();
                        }
                        slot_done();
                        return;
                    }
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let mut rest = &buf[..n];
                        while !rest.is_empty() {
                            match conn_send(conn, rest, 0) {
                                Ok(k) => rest = &rest[k..],
                                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                                Err(_) => {
                                    // The peer is gone or reads no more: the program's next
                                    // write fails, as after the peer's kernel's RST, rather
                                    // than blocking once nobody reads the loopback.
                                    let _ = rustix::net::connect_unspec(&tcp);
                                    break 'up;
                                }
                            }
                        }
                    }
                }
            }
            let others = program_closed(relayed.program, relayed.app_ino) && conn.holders().leave(me, control);
            slot_done();
            if others {
                // SYNC POINT: Release, with the Acquire load in `downward`.
                leave.store(true, Ordering::Release);
                // A read shutdown of the relay's own, which wakes the downward loop.
                conn.shm().shutdown_as_tcp(true, false);
                return;
            }
            // SYNC POINT: Release, with the Acquire load in `downward`; the shutdown wakes it.
            upward_ended.store(true, Ordering::Release);
            conn.shm().shutdown_as_tcp(false, true);
        });
        // The peer's bytes toward the program, from the first one this side has not read, each
        // taken off the ring only once the program read it (or, without a hold, once sent on).
        let r = downward::Relayed {
            page: Some(conn.holders()),
            me,
            slot: relayed.slot,
            control,
            program: relayed.program,
            app_ino: relayed.app_ino,
            leave: &leave,
            upward_ended: &upward_ended,
            lost: Some(&lost),
        };
        kept = downward(conn.shm(), &tcp, hold, &r);
    });
    drop(kept);
    if leave.load(Ordering::Relaxed) {
        // SAFETY: ends the relay without running the program's exit handlers; the connection's
        // descriptors close here, while another process holds it (no FIN).
        unsafe { libc::_exit(0) };
    }
    if upward_ended.load(Ordering::Relaxed) {
        // The program closed its end and the relay, the last holder, ends the connection as the
        // shim's last close does (`Conn`'s drop): with a reset if the peer sent bytes no program
        // read (kernel TCP answers them with RST), else reading no more, so that the peer's
        // next write fails as over TCP (taken once, then EPIPE: `takes_write_after_close`).
        let unread = lost.load(Ordering::Relaxed) || conn.available().map_or(true, |n| n > 0);
        if unread {
            conn.shm().abort();
        } else {
            conn.shm().shutdown_as_tcp(true, true);
        }
        // The pages go back as at the shim's last close, and bytes a peer of another user has
        // yet to read are kept (this process lingers) until it read them or lost them: the
        // exit below would leave them charged to us for as long as the peer keeps its memfd.
        conn.shm().let_go_before_exit();
    }
    drop((tcp, carrier));
    // SAFETY: ends the relay without running the program's exit handlers; the kernel closes the
    // connection's descriptors, which ends it for the peer (the last holder).
    unsafe { libc::_exit(0) }
}
