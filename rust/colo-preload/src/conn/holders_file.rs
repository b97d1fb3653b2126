//! This process's *holders file*: one memfd (`colo-holders`) of `CAPACITY` pages that holds the
//! holders page (`holders::Page`) of each of its connections, so that no connection needs a
//! descriptor of its own for it.
//!
//! Page 0 is the allocation bitmap (bit `i`: page `i` in use; bit 0, the bitmap itself, always
//! set), taken and given back with compare-and-swap. The whole file is mapped once, shared and
//! writable, at its creation; the mapping, the descriptor and the bitmap go to fork children
//! with the rest of the process, so fork copies allocate from the one bitmap and a connection's
//! page is the same page, by index, in every copy. An image exec'd with inheritable connections
//! inherits the descriptor (inheritable only while this process has one: `inheritable`), maps
//! the same file (`adopt`) and finds each connection's page by the index its handover record
//! names.
//!
//! The file is sized to its capacity at once: a memfd is sparse, so only pages in use hold
//! memory, and no process ever shrinks it under another's mapping. A page is given back (its
//! memory returned, its bit cleared) when its connection ends (`release`); the pages of
//! connections whose every listed holder died without closing are taken back every
//! `RECLAIM_EVERY` allocations of a process and whenever no page is free (`reclaim`).
//!
//! The descriptor is read-only, in a file of mode 0600 (`record::inheritable_memfd`): a child of
//! another uid exec'd without the shim that inherits it can neither write through it nor open
//! the file again for writing. The next image of this process opens it again for writing
//! through `/proc/self/fd`, which the kernel allows the file's owner only.

use crate::conn::holders::{alive, HOLDERS, PAGE};
use colo_sys::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32, AtomicU8, AtomicUsize, Ordering};

/// The memfd's name (`/proc/PID/fd` shows it; the next image looks for it).
pub const NAME: &str = "colo-holders";

/// Pages in the file (page 0 the bitmap, one bit per page): 8 MiB of address space, mapped once.
/// A program may cap its address space (vsftpd's processes set `RLIMIT_AS`), and the mapping
/// counts against it whether or not its pages hold memory. Beyond this many connections held at
/// once, a connection's page is an anonymous one (`holders::Page`), not carried across `exec`.
pub const CAPACITY: usize = 2048;
const BITMAP_WORDS: usize = CAPACITY / 32;
const LEN: usize = CAPACITY * PAGE;

/// The file's state in this process: none yet, being made, ready, or not to be had.
const NONE: u8 = 0;
const MAKING: u8 = 1;
const READY: u8 = 2;
const FAILED: u8 = 3;
static STATE: AtomicU8 = AtomicU8::new(NONE);
/// The shared mapping of the whole file (set before `STATE` becomes `READY`).
static BASE: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
/// The read-only descriptor of the file.
static FD: AtomicI32 = AtomicI32::new(-1);
/// This process's inheritable connections with a page here: the descriptor is inheritable
/// while there is one.
static INHERITABLE: AtomicUsize = AtomicUsize::new(0);
/// Where the next allocation starts looking (a bitmap word).
static HINT: AtomicUsize = AtomicUsize::new(0);
/// Pages this process allocated: every `RECLAIM_EVERY`th allocation reclaims first.
static ALLOCS: AtomicUsize = AtomicUsize::new(0);
const RECLAIM_EVERY: usize = 1024;

/// Word `i` of page `page` (`page` < `CAPACITY`, `i` < `PAGE / 4`), of a ready file.
fn word(base: *mut u8, page: usize, i: usize) -> &'static AtomicU32 {
    debug_assert!(page < CAPACITY && i < PAGE / 4);
    // SAFETY: within the mapping of the whole file (`LEN` bytes), which is never unmapped: the
    // file is this process's for its life; every access to it is atomic.
    unsafe { &*(base.add(page * PAGE) as *const AtomicU32).add(i) }
}

/// The mapping, if the file is ready (made on first need).
fn base() -> Option<*mut u8> {
    // SYNC POINT: Acquire, with the Release store of `READY` in `make`/`adopt`: `BASE` and `FD`
    // are set before.
    match STATE.load(Ordering::Acquire) {
        READY => Some(BASE.load(Ordering::Relaxed)),
        NONE => make(),
        _ => None,
    }
}

/// `/proc/self/fd/N` of `fd`, on the stack (no allocation: this may run in a forked child).
fn reopen(fd: RawFd, flags: rustix::fs::OFlags) -> Option<OwnedFd> {
    let mut path = [0u8; 32];
    let mut cur = std::io::Cursor::new(&mut path[..31]);
    std::io::Write::write_fmt(&mut cur, format_args!("/proc/self/fd/{fd}")).ok()?;
    let path = std::ffi::CStr::from_bytes_until_nul(&path).ok()?;
    rustix::fs::open(path, flags | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty()).ok()
}

