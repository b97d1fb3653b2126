//! Readiness through poll, ppoll, select and pselect: a set with accelerated fds is answered from
//! the rings, each connection's control socket and self bell (`Conn::kernel_fds`) standing in
//! for its socket in the kernel's wait. An epoll set with connections in it, polled itself, is
//! answered from its registrations' rings too (`epoll::set_polled`).

use crate::api::epoll;
use crate::base::guard::Guard;
use crate::base::mem::{slice, slice_mut};
use crate::conn::regs::waker;
use crate::conn::state::{Conn, ERR, HUP};
use crate::conn::waking::Waking;
use crate::conn::table;
use crate::real;
use crate::service::{client, elsewhere};
use crate::service::server::held::{self, Held};
use libc::{c_int, nfds_t, pollfd, sigset_t, timespec};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// poll/ppoll over a mix of kernel and accelerated fds. `timeout`: None waits forever.
pub unsafe fn ppoll_impl(fds: *mut pollfd, n: nfds_t, timeout: Option<Duration>, mask: *const sigset_t) -> c_int {
    // A timeout past what the clock can say (`tv_sec` near its maximum) waits for ever, as the kernel's.
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    loop {
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        // SAFETY: the caller's contract, passed on.
        if let Some(r) = unsafe { ppoll_round(fds, n, left, mask) } {
            return r;
        }
    }
}

