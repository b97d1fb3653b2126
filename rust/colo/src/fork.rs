//! `fork(2)` in a threaded process copies only the forking thread: a lock another thread held at
//! that instant would stay locked forever in the child. So around every fork the forking thread
//! takes all of colo's process-wide locks (`pthread_atfork`) and releases them on both sides.
//!
//! Each module that owns such locks registers them here ([`protect`]) before it takes one for
//! the first time, so a fork from then on takes them; this module names none of those modules
//! and sits below them all. Order matters: a thread may hold one of the first while it waits for
//! a later one (the caches hand segments to the reaper), never the reverse: [`Rank`] is that
//! order, whichever module registered first.

use std::any::Any;
use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

/// A module's process-wide locks, as the fork handlers take them.
pub struct Locks {
    /// Takes every lock of the module, in the module's own order, into the holder.
    pub take: fn(&mut Held),
    /// Runs in the child once every lock is released again.
    pub in_child: Option<fn()>,
}

/// The order in which the forking thread takes the modules' locks.
#[derive(Clone, Copy)]
pub enum Rank {
    /// The LD_PRELOAD shim's locks (through `internal::fork`): its held sets of connections from
    /// other namespaces and the epoll registrations that follow them. First: a thread holding
    /// one of them may go on to any lock below (a held connection's claim, the rendezvous of a
    /// port), never the reverse.
    Shim,
    /// The rendezvous of this process's listening ports (`netns`).
    Netns,
    /// The listeners a client dialed before (`known`).
    Known,
    /// The client's segments built ahead (`handshake`).
    Prepared,
    /// The parked segments and their sweeper (`recycle`).
    Recycle,
    /// The segment reaper (`reaper`).
    Reaper,
    /// The hang-up watcher (`hangup`).
    Hangup,
    /// The rings the shrinker looks at (`shrink`).
    Shrink,
    /// The segments closed with bytes a peer of another user has yet to read (`orphan`).
    Orphan,
    /// The budgets of peer segments mapped (`budget`): last, as a lease is taken or given back
    /// under other modules' locks (a segment dropped by the reaper or the orphan thread), and
    /// its holder takes no other lock.
    Budget,
}

const RANKS: usize = Rank::Budget as usize + 1;
const _: () = assert!(RANKS <= u64::BITS as usize, "a bit of `Forking::took` a rank");

/// The registered modules, by rank (null: none yet). Only `&'static Locks` are stored.
static REGISTERED: [AtomicPtr<Locks>; RANKS] = [const { AtomicPtr::new(std::ptr::null_mut()) }; RANKS];

/// Guards kept in place, without the allocator: one of up to three words each.
const IN_PLACE: usize = 24;
type Words = [usize; 3];

/// The guards the forking thread holds between `prepare` and `parent`/`child`. Kept without
/// allocating, and beside the other state the fork handlers write (section `colo_fork`, see
/// `colo_sys::host`): every page a process writes after a fork costs it a copy-on-write fault,
/// in the parent as in the child, and the allocator's pages are several. A guard too large to
/// keep in place, or one past [`IN_PLACE`], is boxed.
pub struct Held {
    /// Guards kept in place: `words[i]` holds a guard while `drops[i]` is its drop.
    words: [MaybeUninit<Words>; IN_PLACE],
    drops: [Option<unsafe fn(*mut Words)>; IN_PLACE],
    kept: usize,
    /// Guards taken after the places ran out, or too large for one.
    boxed: Vec<Box<dyn Any>>,
}