/// Maps the whole of the file open for writing in `w`.
fn map(w: &OwnedFd) -> Option<*mut u8> {
    // SAFETY: a fresh shared mapping of the file, which is `LEN` bytes long; never unmapped.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), LEN, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_NORESERVE, w.as_raw_fd(), 0)
    };
    (p != libc::MAP_FAILED).then_some(p as *mut u8)
}

fn publish(base: *mut u8, fd: OwnedFd) {
    BASE.store(base, Ordering::Relaxed);
    FD.store(std::mem::ManuallyDrop::new(fd).as_raw_fd(), Ordering::Relaxed);
    // SYNC POINT: Release, with the Acquire load in `base`.
    STATE.store(READY, Ordering::Release);
}

/// Makes the file (one thread does; another that finds it being made goes without).
fn make() -> Option<*mut u8> {
    if STATE.compare_exchange(NONE, MAKING, Ordering::Relaxed, Ordering::Relaxed).is_err() {
        // SYNC POINT: as in `base`.
        return (STATE.load(Ordering::Acquire) == READY).then(|| BASE.load(Ordering::Relaxed));
    }
    let made = (|| {
        let (w, r) = crate::record::inheritable_memfd(NAME)?;
        rustix::fs::ftruncate(&w, LEN as u64).ok()?;
        let base = map(&w)?;
        // The bitmap's own page and the lock's are never handed out.
        word(base, 0, 0).store(1, Ordering::Relaxed);
        word(base, 0, RECLAIM_PAGE / 32).store(1 << (RECLAIM_PAGE % 32), Ordering::Relaxed);
        Some((base, r))
    })();
    match made {
        Some((base, r)) => {
            publish(base, r);
            Some(base)
        }
        None => {
            STATE.store(FAILED, Ordering::Relaxed);
            None
        }
    }
}

/// In the shim's constructor, before any connection: the holders file an earlier image handed
/// over in `fd` becomes this process's, if it is one (a memfd of ours: our uid's, mode 0600,
/// of the file's size). Else it is closed, and the connections handed over get pages of their
/// own.
pub fn adopt(fd: OwnedFd) -> bool {
    let Ok(st) = rustix::fs::fstat(&fd) else { return false };
    let ours = st.st_mode & libc::S_IFMT == libc::S_IFREG
        && st.st_mode & 0o077 == 0
        && st.st_uid == rustix::process::geteuid().as_raw()
        && st.st_size as u64 == LEN as u64;
    if !ours || STATE.compare_exchange(NONE, MAKING, Ordering::Relaxed, Ordering::Relaxed).is_err() {
        return false;
    }
    // Mapped for writing through a descriptor opened again for writing, which only the owner
    // of a 0600 file gets; closed once mapped.
    let Some(base) = reopen(fd.as_raw_fd(), rustix::fs::OFlags::RDWR).and_then(|w| map(&w)) else {
        // A file of this image's own is made at its first connection.
        STATE.store(NONE, Ordering::Relaxed);
        return false;
    };
    let _ = rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC);
    publish(base, fd);
    true
}

/// The descriptor of the file, if this process has one.
pub fn fd() -> Option<RawFd> {
    // SYNC POINT: as in `base`.
    (STATE.load(Ordering::Acquire) == READY).then(|| FD.load(Ordering::Relaxed))
}

/// A fresh page: its index and its words, zeroed. `None` when there is no file or no free page.
pub fn alloc() -> Option<(u32, *const AtomicU32)> {
    let base = base()?;
    // Now and then (and whenever no page is free), the pages of the dead are taken back: a
    // forking server whose children exit without closing their copies leaves one a connection.
    if ALLOCS.fetch_add(1, Ordering::Relaxed) % RECLAIM_EVERY == RECLAIM_EVERY - 1 {
        reclaim(base);
    }
    let found = take_free(base).or_else(|| {
        reclaim(base);
        take_free(base)
    })?;
    // The page is ours alone: no holder of its last connection is left (`release`, `reclaim`).
    for i in 0..PAGE / 4 {
        word(base, found, i).store(0, Ordering::Relaxed);
    }
    Some((found as u32, word(base, found, 0) as *const AtomicU32))
}

