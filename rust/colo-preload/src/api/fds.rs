//! The calls that make, connect, accept, close, duplicate and configure descriptors: each keeps
//! the table in step with the kernel's descriptors (`socket` marks a fresh TCP socket, `connect`
//! offers shared memory, `accept` claims an offer, `close` and `dup2` forget, `dup` copies).

use crate::api::forget::{forget, new_number};
use crate::api::repeat;
use crate::api::route::{plain, with_conn};
use crate::base::addr::parse_sockaddr;
use crate::base::guard::{errno_loc, Guard};
use crate::base::log::log_info;
use crate::conn::regs;
use crate::conn::table::{self, Entry, GUEST, LISTEN, NONE};
use crate::real;
use crate::service::{client, handover, prepared, server};
use colo::errno_of;
use libc::{c_int, c_ulong, sockaddr, socklen_t, ssize_t};
use std::io;
use std::net::SocketAddr;

/// `socket(2)`: a TCP socket is marked fresh (`table::is_fresh`), as only those may be
/// accelerated by `connect`.
pub unsafe fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    // SAFETY: `real::socket` is libc's `socket`, given the application's arguments unchanged: the
    // contract the caller met.
    let fd = unsafe { real::socket(domain, ty, protocol) };
    repeat::forget(fd);
    let tcp = matches!(domain, libc::AF_INET | libc::AF_INET6)
        && ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) == libc::SOCK_STREAM
        && matches!(protocol, 0 | libc::IPPROTO_TCP);
    new_number(fd, tcp);
    fd
}

pub unsafe fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: the first field of any socket address the caller passed, `len` bytes long.
    if !addr.is_null() && len as usize >= std::mem::size_of::<libc::sa_family_t>() && unsafe { (*addr).sa_family } == libc::AF_UNSPEC as libc::sa_family_t {
        disconnect(fd);
    }
    if !table::is_fresh(fd) || addr.is_null() {
        // SAFETY: `real::connect` is libc's `connect`, given the application's arguments unchanged:
        // the contract the caller met.
        return unsafe { real::connect(fd, addr, len) };
    }
    // SAFETY: `len` bytes of address at `addr`.
    let peer = unsafe { parse_sockaddr(addr, len) };
    let r = match peer {
        // Not an IPv4 or IPv6 address (or too short for one): the kernel's answer.
        // SAFETY: `real::connect` is libc's `connect`, given the application's arguments unchanged:
        // the contract the caller met.
        None => unsafe { real::connect(fd, addr, len) },
        // Plain TCP there for now (a plain period of a client that connects per request, or no
        // colo listener a moment ago): nothing to decide, so neither the guard's thread-local
        // nor the client's other tests (about a fifth of the shim's cost per request). So also
        // from inside the shim, which dials no TCP through libc.
        // SAFETY: `real::connect` is libc's `connect`, given the application's arguments unchanged:
        // the contract the caller met.
        Some(p) if client::known_plain(p) => unsafe { real::connect(fd, addr, len) },
        Some(p) => match Guard::try_enter() {
            // SAFETY: `connect_fresh` requires what libc's `connect` does of these arguments, which
            // the application's call met.
            Some(g) => unsafe { connect_fresh(g, fd, p, addr, len) },
            // SAFETY: `real::connect` is libc's `connect`, given the application's arguments
            // unchanged: the contract the caller met.
            None => return unsafe { real::connect(fd, addr, len) },
        },
    };
    // Connected or on its way: no longer fresh (a refused socket may be connected again).
    // SAFETY: reading this thread's errno.
    if r == 0 || matches!(unsafe { *errno_loc() }, libc::EINPROGRESS | libc::EALREADY | libc::EISCONN | libc::EINTR) {
        table::set_fresh(fd, false);
    }
    r
}

