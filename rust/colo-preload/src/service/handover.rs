//! Accelerated connections across `exec`.
//!
//! A program that execs keeps its inheritable descriptors (those without `FD_CLOEXEC`); an
//! accelerated socket among them is only half of a connection: its payload moves through the
//! segment. So a connection whose application socket is inheritable keeps its own descriptors
//! (segment memfd, control socket and self bell) inheritable too, and is listed in this process's
//! *handover file*: an inheritable memfd named `colo-handover` with one record per such
//! connection. The shim's constructor in the new program image finds the file among its
//! descriptors, takes each connection back (the record names the socket by inode; the rings
//! continue where they are) and closes what no socket claims any more.
//!
//! A program that cannot be preloaded (static, setuid) inherits the socket without the shim:
//! nothing reaches it over TCP, as nothing would reach a program that inherited half a pipe.
//! `colo run` warns about such programs.

use crate::base::log::log_info;
use crate::conn::holders::Page;
use crate::conn::holders_file;
use crate::conn::options;
use crate::conn::state::Conn;
use crate::conn::table::{self, Entry};
use crate::record::handover_file::record::{Record, RECORD_LEN};
use crate::record::handover_file::{self, FILE_NAME};
use crate::record::app_nofile;
use crate::record::relayed::{self, Names};
use crate::service::{relay, stdio};
use colo_sys::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;

fn cloexec(fd: BorrowedFd<'_>) -> bool {
    rustix::io::fcntl_getfd(fd).map(|f| f.contains(rustix::io::FdFlags::CLOEXEC)).unwrap_or(true)
}

/// Whether the application's descriptor `fd` is close-on-exec (a connection made on it then
/// needs no memfd: see `Conn::build`).
pub fn is_cloexec(fd: i32) -> bool {
    // SAFETY: only asks the kernel about the number; a closed one counts as close-on-exec.
    cloexec(unsafe { BorrowedFd::borrow_raw(fd) })
}

/// Brings the handover state of `conn` up to date after one of its application descriptors
/// appeared or changed `FD_CLOEXEC`: inheritable if any of them is. `fd` is that descriptor.
pub fn update(fd: i32, conn: &Arc<Conn>) {
    // SAFETY: the application's descriptor, open during this call.
    let b = unsafe { BorrowedFd::borrow_raw(fd) };
    let inheritable = !cloexec(b)
        || table::fds_of_kind(table::CONN).any(|other| {
            other as i32 != fd
                && table::conn(other as i32).is_some_and(|c| Arc::ptr_eq(&c, conn))
                // SAFETY: a descriptor the table says is an open application socket.
                && !cloexec(unsafe { BorrowedFd::borrow_raw(other as i32) })
        });
    set(conn, inheritable, b);
}

/// After an accept or connect that created `conn` for `fd`, made `inheritable` (`fd` was not
/// close-on-exec when the caller looked, [`is_cloexec`]): no scan needed (one descriptor).
pub fn on_new(fd: i32, conn: &Arc<Conn>, inheritable: bool) {
    // SAFETY: the application's descriptor, open during this call.
    let b = unsafe { BorrowedFd::borrow_raw(fd) };
    // (Born inheritable, the connection kept its memfd; should another thread have cleared
    // `FD_CLOEXEC` since the connection was made, the relay's fork must wait for the table slot
    // the caller may hold: the descriptor is left as it is. A thread that changes the flag
    // meanwhile brings the state up to date after us, `update`, as it waits for that slot too.)
    if inheritable && conn.exec_maps() {
        set(conn, true, b);
    }
}

