//! Hang-up watching for futex sleepers (spec/WIRE.md section 6).
//!
//! A thread asleep on its connection's futex is not woken by the peer's death: that shows on the
//! control socket. A timed futex sleep would notice it late, but arming a timer on every sleep
//! costs an exit to the hypervisor on a virtual machine (programming the timer), a large part of
//! a wake-up's price (docs/ARCHITECTURE.md has the figures). So one thread per process
//! watches, in an epoll set, the control sockets of the connections whose threads sleep on their
//! futex (registered at the first such sleep, one-shot). When one becomes readable (the peer hung
//! up, or a late answer to a HELLO came), the thread marks the connection and wakes its futex as
//! a peer would; the woken sleeper reads the control socket itself and re-arms the watch.
//! With connections to watch, the thread sleeps in `epoll_wait` and costs nothing; with none for
//! [`IDLE`], it ends (the next registration starts another), so that a process whose
//! connections are gone is single-threaded again, as the segment reaper's idle end intends.
//!
//! The `waiting` word a sleeper waits on is shared with the peer, which may write anything there
//! (a hostile peer stores 0, clearing the FUTEX bit, then hangs up). Nothing the peer writes may
//! keep our sleeper asleep after a hang-up, so the watcher's mark lives in private memory
//! (`fired`, which the sleeper looks at before every untimed sleep), and the watcher wakes the
//! futex whatever the word holds. A peer that writes the announced value back just between the
//! sleeper's look at the mark and its `FUTEX_WAIT` could still make that one wake-up miss: so
//! while a mark is not taken, the watcher wakes the futex again, at [`REWAKE_FIRST`] and then at
//! doubling intervals up to [`REWAKE_MAX`], until the sleeper (or a writer) takes the mark.

use crate::fork;
use colo_ring::notify::SLEEP_FUTEX;
use colo_ring::sync::{AtomicU32, Ordering};
use colo_sys::doorbell::Poller;
use colo_sys::{AsRawFd, FromRawFd, OwnedFd};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the watcher waits with nothing to watch before it ends.
const IDLE: Duration = Duration::from_millis(250);

/// This process image's generation: bumped in a forked child, whose copy of the watcher has no
/// thread (a registration made before the fork belongs to the parent's watcher), and when the
/// watcher's wait fails (its registrations go with it).
static GENERATION: AtomicU64 = AtomicU64::new(1);

/// A `key` meaning "this process cannot watch": sleep with a timeout instead.
const UNWATCHABLE: u64 = u64::MAX;

struct Watched {
    fired: Arc<AtomicBool>,
    /// The address of the connection's own `waiting` word, inside its mapped segment. The entry
    /// is removed (under the lock) before the segment can be unmapped.
    word: usize,
    /// The connection's self bell (a descriptor of its readiness set), rung when the control
    /// socket becomes readable: an edge-triggered waiter on the readiness fd whose read found
    /// nothing (a non-blocking miss does not read the control socket while the mark is unset)
    /// then gets a new edge and reads again. The entry is removed (under the lock) before the
    /// descriptor can be closed.
    bell: colo_sys::RawFd,
    /// While `fired` is set and not taken: when to wake the futex again, and the interval after
    /// that (see the module doc).
    rewake: Option<(Instant, Duration)>,
}