/// `connect` of a fresh TCP socket to `peer`: offered shared memory if its destination may take
/// it.
unsafe fn connect_fresh(g: Guard, fd: c_int, peer: SocketAddr, addr: *const sockaddr, len: socklen_t) -> c_int {
    match client::prepare(fd, peer) {
        prepared::Prepared::Plain => {
            drop(g);
            // SAFETY: `real::connect` is libc's `connect`, given the application's arguments
            // unchanged: the contract the caller met.
            unsafe { real::connect(fd, addr, len) }
        }
        prepared::Prepared::NoListener(target) => {
            // SAFETY: `real::connect` is libc's `connect`, given the application's arguments
            // unchanged: the contract the caller met.
            let r = unsafe { real::connect(fd, addr, len) };
            let e = io::Error::last_os_error().raw_os_error().unwrap_or(0);
            client::note_no_listener(fd, target, r, e);
            if r == 0 {
                g.ok(0) as c_int
            } else {
                g.err(e) as c_int
            }
        }
        prepared::Prepared::Connected { later, errno } => {
            // Registered in epoll before `connect`: an offer is decided now (as below). A
            // proposal's answer is not: it comes on the TCP socket those registrations watch.
            let decide = matches!(later, Entry::Pending(_));
            if !matches!(later, Entry::None) {
                client::record_entry(fd, later);
                if decide && regs::has_plain(fd) {
                    client::resolve_fd(fd);
                }
            }
            if errno == 0 {
                g.ok(0) as c_int
            } else {
                g.err(errno) as c_int
            }
        }
        prepared::Prepared::Offered(p) => {
            // SAFETY: `real::connect` is libc's `connect`, given the application's arguments
            // unchanged: the contract the caller met.
            let r = unsafe { real::connect(fd, addr, len) };
            let e = io::Error::last_os_error().raw_os_error().unwrap_or(0);
            if r == 0 || e == libc::EINPROGRESS {
                client::record(fd, p);
                // Registered in epoll before `connect` (nginx's upstreams): decide now, so that
                // the registrations watch the ring from the start. Otherwise a server that speaks
                // first (a banner) would never be reported: nothing else resolves the fd.
                if regs::has_plain(fd) {
                    client::resolve_fd(fd);
                }
            } else {
                client::withdraw(p);
            }
            if r == 0 {
                g.ok(0) as c_int
            } else {
                g.err(e) as c_int
            }
        }
    }
}

pub unsafe fn listen(fd: c_int, backlog: c_int) -> c_int {
    // SAFETY: `real::listen` is libc's `listen`, given the application's arguments unchanged: the
    // contract the caller met.
    let r = unsafe { real::listen(fd, backlog) };
    if r != 0 || Guard::busy() {
        return r;
    }
    let g = Guard::enter();
    server::on_listen(fd);
    g.ok(0) as c_int
}

