//! Readiness through epoll: `epoll_ctl` and the `epoll_wait` family report accelerated fds from
//! the rings (poll and select: `ppoll`). The kernel still does the multiplexing: an accelerated
//! fd is represented by its connection's control socket and self bell, both registered in the
//! application's epoll set with the application's ET/ONESHOT flags and one tagged `data`
//! (`conn::regs`); `epoll_wait` maps those events back to the application's fd and data (one
//! event however many of the two the kernel reported), with IN/OUT computed from ring state.

use crate::api::{lregs, repeat};
use crate::base::env::spin;
use crate::base::guard::Guard;
use crate::conn::regs::{self, kernel_ctl, kernel_del, kernel_events, note_plain, register, set_wake, waker, with_regs, Reg, Regs, DUP_CHECK, PASS_FLAGS, TAG, TAG_MASK, WAKE};
use crate::conn::state::{Conn, IN, OUT};
use crate::conn::waking::Waking;
use crate::conn::table::{self, CONN, PENDING};
use crate::real;
use crate::service::client;
use colo::internal::shm::Drainer;
use colo::SpinMode;
use colo_ring::spin::Spinner;
use libc::{c_int, epoll_event};
use std::sync::Arc;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

#[inline(always)]
pub unsafe fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int {
    let r = if table::kind(fd) == table::NONE && !table::is_fresh(fd) {
        // SAFETY: `repeat::epoll_ctl` requires what libc's `epoll_ctl` does of these
        // arguments, which the application's call met.
        unsafe { repeat::epoll_ctl(epfd, op, fd, ev) }
    } else {
        // SAFETY: `epoll_ctl_slow` requires what libc's `epoll_ctl` does of these arguments,
        // which the application's call met.
        unsafe { epoll_ctl_slow(epfd, op, fd, ev) }
    };
    if r == 0 && table::is_epoll(fd) {
        regs::nest(epfd, op, fd);
    }
    r
}