impl Watched {
    /// Marks the connection and wakes every thread of ours asleep on its futex, whatever the
    /// peer left in the shared word; `ring`: and rings its self bell (once per report of the
    /// control socket, not at every repeated wake-up).
    fn fire(&self, ring: bool) {
        // SYNC POINT with the sleeper's `Watch::take_fired` (Acquire): the mark is released
        // by the read-modify-write below, which the sleeper's announcement reads or follows.
        self.fired.store(true, Ordering::Release);
        // SAFETY: `word` is an aligned atomic in a segment that stays mapped while the entry
        // exists (`Watch::release` removes it under the watcher's lock before the unmapping).
        let word = unsafe { &*(self.word as *const AtomicU32) };
        // SYNC POINT with `notify::announce_sleep`: a sleeper that announced FUTEX before this
        // finds its word changed (no sleep) or is woken below; one that announces after it
        // synchronises with it and sees the mark before sleeping. Only the FUTEX bit is
        // taken: a DOORBELL bit stays for the peer to ring. The wake-up does not depend on
        // the bit: the peer may have cleared it.
        word.fetch_and(!SLEEP_FUTEX, Ordering::AcqRel);
        colo_sys::futex::wake_all(word);
        if ring {
            // SAFETY: the connection's self bell, open while the entry exists (`Watch::release`
            // removes it under the watcher's lock before the descriptor is closed).
            colo_sys::doorbell::ring(unsafe { colo_sys::BorrowedFd::borrow_raw(self.bell) });
        }
    }
}

struct Watcher {
    generation: u64,
    poller: Arc<Poller>,
    watched: HashMap<u64, Watched>,
    /// Rung when the last watched connection goes, so that the thread starts its idle wait.
    wake: OwnedFd,
    /// The watcher's thread, joined by [`retire`] (detached when the thread ends by itself);
    /// `None` between a [`retire`] and its [`resume`].
    thread: Option<JoinHandle<()>>,
    /// Which thread is the watcher's: a thread runs while this is the count it started with
    /// (`retire` moves it on, so that its thread ends and the next one, `resume`'s, takes over
    /// the same poller and registrations).
    epoch: u64,
}

/// The key of the watcher's own `wake` eventfd in its poller (registrations' keys count up from
/// 0 and never reach it).
const WAKE: u64 = UNWATCHABLE - 1;

/// The next registration's key: never reused within a process image, not even by the next
/// watcher after one ended idle.
static NEXT_KEY: AtomicU64 = AtomicU64::new(0);

// Locked at every fork: kept with what the fork handlers write (see `colo_sys::host`).
#[link_section = "colo_fork"]
static WATCHER: Mutex<Option<Watcher>> = Mutex::new(None);

/// The thread of a watcher that ended by itself (idle, or its wait failed), which may not have
/// exited yet: [`retire`] joins it. Locked after `WATCHER` where both are taken.
#[link_section = "colo_fork"]
static ENDED: Mutex<Option<JoinHandle<()>>> = Mutex::new(None);

static LOCKS: fork::Locks = fork::Locks { take: fork_guard, in_child: Some(forked) };

/// The watcher, locked (registered with `fork` before its first use).
fn lock() -> MutexGuard<'static, Option<Watcher>> {
    fork::protect(fork::Rank::Hangup, &LOCKS);
    WATCHER.lock().unwrap_or_else(|e| e.into_inner())
}

/// The watcher's lock, taken around a fork (see `fork`).
fn fork_guard(held: &mut fork::Held) {
    held.hold(WATCHER.lock().unwrap_or_else(|e| e.into_inner()));
    held.hold(ENDED.lock().unwrap_or_else(|e| e.into_inner()));
}

/// Called in a forked child, after the fork's locks are released. The parent's watcher thread
/// is not in this process: its copies of the watcher's descriptors go now, or a child that
/// neither watches nor execs would keep them for life.
fn forked() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
    // A parent's thread is joined by nobody here (a join would wait for a thread this process
    // does not have): its handle is forgotten.
    std::mem::forget(ENDED.lock().unwrap_or_else(|e| e.into_inner()).take());
    let Some(Watcher { poller, wake, thread, .. }) = lock().take() else { return };
    std::mem::forget(thread);
    drop(wake);
    // The parent's thread held a second reference to the poller, copied here with nobody to drop
    // it: the set is closed by number and the small allocation is left behind.
    let epoll = poller.fd().as_raw_fd();
    std::mem::forget(poller);
    // SAFETY: this image's copy of the watcher's epoll fd, which nothing in the child refers to
    // any more (the poller that owned it was forgotten above, so it is not closed twice).
    drop(unsafe { OwnedFd::from_raw_fd(epoll) });
}