impl Held {
    /// Holds `guard` until the fork is over (released in reverse order of holding).
    pub fn hold<G: 'static>(&mut self, guard: G) {
        let fits = size_of::<G>() <= size_of::<Words>() && align_of::<G>() <= align_of::<Words>();
        if !fits || self.kept == IN_PLACE || !self.boxed.is_empty() {
            self.boxed.push(Box::new(guard));
            return;
        }
        /// Drops the `G` kept at `p`.
        ///
        /// # Safety
        /// `p` holds a `G` written by `hold`, dropped only this once.
        #[link_section = "colo_fork_text"]
        unsafe fn drop_as<G>(p: *mut Words) {
            // SAFETY: the caller's promise.
            unsafe { std::ptr::drop_in_place(p.cast::<G>()) }
        }
        let i = self.kept;
        // SAFETY: the place is free (past `kept`), large and aligned enough for a `G` (`fits`).
        unsafe { self.words[i].as_mut_ptr().cast::<G>().write(guard) };
        self.drops[i] = Some(drop_as::<G>);
        self.kept += 1;
    }

    /// Releases every guard, in reverse order of holding.
    #[link_section = "colo_fork_text"]
    fn release(&mut self) {
        while let Some(g) = self.boxed.pop() {
            drop(g);
        }
        while self.kept > 0 {
            self.kept -= 1;
            let i = self.kept;
            if let Some(d) = self.drops[i].take() {
                // SAFETY: place `i` holds the guard `hold` wrote with this drop, taken once.
                unsafe { d(self.words[i].as_mut_ptr()) };
            }
        }
    }
}

/// The holder and the lock that gives it to one forking thread at a time (from `prepare` to
/// `parent` or `child`): taken before any module's lock, released after them all.
struct Forking {
    lock: UnsafeCell<libc::pthread_mutex_t>,
    held: UnsafeCell<Held>,
    /// The modules whose locks `prepare` took (bit `rank`). The child lets only those act
    /// (`in_child`): a module registered after `prepare` looked may have its lock held, at the
    /// fork, by a thread the child does not have.
    took: UnsafeCell<u64>,
}

// SAFETY: `held` is used only by the thread that holds `lock` (`prepare` to `release`); the
// pthread mutex is made to be shared between threads.
unsafe impl Sync for Forking {}

#[link_section = "colo_fork"]
static FORKING: Forking = Forking {
    lock: UnsafeCell::new(libc::PTHREAD_MUTEX_INITIALIZER),
    held: UnsafeCell::new(Held { words: [const { MaybeUninit::uninit() }; IN_PLACE], drops: [None; IN_PLACE], kept: 0, boxed: Vec::new() }),
    took: UnsafeCell::new(0),
};

/// The modules registered so far, in rank order, with their ranks.
fn registered() -> impl Iterator<Item = (usize, &'static Locks)> {
    // Relaxed: the pointer is to a static, complete before the program started; a registration
    // this load misses is one whose locks were not taken yet when the fork began.
    // SAFETY: only `&'static Locks` are stored in `REGISTERED` (`protect`), never freed.
    REGISTERED.iter().enumerate().filter_map(|(rank, slot)| unsafe { slot.load(Ordering::Relaxed).as_ref() }.map(|l| (rank, l)))
}

/// A count that moves on around every fork, in both parent and child (`colo_sys::host::forks`,
/// counting from the first [`protect`] at the latest): a value that changed means a connection
/// made before may now be shared with another process.
pub(crate) fn forks() -> u64 {
    colo_sys::host::forks()
}

extern "C" fn prepare() {
    // SAFETY: a statically initialized mutex, never moved or destroyed; released by `release`
    // in the parent and in the child (a normal mutex: the child's copy of this thread may).
    unsafe { libc::pthread_mutex_lock(FORKING.lock.get()) };
    // SAFETY: this thread holds `FORKING.lock`, and with it the only reference to the holder.
    let held = unsafe { &mut *FORKING.held.get() };
    let mut took = 0;
    registered().for_each(|(rank, locks)| {
        (locks.take)(held);
        took |= 1 << rank;
    });
    // SAFETY: as `held`: this thread holds `FORKING.lock`.
    unsafe { *FORKING.took.get() = took };
}

#[link_section = "colo_fork_text"]
extern "C" fn release() {
    // SAFETY: as in `prepare`: this thread (or, in the child, its copy) holds the lock.
    unsafe { (*FORKING.held.get()).release() };
    // SAFETY: held since `prepare`.
    unsafe { libc::pthread_mutex_unlock(FORKING.lock.get()) };
}