#[inline(never)]
unsafe fn epoll_ctl_slow(epfd: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int {
    // Not a plain descriptor's change: nothing of it may be answered from memory, and the set
    // counts it as a change.
    repeat::forget(fd);
    repeat::touch(epfd);
    let k = table::kind(fd);
    if (k != CONN && k != PENDING) || Guard::busy() {
        // Sampled with the kind: a `connect` on another thread may clear it meanwhile, and its
        // adoption must then find this registration.
        let fresh = table::is_fresh(fd);
        // SAFETY: `real::epoll_ctl` is libc's `epoll_ctl`, given the application's arguments
        // unchanged: the contract the caller met.
        let r = unsafe { real::epoll_ctl(epfd, op, fd, ev) };
        if r == 0 && k == table::NONE && fresh {
            note_plain(epfd, op, fd, ev);
        }
        if r == 0 && k == table::LISTEN && colo::internal::netns::server_configured() && !Guard::busy() {
            lregs::follow(epfd, op, fd, ev);
        }
        return r;
    }
    let g = Guard::enter();
    client::resolve_fd(fd);
    let Some(conn) = table::conn(fd) else {
        drop(g);
        // SAFETY: `real::epoll_ctl` is libc's `epoll_ctl`, given the application's arguments
        // unchanged: the contract the caller met.
        return unsafe { real::epoll_ctl(epfd, op, fd, ev) };
    };
    let (events, data) = if ev.is_null() {
        (0, 0)
    } else {
        // SAFETY: the application's event.
        let e = unsafe { *ev };
        (e.events, e.u64)
    };
    match op {
        libc::EPOLL_CTL_ADD => {
            let kernel = kernel_events(events);
            // A registration the application deleted comes back without a system call, unless
            // its kernel flags change; one left by an earlier connection on this fd number goes.
            // The kernel's registration changes under the registrations' lock with ours, as in
            // `EPOLL_CTL_MOD` (below): another thread may report and close it at once.
            let revived = with_regs(|r| {
                let idx = *r.index.get(&(epfd, fd))?;
                let reg = r.slab[idx].as_mut()?;
                if !reg.deleted {
                    return Some(Err((libc::EEXIST, None)));
                }
                if !Arc::ptr_eq(&reg.conn, &conn) {
                    let old = r.remove(idx)?;
                    return Some(Ok(Some(old)));
                }
                let old_kernel = reg.kernel;
                let mut fresh = Reg::new(epfd, fd, events, data, conn.clone());
                std::mem::swap(&mut fresh.stand, &mut reg.stand);
                fresh.key = reg.key;
                *reg = fresh;
                // New flags: register anew (EPOLLEXCLUSIVE cannot be modified). The same
                // one-shot flags: re-arm.
                let op = if old_kernel != kernel {
                    kernel_del(epfd, reg.stand.fds);
                    Some(libc::EPOLL_CTL_ADD)
                } else if kernel & libc::EPOLLONESHOT as u32 != 0 {
                    Some(libc::EPOLL_CTL_MOD)
                } else {
                    None
                };
                if let Some(op) = op {
                    if let Err(e) = kernel_ctl(epfd, op, reg.stand.fds, kernel, reg.key) {
                        // Our registration is broken; take it out of the kernel's set.
                        kernel_del(epfd, reg.stand.fds);
                        return Some(Err((e, r.remove(idx))));
                    }
                }
                Some(Ok(None))
            });
            match revived {
                Some(Err((e, _broken))) => return g.err(e) as c_int,
                Some(Ok(None)) => {
                    if table::has_sleepers(epfd) {
                        conn.poke();
                    }
                    return g.ok(0) as c_int;
                }
                // A registration of a connection that is gone from this fd.
                Some(Ok(Some(stale))) => kernel_del(epfd, stale.stand.fds),
                None => {}
            }
            match register(epfd, fd, events, data, &conn) {
                Ok(()) => g.ok(0) as c_int,
                Err(e) => g.err(e) as c_int,
            }
        }
        libc::EPOLL_CTL_MOD => {
            // The kernel's registration changes under the registrations' lock, with ours: a
            // re-armed one-shot registration may be reported at once by another thread's
            // `epoll_wait` (the peer hung up meanwhile), and that thread's `close` of it, which
            // takes our descriptors out of the kernel's set, must not come before this `MOD`
            // reaches the kernel (the application's `MOD` would fail with `ENOENT`).
            // As the kernel: an exclusive registration is never modified, nor one made so.
            if events & libc::EPOLLEXCLUSIVE as u32 != 0 {
                return g.err(libc::EINVAL) as c_int;
            }
            let changed = with_regs(|r| {
                let idx = *r.index.get(&(epfd, fd))?;
                let reg = r.slab[idx].as_mut().filter(|reg| !reg.deleted)?;
                if reg.events & libc::EPOLLEXCLUSIVE as u32 != 0 {
                    return Some(Err(libc::EINVAL));
                }
                let old = reg.events;
                reg.events = events;
                reg.data = data;
                reg.seen = None;
                reg.quiet = None;
                reg.fired = false;
                // A thread asleep on this set must look at the new interest, as the kernel would
                // wake it; but one with no interest (`rings_report`) can only report an error or
                // hang-up there now, and the kernel wakes no one for it otherwise.
                let look = regs::rings_report(events) || reg.would_report();
                // The kernel only watches our descriptors for IN with the application's flags:
                // an interest change (event loops flip OUT on and off around every reply) needs no
                // system call, as `epoll_wait` reads the rings first. A one-shot re-arm, a flag
                // change, or a change to or from no interest at all (`kernel_events`) does.
                if (old ^ events) & PASS_FLAGS != 0 || events & libc::EPOLLONESHOT as u32 != 0 || regs::rings_report(old) != regs::rings_report(events) {
                    reg.kernel = kernel_events(events);
                    return Some(kernel_ctl(epfd, libc::EPOLL_CTL_MOD, reg.stand.fds, reg.kernel, reg.key).map(|()| look));
                }
                Some(Ok(look))
            });
            let look = match changed {
                None => return g.err(libc::ENOENT) as c_int,
                Some(Err(e)) => return g.err(e) as c_int,
                Some(Ok(look)) => look,
            };
            if look && table::has_sleepers(epfd) {
                conn.poke();
            }
            g.ok(0) as c_int
        }
        libc::EPOLL_CTL_DEL => {
            let found = with_regs(|r| {
                let idx = *r.index.get(&(epfd, fd))?;
                let reg = r.slab[idx].as_mut().filter(|reg| !reg.deleted)?;
                reg.deleted = true;
                Some(())
            });
            match found {
                Some(()) => g.ok(0) as c_int,
                None => g.err(libc::ENOENT) as c_int,
            }
        }
        _ => g.err(libc::EINVAL) as c_int,
    }
}

/// Fills `out` with events of `epfd`'s accelerated registrations that are ready now, read from
/// the rings without a system call; returns how many, and the round they were marked with.
///
/// Fairly, as the kernel is (it rotates its ready list, so that a level-triggered fd ready at
/// every call cannot starve the others): each look starts after the registration the previous
/// look at this set reported last, and every other look leaves one slot of `out` for the
/// kernel's events (with a single slot, `kernel_turn` gives the kernel the first try instead).
/// Without that, connections always ready (level-triggered `EPOLLOUT`) filled every batch: the
/// set's other fds were never reported, nor, with `maxevents` 1, any connection but the first.
fn from_rings(epfd: c_int, out: &mut [epoll_event]) -> (usize, u64) {
    let round = next_round();
    with_regs(|r| {
        let Regs { slab, by_epfd, turns, .. } = r;
        let Some(list) = by_epfd.get(&epfd) else { return (0, round) };
        let (next, looks) = turns.get(&epfd).copied().unwrap_or_default();
        let room = if out.len() > 1 && looks % 2 == 1 { out.len() - 1 } else { out.len() };
        let start = next % list.len().max(1);
        let (mut n, mut after) = (0, next);
        for (k, &idx) in list[start..].iter().chain(&list[..start]).enumerate() {
            if n == room {
                break;
            }
            let Some(Some(reg)) = slab.get_mut(idx) else { continue };
            let m = reg.report(false);
            if m != 0 {
                out[n] = epoll_event { events: m, u64: reg.data };
                n += 1;
                reg.round = round;
                after = start + k + 1;
            }
        }
        turns.insert(epfd, (after, looks + 1));
        (n, round)
    })
}

/// A fresh mark for the registrations one look reports (`Reg::round`).
fn next_round() -> u64 {
    static ROUNDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    ROUNDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Whether a wait with room for one event should ask the kernel before the rings (every other
/// look at the set: see `from_rings`); taking the turn passes it back to the rings.
fn kernel_turn(epfd: c_int) -> bool {
    with_regs(|r| match r.turns.get_mut(&epfd) {
        Some((_, looks)) if *looks % 2 == 1 => {
            *looks += 1;
            true
        }
        _ => false,
    })
}

/// After `n` events found in the rings (marked `round`): adds the other fds' events, asking the
/// kernel without waiting; returns the total.
fn with_kernel_events(epfd: c_int, all: &mut [epoll_event], n: usize, round: u64, wait: &impl Fn(*mut epoll_event, c_int, c_int) -> c_int) -> usize {
    let rest = &mut all[n..];
    let k = if rest.is_empty() { 0 } else { wait(rest.as_mut_ptr(), rest.len() as c_int, 0) };
    n + if k > 0 { translate(epfd, &mut rest[..k as usize], Some(round)) } else { 0 }
}

/// Rewrites the kernel's events of one `epoll_wait` batch in place (our descriptors' events become
/// the application's fds and events, one per registration however many of its descriptors the
/// kernel reported; registrations reported from the rings in `round` are skipped); returns how
/// many remain.
fn translate(epfd: c_int, evs: &mut [epoll_event], round: Option<u64>) -> usize {
    // Marks each registration this batch looked at: its other descriptor's event is the same news.
    let this = next_round();
    let mut out = 0;
    let mut hung_up = Vec::new();
    // The set's wake-up eventfd, if this batch had its event.
    let mut passed = None;
    // Reports of listeners' held sets (`lregs`), looked at after the registrations' lock.
    let mut listeners = Vec::new();
    with_regs(|r| {
        for i in 0..evs.len() {
            let ev = evs[i];
            let d = ev.u64;
            if d == WAKE {
                // Another thread's drain took a ring (see `set_wake`): the caller looks at the
                // rings again and re-announces before any further sleep.
                if let Some(&(_, fd)) = r.wakes.get(&epfd) {
                    // SAFETY: the set's wake-up eventfd, never closed.
                    colo_sys::doorbell::drain(unsafe { colo_sys::BorrowedFd::borrow_raw(fd) });
                    passed = Some(fd);
                }
                continue;
            }
            if d & TAG_MASK != TAG {
                evs[out] = ev;
                out += 1;
                continue;
            }
            if d & lregs::LISTENER != 0 {
                listeners.push(d);
                continue;
            }
            let idx = regs::slot_of(d);
            let Some(reg) = r.slab.get_mut(idx).and_then(Option::as_mut).filter(|reg| reg.key == d) else { continue };
            if reg.round == this {
                continue;
            }
            let from_rings = Some(reg.round) == round;
            reg.round = this;
            if reg.deleted {
                // A doorbell or a hang-up left readable would end every sleep: drain it, and if
                // the peer hung up, the kernel registration must go now.
                reg.conn.drain(Drainer::Awake);
                if reg.conn.peer_gone() {
                    hung_up.push(idx);
                }
                continue;
            }
            // The kernel reported the connection: its doorbell or self bell rang, or the peer
            // hung up.
            reg.rung = true;
            if from_rings {
                // Reported from the rings this round already; but the kernel's event may be the
                // peer's hang-up, which the rings cannot show (an interest with OUT, reported
                // writable every round, never asked): learn it, so that a report carries it as
                // an edge of its own. An edge-triggered (or one-shot) registration asks at once,
                // whatever the rings hold: its hang-up is not reported twice, and a reader that
                // stops at a short read (nginx) waits for EPOLLRDHUP. A level one sees a hang-up
                // in every wait from then on, and a read that finds the ring empty looks at the
                // control socket itself, so it asks only with nothing to read, on one duplicate
                // in `DUP_CHECK`: a doorbell left rung, the usual cause of a duplicate, costs no
                // system call per request (docs/ARCHITECTURE.md).
                if !reg.conn.known_gone() {
                    let edge = reg.kernel & (libc::EPOLLET | libc::EPOLLONESHOT) as u32 != 0;
                    let ask = edge || reg.conn.ready(false) & IN == 0 && {
                        reg.dups = reg.dups.wrapping_add(1);
                        reg.dups % DUP_CHECK == 0
                    };
                    if ask {
                        reg.conn.peer_gone();
                    }
                }
                continue;
            }
            // A level-triggered registration for input asks the control socket only when its
            // doorbell does not explain the report (see `Conn::arm`), so that a ring left from a
            // reply already read costs no `recv` on the control socket. The peer's hang-up is then
            // reported at the next wait, as end of stream. An edge (or one-shot) registration is
            // not reported again for a hang-up, and one for output would be told "writable"
            // meanwhile: those ask now.
            let level = reg.kernel & (libc::EPOLLET | libc::EPOLLONESHOT) as u32 == 0;
            let mut m = reg.report(!level || reg.events & OUT != 0);
            if m == 0 && !reg.fired {
                // A ring with nothing new behind it (or one meant for an earlier state): drain
                // the doorbell, announce, and look once more.
                reg.rung = false;
                if reg.conn.arm(Drainer::Awake, !level) != 0 {
                    m = reg.report(false);
                }
            }
            if m == 0 {
                if reg.events & libc::EPOLLONESHOT as u32 != 0 && !reg.fired {
                    // A spurious wake-up: re-armed, under the lock (the registration's
                    // descriptors stay open while it is listed). But not one that watches only
                    // for the peer's hang-up (no interest: `kernel_events`) once that came: the
                    // hung-up control socket would report it again at once, every wait.
                    if reg.kernel & libc::EPOLLIN as u32 != 0 || !reg.conn.known_gone() {
                        let _ = kernel_ctl(epfd, libc::EPOLL_CTL_MOD, reg.stand.fds, reg.kernel, d);
                    }
                } else if level && reg.conn.known_gone() {
                    // The peer is gone (`arm` asked, unless a ring explained this report)
                    // and nothing the application wants was reported: the control socket stays
                    // readable (it hung up), so a level registration would end
                    // every sleep at once. Edge-triggered from now on; `from_rings` still reports
                    // the state whenever the interest asks for it.
                    reg.kernel |= libc::EPOLLET as u32;
                    let _ = kernel_ctl(epfd, libc::EPOLL_CTL_MOD, reg.stand.fds, reg.kernel, d);
                }
                continue;
            }
            evs[out] = epoll_event { events: m, u64: reg.data };
            out += 1;
        }
    });
    // The application's own events (a one-shot listener's among them disarms its held set's).
    lregs::listener_reported(epfd, evs[..out].iter().map(|e| e.u64));
    // Each skipped above: room for its report, unless the listener's own registration reported
    // in this batch already (one report of a listener per batch).
    for d in listeners {
        if let Some(ev) = lregs::report(epfd, d) {
            if evs[..out].iter().any(|e| e.u64 == ev.u64 && e.events & libc::EPOLLIN as u32 != 0) {
                continue;
            }
            evs[out] = ev;
            out += 1;
        }
    }
    if let (Some(fd), true) = (passed, out > 0 && table::regs_in(epfd) > 0) {
        // This thread returns other events without looking at the rings again: pass the ring on
        // to another thread asleep on the set, if any (else this thread's next wait sees it).
        // Not in a set without connections (any more): nothing to look at, and a busy loop's
        // every wait would read and write the eventfd again.
        // SAFETY: the set's wake-up eventfd, never closed.
        colo_sys::doorbell::ring(unsafe { colo_sys::BorrowedFd::borrow_raw(fd) });
    }
    // Deleted, hung-up connections.
    for idx in hung_up {
        if let Some(reg) = with_regs(|r| r.remove(idx)) {
            kernel_del(epfd, reg.stand.fds);
        }
    }
    out
}

/// A sleep of `t` ms (-1: forever) cut to `UNPASSED_SLEEP`.
fn unpassed_ms(t: c_int) -> c_int {
    let cap = colo::internal::shm::UNPASSED_SLEEP.as_millis() as c_int;
    if t < 0 { cap } else { t.min(cap) }
}

fn deadline_of(timeout_ms: c_int) -> Option<Instant> {
    (timeout_ms >= 0).then(|| Instant::now() + Duration::from_millis(timeout_ms as u64))
}

fn remaining_ms(deadline: Option<Instant>) -> c_int {
    match deadline {
        None => -1,
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            left.as_millis().min(c_int::MAX as u128) as c_int + if left.subsec_micros() % 1000 > 0 { 1 } else { 0 }
        }
    }
}

/// The connections of `epfd` that may wake a sleeper (`Reg::may_wake`), the spin policy for
/// waiting on them (the strictest of theirs: "never" when any pair shares one CPU), and the set's
/// wake-up eventfd if this process made one (see `set_wake`).
fn watched(epfd: c_int) -> (Vec<Arc<Conn>>, SpinMode, Option<colo_sys::RawFd>) {
    with_regs(|r| {
        let conns: Vec<Arc<Conn>> = r
            .by_epfd
            .get(&epfd)
            .map(|l| l.iter().filter_map(|&i| r.slab[i].as_ref()).filter(|g| g.may_wake()).map(|g| g.conn.clone()).collect())
            .unwrap_or_default();
        let mut mode = spin();
        if mode != SpinMode::Always && conns.iter().any(|c| c.never_spin()) {
            mode = SpinMode::Never;
        }
        let wake = r.wakes.get(&epfd).filter(|w| w.0 == colo_sys::host::pid()).map(|w| w.1);
        (conns, mode, wake)
    })
}

/// Announces a sleep on every registration of `epfd` that may report (`Reg::may_wake`),
/// as they are now, under the lock a `MOD` takes (see the caller): no list is made.
fn announce_sleep(epfd: c_int) {
    with_regs(|r| {
        let Some(list) = r.by_epfd.get(&epfd) else { return };
        for g in list.iter().filter_map(|&i| r.slab[i].as_ref()).filter(|g| g.may_wake()) {
            g.conn.will_sleep();
        }
    });
}

/// For a `poll` or `select` on the epoll set `epfd` itself (EventMachine sleeps so, then asks the
/// set with a zero timeout): whether a registration of a connection in it would report now.
/// Before such a poll sleeps, [`sleep_on_polled_set`] readies the set.
pub fn set_polled(epfd: c_int) -> bool {
    readied(epfd, false, None).is_some()
}

/// Whether a registration of a connection in `epfd` would report now, with that connection.
/// When `arm` and none would, the set is readied for a sleep in the kernel: doorbells the kernel
/// reported are drained (by the sleeper whose wake-up eventfd is `wake`: the drain rings the
/// other sleepers' eventfds, not its own), and the sleep is announced on every registration, so
/// that the peers' next progress rings a doorbell in the set and the kernel reports the set
/// readable; then the rings are looked at once more (progress made before the announcements
/// rang nothing).
fn readied(epfd: c_int, arm: bool, wake: Option<colo_sys::RawFd>) -> Option<Arc<Conn>> {
    let reporting = || {
        with_regs(|r| r.by_epfd.get(&epfd)?.iter().filter_map(|&i| r.slab[i].as_ref()).find(|g| g.would_report()).map(|g| g.conn.clone()))
    };
    if let Some(c) = reporting() {
        return Some(c);
    }
    if !arm {
        return None;
    }
    for (c, _) in rung(epfd) {
        c.drain(waker(wake));
    }
    announce_sleep(epfd);
    reporting()
}

/// A `poll` or `select` asleep in the kernel on an epoll set itself (see [`set_polled`]): for as
/// long as it lives, the set's wake-up eventfd, which is in the set, is registered with the
/// set's connections, so that another thread's drain of one of their doorbells (which takes the
/// ring meant for this sleep) rings it and the kernel reports the set readable, as `epoll_wait`'s
/// sleep is woken; and the set counts as slept on, so that a one-shot re-arm pokes it.
pub struct PolledSet {
    epfd: c_int,
    /// Whether a registration of the set may wake it (`watched` found a connection).
    watched: bool,
    waking: Option<Waking>,
}

impl PolledSet {
    /// Whether every connection of the set that may report can ring the sleeper: if not, the
    /// sleep must be no longer than `colo::internal::shm::UNPASSED_SLEEP`.
    pub fn complete(&self) -> bool {
        !self.watched || self.waking.as_ref().is_some_and(Waking::complete)
    }
}

impl Drop for PolledSet {
    fn drop(&mut self) {
        self.waking = None;
        table::set_sleeping(self.epfd, false);
    }
}

/// Readies the epoll set `epfd` for a `poll` of it that is about to sleep (see [`PolledSet`]);
/// `None` when a registration of a connection in it would report now (nothing to sleep for).
pub fn sleep_on_polled_set(epfd: c_int) -> Option<PolledSet> {
    let (conns, _, wake) = watched(epfd);
    let watched = !conns.is_empty();
    let wake = if watched { wake.or_else(|| set_wake(epfd)) } else { None };
    let waking = wake.map(|fd| Waking::new(&conns, |c| c, fd));
    drop(conns);
    table::set_sleeping(epfd, true);
    let sleep = PolledSet { epfd, watched, waking };
    readied(epfd, true, wake).is_none().then_some(sleep)
}

/// Readies the epoll sets registered in `epfd` for a wait on it (`ready_nested`).
fn ready_nested_in(epfd: c_int) {
    for inner in regs::nested_in(epfd) {
        ready_nested(inner);
    }
}

/// For an epoll set registered in another set (`regs::nest`), before a wait on the outer one:
/// readies it as [`set_polled`] does for a poll of it, and when a registration would report
/// now, rings that connection's self bell, so that the kernel reports the set readable in the
/// outer one (with the application's data and flags there).
fn ready_nested(inner: c_int) {
    if let Some(c) = is_colo_set(inner).then(|| readied(inner, true, None)).flatten() {
        c.poke();
    }
}

/// `epoll_create`/`epoll_create1` returned `fd` (`forks`: `repeat::before_create`'s count): it is
/// known as an epoll set from now on, should it be registered in another (`regs::nest`).
pub fn created(fd: c_int, forks: u64) -> c_int {
    repeat::created(fd, forks);
    table::set_epoll(fd, true);
    fd
}

/// Whether `fd` is an epoll set with connections registered in it (see [`set_polled`]).
pub fn is_colo_set(fd: c_int) -> bool {
    table::is_epoll(fd) && table::regs_in(fd) > 0
}

/// The connections of `epfd` whose doorbells the kernel reported since they were last drained,
/// each with whether it is among the `watched` ones.
fn rung(epfd: c_int) -> Vec<(Arc<Conn>, bool)> {
    with_regs(|r| {
        let Regs { slab, by_epfd, .. } = r;
        let Some(list) = by_epfd.get(&epfd) else { return Vec::new() };
        let mut out = Vec::new();
        for &i in list {
            if let Some(g) = slab[i].as_mut().filter(|g| g.rung) {
                g.rung = false;
                out.push((g.conn.clone(), !g.fired && !g.deleted));
            }
        }
        out
    })
}

thread_local! {
    /// Spin state of this thread's epoll waits (adaptive, like a connection's).
    static SPINNER: std::cell::RefCell<Option<Spinner>> = const { std::cell::RefCell::new(None) };
}

/// epoll_wait / epoll_pwait / epoll_pwait2, with the kernel wait given as a closure
/// `wait(buffer, max, timeout_ms)`.
///
/// Accelerated connections are looked at in the rings first: a ready one is reported with no
/// system call for it (the kernel is asked, without waiting, only about the other fds). Only when
/// nothing is ready does the wait spin briefly (adaptive, as a connection's reads do), announce
/// on every connection that it will sleep, look once more and sleep in the kernel. So a busy
/// event loop is never woken through a doorbell, and its peers never ring one.
pub unsafe fn epoll_wait_with(
    epfd: c_int,
    evs: *mut epoll_event,
    max: c_int,
    timeout_ms: c_int,
    wait: impl Fn(*mut epoll_event, c_int, c_int) -> c_int,
) -> c_int {
    if max <= 0 {
        return wait(evs, max, timeout_ms);
    }
    let deadline = deadline_of(timeout_ms);
    let mut t = timeout_ms;
    if regs::nesting() && !Guard::busy() {
        let _g = Guard::enter();
        ready_nested_in(epfd);
    }
    // Before the guard's test, which looks up a thread-local: a wait made from inside the shim
    // (guard up) gets what the kernel reports, untranslated, on either path.
    if table::regs_in(epfd) == 0 {
        // No connection is registered in this set: the kernel's wait, marked sleeping so that a
        // connection another thread registers meanwhile rings it (`register` counts the
        // registration, then looks for sleepers; with a fence on each side, at least one sees
        // the other). What the kernel reports is the application's unless tagged: an event of
        // a registration made meanwhile, of a duplicate of a set with connections (those are
        // known under the original number), or of the set's wake-up eventfd. A set whose
        // connections have all closed counts none again and comes back to this path.
        table::set_sleeping(epfd, true);
        fence(Ordering::SeqCst); // Partner: the fence in `register`.
        if table::regs_in(epfd) == 0 {
            let k = wait(evs, max, t);
            table::set_sleeping(epfd, false);
            if k <= 0 {
                return k;
            }
            // SAFETY: the kernel filled `k` events at `evs`.
            let got = unsafe { std::slice::from_raw_parts_mut(evs, k as usize) };
            if got.iter().all(|e| e.u64 & TAG_MASK != TAG) {
                // A one-shot listener among them disarms its held set's registration (one load
                // unless one-shot listeners are registered).
                if lregs::any_one_shot() && !Guard::busy() {
                    let _g = Guard::enter();
                    lregs::listener_reported(epfd, got.iter().map(|e| e.u64));
                }
                return k;
            }
            if Guard::busy() {
                return k;
            }
            if let Some(n) = translated(epfd, got) {
                return n;
            }
            t = remaining_ms(deadline);
            if t == 0 {
                return 0;
            }
        } else {
            table::set_sleeping(epfd, false);
        }
    }
    if Guard::busy() {
        return wait(evs, max, t);
    }
    let mut spun = false;
    loop {
        let g = Guard::enter();
        ready_nested_in(epfd);
        if max == 1 && kernel_turn(epfd) {
            // The kernel's turn (see `from_rings`): its fds first, without waiting.
            let k = wait(evs, 1, 0);
            // SAFETY: the kernel filled `k` (at most 1) events at `evs`.
            if k > 0 && translate(epfd, unsafe { std::slice::from_raw_parts_mut(evs, k as usize) }, None) > 0 {
                return g.ok(1) as c_int;
            }
        }
        // SAFETY: the application gave us room for `max` events at `evs`.
        let all = unsafe { std::slice::from_raw_parts_mut(evs, max as usize) };
        let (n, round) = from_rings(epfd, all);
        if n > 0 {
            return g.ok(with_kernel_events(epfd, all, n, round, &wait) as libc::ssize_t) as c_int;
        }
        let (conns, mode, wake) = watched(epfd);
        if !spun && t != 0 && !conns.is_empty() {
            spun = true;
            // Spin until a ring has something to report, within the budget. A change that
            // reports nothing (the peer took our request; the answer is still to come) spins on.
            let mut before: Vec<_> = conns.iter().map(|c| c.edges()).collect();
            let mut found = (0, 0);
            SPINNER.with(|s| {
                let mut s = s.borrow_mut();
                let sp = s.get_or_insert_with(|| colo::internal::shm::spinner(mode));
                if sp.mode() != mode {
                    *sp = colo::internal::shm::spinner(mode);
                }
                sp.spin(|| {
                    let mut changed = false;
                    for (c, b) in conns.iter().zip(before.iter_mut()) {
                        let now = c.edges();
                        changed |= now != *b;
                        *b = now;
                    }
                    if changed {
                        found = from_rings(epfd, all);
                    }
                    found.0 > 0
                });
            });
            if found.0 > 0 {
                return g.ok(with_kernel_events(epfd, all, found.0, found.1, &wait) as libc::ssize_t) as c_int;
            }
        }
        let sleeps = t != 0;
        // The set's wake-up eventfd, registered with the watched connections from before the
        // drains and announcements until the kernel wait returns (see `set_wake`).
        let wake = if sleeps && !conns.is_empty() { wake.or_else(|| set_wake(epfd)) } else { None };
        let waking = wake.map(|fd| Waking::new(&conns, |c| c, fd));
        // Without a pass from other threads' drains, sleep in short steps (see `UNPASSED_SLEEP`).
        let unpassed = sleeps && !conns.is_empty() && !waking.as_ref().is_some_and(|w| w.complete());
        if sleeps {
            table::set_sleeping(epfd, true);
            // Doorbells the kernel reported are drained now (one read each), not when reported:
            // this sleep would otherwise end at once, and until now a set nested above the
            // application's saw them readable.
            for (c, watched) in rung(epfd) {
                c.drain(if watched { waker(wake) } else { Drainer::Awake });
            }
            // Announced on the registrations as they are now that this thread counts as asleep:
            // a one-shot one re-armed by another thread since `watched` was asked (its `MOD`
            // found no sleeper to poke) is among them, so either the `MOD` saw this sleeper or
            // this sees the registration (the regs lock orders the two), and a ring that fills
            // after the last look below rings its doorbell.
            announce_sleep(epfd);
            // Progress made before the announcements rang nothing: look once more.
            let (n, round) = from_rings(epfd, all);
            if n > 0 {
                table::set_sleeping(epfd, false);
                return g.ok(with_kernel_events(epfd, all, n, round, &wait) as libc::ssize_t) as c_int;
            }
        }
        // Not held through the sleep: a connection another thread closes meanwhile ends at
        // its close, as in the kernel (see `Waking`).
        drop(conns);
        drop(g);
        let slept = Instant::now();
        let k = wait(evs, max, if unpassed { unpassed_ms(t) } else { t });
        drop(waking);
        if sleeps {
            table::set_sleeping(epfd, false);
        }
        if k == 0 && unpassed {
            t = remaining_ms(deadline);
            if t == 0 {
                return 0;
            }
            continue;
        }
        if k <= 0 {
            return k;
        }
        // SAFETY: the kernel filled `k` events at `evs`.
        let got = unsafe { std::slice::from_raw_parts_mut(evs, k as usize) };
        // Only a connection's doorbell (or the set's wake-up, rung for one) tells the spinner
        // how soon a ring had news; a wait the application's own fds ended (an event loop's
        // mailbox, a timer) is one the spin on the rings could never have caught.
        let by_rings = got.iter().any(|e| e.u64 & TAG_MASK == TAG);
        SPINNER.with(|s| {
            if let Some(sp) = s.borrow_mut().as_mut() {
                if by_rings {
                    sp.slept(slept.elapsed());
                } else {
                    sp.woken_elsewhere();
                }
            }
        });
        if let Some(n) = translated(epfd, got) {
            return n;
        }
        t = remaining_ms(deadline);
        if t == 0 {
            return 0;
        }
    }
}

/// The kernel's batch `got` translated for the application: its count, or `None` if nothing in
/// it was the application's (the caller waits on).
fn translated(epfd: c_int, got: &mut [epoll_event]) -> Option<c_int> {
    let g = Guard::enter();
    let out = translate(epfd, got, None);
    (out > 0).then(|| g.ok(out as libc::ssize_t) as c_int)
}
