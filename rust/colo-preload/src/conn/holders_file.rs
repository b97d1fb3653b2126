//! This process's *holders file*: one memfd (`colo-holders`) that holds the holders page
//! (`holders::Page`, `SLOT` bytes) of each of its connections in a slot of its own, so that no
//! connection needs a descriptor of its own for it, and eight connections share a memory page.
//!
//! The first memory page holds the allocation bitmap (bit `i`: slot `i` in use; the bits of the
//! first page's own slots always set), taken and given back with compare-and-swap, and the lock
//! of `reclaim`. The whole file is mapped once, shared and writable, at its creation; the
//! mapping, the descriptor and the bitmap go to fork children with the rest of the process, so
//! fork copies allocate from the one bitmap and a connection's slot is the same slot, by index,
//! in every copy. An image exec'd with inheritable connections inherits the descriptor
//! (inheritable only while this process has one: `inheritable`), maps the same file (`adopt`)
//! and finds each connection's slot by the index its handover record names.
//!
//! The file is sized to its capacity at once: a memfd is sparse, so only memory pages with a
//! slot in use hold memory, and no process ever shrinks it under another's mapping. A slot is
//! given back (its bit cleared) when its connection ends (`release`), and a memory page whose
//! every slot is free gives its memory back (`free`); the slots of connections whose every
//! listed holder died without closing are taken back every `RECLAIM_EVERY` allocations of a
//! process and whenever no slot is free (`reclaim`).
//!
//! The descriptor is read-only, in a file of mode 0600 (`record::inheritable_memfd`): a child of
//! another uid exec'd without the shim that inherits it can neither write through it nor open
//! the file again for writing. The next image of this process opens it again for writing
//! through `/proc/self/fd`, which the kernel allows the file's owner only.

use colo_sys::host::alive;
use colo_sys::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32, AtomicU8, AtomicUsize, Ordering};

/// The size in bytes of a slot, a connection's holders page (`holders::Page`): an eighth of a
/// memory page.
pub const SLOT: usize = 512;
/// The first `HOLDERS` words of a slot list the pids of the processes holding its connection
/// (0: none), which `reclaim` looks at.
pub const HOLDERS: usize = 64;

/// The memfd's name (`/proc/PID/fd` shows it; the next image looks for it).
pub const NAME: &str = "colo-holders";

/// The file's length: 8 MiB of address space, mapped once. A program may cap its address space
/// (vsftpd's processes set `RLIMIT_AS`), and the mapping counts against it whether or not its
/// pages hold memory. Beyond `CAPACITY - FIRST` connections held at once, a connection's page is
/// an anonymous one (`holders::Page`), not carried across `exec`.
const LEN: usize = 8 << 20;
/// Slots in the file.
pub const CAPACITY: usize = LEN / SLOT;
const BITMAP_WORDS: usize = CAPACITY / 32;
/// A memory page, and the slots in one (a byte of the bitmap).
const MEMORY_PAGE: usize = 4096;
const PER_PAGE: usize = MEMORY_PAGE / SLOT;
const _: () = assert!(PER_PAGE == 8 && BITMAP_WORDS * 4 + 4 <= MEMORY_PAGE);
/// The first slot handed out: the slots before it are the first memory page, the bitmap's and
/// the lock's.
const FIRST: usize = PER_PAGE;
/// The word of the first memory page that is `reclaim`'s lock (the pid holding it).
const RECLAIM_LOCK: usize = BITMAP_WORDS;

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
/// The effective uid this process had when it made or adopted the file (set before `STATE`
/// becomes `READY`): its owner's.
static OWNER: AtomicU32 = AtomicU32::new(0);
/// Where the next allocation starts looking (a bitmap word).
static HINT: AtomicUsize = AtomicUsize::new(0);
/// Pages this process allocated: every `RECLAIM_EVERY`th allocation reclaims first.
static ALLOCS: AtomicUsize = AtomicUsize::new(0);
const RECLAIM_EVERY: usize = 1024;

