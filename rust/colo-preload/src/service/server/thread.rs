//! The offer service: one thread per lineage, in the process that owns the lineage (the first
//! to listen, or a process forked from it once it is gone), collecting offers as they arrive,
//! expiring them on its own timer, tending the short-lived markers, and answering the requests
//! of the processes forked from it.

use super::markers::tend_markers;
use super::offers::{drain, expire, publish, take, State};
use crate::base::log::log_info;
use crate::conn::entry::Listen;
use crate::record::lineage::{Lineage, Request};
use crate::service::offer_key;
use colo_sys::{AsFd, AsRawFd, OwnedFd};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// While the application's own accepts collect the offers (`accept::on_accept` reads the
/// rendezvous of the listener it accepted on), and this process has not forked lately, the
/// service thread leaves the rendezvous alone and looks at them every
/// `ACCEPTS_COLLECT_EVERY_MS`: an event loop that accepts a connection per request then takes
/// its offer on its own thread, with no second thread woken for the HELLO and no contention for
/// the state lock. A process that forks per connection from its accepting thread (postgres)
/// keeps the service thread collecting beside its accepts, so that the accept path every
/// connection waits on stays short. Back to waking for each HELLO `ACCEPTS_QUIET_MS` after the
/// last accept that collected one (docs/ARCHITECTURE.md has the measurements), and never while
/// another process's listener on the same address asks for offers (`offers::asked_lately`): its
/// accepts wait on the answers.
const ACCEPTS_QUIET_MS: u64 = 1000;
const ACCEPTS_COLLECT_EVERY_MS: u64 = 20;

/// When (`marker::now_ms`) an accept of this process last collected offers itself.
static ACCEPT_COLLECTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// An accept of this process has just collected the offers of its listener.
pub(super) fn accept_collected() {
    ACCEPT_COLLECTED.store(crate::record::marker::now_ms(), Ordering::Relaxed);
}

/// Whether the service thread leaves the rendezvous to the accepts now (see `ACCEPTS_QUIET_MS`).
fn accepts_collect() -> bool {
    let now = crate::record::marker::now_ms();
    let since_collected = now.saturating_sub(ACCEPT_COLLECTED.load(Ordering::Relaxed));
    // The last fork, on `marker::now_ms`'s clock.
    let since_fork = now.saturating_sub(colo_sys::host::last_fork_ms());
    since_collected < ACCEPTS_QUIET_MS && since_fork >= ACCEPTS_QUIET_MS && !super::offers::asked_lately()
}

/// One offer service: the process it runs in, its lineage, what it holds, and the eventfd that
/// wakes its thread.
pub(super) struct Service {
    pub(super) pid: u32,
    pub(super) lineage: &'static Lineage,
    pub(super) state: Mutex<State>,
    pub(super) wake: OwnedFd,
    /// Notified (with `state`'s lock) each time the thread has collected the descriptors it polls.
    pub(super) collected: Condvar,
}

/// The offer service of this process (or, in a fork child, of the process it was forked from).
static SERVICE: AtomicPtr<Service> = AtomicPtr::new(std::ptr::null_mut());

pub(super) fn service() -> Option<&'static Service> {
    // SYNC POINT with the Release store in `start`.
    let p = SERVICE.load(Ordering::Acquire);
    // SAFETY: services are leaked (never freed), so a non-null pointer stays valid.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// This process's own service, if it runs one.
pub(super) fn own() -> Option<&'static Service> {
    service().filter(|s| s.pid == colo_sys::host::pid())
}

pub(super) fn own_service() -> io::Result<&'static Service> {
    if let Some(s) = own() {
        return Ok(s);
    }
    let lineage = Lineage::new()?;
    start(lineage, lineage.owner(), Vec::new()).ok_or_else(|| io::Error::other("the service thread did not start"))
}

/// A wake-up eventfd for the service thread, private to its process (fork children close their
/// copy), so ringing it never blocks.
fn wake_fd() -> io::Result<OwnedFd> {
    let fd = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK)?;
    out_of_the_way(fd)
}