pub unsafe fn accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int {
    if table::kind(fd) == LISTEN && colo::internal::netns::server_configured() {
        if let Some(g) = Guard::try_enter() {
            // SAFETY: the application's arguments to accept4, unchanged.
            return unsafe { accept_netns(g, fd, addr, len, flags) };
        }
    }
    // The size of the application's buffer (the kernel writes back the address's full size).
    // SAFETY: `len`, if not null, points to the application's length.
    let room = if addr.is_null() || len.is_null() { 0 } else { unsafe { *len } };
    // SAFETY: `real::accept4` is libc's `accept4`, given the application's arguments unchanged: the
    // contract the caller met.
    let nfd = unsafe { real::accept4(fd, addr, len, flags) };
    new_number(nfd, false);
    if nfd >= 0 {
        crate::conn::options::inherit_sndbuf(fd, nfd);
    }
    repeat::forget(nfd);
    let kind = table::kind(fd);
    if nfd < 0 || (kind != LISTEN && kind != GUEST) {
        return nfd;
    }
    if kind == GUEST {
        // Whatever the client's port: one that dialed no rendezvous never offers (see
        // `look_for_vacancy`).
        let guest = table::lock(fd).and_then(|mut s| match s.entry() {
            Entry::Guest(g) => Some(g.clone()),
            _ => None,
        });
        if let (Some(guest), Some(_busy)) = (guest, Guard::try_enter()) {
            server::look_for_vacancy(fd, &guest);
        }
    }
    // A CARRIER client's port is odd (spec/WIRE.md section 3): from an even one, no offer can
    // come, and the connection is plain without a look at the rendezvous (a system call), or at
    // the guard's thread-local.
    // From another network namespace, a proposal may come whatever the port (spec/WIRE.md
    // section 11).
    let plain = |p: SocketAddr| {
        p.port().is_multiple_of(2) && !(colo::internal::netns::server_configured() && colo::internal::netns::from_elsewhere(p))
    };
    // The peer's address as the kernel wrote it for the application, or else asked for (a
    // system call, cheaper than the look at the rendezvous: a server that passes no buffer and
    // forks per connection would otherwise write pages its last child shares).
    let peer = if room > 0 {
        // SAFETY: the kernel wrote the peer's address at `addr`, `*len` bytes of it within `room`.
        unsafe { parse_sockaddr(addr, room.min(*len)) }
    } else {
        // SAFETY: the descriptor the kernel just gave the application, open during this call.
        rustix::net::getpeername(unsafe { colo_sys::BorrowedFd::borrow_raw(nfd) }).ok().flatten().as_ref().and_then(crate::base::addr::sockaddr_of)
    };
    if peer.is_some_and(plain) {
        return nfd;
    }
    let Some(g) = Guard::try_enter() else { return nfd };
    let nonblocking = flags & libc::SOCK_NONBLOCK != 0;
    let (own, guest) = match table::lock(fd) {
        Some(mut s) => match s.entry() {
            Entry::Listen(l) => (Some(l.clone()), None),
            Entry::Guest(guest) => (None, Some(guest.clone())),
            _ => (None, None),
        },
        None => (None, None),
    };
    if let Some(l) = own {
        server::on_accept(&l, nfd, nonblocking);
    } else if let Some(guest) = guest {
        server::on_guest_accept(fd, &guest, nfd, nonblocking);
    }
    g.ok(nfd as ssize_t) as c_int
}