fn set(conn: &Arc<Conn>, inheritable: bool, sock: BorrowedFd<'_>) {
    if conn.inheritable() == inheritable {
        return;
    }
    let [control, self_bell, memfd] = conn.fds();
    if inheritable && !conn.exec_maps() {
        // Born close-on-exec (its memfd closed, or open only for reads through it:
        // `Conn::exec_maps`): the next image will not map it, so it is relayed (`relay`)
        // before an `exec` (`relay_inheritable`); until then it serves this image, and the fork
        // children that share its mapping, as it is (a `dup` that no `exec` follows costs
        // nothing). A child that shares this process's memory (`vfork`, which the program
        // makes its descriptors inheritable in before it execs)
        // relays it at once: its `exec` comes with no look of the shim's first.
        if crate::base::vm::shares_memory() {
            relay(conn, sock.as_raw_fd());
        }
        return;
    }
    conn.set_inheritable(inheritable);
    if !inheritable {
        handover_file::forget(memfd, false);
        return;
    }
    let Ok(st) = rustix::fs::fstat(sock) else { return };
    let r = Record { sock_ino: st.st_ino, memfd, control, self_bell, role: conn.shm().role(), holders: conn.holders_index() };
    handover_file::add(r);
}

/// Relays `conn`, born close-on-exec, over loopback TCP (`service::relay`): one of its application
/// descriptors, `sock`, is inheritable.
fn relay(conn: &Arc<Conn>, sock: i32) {
    if conn.relayed_here() {
        // A `vfork` child's copy of a descriptor it relayed already: the relay's socket.
        return;
    }
    let mut socks: Vec<i32> = table::fds_of_kind(table::CONN)
        .map(|fd| fd as i32)
        .filter(|&fd| table::conn(fd).is_some_and(|c| Arc::ptr_eq(&c, conn)))
        .collect();
    // (Not in the table in a `vfork` child: see `api::fds::copy_entry`.)
    if !socks.contains(&sock) {
        socks.push(sock);
    }
    let peer = conn.shm().peer_addr();
    match relay::hand_on(conn, &socks, true) {
        Ok(()) => log_info(format_args!("connection to {peer} on fd {sock} made inheritable: relayed over loopback TCP")),
        Err(why) => log_info(format_args!("connection to {peer} on fd {sock} made inheritable, not relayed: {why}")),
    }
}

/// Before an `exec` of this process, or of a child that shares its memory (`api::exports`):
/// relays each connection born close-on-exec that has an inheritable application descriptor
/// now (see `set`), so that the new image gets a socket that carries its bytes. After a change
/// of uid since this image started (a server that runs a service as another user: `setuid`,
/// then `exec`), every connection with an inheritable descriptor is relayed, none handed over:
/// its peer judged who we are by the credentials of our `connect` or `listen`
/// (`SO_PEERCRED`), taken before the change, and trusts a peer of its own uid with its rings
/// (it reads them through its mapping: `colo::Segment::read_through_memfd`); the new image,
/// which the new uid may `ptrace` or is that user's own program, would hold the segment and
/// the control socket. The relay, forked before the `exec`, is not such an image: it execs
/// nothing and makes itself undumpable (`stdio::start_relay`).
pub fn relay_inheritable() {
    let uid_changed = crate::base::uids::changed();
    let fds: Vec<i32> = table::fds_of_kind(table::CONN).map(|fd| fd as i32).collect();
    for fd in fds {
        // (A connection relayed at an earlier descriptor of it left the table at every one.)
        let Some(c) = table::conn(fd) else { continue };
        if is_cloexec(fd) {
            continue;
        }
        if c.exec_maps() && uid_changed {
            // Not handed over, relayed or not: its descriptors become close-on-exec and its
            // record leaves the handover file.
            // SAFETY: the application's descriptor, open (the table lists it).
            set(&c, false, unsafe { BorrowedFd::borrow_raw(fd) });
            relay(&c, fd);
        } else if !c.exec_maps() {
            relay(&c, fd);
        }
    }
}

/// Before the `exec` of a child that shares its parent's memory (`vfork`) and has changed its
/// uid since the image started (`setuid` between `vfork` and `exec`): as `relay_inheritable`
/// after a change of uid, each connection with an inheritable descriptor in the child is
/// relayed, none handed over, and its own descriptors (segment memfd, control socket, self bell)
/// become close-on-exec in the child's table, so that the new image, which the new uid may
/// `ptrace` or is that user's own program, holds none of them. The parent's state (the
/// handover file, the connection's flags, its descriptors) is left as it is: the parent keeps
/// the connection and may hand it on to an `exec` of its own.
pub fn relay_inheritable_in_child() {
    if !crate::base::uids::changed() {
        return;
    }
    let fds: Vec<i32> = table::fds_of_kind(table::CONN).map(|fd| fd as i32).collect();
    for fd in fds {
        let Some(c) = table::conn(fd) else { continue };
        if !c.exec_maps() || c.relayed_here() || is_cloexec(fd) {
            continue;
        }
        for own in c.fds().into_iter().filter(|&own| own >= 0) {
            // SAFETY: the connection's own descriptor; the child's table is its own.
            let _ = rustix::io::fcntl_setfd(unsafe { BorrowedFd::borrow_raw(own) }, rustix::io::FdFlags::CLOEXEC);
        }
        relay(&c, fd);
    }
}