/// Wakes the service thread: it looks at its listeners, offers and markers again.
pub(super) fn ring(svc: &Service) {
    let _ = rustix::io::write(&svc.wake, &1u64.to_ne_bytes());
}

/// Starts a service thread in this process for `lineage`, serving `listens`, if it becomes the
/// lineage's owner (the owner word still reads `seen`); returns the service it then is.
pub(super) fn start(lineage: &'static Lineage, seen: u32, listens: Vec<Arc<Listen>>) -> Option<&'static Service> {
    let wake = match wake_fd() {
        Ok(w) => w,
        Err(e) => {
            log_info(format_args!("offer service: {e}"));
            return None;
        }
    };
    let state = State { listens, waiting: Vec::new(), offers: HashMap::new(), rivals: Vec::new(), shared: lineage.shared, swept: Instant::now(), full: false, full_uids: Vec::new(), starved: None, closed_here: Vec::new(), collected: 0, asks: Vec::new() };
    let svc = Box::new(Service { pid: colo_sys::host::pid(), lineage, state: Mutex::new(state), wake, collected: Condvar::new() });
    let (tx, rx) = std::sync::mpsc::sync_channel::<Option<usize>>(1);
    let spawned = colo_sys::host::spawn("colo-offers", move || {
            if !svc.lineage.take_over(seen) {
                // Another process (or thread) serves: this one's `wake` is closed with it.
                let _ = tx.send(None);
                return;
            }
            let svc: &'static Service = Box::leak(svc);
            {
                // Counts a service that ended left behind are not this one's.
                let st = lock(svc);
                // SYNC POINT with the SeqCst loads in `forked::may_have_offer`, as in
                // `offers::drain_one`.
                svc.lineage.shared.busy.store(0, Ordering::SeqCst);
                publish(&st);
            }
            // SYNC POINT with the Acquire load in `service`: a thread that sees the pointer sees
            // the Service built above.
            SERVICE.store(svc as *const Service as *mut Service, Ordering::Release);
            let _ = tx.send(Some(svc as *const Service as usize));
        serve(svc)
    });
    if let Err(e) = spawned {
        log_info(format_args!("offer service: {e}"));
        return None;
    }
    // The verdict comes at once (the thread's first act); a thread that died first dropped `tx`.
    // SAFETY: the pointer is to a leaked `Service` (never freed).
    rx.recv().ok().flatten().map(|p| unsafe { &*(p as *const Service) })
}

/// A descriptor the service keeps for long, moved out of the numbers the application uses: a
/// program that `dup2`s onto a low number it believes free (a shell redirection, `dup2(s, 5)`)
/// would otherwise close the rendezvous under the service, which then took the application's
/// next connection at that number for its own.
pub(super) fn out_of_the_way(fd: OwnedFd) -> io::Result<OwnedFd> {
    colo_sys::preload::move_above(fd, colo::internal::fd_floor())
}

pub(super) fn lock(s: &Service) -> std::sync::MutexGuard<'_, State> {
    s.state.lock().unwrap_or_else(|e| e.into_inner())
}

/// Answers one request of a process of the lineage: the offer's descriptors, or "none".
fn answer_request(svc: &Service, req: Request) {
    let Some(k) = offer_key::decode(&req.bytes) else {
        return req.answer(&[0, 0], &[]);
    };
    let hello = {
        let mut st = lock(svc);
        drain(&mut st);
        let h = take(&mut st, &k);
        publish(&st);
        h
    };
    match hello {
        Some(h) => {
            req.answer(&[1, h.mode as u8], &[h.control.as_fd(), h.memfd()]);
        }
        None => req.answer(&[0, 0], &[]),
    }
}