/// One round of [`ppoll_impl`]: `None` when a connect to another namespace whose answer was
/// awaited in it (`elsewhere::undecided`) can be decided now and nothing else was reported (the
/// next round decides it, and polls it as what it became).
unsafe fn ppoll_round(fds: *mut pollfd, n: nfds_t, timeout: Option<Duration>, mask: *const sigset_t) -> Option<c_int> {
    // SAFETY: `n` pollfds at `fds`, as the application promised.
    let arr = unsafe { slice_mut(fds, n as usize) };
    let g = Guard::enter();
    // Connects whose answer has not come: the kernel watches each for the answer (input), and
    // nothing is reported for it until it is decided, as for a connect still under way. The
    // others are decided first (a same-namespace offer's answer is awaited here, bounded).
    let dialing: Vec<(usize, Instant)> = arr.iter().enumerate().filter_map(|(i, p)| elsewhere::undecided(p.fd).map(|d| (i, d))).collect();
    let is_dialing = |i: usize| dialing.iter().any(|d| d.0 == i);
    for (i, p) in arr.iter().enumerate() {
        if !is_dialing(i) {
            client::resolve_fd(p.fd);
        }
    }
    let conns: Vec<(usize, Arc<Conn>)> =
        arr.iter().enumerate().filter_map(|(i, p)| table::conn(p.fd).map(|c| (i, c))).collect();
    // Listeners watched for input with connections held aside (`server::held`): their sets'
    // fds are polled with them, and a resolved connection reports the listener readable.
    let listens: Vec<(usize, Arc<Held>)> = arr
        .iter()
        .enumerate()
        .filter(|(_, p)| p.events & libc::POLLIN != 0)
        .filter_map(|(i, p)| held_of(p.fd).map(|h| (i, h)))
        .collect();
    // Epoll sets with connections in them, watched for input (`epoll::set_polled`).
    let sets: Vec<usize> = arr.iter().enumerate().filter(|(_, p)| p.events & libc::POLLIN != 0 && epoll::is_colo_set(p.fd)).map(|(i, _)| i).collect();
    // A timeout past what the clock can say (`tv_sec` near its maximum) waits for ever, as the kernel's.
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    let mut copy: Vec<pollfd> = Vec::with_capacity(arr.len() + 1);
    copy.extend_from_slice(arr);
    let mut armed = false;
    // This thread's own wake-up eventfd, registered with the connections from the first arming
    // on and polled with them: another thread's drain of a doorbell rings it (see
    // `Shm::drain_doorbell`).
    let mut wake = None;
    let mut _waking = None;
    // Without a pass from other threads' drains, sleep in short steps (see `UNPASSED_SLEEP`).
    let mut unpassed = false;
    loop {
        // Rings first.
        let mut ready = 0;
        for (i, c) in &conns {
            let want = arr[*i].events as u32 | ERR | HUP;
            let m = c.ready_quick() & want;
            arr[*i].revents = m as i16;
            if m != 0 {
                ready += 1;
            }
        }
        let ready_listens: Vec<usize> = listens.iter().filter(|(_, h)| h.service()).map(|(i, _)| *i).collect();
        ready += ready_listens.len();
        let ready_sets: Vec<usize> = sets.iter().copied().filter(|&i| epoll::set_polled(arr[i].fd)).collect();
        ready += ready_sets.len();
        let zero = timespec { tv_sec: 0, tv_nsec: 0 };
        if ready > 0 {
            // Report the application's kernel fds' state now too, and whether each connection's
            // control socket or self bell is readable: the quick look did not ask the control
            // socket, so a hang-up the hang-up watcher has not seen yet shows only there; a
            // connection whose control socket or self bell reports is asked now (`ready(true)`),
            // so what is returned is what asking every time would return, without a system call
            // more than the look at the application's fds. What the quick look found stays
            // reported: it was the connection's state then, as the kernel's poll reports the state
            // it found, and another holder (a thread, a fork copy) may have read the bytes since;
            // an answer of nothing would end a wait without a timeout with 0.
            for (i, p) in copy.iter_mut().enumerate() {
                *p = arr[i];
                p.revents = 0;
            }
            for &(i, _) in &dialing {
                copy[i].events = libc::POLLIN;
            }
            let extra = place(&mut copy, &conns, |_| false);
            // SAFETY: our copy of the array (the connections' further fds after the application's).
            let r = unsafe { real::ppoll(copy.as_mut_ptr(), copy.len() as nfds_t, &zero, mask) };
            let hung = hung_up(&copy, &conns, r);
            fold(&mut copy, arr.len(), &extra);
            let mut total = 0;
            for (k, (i, c)) in conns.iter().enumerate() {
                if r > 0 && copy[*i].revents != 0 && !c.known_gone() {
                    arr[*i].revents |= (c.ready(hung[k]) & (arr[*i].events as u32 | ERR | HUP)) as i16;
                }
                if arr[*i].revents != 0 {
                    total += 1;
                }
            }
            for (i, p) in arr.iter_mut().enumerate() {
                if conns.iter().any(|(j, _)| *j == i) {
                    continue;
                }
                // A negative fd's revents the kernel zeroes; an undecided connect has none yet.
                p.revents = if r > 0 && p.fd >= 0 && !is_dialing(i) { copy[i].revents } else { 0 };
                if ready_listens.contains(&i) || ready_sets.contains(&i) {
                    p.revents |= libc::POLLIN;
                }
                if p.revents != 0 {
                    total += 1;
                }
            }
            return Some(g.ok(total as libc::ssize_t) as c_int);
        }
        if !armed {
            wake = if conns.is_empty() { None } else { colo::internal::wake::own_fd() };
            if let Some(fd) = wake {
                _waking = Some(Waking::new(&conns, |(_, c)| c, fd));
            }
            unpassed = !conns.is_empty() && !_waking.as_ref().is_some_and(|w| w.complete());
            let mut any = false;
            for (_, c) in &conns {
                if c.arm_quick(waker(wake)) != 0 {
                    any = true;
                }
            }
            armed = true;
            if any {
                let again = conns.iter().any(|(i, c)| c.ready_quick() & (arr[*i].events as u32 | ERR | HUP) != 0);
                if again {
                    continue;
                }
            }
        }
        // Each polled set readied for the sleep; one that has news now is reported above.
        let Some(polled_sets) = sets.iter().map(|&i| epoll::sleep_on_polled_set(arr[i].fd)).collect::<Option<Vec<_>>>() else {
            continue;
        };
        let short = unpassed || polled_sets.iter().any(|s| !s.complete());
        for (i, p) in copy.iter_mut().enumerate() {
            *p = arr[i];
            p.revents = 0;
        }
        for &(i, _) in &dialing {
            copy[i].events = libc::POLLIN;
        }
        // A connection whose peer is gone and that reported nothing wanted above never will (its
        // control socket stays readable: it hung up): left out, or this sleep would
        // return at once, again and again.
        let extra = place(&mut copy, &conns, |(i, c)| {
            c.known_gone() || (arr[*i].events & (libc::POLLIN | libc::POLLRDHUP)) == 0 && c.peer_gone_quick()
        });
        let mut left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if short {
            left = Some(left.map_or(colo::internal::shm::UNPASSED_SLEEP, |l| l.min(colo::internal::shm::UNPASSED_SLEEP)));
        }
        // Until the first undecided connect's wait for its answer is over, at most.
        if let Some(first) = dialing.iter().map(|d| d.1).min() {
            let l = first.saturating_duration_since(Instant::now());
            left = Some(left.map_or(l, |x| x.min(l)));
        }
        let ts = left.map(|l| timespec { tv_sec: l.as_secs() as i64, tv_nsec: l.subsec_nanos() as i64 });
        let tsp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const timespec);
        for (_, h) in &listens {
            copy.push(pollfd { fd: h.fd(), events: libc::POLLIN, revents: 0 });
        }
        if let Some(fd) = wake {
            copy.push(pollfd { fd, events: libc::POLLIN, revents: 0 });
        }
        // SAFETY: our copy of the array (with the wake-up eventfd after the application's fds).
        let r = unsafe { real::ppoll(copy.as_mut_ptr(), copy.len() as nfds_t, tsp, mask) };
        drop(polled_sets);
        // Woken through our own eventfd: another thread emptied a doorbell, taking with it the
        // announcements made on it, ours too; so re-arm, as after a spurious ring.
        let mut passed = false;
        if let Some(fd) = wake {
            let revents = copy.pop().map_or(0, |p| p.revents);
            if revents & libc::POLLNVAL != 0 {
                // The application closed it: this sleep goes on without one (the next takes
                // another).
                colo::internal::wake::forget_own();
                wake = None;
                _waking = None;
                unpassed = true;
            } else if revents & libc::POLLIN != 0 {
                passed = true;
                // SAFETY: this thread's own eventfd, never closed by us.
                colo_sys::doorbell::drain(unsafe { colo_sys::BorrowedFd::borrow_raw(fd) });
            }
        }
        if r < 0 {
            let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINTR);
            return Some(g.err(e) as c_int);
        }
        // The held sets' fds, after the application's and the connections' further ones: one
        // reported moves its set on.
        let at = arr.len() + extra.len();
        let moved: Vec<usize> = listens
            .iter()
            .enumerate()
            .filter(|(k, (_, h))| copy[at + k].revents != 0 && h.service())
            .map(|(_, (i, _))| *i)
            .collect();
        let hung = hung_up(&copy, &conns, r);
        fold(&mut copy, arr.len(), &extra);
        let mut total = 0;
        // An undecided connect whose answer came (or whose stream ended) meanwhile.
        let mut moved_on = false;
        for (i, p) in arr.iter_mut().enumerate() {
            if conns.iter().any(|(j, _)| *j == i) {
                continue;
            }
            if is_dialing(i) {
                moved_on |= copy[i].revents != 0;
                p.revents = 0;
                continue;
            }
            p.revents = copy[i].revents;
            if moved.contains(&i) {
                p.revents |= libc::POLLIN;
            }
            if p.revents != 0 {
                total += 1;
            }
        }
        for (k, (i, c)) in conns.iter().enumerate() {
            // A number another thread closed while this one slept: the kernel's poll, looking
            // again on a wake-up, finds no file there.
            if !table::conn(arr[*i].fd).is_some_and(|now| Arc::ptr_eq(&now, c)) && closed_number(arr[*i].fd) {
                arr[*i].revents = libc::POLLNVAL;
                total += 1;
                continue;
            }
            // A connection whose control socket or self bell the kernel reported is looked at
            // afresh (a ring), and told gone if its control socket reported a hang-up (one the
            // hang-up watcher may not have seen yet); one whose two stayed quiet had no hang-up
            // on its control socket, and is asked only if the watcher cannot vouch.
            let m = if copy[*i].revents != 0 { c.ready(hung[k]) } else { c.ready_quick() };
            let m = m & (arr[*i].events as u32 | ERR | HUP);
            arr[*i].revents = m as i16;
            if m != 0 {
                total += 1;
            } else if copy[*i].revents != 0 || passed || r == 0 && unpassed {
                // A spurious ring (or a short sleep's end): re-arm before sleeping again.
                c.arm(waker(wake), true);
            }
        }
        if total > 0 {
            return Some(g.ok(total as libc::ssize_t) as c_int);
        }
        if moved_on || dialing.iter().any(|d| Instant::now() >= d.1) {
            return None;
        }
        if r == 0 && !short || deadline.is_some_and(|d| Instant::now() >= d) {
            return Some(g.ok(0) as c_int);
        }
    }
}