/// The first repeated wake-up of a futex whose mark is not taken yet (see the module doc).
const REWAKE_FIRST: Duration = Duration::from_millis(10);
/// The longest interval between repeated wake-ups of a futex whose mark is not taken.
const REWAKE_MAX: Duration = Duration::from_secs(1);

/// The watcher of this process image, started on first use (and again after one ended idle);
/// `None` if it cannot run.
fn watcher(w: &mut Option<Watcher>) -> Option<&mut Watcher> {
    let generation = GENERATION.load(Ordering::Relaxed);
    if w.as_ref().is_none_or(|w| w.generation != generation) {
        *w = None;
        let poller = Arc::new(Poller::new_above(crate::floor::fd_floor()).ok()?);
        let wake = colo_sys::preload::move_above(colo_sys::doorbell::create().ok()?, crate::floor::fd_floor()).ok()?;
        poller.add(&wake, WAKE).ok()?;
        let thread = spawn(&poller, 0)?;
        *w = Some(Watcher { generation, poller, watched: HashMap::new(), wake, thread: Some(thread), epoch: 0 });
    }
    w.as_mut()
}

/// The application is about to put a file of its own on the number `fd` (its `dup2` onto it): if
/// that is the watcher's wake-up eventfd, the watcher takes another first, so that it never
/// rings or closes the number again. Returns whether it was.
pub fn give_up(fd: colo_sys::RawFd) -> bool {
    let mut g = lock();
    let Some(w) = g.as_mut().filter(|w| w.wake.as_raw_fd() == fd) else { return false };
    let Some(new) = colo_sys::doorbell::create().ok().and_then(|e| colo_sys::preload::move_above(e, crate::floor::fd_floor()).ok()) else {
        return true;
    };
    // The new one in the poller before the old one leaves it: a ring meant for the thread asleep
    // there now goes to the new one from here on.
    if w.poller.add(&new, WAKE).is_ok() {
        let _ = w.poller.delete(&w.wake);
        // The old one closes here, before the application's `dup2` takes its number.
        w.wake = new;
    }
    true
}

/// Starts the watcher's thread on `poller`, as the watcher's `epoch` one.
fn spawn(poller: &Arc<Poller>, epoch: u64) -> Option<JoinHandle<()>> {
    let p = poller.clone();
    colo_sys::host::spawn("colo-hangup", move || run(&p, epoch)).ok()
}

fn run(poller: &Arc<Poller>, epoch: u64) {
    let mine = |w: &Option<Watcher>| w.as_ref().is_some_and(|w| Arc::ptr_eq(&w.poller, poller) && w.epoch == epoch);
    loop {
        let (idle, rewake) = {
            let w = lock();
            if !mine(&w) {
                return;
            }
            let w = w.as_ref().expect("mine");
            (w.watched.is_empty(), w.watched.values().filter_map(|c| c.rewake.map(|(at, _)| at)).min())
        };
        let timeout = match rewake {
            Some(at) => Some(at.saturating_duration_since(Instant::now())),
            None => idle.then_some(IDLE),
        };
        let keys = poller.wait(timeout);
        let mut guard = lock();
        if !mine(&guard) {
            return;
        }
        let Ok(keys) = keys else {
            // No thread watches from now on: a new generation makes every connection register
            // again, with another watcher, at its next sleep (its current registration would
            // otherwise pass for watched). Marks not taken yet are woken once more first.
            if let Some(w) = guard.as_ref() {
                w.watched.values().filter(|c| c.rewake.is_some()).for_each(|c| c.fire(false));
            }
            GENERATION.fetch_add(1, Ordering::Relaxed);
            end(&mut guard);
            return;
        };
        if idle && keys.is_empty() && guard.as_ref().is_some_and(|w| w.watched.is_empty()) {
            // Registrations are made under this lock: none is lost, and the next one starts
            // another watcher.
            end(&mut guard);
            return;
        }
        let Some(w) = guard.as_mut() else { return };
        let now = Instant::now();
        for key in keys {
            if key == WAKE {
                colo_sys::doorbell::drain(&w.wake);
                continue;
            }
            let Some(c) = w.watched.get_mut(&key) else { continue };
            c.fire(true);
            c.rewake = Some((now + REWAKE_FIRST, REWAKE_FIRST));
        }
        for c in w.watched.values_mut() {
            let Some((at, every)) = c.rewake else { continue };
            if !c.fired.load(Ordering::Relaxed) {
                // Taken: the sleeper is awake (it re-arms the watch if the peer is still there).
                c.rewake = None;
            } else if at <= now {
                c.fire(false);
                let every = (every * 2).min(REWAKE_MAX);
                c.rewake = Some((now + every, every));
            }
        }
    }
}

