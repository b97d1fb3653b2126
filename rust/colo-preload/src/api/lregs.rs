//! The epoll registrations of listening sockets whose connections from listed peers of other
//! namespaces are held aside (`service::server::held`). The kernel reports the listening socket
//! only for connections in its own queue; a held connection resolved later is reported through
//! the held set's epoll fd, registered in the application's set next to the listener (the
//! listener's own registration stays the kernel's, untouched), with the application's
//! edge-triggered and one-shot flags and a tagged `data` (`regs::TAG | LISTENER | index`).
//! `api::epoll::translate` turns its report into the listener's (`report`), after moving the
//! held connections on, as it turns a connection's kernel fds' events into the connection's.

use crate::base::guard::Guard;
use crate::conn::regs::TAG;
use crate::conn::table::{self, Entry};
use crate::real;
use crate::service::server::held::{self, Held};
use libc::{c_int, epoll_event};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The bit of a tagged `data` that names a listener's registration (below the tag's bits, above
/// the indexes of connections' registrations).
pub const LISTENER: u64 = 1 << 47;

struct LReg {
    epfd: c_int,
    fd: c_int,
    events: u32,
    data: u64,
    held: Arc<Held>,
    /// The descriptor of the held set's epoll fd registered in `epfd`: `held.fd()`, or a
    /// duplicate of it (`dup`) where `epfd` has it already for another listening fd of the same
    /// listener (a duplicate, an `SO_REUSEPORT` sibling: the kernel keys a registration by
    /// descriptor).
    kfd: c_int,
    /// That duplicate, kept open while registered (removed from `epfd` before it is closed: the
    /// kernel drops a registration only with the last descriptor of its file).
    _dup: Option<colo_sys::OwnedFd>,
}

// Locked at every fork: kept with what the fork handlers write (see `colo_sys::host`).
#[link_section = "colo_fork"]
static LREGS: Mutex<Vec<Option<LReg>>> = Mutex::new(Vec::new());

/// How many registrations are one-shot (their kernel registration and the listener's own are
/// each disarmed when the other reports: `listener_reported`); 0 spares every batch the look.
static ONE_SHOT: AtomicUsize = AtomicUsize::new(0);

fn count_one_shot(events: u32, up: bool) {
    if events & libc::EPOLLONESHOT as u32 != 0 {
        // Relaxed: a hint; a batch that misses a change reports as it did before it.
        if up {
            ONE_SHOT.fetch_add(1, Ordering::Relaxed);
        } else {
            ONE_SHOT.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

fn lregs() -> std::sync::MutexGuard<'static, Vec<Option<LReg>>> {
    LREGS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The events of the held set's registration for the application's `events`: input if it asks
/// for input (else none: a ready set would end its every wait), with its edge-triggered and
/// one-shot flags (not `EPOLLEXCLUSIVE`: the set is this process's own).
fn kernel_events(events: u32) -> u32 {
    events & (libc::EPOLLIN | libc::EPOLLET | libc::EPOLLONESHOT) as u32
}

/// After the application's `epoll_ctl(epfd, op, fd, ev)` on the listening socket `fd`
/// succeeded: the held set's registration in `epfd` follows it (made with the set if this
/// process serves other namespaces on its port).
pub fn follow(epfd: c_int, op: c_int, fd: c_int, ev: *const epoll_event) {
    let _g = Guard::enter();
    let listen = table::lock(fd).and_then(|mut s| match s.entry() {
        Entry::Listen(l) => Some(l.clone()),
        _ => None,
    });
    let Some(h) = listen.and_then(|l| held::of(&l, op == libc::EPOLL_CTL_ADD)) else { return };
    let (events, data) = if ev.is_null() {
        (0, 0)
    } else {
        // SAFETY: the application's event, which the kernel just accepted.
        let e = unsafe { *ev };
        (e.events, e.u64)
    };
    let mut all = lregs();
    let at = all.iter().position(|r| r.as_ref().is_some_and(|r| r.epfd == epfd && r.fd == fd));
    match (op, at) {
        (libc::EPOLL_CTL_ADD, _) => {
            // One left by a listener closed past the shim at this number goes first.
            if let Some(i) = at {
                if let Some(old) = all[i].take() {
                    count_one_shot(old.events, false);
                    // SAFETY: removing our registration of the old set's fd from the application's set.
                    unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, old.kfd, std::ptr::null_mut()) };
                }
            }
            let i = all.iter().position(Option::is_none).unwrap_or_else(|| {
                all.push(None);
                all.len() - 1
            });
            let mut kev = epoll_event { events: kernel_events(events), u64: TAG | LISTENER | i as u64 };
            // SAFETY: adding the held set's epoll fd (open while `h` lives) to the application's set.
            let (kfd, dup) = if unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, h.fd(), &mut kev) } == 0 {
                (h.fd(), None)
            } else {
                // SAFETY: the held set's epoll fd, open while `h` lives, borrowed for the dup.
                let Ok(d) = rustix::io::fcntl_dupfd_cloexec(unsafe { colo_sys::BorrowedFd::borrow_raw(h.fd()) }, colo::internal::fd_floor()) else { return };
                let kfd = std::os::fd::AsRawFd::as_raw_fd(&d);
                // SAFETY: adding our duplicate (owned by the registration) to the application's set.
                if unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, kfd, &mut kev) } != 0 {
                    return;
                }
                (kfd, Some(d))
            };
            count_one_shot(events, true);
            all[i] = Some(LReg { epfd, fd, events, data, held: h, kfd, _dup: dup });
            // Its close then comes through `forget`.
            table::set_epoll(epfd, true);
        }
        (libc::EPOLL_CTL_MOD, Some(i)) => {
            if let Some(r) = all[i].as_mut() {
                count_one_shot(r.events, false);
                count_one_shot(events, true);
                r.events = events;
                r.data = data;
                let mut kev = epoll_event { events: kernel_events(events), u64: TAG | LISTENER | i as u64 };
                // SAFETY: modifying (and so re-arming) our registration in the application's set.
                unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_MOD, r.kfd, &mut kev) };
            }
        }
        (libc::EPOLL_CTL_DEL, Some(i)) => {
            if let Some(old) = all[i].take() {
                count_one_shot(old.events, false);
                // SAFETY: removing our registration from the application's set.
                unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, old.kfd, std::ptr::null_mut()) };
            }
        }
        _ => {}
    }
}

