//! The per-fd table: one atomic kind byte per fd (the only cost for a non-colo fd) and, for the
//! few fds that are colo's, an entry behind a per-fd mutex. Fds at or above [`MAX_FD`] are never
//! accelerated (they stay plain TCP).

use crate::conn::entry::{Dialing, Guest, Listen, Owed, Pending};
use crate::conn::state::Conn;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

pub const MAX_FD: usize = 1 << 16;

pub const NONE: u8 = 0;
pub const CONN: u8 = 1;
pub const PENDING: u8 = 2;
pub const LISTEN: u8 = 3;
pub const GUEST: u8 = 4;

pub enum Entry {
    None,
    Conn(Arc<Conn>),
    Pending(Box<Pending>),
    /// Kind `PENDING` too: each is decided (or its answer taken) by `client::resolve`.
    Dialing(Box<Dialing>),
    Owed(Box<Owed>),
    Listen(Arc<Listen>),
    Guest(Arc<Guest>),
}

impl Entry {
    fn kind(&self) -> u8 {
        match self {
            Entry::None => NONE,
            Entry::Conn(_) => CONN,
            Entry::Pending(_) | Entry::Dialing(_) | Entry::Owed(_) => PENDING,
            Entry::Listen(_) => LISTEN,
            Entry::Guest(_) => GUEST,
        }
    }
}

static KIND: [AtomicU8; MAX_FD] = [const { AtomicU8::new(0) }; MAX_FD];
/// One past the highest fd whose kind was ever set to anything but NONE: the scans of
/// `fds_of_kind` stop there. A process that forks per connection (postgres, inetd-style
/// servers) scans on every fork in the parent and in the child, and its descriptors are low.
static TOP: AtomicUsize = AtomicUsize::new(0);
/// TCP sockets this process made with `socket(2)` that have not connected yet: the only fds
/// `connect` may accelerate, so the only ones whose epoll registrations the shim records (see
/// `poll::note_plain`). A mark left on a number whose socket was closed behind the shim's back
/// (`fclose`, `close_range`) and reused by a non-socket only costs that fd the recording; a
/// socket made some other way (a raw system call, inherited across `exec`) stays plain TCP.
static FRESH: [AtomicU8; MAX_FD] = [const { AtomicU8::new(0) }; MAX_FD];
/// epoll fds in which a colo connection was ever registered.
static EPOLL: [AtomicU8; MAX_FD] = [const { AtomicU8::new(0) }; MAX_FD];
/// Registrations of connections in each epoll fd (see `regs_in`).
static REGS_IN: [AtomicU32; MAX_FD] = [const { AtomicU32::new(0) }; MAX_FD];
/// Threads now asleep in the kernel on each epoll fd (an interest change must wake them).
static SLEEPERS: [AtomicU32; MAX_FD] = [const { AtomicU32::new(0) }; MAX_FD];
static SLOTS: Slots = Slots([const { SlotCell { lock: UnsafeCell::new(Mutex::new(Entry::None)), taken: AtomicU8::new(0) } }; MAX_FD]);
/// The slots, a page's worth of them at a time (`SLOTS_PER_PAGE`) on a page of their own.
#[repr(C, align(4096))]
struct Slots([SlotCell; MAX_FD]);
const SLOTS_PER_PAGE: usize = 4096 / std::mem::size_of::<SlotCell>();
const _: () = assert!(4096 % std::mem::size_of::<SlotCell>() == 0);
/// Per page of slots: whether one of them was ever locked through [`lock`] (`forked` reads only
/// those pages: reading a page never touched would cost a fork child a fault).
static LOCKED_PAGES: [AtomicU8; MAX_FD / SLOTS_PER_PAGE] = [const { AtomicU8::new(0) }; MAX_FD / SLOTS_PER_PAGE];

/// A slot's entry, and whether a thread of this process image may hold it.
struct SlotCell {
    /// Written over only by `forked`, in a fork child that has one thread.
    lock: UnsafeCell<Mutex<Entry>>,
    /// Set before a thread takes `lock` through [`lock`] and left set (cleared only by `forked`
    /// in a fork child): a fork at any moment of a hold finds it set. 0: no thread has taken the
    /// lock so since the last fork (a brief `try_lock`, the fork guards do not count).
    taken: AtomicU8,
}

// SAFETY: shared as the `Mutex` inside is; the cell is written only by `forked`, in a process
// with one thread and no reference into it.
unsafe impl Sync for SlotCell {}

impl SlotCell {
    fn mutex(&self) -> &Mutex<Entry> {
        // SAFETY: the cell is written only by `forked`, while no reference into it is alive.
        unsafe { &*self.lock.get() }
    }
}