/// Whether `fd` is no open descriptor.
fn closed_number(fd: c_int) -> bool {
    // SAFETY: `real::fcntl` is libc's; F_GETFD reads the number's flags and changes nothing.
    unsafe { real::fcntl(fd, libc::F_GETFD, 0) < 0 }
}

/// Puts in `copy` (the application's array) what the kernel watches for each connection of
/// `conns` (`Conn::kernel_fds`): its first fd in the connection's place, its further ones after
/// the application's, whose places in `copy` and connections' in the application's array are
/// returned, for `fold`. A connection for which `skip` holds is left out (fd -1).
fn place(copy: &mut Vec<pollfd>, conns: &[(usize, Arc<Conn>)], skip: impl Fn(&(usize, Arc<Conn>)) -> bool) -> Vec<(usize, usize)> {
    let mut extra = Vec::new();
    for ic in conns {
        let fds = ic.1.kernel_fds();
        let i = ic.0;
        let skipped = skip(ic);
        copy[i].fd = if skipped { -1 } else { fds[0] };
        // RDHUP too: the control socket's own answer says whether the peer hung up
        // (`hung_up`), as `doorbell::hung_up` would be told at the same moment.
        copy[i].events = libc::POLLIN | libc::POLLRDHUP;
        if !skipped {
            for &fd in &fds[1..] {
                extra.push((copy.len(), i));
                copy.push(pollfd { fd, events: libc::POLLIN, revents: 0 });
            }
        }
    }
    extra
}