/// The watcher's thread ends by itself: the watcher goes, and its thread's handle is kept for
/// [`retire`] (the handle of one that ended before is let go: it has returned long since, or
/// is about to).
fn end(guard: &mut MutexGuard<'static, Option<Watcher>>) {
    let thread = guard.take().and_then(|mut w| w.thread.take());
    *ENDED.lock().unwrap_or_else(|e| e.into_inner()) = thread;
}

/// Ends this process's watcher thread and waits until it has exited, before the application
/// changes its credentials (`setuid` and the like); [`resume`] starts another after the call.
/// glibc applies such a change to every thread of the process and aborts it when they do not
/// all succeed alike, and capabilities and `PR_SET_KEEPCAPS` are per thread: a watcher started
/// before the application adjusted its own thread's (with `capset`, out of our sight) can fail
/// where the application succeeds. Only the thread goes: the poller keeps its registrations (a
/// hang-up meanwhile waits in its ready list) and the watched connections their marks and
/// repeated wake-ups, which `resume`'s thread carries on: a sleeper's hang-up stays watched
/// across the change, whatever its peer writes to the word it waits on.
pub fn retire() {
    let ended = ENDED.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(t) = ended {
        let _ = t.join();
    }
    let thread = {
        let mut guard = lock();
        let Some(w) = guard.as_mut() else { return };
        w.epoch += 1;
        colo_sys::doorbell::ring(&w.wake);
        w.thread.take()
    };
    // The thread finds itself retired once its wait returns (its wake-up was rung above).
    if let Some(t) = thread {
        let _ = t.join();
    }
}

/// After the credentials change [`retire`] came before: the watcher's thread again, started by
/// the caller's thread (with the credentials of now), for the registrations the retired one
/// left. If none can be started, the connections are woken and register anew at their next
/// sleep (with another watcher, or a timed sleep where none can run).
pub fn resume() {
    let mut guard = lock();
    let Some(w) = guard.as_mut() else { return };
    if w.thread.is_some() || w.generation != GENERATION.load(Ordering::Relaxed) {
        return;
    }
    if w.watched.is_empty() {
        // Nothing to watch: the next registration starts a watcher, as after an idle end.
        *guard = None;
        return;
    }
    if let Some(t) = spawn(&w.poller, w.epoch) {
        w.thread = Some(t);
        return;
    }
    w.watched.values().for_each(|c| c.fire(true));
    GENERATION.fetch_add(1, Ordering::Relaxed);
    *guard = None;
}

/// One side of a connection, as the watcher knows it.
pub(crate) struct Watch {
    fired: Arc<AtomicBool>,
    /// The generation it is registered in (0: never).
    generation: AtomicU64,
    key: AtomicU64,
}

impl Watch {
    pub(crate) fn new() -> Watch {
        Watch { fired: Arc::new(AtomicBool::new(false)), generation: AtomicU64::new(0), key: AtomicU64::new(UNWATCHABLE) }
    }