fn serve(svc: &'static Service) {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut next_expiry: Option<Instant> = None;
    // Whether the lineage's socket pair is still open here (a program that closes descriptors
    // it does not know closes it too: its processes then get no answers, and this thread must
    // not spin on the invalid descriptor).
    let mut requests = true;
    loop {
        // Before the rendezvous are collected: it may let go of some (closing their fds).
        let closed_ms = closed_here(svc);
        let accepting = accepts_collect();
        let fds: Vec<i32> = {
            let mut st = lock(svc);
            let starved = st.starved.is_some_and(|t| t > Instant::now());
            if !starved {
                st.starved = None;
            }
            let listens = st.listens.iter().filter(|_| !starved && !accepting);
            let mut v: Vec<i32> = listens.map(|l| l.rendezvous.as_raw_fd()).collect();
            if !accepting {
                v.extend(st.waiting.iter().map(|w| w.0.as_raw_fd()));
            }
            st.collected = st.collected.wrapping_add(1);
            svc.collected.notify_all();
            v
        };
        let mut pfds = Vec::with_capacity(fds.len() + 2);
        pfds.push(PollFd::new(&svc.wake, PollFlags::IN));
        let serve_fd = svc.lineage.serve_fd();
        if requests {
            pfds.push(PollFd::new(&serve_fd, PollFlags::IN));
        }
        // SAFETY: these fds stay open while we poll: listens are only removed under the lock, by
        // `listen::on_close_listen`, which wakes us first, or by this thread (`closed_here`),
        // and a closed fd in poll only reports POLLNVAL.
        let borrowed: Vec<_> = fds.iter().map(|&f| unsafe { colo_sys::BorrowedFd::borrow_raw(f) }).collect();
        for b in &borrowed {
            pfds.push(PollFd::new(b, PollFlags::IN));
        }
        // The pending offers' timer: the thread wakes when the oldest expires, whatever else
        // happens (or not) meanwhile.
        let until_expiry = next_expiry.map_or(u64::MAX, |t| t.saturating_duration_since(Instant::now()).as_millis() as u64 + 1);
        let starved_ms = lock(svc).starved.map_or(u64::MAX, |t| t.saturating_duration_since(Instant::now()).as_millis() as u64 + 1);
        let collect_ms = if accepting { ACCEPTS_COLLECT_EVERY_MS } else { u64::MAX };
        let wait_ms = tend_markers(svc.lineage.shared, || lock(svc).listens.clone())
            .min(1000)
            .min(until_expiry)
            .min(starved_ms)
            .min(closed_ms)
            .min(collect_ms) as i64;
        let t = rustix::event::Timespec { tv_sec: wait_ms / 1000, tv_nsec: wait_ms % 1000 * 1_000_000 };
        let _ = poll(&mut pfds, Some(&t));
        let woke = pfds[0].revents().contains(PollFlags::IN);
        let req = requests && pfds[1].revents().contains(PollFlags::IN);
        if requests && pfds[1].revents().contains(PollFlags::NVAL) {
            requests = false;
            log_info(format_args!("offer service: the program closed its socket pair; processes forked from this one get no offers"));
        }
        drop(pfds);
        if woke {
            let mut b = [0u8; 8];
            let _ = rustix::io::read(&svc.wake, &mut b);
        }
        {
            let mut st = lock(svc);
            drain(&mut st);
            next_expiry = expire(&mut st);
        }
        if req {
            while let Some(r) = svc.lineage.next_request() {
                answer_request(svc, r);
            }
        }
    }
}

/// Waits (at most `MAX_WAIT`) until the service thread has collected the descriptors it polls
/// since `since` (`State::collected` read under the lock that took a listener out of `listens`),
/// and so polls that listener's rendezvous no more: its poll of the old set has returned. A
/// poll holds a reference to each descriptor's file while it scans them, so a close of the
/// rendezvous in another thread meanwhile leaves the last reference to the poll, which releases
/// the socket, and with it the rendezvous name, only when it returns. The caller then closes the
/// rendezvous itself, and its name is free when its close returns: a program that listens again
/// on the same address at once (iperf3 after each test) binds it again.
pub(super) fn polled_without(svc: &Service, since: u64) {
    const MAX_WAIT: Duration = Duration::from_millis(100);
    let deadline = Instant::now() + MAX_WAIT;
    let mut st = lock(svc);
    while st.collected == since {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        st = svc.collected.wait_timeout(st, left).map_or_else(|e| e.into_inner().0, |r| r.0);
    }
}