#[inline]
pub fn kind(fd: i32) -> u8 {
    if fd < 0 || fd as usize >= MAX_FD {
        return NONE;
    }
    // SYNC POINT with the Release store in `Slot::set`: a kind seen is one whose entry was
    // stored before it (a reader still takes the slot's lock to use the entry).
    KIND[fd as usize].load(Ordering::Acquire)
}

#[inline]
pub fn is_fresh(fd: i32) -> bool {
    fd >= 0 && (fd as usize) < MAX_FD && FRESH[fd as usize].load(Ordering::Relaxed) != 0
}

#[inline]
pub fn set_fresh(fd: i32, on: bool) {
    // Looked at before it is written: a page written after a fork costs the process a copy (a
    // server that forks per connection accepts after each fork).
    if fd >= 0 && (fd as usize) < MAX_FD && FRESH[fd as usize].load(Ordering::Relaxed) != on as u8 {
        FRESH[fd as usize].store(on as u8, Ordering::Relaxed);
    }
}

#[inline]
pub fn is_epoll(fd: i32) -> bool {
    fd >= 0 && (fd as usize) < MAX_FD && EPOLL[fd as usize].load(Ordering::Relaxed) != 0
}

pub fn set_epoll(fd: i32, on: bool) {
    if fd >= 0 && (fd as usize) < MAX_FD {
        EPOLL[fd as usize].store(on as u8, Ordering::Relaxed);
    }
}