/// In the shim's constructor: takes back the connections an earlier image of this process
/// handed over.
pub fn take_back() {
    crate::base::uids::record_start();
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return };
    let mut files = Vec::new();
    let mut relayed_files = Vec::new();
    let mut holders_files = Vec::new();
    let mut sockets: Vec<(u64, i32)> = Vec::new();
    for e in dir.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        let Ok(link) = std::fs::read_link(e.path()) else { continue };
        let link = link.to_string_lossy();
        // SAFETY: listed in /proc/self/fd just now; borrowed for the look only.
        let ours = || crate::record::inherited_is_ours(unsafe { colo_sys::BorrowedFd::borrow_raw(fd) });
        let named_as_ours = [FILE_NAME, relayed::FILE_NAME, holders_file::NAME, app_nofile::FILE_NAME].iter().any(|n| link.starts_with(&format!("/memfd:{n}")));
        if named_as_ours && !ours() {
            log_info(format_args!("exec: fd {fd} is named as colo's ({link}) but is not a file of this user's: left alone"));
            continue;
        }
        if link.starts_with(&format!("/memfd:{FILE_NAME}")) {
            files.push(fd);
        } else if link.starts_with(&format!("/memfd:{}", relayed::FILE_NAME)) {
            relayed_files.push(fd);
        } else if link.starts_with(&format!("/memfd:{}", holders_file::NAME)) {
            holders_files.push(fd);
        } else if link.starts_with(&format!("/memfd:{}", app_nofile::FILE_NAME)) {
            // SAFETY: an inherited descriptor nobody else in this image owns (the application
            // does not know it exists); `inherit` keeps or closes it.
            app_nofile::inherit(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
        } else if let Some(ino) = link.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
            if let Ok(ino) = ino.parse() {
                sockets.push((ino, fd));
            }
        }
    }
    // The holders file (`conn::holders_file`): ours from now on, if there is exactly one (the
    // records name pages by index, in the one file); else every page named is left alone.
    let one = holders_files.len() == 1;
    let mut pages_named = false;
    for fd in holders_files {
        // SAFETY: an inherited descriptor nobody else in this image owns; adopted or closed.
        let f = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        pages_named = one && holders_file::adopt(f);
    }
    let mut records = Vec::new();
    for fd in files {
        // SAFETY: an inherited descriptor nobody else in this image owns (the application does
        // not know it exists); we close it here.
        let f = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        // From offset 0 (pread): the file description, and its offset, is shared with every
        // other process that inherited it (an earlier spawned child has read it already).
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        while let Ok(n) = rustix::io::pread(&f, &mut chunk, buf.len() as u64) {
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        records.extend(buf.chunks_exact(RECORD_LEN).filter_map(Record::decode).map(|r| Record { holders: r.holders.filter(|_| pages_named), ..r }));
    }
    // Connections an earlier image relayed whose sockets are still open here.
    let mut relayed: Vec<Names> = Vec::new();
    for fd in relayed_files {
        // SAFETY: an inherited descriptor nobody else in this image owns; closed by the read.
        let f = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        relayed.extend(relayed::read_inherited(f).into_iter().filter(|n| sockets.iter().any(|(ino, _)| *ino == n.ino)));
    }
    // A descriptor is taken by one record at most: owned twice, it would be closed under the
    // connection that kept it.
    let mut taken: Vec<RawFd> = Vec::new();
    for r in records {
        let fds = [r.memfd, r.control, r.self_bell];
        if fds.iter().any(|fd| taken.contains(fd)) {
            log_info(format_args!("exec: a handed-over connection names descriptors another took; left alone"));
            continue;
        }
        taken.extend(fds);
        let socks: Vec<i32> = sockets.iter().filter(|(ino, _)| *ino == r.sock_ino).map(|(_, fd)| *fd).collect();
        relayed.extend(take_back_one(r, &socks));
    }
    relayed::publish(relayed);
    // Listening sockets among them: listeners of this image's (socket activation, a launcher
    // that execs its server).
    for (_, fd) in sockets {
        crate::service::server::adopt_inherited(fd);
    }
}