/// After the kernel's wait `r` on `copy` (before `fold`): for each connection of `conns`, whether
/// its control socket (in the connection's place, `place`) reported a hang-up, as
/// `colo_sys::doorbell::hung_up` would have found it. A control socket left readable by a ring
/// nobody drained yet (a poll that returns what it finds drains nothing) is then no reason to ask
/// the kernel again at every call: `Conn::ready(true)` would (`peer_gone`), a system call a
/// poll while the connection stays unreadable beside one that is read from.
fn hung_up(copy: &[pollfd], conns: &[(usize, Arc<Conn>)], r: c_int) -> Vec<bool> {
    let bits = libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL;
    conns.iter().map(|(i, _)| r > 0 && copy[*i].revents & bits != 0).collect()
}

/// After the kernel's wait: each connection's further fds' `revents` (`place`) join its own
/// place's, and `copy` is the application's length again.
fn fold(copy: &mut Vec<pollfd>, len: usize, extra: &[(usize, usize)]) {
    for &(at, i) in extra {
        copy[i].revents |= copy[at].revents;
    }
    copy.truncate(len);
}

pub fn has_colo(fds: *const pollfd, n: nfds_t) -> bool {
    if Guard::busy() || fds.is_null() {
        return false;
    }
    // More entries than the process may open descriptors the kernel refuses (EINVAL) without
    // reading them; nor are they read here, where they may run past the application's memory.
    if n > 256 && rustix::process::getrlimit(rustix::process::Resource::Nofile).current.is_some_and(|cur| n > cur) {
        return false;
    }
    // SAFETY: `n` pollfds at `fds`.
    let arr = unsafe { slice(fds, n as usize) };
    arr.iter().any(|p| is_colo(p.fd))
}

/// Whether `fd` is a listener with a set of connections held aside in this process.
fn holds(fd: c_int) -> bool {
    table::kind(fd) == table::LISTEN && colo::internal::netns::server_configured() && held_of(fd).is_some()
}

/// The held set of the listener `fd` in this process, if it has one.
fn held_of(fd: c_int) -> Option<Arc<Held>> {
    if table::kind(fd) != table::LISTEN || !colo::internal::netns::server_configured() {
        return None;
    }
    let l = table::lock(fd).and_then(|mut s| match s.entry() {
        table::Entry::Listen(l) => Some(l.clone()),
        _ => None,
    })?;
    held::of(&l, false)
}