/// Word `i` of slot `slot` (`slot` < `CAPACITY`, `i` < `SLOT / 4`; the first memory page's
/// words by slot 0, `i` < `MEMORY_PAGE / 4`), of a ready file.
fn word(base: *mut u8, slot: usize, i: usize) -> &'static AtomicU32 {
    debug_assert!(slot < CAPACITY && (i < SLOT / 4 || slot == 0 && i < MEMORY_PAGE / 4));
    // SAFETY: within the mapping of the whole file (`LEN` bytes), which is never unmapped: the
    // file is this process's for its life; every access to it is atomic.
    unsafe { &*(base.add(slot * SLOT) as *const AtomicU32).add(i) }
}

/// The bitmap word that holds slot `slot`'s bit.
fn bits(base: *mut u8, slot: usize) -> &'static AtomicU32 {
    word(base, 0, slot / 32)
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
    OWNER.store(rustix::process::geteuid().as_raw(), Ordering::Relaxed);
    FD.store(std::mem::ManuallyDrop::new(fd).as_raw_fd(), Ordering::Relaxed);
    // SYNC POINT: Release, with the Acquire loads in `base` and `of_another_uid`.
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
        // The slots of the bitmap's and the lock's memory page are never handed out.
        word(base, 0, 0).store((1 << FIRST) - 1, Ordering::Relaxed);
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

/// Whether this process maps a holders file it made or adopted under another effective uid: the
/// file of a parent it was forked from before it changed uid, which holds that parent's pages
/// (those of its connections then and since) and is writable through this process's mapping.
pub fn of_another_uid() -> bool {
    // SYNC POINT: Acquire, with the Release store of `READY` in `publish`: `OWNER` is set before.
    STATE.load(Ordering::Acquire) == READY && OWNER.load(Ordering::Relaxed) != rustix::process::geteuid().as_raw()
}

/// A fresh slot: its index and its words, zeroed. `None` when there is no file or no free slot.
pub fn alloc() -> Option<(u32, *const AtomicU32)> {
    let base = base()?;
    // Now and then (and whenever no slot is free), the slots of the dead are taken back: a
    // forking server whose children exit without closing their copies leaves one a connection.
    if ALLOCS.fetch_add(1, Ordering::Relaxed) % RECLAIM_EVERY == RECLAIM_EVERY - 1 {
        reclaim(base);
    }
    let found = take_free(base).or_else(|| {
        reclaim(base);
        take_free(base)
    })?;
    // The slot is ours alone: no holder of its last connection is left (`release`, `reclaim`).
    for i in 0..SLOT / 4 {
        word(base, found, i).store(0, Ordering::Relaxed);
    }
    Some((found as u32, word(base, found, 0) as *const AtomicU32))
}