    /// Whether a hang-up of `control` wakes a futex sleep on `word` (the connection's own
    /// `waiting` word) and rings `bell` (its self bell): registers on first use in this process
    /// image. False if the watcher cannot run here (out of descriptors or threads): sleep with
    /// a timeout then, and read the control socket at a non-blocking miss.
    pub(crate) fn armed(&self, control: &OwnedFd, bell: &OwnedFd, word: &AtomicU32) -> bool {
        // SYNC POINT (Acquire) with the Release store of the generation below: a thread that
        // sees this image's generation sees the key registered with it.
        if self.generation.load(Ordering::Acquire) == GENERATION.load(Ordering::Relaxed) {
            return self.key.load(Ordering::Relaxed) != UNWATCHABLE;
        }
        let mut guard = lock();
        if self.generation.load(Ordering::Relaxed) == GENERATION.load(Ordering::Relaxed) {
            // Another thread of this connection registered it meanwhile.
            return self.key.load(Ordering::Relaxed) != UNWATCHABLE;
        }
        let key = match watcher(&mut guard) {
            Some(w) => {
                let key = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
                match w.poller.add_hang_up_once(control, key) {
                    Ok(()) => {
                        let entry = Watched {
                            fired: self.fired.clone(),
                            word: word as *const AtomicU32 as usize,
                            bell: bell.as_raw_fd(),
                            rewake: None,
                        };
                        w.watched.insert(key, entry);
                        key
                    }
                    Err(_) => UNWATCHABLE,
                }
            }
            None => UNWATCHABLE,
        };
        self.key.store(key, Ordering::Relaxed);
        // Release: partner of the Acquire load at the top.
        self.generation.store(GENERATION.load(Ordering::Relaxed), Ordering::Release);
        key != UNWATCHABLE
    }

    /// Whether the connection is registered with this process image's watcher (no system call,
    /// no lock; `armed` registers it).
    pub(crate) fn watching(&self) -> bool {
        // Acquire: as in `armed`.
        self.generation.load(Ordering::Acquire) == GENERATION.load(Ordering::Relaxed)
            && self.key.load(Ordering::Relaxed) != UNWATCHABLE
    }

    /// Whether the control socket hung up since the last call (consumes the mark).
    pub(crate) fn take_fired(&self) -> bool {
        // Acquire: partner of the watcher's Release store.
        self.fired.load(Ordering::Acquire) && self.fired.swap(false, Ordering::Acquire)
    }

    /// Watches `control` again after the sleeper read it and the peer is still there.
    pub(crate) fn rearm(&self, control: &OwnedFd) {
        let mut guard = lock();
        let Some(w) = guard.as_mut() else { return };
        let key = self.key.load(Ordering::Relaxed);
        if w.generation == self.generation.load(Ordering::Relaxed) && w.watched.contains_key(&key) {
            let _ = w.poller.rearm_hang_up_once(control, key);
        }
    }

    /// Stops watching: the connection is closing and its segment may be unmapped after this.
    pub(crate) fn release(&self) {
        if self.generation.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut guard = lock();
        if let Some(w) = guard.as_mut() {
            if w.generation == self.generation.load(Ordering::Relaxed) {
                // The registration itself goes when the control socket closes (or, if a forked
                // process still holds it, reports to a key that no longer exists).
                w.watched.remove(&self.key.load(Ordering::Relaxed));
                if w.watched.is_empty() {
                    colo_sys::doorbell::ring(&w.wake);
                }
            }
        }
    }
}