/// `accept4` on a listener of a process that serves other network namespaces: a connection
/// from a listed peer never makes it wait (`server::held`). Resolved ones come first; a
/// blocking accept waits for the kernel's queue and the held set together.
///
/// # Safety
/// The arguments of libc's `accept4`, as the application passed them.
unsafe fn accept_netns(g: Guard, fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int {
    let Some(l) = table::lock(fd).and_then(|mut s| match s.entry() {
        Entry::Listen(l) => Some(l.clone()),
        _ => None,
    }) else {
        drop(g);
        // SAFETY: libc's `accept4`, given the application's arguments unchanged.
        return unsafe { real::accept4(fd, addr, len, flags) };
    };
    let held = server::held::of(&l, true);
    // The size of the application's buffer: each accept below starts from it again (one that
    // took a connection to hold wrote that connection's address there).
    // SAFETY: `len`, if not null, points to the application's length.
    let room = if len.is_null() { None } else { Some(unsafe { *len }) };
    let reset = || {
        if let Some(r) = room {
            // SAFETY: `len` is not null (it was read above) and the application's to write.
            unsafe { *len = r };
        }
    };
    // Leaving with connections held here: a thread of this process asleep in the kernel's
    // accept may now be the only one left to take them (`server::held`'s watcher wakes it).
    let leave = |h: &Option<std::sync::Arc<server::held::Held>>| {
        if let Some(h) = h {
            h.watch_if_needed();
        }
    };
    // Once per call (a system call each): whether the kernel's accept may sleep, and the
    // socket's tag among the lineage's sleepers.
    let blocking = held.is_some() && blocks(fd);
    let sock = if blocking { server::held::socket_tag(fd) } else { 0 };
    loop {
        if let Some(h) = &held {
            h.service();
            if let Some((res, peer)) = h.pop() {
                reset();
                // SAFETY: the application's `addr` and `len`, as accept4 takes them.
                let nfd = unsafe { server::hand_out(res, peer, addr, len, flags) };
                repeat::forget(nfd);
                leave(&held);
                return g.ok(nfd as ssize_t) as c_int;
            }
            if blocking && h.waiting() > 0 {
                // The kernel's accept would sleep past a held connection's resolution. While
                // another process of the server sleeps in the kernel's accept, the listener's
                // queue is left to it (a look again every 10 ms): this process, away with a
                // connection of the queue, would leave its held ones waiting for its return.
                let others = h.others_asleep(sock);
                let mut p = [libc::pollfd { fd: h.fd(), events: libc::POLLIN, revents: 0 }, libc::pollfd { fd, events: libc::POLLIN, revents: 0 }];
                let tick = libc::timespec { tv_sec: 0, tv_nsec: 10_000_000 };
                let (n, t) = if others { (1, &raw const tick) } else { (2, std::ptr::null()) };
                h.watching(true);
                // SAFETY: our own pollfds, `n` of them, and a timeout that outlives the call.
                let r = unsafe { real::ppoll(p.as_mut_ptr(), n, t, std::ptr::null()) };
                let e = io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINTR);
                h.watching(false);
                if r < 0 {
                    // The kernel restarts an accept a `SA_RESTART` handler interrupted; ppoll
                    // it never restarts.
                    if e == libc::EINTR && !crate::eintr_wanted() {
                        continue;
                    }
                    leave(&held);
                    return g.err(e) as c_int;
                }
                if others || p[1].revents == 0 {
                    continue;
                }
            }
        }
        reset();
        // Another thread may take the queued connection first: this one then sleeps in the
        // kernel, where the set's watcher can wake it.
        if let (Some(h), true) = (&held, blocking) {
            h.asleep(true, sock);
        }
        // SAFETY: libc's `accept4`, given the application's arguments unchanged.
        let nfd = unsafe { real::accept4(fd, addr, len, flags) };
        let e = io::Error::last_os_error().raw_os_error().unwrap_or(libc::EAGAIN);
        if let (Some(h), true) = (&held, blocking) {
            h.asleep(false, sock);
        }
        if nfd < 0 {
            leave(&held);
            return g.err(e) as c_int;
        }
        new_number(nfd, false);
        repeat::forget(nfd);
        if held.as_ref().is_some_and(|h| h.is_wake(nfd)) {
            // SAFETY: the watcher's wake-up connection, just accepted, ours alone.
            unsafe { real::close(nfd) };
            continue;
        }
        match server::netns_accepted(&l, held.as_deref(), nfd, flags) {
            server::Accepted::Held => continue,
            server::Accepted::Now => {
                leave(&held);
                return g.ok(nfd as ssize_t) as c_int;
            }
        }
    }
}

/// Whether an accept on `fd` sleeps when nothing is queued (no `O_NONBLOCK`).
fn blocks(fd: c_int) -> bool {
    // SAFETY: F_GETFL reads the flags of the application's descriptor.
    let fl = unsafe { real::fcntl(fd, libc::F_GETFL, 0) };
    fl >= 0 && fl & libc::O_NONBLOCK == 0
}

/// `close(fd)`; `app`: the application's call, not the shim's own close of a descriptor of its
/// own (see `colo_sys::placed`).
#[inline(always)]
pub unsafe fn close(fd: c_int, app: bool) -> c_int {
    let r = if table::kind(fd) == NONE && !table::is_epoll(fd) && !colo_sys::placed::maybe(fd) {
        // SAFETY: `real::close` is libc's `close`, given the application's arguments unchanged: the
        // contract the caller met.
        unsafe { real::close(fd) }
    } else {
        // SAFETY: `close_slow` requires what libc's `close` does of these arguments, which the
        // application's call met.
        unsafe { close_slow(fd, app) }
    };
    // After the call: a change racing with the close cannot leave a memory of the closed number.
    repeat::forget(fd);
    r
}