/// Stops serving the listeners this process closed (`listen::on_close_listen`) once the kernel
/// no longer lists their sockets (no child holds them either); the milliseconds until the next
/// look. A close not yet done is looked at again soon; a socket still listening, each second.
fn closed_here(svc: &Service) -> u64 {
    let now = Instant::now();
    let me = colo_sys::host::pid();
    let due: Vec<(i32, u64, bool)> = {
        let st = lock(svc);
        st.closed_here.iter().filter(|c| c.next <= now).map(|c| (c.fd, c.inode, c.listen.pid == me)).collect()
    };
    let mut gone = Vec::new();
    let mut later = Vec::new();
    for (fd, inode, listened_here) in due {
        // SAFETY: fstat of a number that may or may not be open; only its answer is used.
        let still_ours = rustix::fs::fstat(unsafe { colo_sys::BorrowedFd::borrow_raw(fd) }).is_ok_and(|st| st.st_ino == inode);
        if still_ours {
            later.push((inode, Duration::from_millis(10)));
        } else if colo_sys::diag::listening(inode).unwrap_or(false)
            && (!listened_here || claimer_holds(inode, svc.lineage.ask_end()) != Some(false))
        {
            later.push((inode, Duration::from_secs(1)));
        } else {
            gone.push(inode);
        }
    }
    let mut st = lock(svc);
    for inode in gone {
        if let Some(i) = st.closed_here.iter().position(|c| c.inode == inode) {
            let c = st.closed_here.swap_remove(i);
            st.listens.retain(|x| !Arc::ptr_eq(x, &c.listen));
        }
    }
    for (inode, after) in later {
        if let Some(c) = st.closed_here.iter_mut().find(|c| c.inode == inode) {
            c.next = now + after;
        }
    }
    st.closed_here.iter().map(|c| c.next.saturating_duration_since(now).as_millis() as u64 + 1).min().unwrap_or(u64::MAX)
}

/// Whether a process that can claim this lineage's offers holds the socket with inode `ino`, a
/// listener this process made: one that still has the lineage's request socket (`ask`: its
/// number here and inode; it is close-on-exec) among this process and its descendants (the only
/// processes that can have both from a fork). An image an `exec` replaced holds the socket
/// without it: it knows nothing of the rendezvous and claims no offer, so serving it would only
/// leave each client waiting its carrier timeout. `None` where this cannot tell (no /proc of
/// its own, as in a chroot without one, where every process would look gone; no `children`
/// files in /proc, descriptors it may not read, a tree too large): the listener is then kept
/// served. Looked at each second while the socket is listed: a process's descriptors are read
/// only if it has the request socket (where it inherited it), and only up to the listener's.
fn claimer_holds(ino: u64, ask: (i32, u64)) -> Option<bool> {
    use std::io::ErrorKind::NotFound;
    let (want_sock, want_ask) = (format!("socket:[{ino}]"), format!("socket:[{}]", ask.1));
    let me = colo_sys::host::pid();
    std::fs::metadata(format!("/proc/{me}/fd")).ok()?;
    let mut todo = vec![me];
    let mut looked = 0;
    while let Some(pid) = todo.pop() {
        looked += 1;
        if looked > 4096 {
            return None;
        }
        match std::fs::read_link(format!("/proc/{pid}/fd/{}", ask.0)) {
            Ok(l) if l.as_os_str() == want_ask.as_str() => match std::fs::read_dir(format!("/proc/{pid}/fd")) {
                Ok(d) => {
                    let holds = d.flatten().any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.as_os_str() == want_sock.as_str()));
                    if holds {
                        return Some(true);
                    }
                }
                Err(e) if e.kind() == NotFound => continue,
                Err(_) => return None,
            },
            // No request socket there (closed, or exec'd), or the process exited.
            Ok(_) => {}
            Err(e) if e.kind() == NotFound => {}
            Err(_) => return None,
        }
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { continue };
        for t in tasks.flatten() {
            match std::fs::read_to_string(t.path().join("children")) {
                Ok(kids) => todo.extend(kids.split_whitespace().filter_map(|k| k.parse::<u32>().ok())),
                Err(e) if e.kind() == NotFound && t.path().exists() => return None,
                Err(_) => {}
            }
        }
    }
    Some(false)
}
