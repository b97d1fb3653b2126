//! Accelerated connections across `exec`.
//!
//! A program that execs keeps its inheritable descriptors (those without `FD_CLOEXEC`); an
//! accelerated socket among them is only half of a connection: its payload moves through the
//! segment. So a connection whose application socket is inheritable keeps its own descriptors
//! (segment memfd, control socket, doorbell and self bell) inheritable too, and is listed in this process's
//! *handover file*: an inheritable memfd named `colo-handover` with one record per such
//! connection. The shim's constructor in the new program image finds the file among its
//! descriptors, takes each connection back (the record names the socket by inode; the rings
//! continue where they are) and closes what no socket claims any more.
//!
//! A program that cannot be preloaded (static, setuid) inherits the socket without the shim:
//! nothing reaches it over TCP, as nothing would reach a program that inherited half a pipe.
//! `colo run` warns about such programs.

use crate::conn::state::Conn;
use crate::conn::table::{self, Entry};
#[cfg(test)]
use colo::segment::Role;
use colo_sys::{BorrowedFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

// The record format alone, in a file of its own: the fuzz target `handover_record` (rust/fuzz)
// compiles this very file, since a cdylib cannot be linked into it.
mod record;
use record::{Record, RECORD_LEN};

const FILE_NAME: &str = "colo-handover";

/// This process's handover file: record `i` at offset `32 * i`; a free slot is all zeros.
struct File {
    /// The process that created it (a forked child writes a file of its own).
    pid: u32,
    fd: OwnedFd,
    slots: Vec<Option<Record>>,
}

static FILE: Mutex<Option<File>> = Mutex::new(None);

fn lock() -> std::sync::MutexGuard<'static, Option<File>> {
    FILE.lock().unwrap_or_else(|e| e.into_inner())
}

fn write_slot(f: &File, i: usize) {
    let bytes = f.slots[i].map_or([0u8; RECORD_LEN], |r| r.encode());
    let _ = rustix::io::pwrite(&f.fd, &bytes, (i * RECORD_LEN) as u64);
}

/// This process's own file (a forked child copies its parent's records into a new one).
fn own(file: &mut Option<File>) -> Option<&mut File> {
    let me = colo_sys::host::pid();
    if file.as_ref().is_none_or(|f| f.pid != me) {
        let fd = rustix::fs::memfd_create(FILE_NAME, rustix::fs::MemfdFlags::empty()).ok()?;
        let fd = colo_sys::preload::move_above(fd, colo::carrier::fd_floor()).ok()?;
        // Inheritable: the point of the file is to survive exec.
        rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::empty()).ok()?;
        // Only now, so that a failure above keeps the records.
        let slots: Vec<Option<Record>> = file.take().map(|f| f.slots).unwrap_or_default();
        let f = File { pid: me, fd, slots };
        for i in 0..f.slots.len() {
            write_slot(&f, i);
        }
        *file = Some(f);
    }
    file.as_mut()
}

/// In a fork child: write our own handover file now, so that the parent's later changes to
/// its file (closing its copies of the connections) do not reach an `exec` of ours.
pub fn atfork_child() {
    // A lock held by a thread that no longer exists: leave it (the next change retries).
    let Ok(mut file) = FILE.try_lock() else { return };
    if file.as_ref().is_some_and(|f| f.slots.iter().any(Option::is_some)) {
        own(&mut file);
    }
}