#[inline(never)]
unsafe fn close_slow(fd: c_int, app: bool) -> c_int {
    // Asked once (a system call), and only where it matters.
    let shared = std::cell::OnceCell::new();
    let shares_memory = || *shared.get_or_init(crate::base::vm::shares_memory);
    if colo_sys::placed::maybe(fd) && !shares_memory() {
        if !app {
            if !colo_sys::placed::closing(fd) {
                // The application took the number with `dup2` (`placed::give_away`): its file.
                return 0;
            }
        } else if colo_sys::placed::refused(fd) {
            return refuse_close(fd);
        }
    }
    // A child sharing this process's memory (`vfork`: CPython's subprocess closes what it does
    // not pass on before its exec) closes its own copy of the descriptor; the table is its
    // parent's, which keeps the connection.
    if (plain(fd) && !table::is_epoll(fd)) || shares_memory() {
        // SAFETY: `real::close` is libc's `close`, given the application's arguments unchanged: the
        // contract the caller met.
        return unsafe { real::close(fd) };
    }
    let g = Guard::enter();
    forget(fd);
    drop(g);
    // SAFETY: `real::close` is libc's `close`, given the application's arguments unchanged: the
    // contract the caller met.
    unsafe { real::close(fd) }
}

/// The application's `close` of one of the shim's own descriptors (`colo_sys::placed`): over
/// TCP that number is not open, so the call fails with `EBADF` and the descriptor stays.
#[cold]
fn refuse_close(fd: c_int) -> c_int {
    static TOLD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !TOLD.swap(true, std::sync::atomic::Ordering::Relaxed) {
        let _g = Guard::enter();
        log_info(format_args!("close of fd {fd}: one of colo's own descriptors, which the program never opened; left open (EBADF, as without colo)"));
    }
    crate::base::guard::set_errno(libc::EBADF);
    -1
}

pub unsafe fn shutdown(fd: c_int, how: c_int) -> c_int {
    with_conn!(
        fd,
        // SAFETY: the application's arguments, as shutdown(2) takes them.
        unsafe { real::shutdown(fd, how) },
        |g, c| {
            let (rd, wr) = match how {
                libc::SHUT_RD => (true, false),
                libc::SHUT_WR => (false, true),
                libc::SHUT_RDWR => (true, true),
                _ => return g.err(libc::EINVAL) as c_int,
            };
            // As kernel TCP: a closed socket (both FINs, a reset) takes the shutdown and fails
            // `ENOTCONN`.
            let closed = c.closed_as_tcp();
            if rd {
                c.shut_read();
            }
            if wr {
                c.wait_forwarded();
            }
            c.shm().shutdown_as_tcp(rd, wr);
            if closed {
                return g.err(libc::ENOTCONN) as c_int;
            }
            g.ok(0) as c_int
        }
    )
}

/// Copies the table entry of `fd` to `nfd` after a successful dup.
fn copy_entry(fd: c_int, nfd: c_int) {
    repeat::duplicated(fd, nfd);
    client::resolve_fd(fd);
    let e = match table::lock(fd) {
        Some(mut s) => match s.entry() {
            Entry::Conn(c) => Entry::Conn(c.clone()),
            Entry::Listen(l) => Entry::Listen(l.clone()),
            Entry::Guest(g) => Entry::Guest(g.clone()),
            // Either number's read takes the late answer off the stream first.
            Entry::Owed(o) => Entry::Owed(Box::new(crate::conn::entry::Owed { peer: o.peer, partial_since: o.partial_since })),
            _ => return,
        },
        None => return,
    };
    let conn = match &e {
        Entry::Conn(c) => Some(c.clone()),
        _ => None,
    };
    // Not in a child that shares this process's memory (`vfork`): the table is the parent's,
    // whose `nfd` is another file; the duplicate lives only until the child's `exec`.
    if !crate::base::vm::shares_memory() {
        if let Some(mut s) = table::lock(nfd) {
            s.set(e);
        }
    }
    // A duplicate may be inheritable where the original was not (see `handover`).
    if let Some(c) = conn {
        handover::update(nfd, &c);
    }
}