/// The event to report for the held set's registration `d` (a tagged `data` with `LISTENER`)
/// in `epfd`: the listener readable with the application's `data` if a held connection is now
/// ready (after moving them on), else nothing (a one-shot registration is armed again).
pub fn report(epfd: c_int, d: u64) -> Option<epoll_event> {
    let i = (d & 0xFFFF_FFFF) as usize;
    let (h, events, data) = {
        let all = lregs();
        let r = all.get(i)?.as_ref().filter(|r| r.epfd == epfd)?;
        (r.held.clone(), r.events, r.data)
    };
    if h.service() && events & libc::EPOLLIN as u32 != 0 {
        if events & libc::EPOLLONESHOT as u32 != 0 {
            // One report per arming, as the application asked: the listener's own one-shot
            // registration is disarmed too (its re-arm, an EPOLL_CTL_MOD, arms both again).
            let all = lregs();
            if let Some(r) = all.get(i).and_then(Option::as_ref).filter(|r| r.epfd == epfd && Arc::ptr_eq(&r.held, &h)) {
                let mut kev = epoll_event { events: libc::EPOLLONESHOT as u32, u64: r.data };
                // SAFETY: modifying the application's registration of its listener `r.fd` in
                // `epfd` to what one report made of it (disarmed); the application re-arms it
                // after this report, which it is given (`r` is still registered: `r.fd` is open).
                unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_MOD, r.fd, &mut kev) };
            }
        }
        return Some(epoll_event { events: libc::EPOLLIN as u32, u64: data });
    }
    if events & libc::EPOLLONESHOT as u32 != 0 {
        // Under the lock, on the registration still there: `forget` closes a duplicate it owned
        // only after taking it out, and the number may then name another descriptor.
        let all = lregs();
        if let Some(r) = all.get(i).and_then(Option::as_ref).filter(|r| r.epfd == epfd && Arc::ptr_eq(&r.held, &h)) {
            let mut kev = epoll_event { events: kernel_events(r.events), u64: d };
            // SAFETY: re-arming our one-shot registration after a report the application did
            // not get; `r.kfd` is open while `r` is registered (the set's fd, or our duplicate).
            unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_MOD, r.kfd, &mut kev) };
        }
    }
    None
}

/// Whether a one-shot registration of a listener's held set exists (see `listener_reported`).
#[inline]
pub fn any_one_shot() -> bool {
    ONE_SHOT.load(Ordering::Relaxed) != 0
}

/// The kernel reported, in `epfd`, events with these `data` values (of the application's own
/// registrations): a one-shot listener among them has its held set's registration disarmed,
/// so that the listener is reported once per arming (the application's re-arm arms both).
/// Costs one load unless a one-shot registration exists.
pub fn listener_reported(epfd: c_int, data: impl Iterator<Item = u64>) {
    if !any_one_shot() {
        return;
    }
    let all = lregs();
    let mine: Vec<(usize, &LReg)> =
        all.iter().enumerate().filter_map(|(i, r)| Some((i, r.as_ref()?))).filter(|(_, r)| r.epfd == epfd && r.events & libc::EPOLLONESHOT as u32 != 0).collect();
    if mine.is_empty() {
        return;
    }
    for d in data {
        for (i, r) in mine.iter().filter(|(_, r)| r.data == d) {
            let mut kev = epoll_event { events: libc::EPOLLONESHOT as u32, u64: TAG | LISTENER | *i as u64 };
            // SAFETY: disarming our one-shot registration (the set's fd, or our duplicate, open
            // while registered) under the registrations' lock; a re-arm (`follow`) restores it.
            unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_MOD, r.kfd, &mut kev) };
        }
    }
}

/// `fd` (a listener) or the epoll set `epfd` is being closed: the registrations of held sets it
/// has go (the kernel drops the listener's own; ours is of another fd).
pub fn forget(fd: c_int) {
    let gone: Vec<LReg> = {
        let mut all = lregs();
        all.iter_mut().filter(|r| r.as_ref().is_some_and(|r| r.fd == fd || r.epfd == fd)).filter_map(Option::take).collect()
    };
    for r in gone {
        count_one_shot(r.events, false);
        if r.epfd != fd {
            // SAFETY: removing our registration from the application's set, which stays open.
            unsafe { real::epoll_ctl(r.epfd, libc::EPOLL_CTL_DEL, r.kfd, std::ptr::null_mut()) };
        }
    }
}

/// Taken around a fork (registered with the held sets' locks, after them: see
/// `held::fork_guards`), so that the child's copy is whole and unlocked.
pub fn fork_guards(held: &mut colo::internal::fork::Held) {
    held.hold(lregs());
}

/// In a fork child, once the locks are released: the registrations are its parent's (in sets it
/// shares with the parent: not removed from the kernel's sets), forgotten here.
#[link_section = "colo_fork_text"]
pub fn forked() {
    let gone: Vec<_> = {
        let mut l = lregs();
        if l.is_empty() {
            return;
        }
        std::mem::take(&mut *l)
    };
    drop(gone);
}