/// Takes back one connection; the addresses of one relayed as standard I/O are returned.
fn take_back_one(r: Record, socks: &[i32]) -> Option<Names> {
    let fds = [r.memfd, r.control, r.self_bell];
    // Each must be open, distinct and of its kind (a segment, a socket, an eventfd); then
    // they are ours. Anything else is left as it is, never closed: the numbers may be the
    // application's own (its standard I/O, a socket it inherited).
    let kinds = ["/memfd:colo-seg", "socket:", "anon_inode:[eventfd]"];
    let of_kind = |fd: RawFd, kind: &str| fd >= 0 && std::fs::read_link(format!("/proc/self/fd/{fd}")).is_ok_and(|l| l.to_string_lossy().starts_with(kind));
    if !fds.iter().zip(kinds).all(|(&fd, kind)| of_kind(fd, kind)) || (1..3).any(|i| fds[..i].contains(&fds[i])) {
        log_info(format_args!("exec: a handed-over connection lost its descriptors; dropped"));
        return None;
    }
    // SAFETY: inherited descriptors recorded for this connection, open (checked above), owned
    // by no one else in this image.
    let [memfd, control, self_bell] = fds.map(|fd| unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    // The holders page the earlier image shared (`conn::holders`), in the holders file it
    // handed over (adopted by `take_back`), if that is a page in use there.
    let page = r.holders.and_then(Page::inherited);
    let Some(&first) = socks.first() else {
        // The application closed (or made close-on-exec) the socket before exec: the connection
        // ends here (closing the control socket tells the peer).
        return None;
    };
    let est = match colo::internal::carrier::reattach(memfd, control, self_bell, r.role) {
        Ok(est) => est,
        Err(why) => {
            log_info(format_args!("exec: connection on fd {first} not taken back: {why}"));
            return None;
        }
    };
    // Standard I/O goes through libc's own calls, which the shim never sees (see `stdio`).
    let (est, page) = if stdio::is_stdio(socks) {
        let peer = est.peer;
        match stdio::relay(est, socks, page) {
            Ok(names) => {
                log_info(format_args!("exec: connection to {peer} on fd {first} is standard I/O: relayed over loopback TCP"));
                return names;
            }
            Err(failed) => {
                let (est, why, page) = *failed;
                log_info(format_args!("exec: connection to {peer} on fd {first} is standard I/O, not relayed: {why}"));
                (est, page)
            }
        }
    } else {
        (est, page)
    };
    // SAFETY: the application's socket, open (listed in /proc/self/fd just now).
    let b = unsafe { BorrowedFd::borrow_raw(first) };
    let nonblocking = rustix::fs::fcntl_getfl(b).map(|f| f.contains(rustix::fs::OFlags::NONBLOCK)).unwrap_or(false);
    let peer = est.peer;
    let conn = match Conn::resume(est, nonblocking, page) {
        Ok(c) => Arc::new(c),
        Err(e) => {
            log_info(format_args!("exec: connection to {peer} not taken back: {e}"));
            return None;
        }
    };
    for &fd in socks {
        if let Some(mut slot) = table::lock(fd) {
            slot.set(Entry::Conn(conn.clone()));
        }
    }
    options::adopt_options(first, &conn);
    options::adopt_inq(first, &conn);
    // The record goes into this image's own handover file (and the flag catches up with the
    // descriptors, which came inheritable).
    update(first, &conn);
    log_info(format_args!("exec: connection to {peer} on fd {first} taken back (shared memory)"));
    None
}