pub unsafe fn dup(fd: c_int) -> c_int {
    if plain(fd) {
        // SAFETY: `real::dup` is libc's `dup`, given the application's arguments unchanged: the
        // contract the caller met.
        let n = unsafe { real::dup(fd) };
        if n >= 0 {
            repeat::duplicated(fd, n);
        }
        return n;
    }
    let g = Guard::enter();
    client::resolve_fd(fd);
    // SAFETY: `real::dup` is libc's `dup`, given the application's arguments unchanged: the
    // contract the caller met.
    let n = unsafe { real::dup(fd) };
    if n < 0 {
        return g.err(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EBADF)) as c_int;
    }
    copy_entry(fd, n);
    g.ok(n as ssize_t) as c_int
}

pub unsafe fn dup3(fd: c_int, nfd: c_int, flags: c_int, two: bool) -> c_int {
    let call = |fd, nfd, flags| {
        if two {
            // SAFETY: `real::dup2` is libc's `dup2`, given the application's arguments unchanged:
            // the contract the caller met.
            unsafe { real::dup2(fd, nfd) }
        } else {
            // SAFETY: `real::dup3` is libc's `dup3`, given the application's arguments unchanged:
            // the contract the caller met.
            unsafe { real::dup3(fd, nfd, flags) }
        }
    };
    if Guard::busy() || (table::kind(fd) == NONE && table::kind(nfd) == NONE && !table::is_epoll(nfd) && !colo_sys::placed::maybe(nfd)) {
        let n = call(fd, nfd, flags);
        if n >= 0 && fd != nfd {
            repeat::duplicated(fd, nfd);
        }
        return n;
    }
    let g = Guard::enter();
    client::resolve_fd(fd);
    if fd == nfd {
        drop(g);
        return call(fd, nfd, flags);
    }
    crate::api::forget::vacate_own(nfd);
    forget(nfd);
    let n = call(fd, nfd, flags);
    if n < 0 {
        return g.err(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EBADF)) as c_int;
    }
    copy_entry(fd, n);
    g.ok(n as ssize_t) as c_int
}

#[inline(always)]
pub unsafe fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong, is64: bool) -> c_int {
    if table::kind(fd) == NONE {
        // SAFETY: `real_fcntl` requires what libc's `fcntl` does of these arguments, which the
        // application's call met.
        let r = unsafe { real_fcntl(fd, cmd, arg, is64) };
        if r >= 0 && (cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC) {
            repeat::duplicated(fd, r);
        }
        return r;
    }
    // SAFETY: `fcntl_slow` requires what libc's `fcntl` does of these arguments, which the
    // application's call met.
    unsafe { fcntl_slow(fd, cmd, arg, is64) }
}

/// `connect(fd, AF_UNSPEC)` is about to disconnect `fd` (Linux: an abortive end of an
/// established connection, a reset for the peer, and the socket unconnected): an accelerated
/// connection is reset at once and ends as a close with `SO_LINGER {1, 0}` does, on every number
/// it has here, and the kernel's disconnect of its TCP socket follows, which answers the
/// program's next calls. A connection still waiting for its server's answer is decided first:
/// its server may have claimed it, and a socket connected again afterwards must not be decided
/// onto those rings.
fn disconnect(fd: c_int) {
    let kind = table::kind(fd);
    if (kind != table::CONN && kind != table::PENDING) || Guard::busy() {
        return;
    }
    let _g = Guard::enter();
    client::resolve_fd(fd);
    let Some(c) = table::conn(fd) else { return };
    // The peer is reset now, as the kernel's disconnect resets it whoever else holds the socket
    // (a fork child's copy would otherwise keep the rings connected until it closed).
    c.shm().abort();
    c.abort_on_close();
    let numbers: Vec<c_int> =
        table::fds_of_kind(table::CONN).map(|n| n as c_int).filter(|&n| table::conn(n).is_some_and(|x| std::sync::Arc::ptr_eq(&x, &c))).collect();
    drop(c);
    for n in numbers {
        forget(n);
    }
}

/// libc's `fcntl64` or `fcntl`, as the application called.
#[inline(always)]
unsafe fn real_fcntl(fd: c_int, cmd: c_int, arg: c_ulong, is64: bool) -> c_int {
    // SAFETY: `real::fcntl64` is libc's `fcntl64`, given the application's arguments unchanged: the
    // contract the caller met.
    unsafe { if is64 { real::fcntl64(fd, cmd, arg) } else { real::fcntl(fd, cmd, arg) } }
}