/// Adds one to (`up`) or takes one from `counters[fd]`.
fn bump(counters: &[AtomicU32; MAX_FD], fd: i32, up: bool) {
    if fd >= 0 && (fd as usize) < MAX_FD {
        let c = &counters[fd as usize];
        if up {
            c.fetch_add(1, Ordering::Relaxed);
        } else {
            c.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Counts a registration of a connection in epoll set `epfd` made (`add`) or removed.
pub fn count_regs(epfd: i32, add: bool) {
    bump(&REGS_IN, epfd, add);
}

/// How many registrations of connections epoll set `epfd` has (deleted ones included, until
/// their fd closes); out of range: as if some, so that its waits go the long way.
#[inline]
pub fn regs_in(epfd: i32) -> u32 {
    if epfd >= 0 && (epfd as usize) < MAX_FD {
        REGS_IN[epfd as usize].load(Ordering::Relaxed)
    } else {
        1
    }
}

/// Counts a thread going to sleep on epoll fd `fd` (`on`) or waking from it.
pub fn set_sleeping(fd: i32, on: bool) {
    bump(&SLEEPERS, fd, on);
}

/// Whether a thread may be asleep in the kernel on epoll fd `fd`.
pub fn has_sleepers(fd: i32) -> bool {
    fd >= 0 && (fd as usize) < MAX_FD && SLEEPERS[fd as usize].load(Ordering::Relaxed) != 0
}

/// A locked slot; writing through it keeps the kind byte in step.
pub struct Slot {
    fd: usize,
    guard: MutexGuard<'static, Entry>,
}

impl Slot {
    pub fn entry(&mut self) -> &mut Entry {
        &mut self.guard
    }
    pub fn set(&mut self, e: Entry) -> Entry {
        if e.kind() != NONE {
            // Relaxed, as the scans' loads of the kind bytes: a scan racing the first set of a
            // higher fd may miss it either way.
            TOP.fetch_max(self.fd + 1, Ordering::Relaxed);
        }
        // SYNC POINT with the Acquire load in `kind`.
        KIND[self.fd].store(e.kind(), Ordering::Release);
        std::mem::replace(&mut *self.guard, e)
    }
    pub fn take(&mut self) -> Entry {
        self.set(Entry::None)
    }
    /// Takes the entry out but keeps publishing its kind: other threads still see (say) PENDING,
    /// so they come to this slot's lock and wait for the outcome instead of treating the fd as
    /// plain TCP meanwhile. The caller must `set` the final entry.
    pub fn take_keeping_kind(&mut self) -> Entry {
        std::mem::replace(&mut *self.guard, Entry::None)
    }
}

pub fn lock(fd: i32) -> Option<Slot> {
    if fd < 0 || fd as usize >= MAX_FD {
        return None;
    }
    let fd = fd as usize;
    // Relaxed: read by `forked` in a fork child, of what its parent's thread stored before the
    // fork; the load first, so that the shared word is written only when it moves.
    let page = &LOCKED_PAGES[fd / SLOTS_PER_PAGE];
    if page.load(Ordering::Relaxed) == 0 {
        page.store(1, Ordering::Relaxed);
    }
    let cell = &SLOTS.0[fd];
    // Relaxed: as above (only a fork child acts on it, on the copy the fork made); set before
    // the lock is taken, so that no moment of the hold goes unmarked.
    if cell.taken.load(Ordering::Relaxed) == 0 {
        cell.taken.store(1, Ordering::Relaxed);
    }
    let guard = cell.mutex().lock().unwrap_or_else(|e| e.into_inner());
    Some(Slot { fd, guard })
}

/// Non-blocking lock, for the fork child (a lock held by a thread that no longer exists).
pub fn try_lock(fd: usize) -> Option<MutexGuard<'static, Entry>> {
    SLOTS.0[fd].mutex().try_lock().ok()
}

/// In a fork child, while it has one thread (the first of its fork handlers): a slot a thread
/// of the parent held at the fork would stay locked for ever, and the child's own close of that
/// connection wait for ever; its lock is let go of, its entry as that thread left it. Only slots
/// taken since the last fork are tried (the others are only read).
#[link_section = "colo_fork_text"]
pub fn forked() {
    let mut fd = 0;
    while fd < MAX_FD {
        if LOCKED_PAGES[fd / SLOTS_PER_PAGE].load(Ordering::Relaxed) == 0 {
            fd += SLOTS_PER_PAGE;
        } else {
            if SLOTS.0[fd].taken.load(Ordering::Relaxed) != 0 {
                let_go_in_child(fd);
            }
            fd += 1;
        }
    }
}

/// [`forked`]'s work on a slot that was held at the fork (apart: the fork child's code page
/// keeps what every child runs).
#[cold]
#[inline(never)]
fn let_go_in_child(fd: usize) {
    let cell = &SLOTS.0[fd];
    if cell.mutex().try_lock().is_err() {
        // SAFETY: this process has one thread, and the only reference into the cell was the
        // guard of another thread of the parent's, which is not in this process (the thread
        // that forks holds no slot across the fork: the shim's fork paths lock none across
        // it). The value is moved out of a bitwise copy of the locked mutex (`into_inner` takes
        // it whatever the lock word says: Linux's futex-based `Mutex` has nothing to release),
        // and a new, unlocked mutex holding it is written over the old one without dropping
        // that.
        let kind = unsafe {
            let value = std::ptr::read(cell.lock.get()).into_inner().unwrap_or_else(|e| e.into_inner());
            let kind = value.kind();
            std::ptr::write(cell.lock.get(), Mutex::new(value));
            kind
        };
        // The kind byte follows the entry as that thread left it (taken out while kept
        // PENDING, say): no caller waits at this slot for an outcome nobody will set.
        // SYNC POINT with the Acquire load in `kind` (no other thread here yet).
        KIND[fd].store(kind, Ordering::Release);
    }
    cell.taken.store(0, Ordering::Relaxed);
}

/// Taken around a fork (see `crate::fork_guards`): the locks of the listeners' slots, so that a
/// child finds its listeners unlocked, whatever other threads of the parent were doing with
/// them (an accept, an `epoll_ctl`, a `poll`). A listener's slot is held only for a look at its
/// entry or a change of it, never while another lock is taken. Connections' slots are not
/// taken (a process may have many): the child looks at those with `try_lock`.
pub fn listen_fork_guards(held: &mut colo::internal::fork::Held) {
    for fd in fds_of_kind(LISTEN) {
        held.hold(SLOTS.0[fd].mutex().lock().unwrap_or_else(|e| e.into_inner()));
    }
}

pub fn conn(fd: i32) -> Option<Arc<Conn>> {
    match lock(fd)?.entry() {
        Entry::Conn(c) => Some(c.clone()),
        _ => None,
    }
}


/// In a relay process that has just closed every descriptor but `keep` (by system call, out of
/// the table's sight): every other entry is let go of, without running its close (the relay
/// is the program's fork and exits with `_exit`; what the entries hold is the program's), so
/// that a file the relay opens later on such a number (its look at `/proc`) is not taken for
/// a connection.
pub fn abandon_all_but(keep: &[i32]) {
    for (fd, kind) in KIND.iter().enumerate().take(TOP.load(Ordering::Relaxed)) {
        if kind.load(Ordering::Relaxed) == NONE || keep.contains(&(fd as i32)) {
            continue;
        }
        if let Some(mut s) = try_lock(fd) {
            std::mem::forget(std::mem::replace(&mut *s, Entry::None));
        }
        // SYNC POINT with the Acquire load in `kind`.
        kind.store(NONE, Ordering::Release);
    }
}

/// Every fd whose kind is `k` (a scan of the kind bytes, up to the highest ever set).
pub fn fds_of_kind(k: u8) -> impl Iterator<Item = usize> {
    (0..TOP.load(Ordering::Relaxed)).filter(move |&i| KIND[i].load(Ordering::Relaxed) == k)
}