/// Whether a number the shim answers for (an accelerated connection, a listener with connections
/// held aside, an epoll set with connections in it) is in one of the sets of a `select`.
fn select_is_colo(nfds: c_int, r: *mut libc::fd_set, w: *mut libc::fd_set, e: *mut libc::fd_set) -> bool {
    if Guard::busy() || nfds <= 0 {
        return false;
    }
    let n = nfds.min(libc::FD_SETSIZE as c_int);
    // SAFETY: fd_sets given by the application (FD_ISSET reads within FD_SETSIZE).
    let isset = |s: *mut libc::fd_set, fd: c_int| !s.is_null() && unsafe { libc::FD_ISSET(fd, s) };
    (0..n).any(|fd| is_colo(fd) && (isset(r, fd) || isset(w, fd) || isset(e, fd)))
}

fn is_colo(fd: c_int) -> bool {
    crate::api::route::is_colo_or_pending(fd) || holds(fd) || epoll::is_colo_set(fd)
}

/// select/pselect: through `ppoll_impl` when an accelerated fd is in a set.
///
/// As the kernel's: every number in a set must be open when the call begins (else `EBADF`, the
/// sets untouched); one another thread closes during the wait is reported in every set it is in
/// when the wait next looks (a wake-up or the timeout), the close itself waking nothing.
pub unsafe fn select_impl(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    timeout: Option<Duration>,
    mask: *const sigset_t,
) -> Option<c_int> {
    if !select_is_colo(nfds, r, w, e) {
        return None;
    }
    let n = nfds.min(libc::FD_SETSIZE as c_int);
    // SAFETY: fd_sets given by the application (FD_ISSET reads within FD_SETSIZE).
    let isset = |s: *mut libc::fd_set, fd: c_int| !s.is_null() && unsafe { libc::FD_ISSET(fd, s) };
    let mut pfds = Vec::new();
    for fd in 0..n {
        let mut ev = 0;
        if isset(r, fd) {
            ev |= libc::POLLIN;
        }
        if isset(w, fd) {
            ev |= libc::POLLOUT;
        }
        if isset(e, fd) {
            ev |= libc::POLLPRI;
        }
        if ev != 0 {
            pfds.push(pollfd { fd, events: ev, revents: 0 });
        }
    }
    // The kernel's look at the sets as the call begins: a number that is no open descriptor
    // fails it. The shim's own connections are open (a close goes through the shim); the other
    // numbers are asked in one system call, with no events, which reports only `POLLNVAL`.
    let mut others: Vec<pollfd> = pfds.iter().filter(|p| !is_colo(p.fd)).map(|p| pollfd { fd: p.fd, events: 0, revents: 0 }).collect();
    if !others.is_empty() {
        // SAFETY: our own array; a zero timeout.
        let k = unsafe { real::poll(others.as_mut_ptr(), others.len() as nfds_t, 0) };
        if k > 0 && others.iter().any(|p| p.revents & libc::POLLNVAL != 0) {
            crate::base::guard::set_errno(libc::EBADF);
            return Some(-1);
        }
    }
    // SAFETY: our own array.
    let rc = unsafe { ppoll_impl(pfds.as_mut_ptr(), pfds.len() as nfds_t, timeout, mask) };
    if rc < 0 {
        return Some(rc);
    }
    for s in [r, w, e] {
        if !s.is_null() {
            // SAFETY: clearing the application's set before we fill it with the result.
            unsafe { libc::FD_ZERO(s) };
        }
    }
    let mut count = 0;
    for p in &pfds {
        // A number closed during the wait: in every set it is in.
        let rv = p.revents;
        let nval = rv & libc::POLLNVAL != 0;
        if !r.is_null() && p.events & libc::POLLIN != 0 && (nval || rv & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0) {
            // SAFETY: fd < n <= FD_SETSIZE, in the application's non-null set `r`.
            unsafe { libc::FD_SET(p.fd, r) };
            count += 1;
        }
        if !w.is_null() && p.events & libc::POLLOUT != 0 && (nval || rv & (libc::POLLOUT | libc::POLLERR) != 0) {
            // SAFETY: fd < n <= FD_SETSIZE, in the application's non-null set `w`.
            unsafe { libc::FD_SET(p.fd, w) };
            count += 1;
        }
        if !e.is_null() && p.events & libc::POLLPRI != 0 && (nval || rv & libc::POLLPRI != 0) {
            // SAFETY: fd < n <= FD_SETSIZE, in the application's non-null set `e`.
            unsafe { libc::FD_SET(p.fd, e) };
            count += 1;
        }
    }
    Some(count)
}