fn take_free(base: *mut u8) -> Option<usize> {
    let start = HINT.load(Ordering::Relaxed);
    for k in 0..BITMAP_WORDS {
        let w = (start + k) % BITMAP_WORDS;
        let bits = word(base, 0, w);
        // A byte of all ones is a memory page being given back by `free`, or in use.
        let mut v = bits.load(Ordering::Relaxed);
        while v != u32::MAX {
            let bit = (!v).trailing_zeros();
            // SYNC POINT: Acquire, with the Release `fetch_and` in `free`: the last holder's
            // use of the slot comes before our zeroing and use of it.
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

/// Gives slot `slot` back (clears its bit), and its memory page's memory once none of the page's
/// slots is in use.
fn free(base: *mut u8, slot: usize) {
    let bits = bits(base, slot);
    // No pid left listed: `reclaim` never takes a free slot (nor one of a page held below).
    for i in 0..HOLDERS {
        word(base, slot, i).store(0, Ordering::Relaxed);
    }
    // SYNC POINT: Release, with the Acquire compare-and-swap in `take_free` (our use of the
    // slot comes before its next holder's zeroing and use) and the Acquire load in `reclaim`.
    let was = bits.fetch_and(!(1 << (slot % 32)), Ordering::Release);
    let shift = (slot % 32) / PER_PAGE * PER_PAGE;
    let page_bits = 0xffu32 << shift;
    let now = was & !(1 << (slot % 32));
    if now & page_bits != 0 {
        return;
    }
    // Every slot of the page free: taken all at once, so that nobody allocates one while the
    // memory goes, then given back. Another thread that took a slot there first keeps it.
    // SYNC POINT: Acquire, with the Release `fetch_and`s of the slots' last frees (this one's
    // above and the others'): their uses come before the memory goes.
    let mut v = now;
    while v & page_bits == 0 {
        match bits.compare_exchange_weak(v, v | page_bits, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => {
                let page = slot / PER_PAGE * PER_PAGE;
                // SAFETY: one memory page of our shared writable mapping of a memfd, none of
                // whose slots is in use (we hold all their bits): its bytes are dropped (read as
                // zeros after).
                unsafe { libc::madvise(base.add(page * SLOT).cast(), MEMORY_PAGE, libc::MADV_REMOVE) };
                // SYNC POINT: Release, with the Acquire compare-and-swap in `take_free`.
                bits.fetch_and(!page_bits, Ordering::Release);
                return;
            }
            Err(seen) => v = seen,
        }
    }
}

/// Slot `index`, handed over by an earlier image: its words, if it is a slot in use.
pub fn at(index: u32) -> Option<*const AtomicU32> {
    let index = index as usize;
    // SYNC POINT: as in `base` (an adopted file only: never made for a handed-over index).
    if STATE.load(Ordering::Acquire) != READY || !(FIRST..CAPACITY).contains(&index) {
        return None;
    }
    let base = BASE.load(Ordering::Relaxed);
    let in_use = bits(base, index).load(Ordering::Relaxed) & 1 << (index % 32) != 0;
    in_use.then(|| word(base, index, 0) as *const AtomicU32)
}

/// The connection of slot `index` ended: the slot is given back.
pub fn release(index: u32) {
    if fd().is_some() && (FIRST..CAPACITY).contains(&(index as usize)) {
        free(BASE.load(Ordering::Relaxed), index as usize);
    }
}

/// Takes back the slots whose listed holders all died (a process that
/// ended without closing its copy). One process at a time (a lock with the pid of its holder,
/// taken over from a dead one); the others go without.
fn reclaim(base: *mut u8) {
    let lock = word(base, 0, RECLAIM_LOCK);
    let me = colo_sys::host::pid();
    let held = lock.load(Ordering::Relaxed);
    if held != 0 && alive(held) {
        return;
    }
    // SYNC POINT: Acquire, with the Release store that unlocks below: the last reclaim's
    // frees come before this one's look at the slots.
    if lock.compare_exchange(held, me, Ordering::Acquire, Ordering::Relaxed).is_err() {
        return;
    }
    for slot in FIRST..CAPACITY {
        // SYNC POINT: Acquire, with the Release `fetch_and` in `free`: a slot seen in use by a
        // page `free` holds is seen with its pids cleared.
        if bits(base, slot).load(Ordering::Acquire) & 1 << (slot % 32) == 0 {
            continue;
        }
        // Relaxed: the pids are the whole message (`holders::Page::add_holder`). A slot with
        // no pid listed is being set up or let go (or is of a memory page `free` holds): never
        // taken.
        let pids = || (0..HOLDERS).map(|i| word(base, slot, i).load(Ordering::Relaxed)).filter(|&p| p != 0);
        if pids().next().is_some() && !pids().any(alive) {
            free(base, slot);
        }
    }
    // SYNC POINT: Release, with the Acquire compare-and-swap above.
    lock.store(0, Ordering::Release);
}

/// One more (`on`) or one fewer of this process's inheritable connections has a slot here: the
/// descriptor is inheritable while there is any.
pub fn inheritable(on: bool) {
    let Some(fd) = fd() else { return };
    let crossed = if on {
        INHERITABLE.fetch_add(1, Ordering::Relaxed) == 0
    } else {
        INHERITABLE.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)) == Ok(1)
    };
    // The flag follows whether the count is zero (close-on-exec as the file is made or adopted,
    // at zero), so only a change that crossed zero sets it: from the count, until the count
    // stays the same across the setting (of two threads that cross at once, the last to look
    // sets what it saw last).
    if !crossed {
        return;
    }
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