fn take_free(base: *mut u8) -> Option<usize> {
    let start = HINT.load(Ordering::Relaxed);
    for k in 0..BITMAP_WORDS {
        let w = (start + k) % BITMAP_WORDS;
        let bits = word(base, 0, w);
        let mut v = bits.load(Ordering::Relaxed);
        while v != u32::MAX {
            let bit = (!v).trailing_zeros();
            // SYNC POINT: Acquire, with the Release `fetch_and` in `free`: the last holder's
            // use of the page comes before our zeroing and use of it.
            match bits.compare_exchange_weak(v, v | 1 << bit, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => {
                    HINT.store(w, Ordering::Relaxed);
                    return Some(w * 32 + bit as usize);
                }
                Err(now) => v = now,
            }
        }
    }
    None
}

/// Returns page `page`'s memory and clears its bit.
fn free(base: *mut u8, page: usize) {
    // SAFETY: one page of our shared writable mapping of a memfd, whose connection has no
    // holder left: its bytes are dropped (read as zeros after).
    unsafe { libc::madvise(base.add(page * PAGE).cast(), PAGE, libc::MADV_REMOVE) };
    // SYNC POINT: Release, with the Acquire compare-and-swap in `take_free`.
    word(base, 0, page / 32).fetch_and(!(1 << (page % 32)), Ordering::Release);
}

/// Page `index`, handed over by an earlier image: its words, if it is a page in use.
pub fn at(index: u32) -> Option<*const AtomicU32> {
    let index = index as usize;
    // SYNC POINT: as in `base` (an adopted file only: never made for a handed-over index).
    if STATE.load(Ordering::Acquire) != READY || index == 0 || index >= RECLAIM_PAGE {
        return None;
    }
    let base = BASE.load(Ordering::Relaxed);
    let in_use = word(base, 0, index / 32).load(Ordering::Relaxed) & 1 << (index % 32) != 0;
    in_use.then(|| word(base, index, 0) as *const AtomicU32)
}

/// The connection of page `index` ended: the page is given back.
pub fn release(index: u32) {
    if fd().is_some() && (1..RECLAIM_PAGE).contains(&(index as usize)) {
        free(BASE.load(Ordering::Relaxed), index as usize);
    }
}

/// The page whose first word is `reclaim`'s lock (the pid holding it): the last, never handed
/// out (its bit is set when the file is made).
const RECLAIM_PAGE: usize = CAPACITY - 1;

/// Takes back the pages whose listed holders all died (a process that
/// ended without closing its copy). One process at a time (a lock with the pid of its holder,
/// taken over from a dead one); the others go without.
fn reclaim(base: *mut u8) {
    let lock = word(base, RECLAIM_PAGE, 0);
    let me = colo_sys::host::pid();
    let held = lock.load(Ordering::Relaxed);
    if held != 0 && alive(held) {
        return;
    }
    // SYNC POINT: Acquire, with the Release store that unlocks below: the last reclaim's
    // frees come before this one's look at the pages.
    if lock.compare_exchange(held, me, Ordering::Acquire, Ordering::Relaxed).is_err() {
        return;
    }
    for page in 1..RECLAIM_PAGE {
        if word(base, 0, page / 32).load(Ordering::Relaxed) & 1 << (page % 32) == 0 {
            continue;
        }
        // Relaxed: the pids are the whole message (`holders::Page::add_holder`). A page with
        // no pid listed is being set up or let go: never taken.
        let pids = || (0..HOLDERS).map(|i| word(base, page, i).load(Ordering::Relaxed)).filter(|&p| p != 0);
        if pids().next().is_some() && !pids().any(alive) {
            free(base, page);
        }
    }
    // SYNC POINT: Release, with the Acquire compare-and-swap above.
    lock.store(0, Ordering::Release);
}

/// One more (`on`) or one fewer of this process's inheritable connections has a page here: the
/// descriptor is inheritable while there is any.
pub fn inheritable(on: bool) {
    let Some(fd) = fd() else { return };
    if on {
        INHERITABLE.fetch_add(1, Ordering::Relaxed);
    } else {
        let _ = INHERITABLE.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }
    // Set from the count, until the count stays the same across the setting: of two threads
    // that change it at once, the last to look sets what it saw last.
    loop {
        let n = INHERITABLE.load(Ordering::Relaxed);
        let flags = if n > 0 { rustix::io::FdFlags::empty() } else { rustix::io::FdFlags::CLOEXEC };
        // SAFETY: the file's descriptor, open for the life of the process.
        let _ = rustix::io::fcntl_setfd(unsafe { colo_sys::BorrowedFd::borrow_raw(fd) }, flags);
        if INHERITABLE.load(Ordering::Relaxed) == n {
            break;
        }
    }
}