#[link_section = "colo_fork_text"]
extern "C" fn child() {
    // This handler may run before the one that renews the pid cache.
    colo_sys::host::renew_pid_after_fork();
    // SAFETY: written by `prepare` in the thread this child is a copy of, under `FORKING.lock`,
    // which the child alone now holds (released just below).
    let took = unsafe { *FORKING.took.get() };
    release();
    registered().filter(|(rank, _)| took & 1 << rank != 0).filter_map(|(_, locks)| locks.in_child).for_each(|f| f());
}

/// Registers `locks` at `rank`, and the fork handlers with the first registration (once per
/// process; a child inherits them). Call it before every first use of the locks (it is a load
/// once registered), never while holding a lock of another module's: the handlers' registration
/// waits for a fork under way. A flag, not a `Once`: a child forked while another thread was
/// inside a `Once` would wait on it forever. A thread that finds the flag set while the first is
/// still registering goes on without waiting: the handlers guard against forks from then on, as
/// they would have a moment later.
pub fn protect(rank: Rank, locks: &'static Locks) {
    let slot = &REGISTERED[rank as usize];
    // Relaxed: see `registered`.
    if !slot.load(Ordering::Relaxed).is_null() {
        return;
    }
    slot.store(std::ptr::from_ref(locks).cast_mut(), Ordering::Relaxed);
    // The fork count's handlers (with the pid cache's) before these.
    colo_sys::host::pid();
    // Relaxed: it orders nothing but this registration, which `pthread_atfork` serialises.
    static HANDLERS: AtomicBool = AtomicBool::new(false);
    if !HANDLERS.swap(true, Ordering::Relaxed) {
        colo_sys::host::at_fork(prepare, release, child);
    }
}

/// A mutex held across waits (a connection's reading and writing halves, its waiters), which
/// [`Locks`] cannot take around a fork: a fork child can let go of it instead
/// ([`ForkableMutex::let_go_in_child`]) when a thread of the parent held it at the fork, as no
/// thread of the child ever will. Used as the `Mutex` it derefs to.
pub(crate) struct ForkableMutex<T>(std::cell::UnsafeCell<std::sync::Mutex<T>>);

// SAFETY: shared as the `Mutex` inside is (`Mutex<T>` is `Sync` for `T: Send`); the cell is
// written only by `let_go_in_child`, whose caller promises no other reference exists.
unsafe impl<T: Send> Sync for ForkableMutex<T> {}

impl<T> ForkableMutex<T> {
    pub(crate) fn new(value: T) -> Self {
        ForkableMutex(std::cell::UnsafeCell::new(std::sync::Mutex::new(value)))
    }

    /// In a fork child, before it has a second thread (a `pthread_atfork` child handler): lets
    /// go of the mutex if a thread of the parent held it at the fork. The value stays as that
    /// thread left it, perhaps halfway through a change: the caller makes it good. Whether it
    /// was held.
    ///
    /// # Safety
    /// The calling process has one thread, and no reference into the mutex or its value is
    /// alive.
    pub(crate) unsafe fn let_go_in_child(&self) -> bool {
        if !matches!(self.try_lock(), Err(std::sync::TryLockError::WouldBlock)) {
            return false;
        }
        // SAFETY: with one thread and no reference into the cell (the caller's promise), nothing
        // reads or writes it meanwhile. The value is moved out of a bitwise copy of the locked
        // mutex (`into_inner` takes the value whatever the lock word says: Linux's futex-based
        // `Mutex` has nothing to release), and a new, unlocked mutex holding it is written over
        // the old one without dropping that (which would drop the value twice).
        unsafe {
            let value = std::ptr::read(self.0.get()).into_inner().unwrap_or_else(|e| e.into_inner());
            std::ptr::write(self.0.get(), std::sync::Mutex::new(value));
        }
        true
    }
}

impl<T> std::ops::Deref for ForkableMutex<T> {
    type Target = std::sync::Mutex<T>;

    fn deref(&self) -> &std::sync::Mutex<T> {
        // SAFETY: the cell is written only by `let_go_in_child`, while no reference is alive.
        unsafe { &*self.0.get() }
    }
}
