//! This process's *handover file* (see `service::handover`): an inheritable memfd named
//! `colo-handover` with one record per accelerated connection whose descriptors survive `exec`.
//! Kept up to date as connections become inheritable and close; read by the next program image.

use colo_sys::{BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

// The record format alone, in a file of its own: the fuzz target `handover_record` (rust/fuzz)
// compiles this very file, since a cdylib cannot be linked into it.
pub mod record;
use record::{Record, RECORD_LEN};

pub const FILE_NAME: &str = "colo-handover";

/// This process's handover file: record `i` at offset `32 * i`; a free slot is all zeros.
struct File {
    /// The process that created it (a forked child writes a file of its own).
    pid: u32,
    /// Written through (close-on-exec).
    fd: OwnedFd,
    /// What the next image inherits: read-only, in a file only this uid may open for writing
    /// (`super::inheritable_memfd`). Kept open for as long as the file is this process's.
    _inherited: OwnedFd,
    slots: Vec<Option<Record>>,
}

// Tried by every fork child that had records: kept with what the fork handlers write (see
// `colo_sys::host`).
#[link_section = "colo_fork"]
static FILE: Mutex<Option<File>> = Mutex::new(None);
/// Whether a record was ever added here: until then a fork child leaves `FILE` unwritten (a
/// page written in the child costs it a copy).
static EVER: AtomicBool = AtomicBool::new(false);

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
        let (fd, inherited) = super::inheritable_memfd(FILE_NAME)?;
        // Inheritable: the point of the file is to survive exec.
        if !super::let_inherit(&inherited) {
            return None;
        }
        // Only now, so that a failure above keeps the records.
        let slots: Vec<Option<Record>> = file.take().map(|f| f.slots).unwrap_or_default();
        let f = File { pid: me, fd, _inherited: inherited, slots };
        for i in 0..f.slots.len() {
            write_slot(&f, i);
        }
        *file = Some(f);
    }
    file.as_mut()
}

/// In a fork child: write our own handover file now, so that the parent's later changes to
/// its file (closing its copies of the connections) do not reach an `exec` of ours.
#[link_section = "colo_fork_text"]
pub fn atfork_child() {
    if !EVER.load(Ordering::Relaxed) {
        return;
    }
    // A lock held by a thread that no longer exists: leave it (the next change retries).
    let Ok(mut file) = FILE.try_lock() else { return };
    if file.as_ref().is_some_and(|f| f.slots.iter().any(Option::is_some)) {
        own(&mut file);
    }
}

/// Lists the inheritable connection `r` in this process's own file.
pub fn add(r: Record) {
    // Relaxed: read in a fork child, whose copy of memory has every store made before the fork.
    EVER.store(true, Ordering::Relaxed);
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