#[inline(never)]
unsafe fn fcntl_slow(fd: c_int, cmd: c_int, arg: c_ulong, is64: bool) -> c_int {
    // SAFETY: `real_fcntl` requires what libc's `fcntl` does of these arguments, which the
    // application's call met.
    let call = || unsafe { real_fcntl(fd, cmd, arg, is64) };
    if plain(fd) {
        return call();
    }
    let g = Guard::enter();
    if cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC {
        client::resolve_fd(fd);
    }
    if cmd == libc::F_SETFL && arg as c_int & libc::O_ASYNC != 0 {
        crate::api::confine::signal_driven(fd);
    }
    let r = call();
    if r < 0 {
        return g.err(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EBADF)) as c_int;
    }
    match cmd {
        libc::F_SETFL => {
            if let Some(c) = table::conn(fd) {
                c.set_nonblocking(arg as c_int & libc::O_NONBLOCK != 0);
            }
        }
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => copy_entry(fd, r),
        libc::F_SETFD => {
            if let Some(c) = table::conn(fd) {
                handover::update(fd, &c);
            }
        }
        _ => {}
    }
    g.ok(r as ssize_t) as c_int
}

pub unsafe fn ioctl(fd: c_int, req: c_ulong, arg: c_ulong) -> c_int {
    if (req == libc::FIONCLEX || req == libc::FIOCLEX) && table::kind(fd) != NONE && !Guard::busy() {
        // `FD_CLOEXEC` set or cleared as by `F_SETFD` (Python's `os.set_inheritable`).
        let g = Guard::enter();
        // SAFETY: the application's arguments, as ioctl(2) takes them.
        let r = unsafe { real::ioctl(fd, req, arg) };
        if r < 0 {
            return g.err(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EBADF)) as c_int;
        }
        if let Some(c) = table::conn(fd) {
            handover::update(fd, &c);
        }
        return g.ok(r as ssize_t) as c_int;
    }
    if req == libc::FIOASYNC && table::kind(fd) != NONE && !Guard::busy() {
        // FIOASYNC's `arg` is the application's `int *`: one it cannot read is the kernel's
        // EFAULT to answer.
        if crate::base::mem::app_int(arg).is_some_and(|on| on != 0) {
            let _g = Guard::enter();
            crate::api::confine::signal_driven(fd);
        }
        // SAFETY: the application's arguments, as ioctl(2) takes them.
        return unsafe { real::ioctl(fd, req, arg) };
    }
    if req != libc::FIONBIO && req != libc::FIONREAD {
        // SAFETY: the application's arguments, as ioctl(2) takes them.
        return unsafe { real::ioctl(fd, req, arg) };
    }
    with_conn!(
        fd,
        // SAFETY: the application's arguments, as ioctl(2) takes them.
        unsafe { real::ioctl(fd, req, arg) },
        |g, c| {
            if arg == 0 {
                return g.err(libc::EFAULT) as c_int;
            }
            if req == libc::FIONBIO {
                // SAFETY: the application's arguments; FIONBIO's `arg` is a non-null `int *`.
                let r = unsafe { real::ioctl(fd, req, arg) };
                if r == 0 {
                    // SAFETY: the non-null `int *` the kernel just read.
                    c.set_nonblocking(unsafe { *(arg as *const c_int) } != 0);
                }
                return r;
            }
            // From the ring counters, without the reading half's lock: a thread blocked in read
            // holds it.
            match c.available() {
                // FIONREAD's `arg` is the application's `int *`: one it cannot write is the
                // kernel's EFAULT to answer.
                Ok(n) if crate::base::mem::put_app_int(arg, n.min(c_int::MAX as usize) as c_int) => g.ok(0) as c_int,
                Ok(_) => g.err(libc::EFAULT) as c_int,
                Err(e) => g.err(errno_of(&e)) as c_int,
            }
        }
    )
}