fn cloexec(fd: BorrowedFd<'_>) -> bool {
    rustix::io::fcntl_getfd(fd).map(|f| f.contains(rustix::io::FdFlags::CLOEXEC)).unwrap_or(true)
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

/// After an accept or connect that created `conn` for `fd`: no scan needed (one descriptor).
pub fn on_new(fd: i32, conn: &Arc<Conn>) {
    // SAFETY: the application's descriptor, open during this call.
    let b = unsafe { BorrowedFd::borrow_raw(fd) };
    if !cloexec(b) {
        set(conn, true, b);
    }
}

fn set(conn: &Conn, inheritable: bool, sock: BorrowedFd<'_>) {
    if conn.inheritable() == inheritable {
        return;
    }
    conn.set_inheritable(inheritable);
    let [control, own_bell, self_bell, memfd] = conn.fds();
    if !inheritable {
        forget(memfd, false);
        return;
    }
    let Ok(st) = rustix::fs::fstat(sock) else { return };
    let r = Record { sock_ino: st.st_ino, memfd, control, own_bell, self_bell, role: conn.shm().role() };
    let mut file = lock();
    let Some(f) = own(&mut file) else { return };
    let i = match f.slots.iter().position(Option::is_none) {
        Some(i) => i,
        None => {
            f.slots.push(None);
            f.slots.len() - 1
        }
    };
    f.slots[i] = Some(r);
    write_slot(f, i);
}

/// A connection is going away (or stops being inheritable): drop its record. `shared`: another
/// process (a child that exec'd and may not have read the file yet) still holds it: this process
/// moves to a fresh copy of its file first, and the inherited one stays as it is.
pub fn forget(memfd: RawFd, shared: bool) {
    let mut file = lock();
    if !file.as_ref().is_some_and(|f| f.slots.iter().flatten().any(|r| r.memfd == memfd)) {
        return;
    }
    if shared {
        if let Some(f) = file.as_mut() {
            f.pid = 0; // `own` makes a new file
        }
    }
    let Some(f) = own(&mut file) else { return };
    if let Some(i) = f.slots.iter().position(|r| r.is_some_and(|r| r.memfd == memfd)) {
        f.slots[i] = None;
        write_slot(f, i);
    }
}

/// An inheritable connection is closing: its descriptors become close-on-exec at once, since the
/// segment's is closed later, by the reaper thread, and an `exec` in between (a forked child's)
/// would carry them into an image that has no record of them and never closes them.
pub fn closing(raw: &[RawFd]) {
    for &fd in raw {
        // SAFETY: the connection's own descriptors, open until its drop closes or retires them;
        // the flag is this process's, per descriptor.
        let _ = rustix::io::fcntl_setfd(unsafe { BorrowedFd::borrow_raw(fd) }, rustix::io::FdFlags::CLOEXEC);
    }
}

/// In the shim's constructor: takes back the connections an earlier image of this process
/// handed over.
pub fn take_back() {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return };
    let mut files = Vec::new();
    let mut sockets: Vec<(u64, i32)> = Vec::new();
    for e in dir.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        let Ok(link) = std::fs::read_link(e.path()) else { continue };
        let link = link.to_string_lossy();
        if link.starts_with(&format!("/memfd:{FILE_NAME}")) {
            files.push(fd);
        } else if let Some(ino) = link.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
            if let Ok(ino) = ino.parse() {
                sockets.push((ino, fd));
            }
        }
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
        records.extend(buf.chunks_exact(RECORD_LEN).filter_map(Record::decode));
    }
    for r in records {
        let socks: Vec<i32> = sockets.iter().filter(|(ino, _)| *ino == r.sock_ino).map(|(_, fd)| *fd).collect();
        take_back_one(r, &socks);
    }
}

fn take_back_one(r: Record, socks: &[i32]) {
    let fds = [r.memfd, r.control, r.own_bell, r.self_bell];
    // Each must be open and distinct; then they are ours.
    // SAFETY: only asks the kernel about the number; a closed one gives EBADF.
    let open = |fd: RawFd| fd >= 0 && rustix::io::fcntl_getfd(unsafe { BorrowedFd::borrow_raw(fd) }).is_ok();
    if !fds.iter().all(|&fd| open(fd)) || (1..4).any(|i| fds[..i].contains(&fds[i])) {
        crate::base::log::log_info(format_args!("exec: a handed-over connection lost its descriptors; dropped"));
        return;
    }
    // SAFETY: inherited descriptors recorded for this connection, open (checked above), owned
    // by no one else in this image.
    let [memfd, control, own_bell, self_bell] = fds.map(|fd| unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    let Some(&first) = socks.first() else {
        // The application closed (or made close-on-exec) the socket before exec: the connection
        // ends here (closing the control socket tells the peer).
        return;
    };
    let est = match colo::carrier::reattach(memfd, control, own_bell, self_bell, r.role) {
        Ok(est) => est,
        Err(why) => {
            crate::base::log::log_info(format_args!("exec: connection on fd {first} not taken back: {why}"));
            return;
        }
    };
    // Standard I/O goes through libc's own calls, which the shim never sees (see `stdio`).
    let est = if crate::service::stdio::is_stdio(socks) {
        let peer = est.peer;
        match crate::service::stdio::relay(est, socks) {
            Ok(()) => {
                crate::base::log::log_info(format_args!("exec: connection to {peer} on fd {first} is standard I/O: relayed over loopback TCP"));
                return;
            }
            Err(failed) => {
                let (est, why) = *failed;
                crate::base::log::log_info(format_args!("exec: connection to {peer} on fd {first} is standard I/O, not relayed: {why}"));
                est
            }
        }
    } else {
        est
    };
    // SAFETY: the application's socket, open (listed in /proc/self/fd just now).
    let b = unsafe { BorrowedFd::borrow_raw(first) };
    let nonblocking = rustix::fs::fcntl_getfl(b).map(|f| f.contains(rustix::fs::OFlags::NONBLOCK)).unwrap_or(false);
    let peer = est.peer;
    let conn = match Conn::resume(est, nonblocking) {
        Ok(c) => Arc::new(c),
        Err(e) => {
            crate::base::log::log_info(format_args!("exec: connection to {peer} not taken back: {e}"));
            return;
        }
    };
    for &fd in socks {
        if let Some(mut slot) = table::lock(fd) {
            slot.set(Entry::Conn(conn.clone()));
        }
    }
    crate::api::semantics::adopt_options(first, &conn);
    // The record goes into this image's own handover file (and the flag catches up with the
    // descriptors, which came inheritable).
    update(first, &conn);
    crate::base::log::log_info(format_args!("exec: connection to {peer} on fd {first} taken back (shared memory)"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let r = Record { sock_ino: 0x1234_5678_9abc, memfd: 900, control: 901, own_bell: 902, self_bell: 903, role: Role::Server };
        assert_eq!(Record::decode(&r.encode()), Some(r));
        let mut bad = r.encode();
        bad[24] = 7;
        assert_eq!(Record::decode(&bad), None);
    }
}