/// The watcher's lock, for a test that keeps the watcher from marking anything while it holds
/// it (the thread blocks on it after its `epoll_wait` reports).
#[cfg(test)]
pub(crate) fn hold() -> impl Drop {
    lock()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    /// A connection side the watcher watches: the peer's end of its control socket, the word
    /// its sleeper announces on (leaked: if an assertion fails before `release`, the watcher
    /// still holds its address), its self bell and its watch.
    struct Armed {
        theirs: std::cell::Cell<Option<UnixStream>>,
        _control: OwnedFd,
        word: &'static AtomicU32,
        bell: OwnedFd,
        watch: Watch,
    }

    impl Armed {
        /// Watched, its sleeper announced with `SLEEP_FUTEX | mark`.
        fn new(mark: u32) -> Armed {
            let (ours, theirs) = UnixStream::pair().unwrap();
            let control = OwnedFd::from(ours);
            let word: &'static AtomicU32 = Box::leak(Box::new(AtomicU32::new(SLEEP_FUTEX | mark)));
            let bell = colo_sys::doorbell::create().unwrap();
            let watch = Watch::new();
            assert!(watch.armed(&control, &bell, word), "a watcher runs in a test process");
            Armed { theirs: std::cell::Cell::new(Some(theirs)), _control: control, word, bell, watch }
        }
    }

    /// Puts a thread to sleep in `FUTEX_WAIT` on `word` for `announced` (`again`: again after
    /// each wake-up while the word still holds it), runs `then` 50 ms later, and tells whether
    /// the sleeper was woken within 5 s (else it is let go, so that a failure is reported
    /// rather than hung).
    fn sleeper_woken(word: &'static AtomicU32, announced: u32, again: bool, then: impl FnOnce()) -> bool {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                colo_sys::futex::wait(word, announced, None);
                while again && word.load(Ordering::Relaxed) == announced {
                    colo_sys::futex::wait(word, announced, None);
                }
                tx.send(()).unwrap();
            });
            std::thread::sleep(Duration::from_millis(50));
            then();
            let woken = rx.recv_timeout(Duration::from_secs(5)).is_ok();
            if !woken {
                word.fetch_add(1, Ordering::Relaxed);
                colo_sys::futex::wake_all(word);
            }
            woken
        })
    }

    /// The peer clears the FUTEX bit, the watcher's first wake-up comes before the sleeper is in
    /// `FUTEX_WAIT`, and the peer writes back the value the sleeper then waits for: the watcher's
    /// repeated wake-ups still end that sleep, as the mark was not taken.
    #[test]
    fn a_hang_up_ends_the_sleep_whatever_the_peer_writes() {
        let Armed { theirs, word, bell, watch, .. } = &Armed::new(0x100);
        let (word, announced) = (*word, word.load(Ordering::Relaxed));
        // The peer clears the bit and hangs up.
        word.store(0, Ordering::Relaxed);
        drop(theirs.take());
        // The watcher marks the connection and wakes the futex at once (nobody sleeps yet).
        let deadline = Instant::now() + Duration::from_secs(5);
        // SYNC POINT with the Release store in `Watched::fire`.
        while !watch.fired.load(Ordering::Acquire) {
            assert!(Instant::now() < deadline, "the watcher saw the hang-up");
            std::thread::sleep(Duration::from_millis(1));
        }
        // The self bell rings with the mark (just after it: `Watched::fire`): an edge for a
        // waiter on the readiness set.
        while !colo_sys::doorbell::drain(bell) {
            assert!(Instant::now() < deadline, "the watcher rang the self bell when it marked the connection");
            std::thread::sleep(Duration::from_millis(1));
        }
        // The peer writes back the announced value: a sleep that looked at the mark before it
        // was set now enters FUTEX_WAIT expecting that value.
        word.store(announced, Ordering::Relaxed);
        assert!(sleeper_woken(word, announced, false, || ()), "the sleeper was woken again");
        assert!(watch.take_fired());
        watch.release();
    }

    /// The application changes its credentials (`retire`, the call, `resume`) while a thread
    /// is about to sleep on its futex, and the peer writes back the value the sleeper waits
    /// for: the peer's later hang-up still ends that sleep (the watch outlives the change).
    #[test]
    fn a_hang_up_after_a_credentials_change_ends_the_sleep() {
        let Armed { theirs, word, watch, .. } = &Armed::new(0x200);
        let (word, announced) = (*word, word.load(Ordering::Relaxed));
        // The sleeper looked at its mark (none): the credentials change comes now.
        assert!(!watch.take_fired());
        retire();
        resume();
        // The peer writes back the announced value, whatever the change did to the word, and
        // the sleeper enters FUTEX_WAIT expecting it; then the peer hangs up.
        word.store(announced, Ordering::Relaxed);
        assert!(sleeper_woken(word, announced, true, || drop(theirs.take())), "the peer's hang-up woke the sleeper");
        watch.release();
    }
}
