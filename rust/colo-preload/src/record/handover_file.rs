//! This process's *handover file* (see `service::handover`): an inheritable memfd named
//! `colo-handover` with one record per accelerated connection whose descriptors survive `exec`.
//! Kept up to date as connections become inheritable and close; read by the next program image.

use super::marker::{ForkLock, ForkLockGuard};
use colo_sys::{BorrowedFd, OwnedFd, RawFd};
use std::sync::{Mutex, MutexGuard};

// The record format alone, in a file of its own: the fuzz target `handover_record` (rust/fuzz)
// compiles this very file, since a cdylib cannot be linked into it.
pub mod record;
use record::{Record, RECORD_LEN};

pub const FILE_NAME: &str = "colo-handover";

/// This process's handover file: record `i` at offset `32 * i`; a free slot is all zeros.
///
/// A file is changed in place only by the process that made it, and only while no fork came
/// since (`forks`): a fork child inherits the file as it stood at the fork, which is what an
/// `exec` of the child (a raw system call too) must read until the child changes a record
/// itself. So the first change after a fork, on either side, goes to a fresh copy; a child
/// whose last record goes away lets go of the inherited file instead (no file: nothing to take
/// back after an `exec`).
struct File {
    /// The process that created it (a forked child writes a file of its own).
    pid: u32,
    /// `colo_sys::host::forks()` when it was made.
    forks: u64,
    /// Written through (close-on-exec).
    fd: OwnedFd,
    /// What the next image inherits: read-only, in a file only this uid may open for writing
    /// (`super::inheritable_memfd`). Kept open for as long as the file is this process's.
    _inherited: OwnedFd,
    slots: Vec<Option<Record>>,
}

static FILE: Mutex<Option<File>> = Mutex::new(None);

/// Taken before `FILE` and held by the shim's `pthread_atfork` handlers across every `fork`
/// (`fork_prepare`, `fork_parent`, `fork_child`): `FILE` is then never locked at a fork, and a
/// fork child's first change of the file cannot wait forever for a lock that another thread of
/// its parent held at the fork (`tests/apps/c/fork_handover_lock.c`).
static FORK_LOCK: ForkLock = ForkLock::new();

/// `FILE`, locked (field order: `FILE` is let go of before `FORK_LOCK`).
struct Locked {
    file: MutexGuard<'static, Option<File>>,
    _fork: ForkLockGuard<'static>,
}

fn lock() -> Locked {
    let fork = FORK_LOCK.hold();
    Locked { file: FILE.lock().unwrap_or_else(|e| e.into_inner()), _fork: fork }
}

/// From the shim's `pthread_atfork` prepare handler: no thread is inside a change of the file
/// during the fork.
pub fn fork_prepare() {
    FORK_LOCK.acquire();
}

/// From the parent's `pthread_atfork` handler.
pub fn fork_parent() {
    FORK_LOCK.release();
}

/// From the child's `pthread_atfork` handler.
#[link_section = "colo_fork_text"]
pub fn fork_child() {
    FORK_LOCK.release();
}

fn write_slot(f: &File, i: usize) {
    let bytes = f.slots[i].map_or([0u8; RECORD_LEN], |r| r.encode());
    let _ = rustix::io::pwrite(&f.fd, &bytes, (i * RECORD_LEN) as u64);
}

/// Whether `f` is this process's to change in place (see `File`).
fn is_own(f: &File) -> bool {
    f.pid == colo_sys::host::pid() && f.forks == colo_sys::host::forks()
}

/// This process's own file (after a fork, a fresh one with the same records).
fn own(file: &mut Option<File>) -> Option<&mut File> {
    let me = colo_sys::host::pid();
    if file.as_ref().is_none_or(|f| !is_own(f)) {
        let (fd, inherited) = super::inheritable_memfd(FILE_NAME)?;
        // Inheritable: the point of the file is to survive exec.
        if !super::let_inherit(&inherited) {
            return None;
        }
        // Only now, so that a failure above keeps the records.
        let slots: Vec<Option<Record>> = file.take().map(|f| f.slots).unwrap_or_default();
        let f = File { pid: me, forks: colo_sys::host::forks(), fd, _inherited: inherited, slots };
        for i in 0..f.slots.len() {
            write_slot(&f, i);
        }
        *file = Some(f);
    }
    file.as_mut()
}

/// Lists the inheritable connection `r` in this process's own file.
pub fn add(r: Record) {
    let mut locked = lock();
    let Some(f) = own(&mut locked.file) else { return };
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
    let mut locked = lock();
    let file = &mut *locked.file;
    if !file.as_ref().is_some_and(|f| f.slots.iter().flatten().any(|r| r.memfd == memfd)) {
        return;
    }
    // The last record of a file not to be changed (not ours since a fork: a fork child closing
    // the one connection it served, or its parent closing its copy; or another process holds
    // the connection): let go of the file; an `exec` then finds none, as it should.
    if file.as_ref().is_some_and(|f| (shared || !is_own(f)) && f.slots.iter().flatten().all(|r| r.memfd == memfd)) {
        *file = None;
        return;
    }
    if shared {
        if let Some(f) = file.as_mut() {
            f.pid = 0; // `own` makes a new file
        }
    }
    let Some(f) = own(file) else { return };
    if let Some(i) = f.slots.iter().position(|r| r.is_some_and(|r| r.memfd == memfd)) {
        f.slots[i] = None;
        write_slot(f, i);
    }
}

/// An inheritable connection is closing: the segment's descriptor `memfd` becomes close-on-exec
/// at once, since it is closed later, by the reaper thread, and an `exec` in between (a forked
/// child's) would carry it into an image that has no record of it and never closes it. (The
/// connection's other descriptors are closed by the same drop, as its record was forgotten.)
pub fn closing(memfd: RawFd) {
    // SAFETY: the connection's own descriptor, open until its drop retires it; the flag is this
    // process's, per descriptor.
    let _ = rustix::io::fcntl_setfd(unsafe { BorrowedFd::borrow_raw(memfd) }, rustix::io::FdFlags::CLOEXEC);
}

#[cfg(test)]
mod tests {
    use super::*;
    use colo::internal::segment::Role;

    #[test]
    fn records_round_trip() {
        let r = Record { sock_ino: 0x1234_5678_9abc, memfd: 900, control: 901, self_bell: 902, role: Role::Server, holders: None };
        assert_eq!(Record::decode(&r.encode()), Some(r));
        let with_page = Record { holders: Some(904), ..r };
        assert_eq!(Record::decode(&with_page.encode()), Some(with_page));
        let mut bad = r.encode();
        bad[24] = 7;
        assert_eq!(Record::decode(&bad), None);
    }
}
