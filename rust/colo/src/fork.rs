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
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

/// A module's process-wide locks, as the fork handlers take them.
pub struct Locks {
    /// Takes every lock of the module, in the module's own order.
    pub take: fn() -> Vec<Box<dyn Any>>,
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
}

const RANKS: usize = Rank::Shrink as usize + 1;

/// The registered modules, by rank (null: none yet). Only `&'static Locks` are stored.
static REGISTERED: [AtomicPtr<Locks>; RANKS] = [const { AtomicPtr::new(std::ptr::null_mut()) }; RANKS];

thread_local! {
    /// The guards the forking thread holds between `prepare` and `parent`/`child`.
    static HELD: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

/// The modules registered so far, in rank order.
fn registered() -> impl Iterator<Item = &'static Locks> {
    // Relaxed: the pointer is to a static, complete before the program started; a registration
    // this load misses is one whose locks were not taken yet when the fork began.
    // SAFETY: only `&'static Locks` are stored in `REGISTERED` (`protect`), never freed.
    REGISTERED.iter().filter_map(|slot| unsafe { slot.load(Ordering::Relaxed).as_ref() })
}

/// Forks since this process image began, counted in both parent and child (the count is taken
/// before the fork): a value that changed means a connection made before may now be shared with
/// another process.
static FORKS: AtomicU64 = AtomicU64::new(0);

/// See [`FORKS`].
pub(crate) fn forks() -> u64 {
    FORKS.load(Ordering::Relaxed)
}

extern "C" fn prepare() {
    // Relaxed: read only by this process's threads after the fork returns, which orders it.
    FORKS.fetch_add(1, Ordering::Relaxed);
    let guards = registered().flat_map(|locks| (locks.take)()).collect();
    HELD.with(|h| *h.borrow_mut() = guards);
}

extern "C" fn release() {
    // Dropped in reverse order of taking.
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        while let Some(g) = h.pop() {
            drop(g);
        }
    });
}

extern "C" fn child() {
    // This handler may run before the one that renews the pid cache.
    colo_sys::host::renew_pid();
    release();
    registered().filter_map(|locks| locks.in_child).for_each(|f| f());
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
