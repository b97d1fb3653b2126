//! Processes forked from the serving one: whether an accepted connection may have an offer,
//! asking the service for it over the lineage's socket pair, and taking the service over when
//! the process that served is gone.

use super::thread::{own, service, start};
use crate::base::log::{log_debug, log_info};
use crate::conn::entry::Listen;
use crate::conn::table::{self, Entry};
use crate::record::lineage::{Asked, Lineage};
use crate::service::offer_key;
use colo::internal::carrier::{self, Hello, Key};
use colo::wire::{Mode, Reason};
use colo_sys::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// How long a process forked from the serving one waits for the service's answer.
const ASK_WAIT: Duration = Duration::from_millis(500);

/// In a process forked from the service's: whether the connection just accepted on `l` may have
/// an offer (then ask the service). The client's HELLO is sent before its SYN, so it is either
/// still queued at the rendezvous (readable), or being taken by the service (`busy`), or held
/// (`offers`): checked in that order, as the service moves it the other way.
pub(super) fn may_have_offer(l: &Listen) -> bool {
    let shared = l.lineage.shared;
    let mut p = [rustix::event::PollFd::new(&l.rendezvous, rustix::event::PollFlags::IN)];
    let queued = rustix::event::poll(&mut p, Some(&rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 })).map_or(true, |n| n > 0);
    // SYNC POINT with `offers::drain_one` (busy) and `offers::publish` (offers): the loads below
    // come after the look at the queue (a system call is no fence on every architecture).
    std::sync::atomic::fence(Ordering::SeqCst);
    queued || shared.busy.load(Ordering::SeqCst) != 0 || shared.offers.load(Ordering::SeqCst) != 0
}

/// The listeners of `lineage` this process holds (inherited with their rendezvous descriptors).
fn inherited_listeners(lineage: &'static Lineage) -> Vec<Arc<Listen>> {
    let mut out = Vec::new();
    for fd in table::fds_of_kind(table::LISTEN) {
        let Some(mut slot) = table::lock(fd as i32) else { continue };
        if let Entry::Listen(l) = slot.entry() {
            if std::ptr::eq(l.lineage, lineage) && !out.iter().any(|x| Arc::ptr_eq(x, l)) {
                out.push(l.clone());
            }
        }
    }
    out
}

/// The service of `lineage` ended (its owner word reads `seen`): a server that daemonizes after
/// `listen` (the parent exits, the child serves; nginx does by default) would otherwise leave
/// every offer unanswered, and every client would wait for its carrier timeout. This process
/// starts a service for the listeners of that lineage it holds, unless it already serves one;
/// the owner word makes exactly one of the processes that try the one that serves.
fn orphaned(lineage: &'static Lineage, seen: u32) {
    if own().is_some() || Lineage::is_alive(seen) || !lineage.intact() {
        return;
    }
    let listens = inherited_listeners(lineage);
    if listens.is_empty() {
        return;
    }
    let n = listens.len();
    if start(lineage, seen, listens).is_some() {
        log_info(format_args!("the process that listened is gone: serving colo offers for {n} inherited listener(s)"));
    }
}

/// In a fork child: let go of the parent's service wake-up descriptor (only the parent's
/// service thread reads it). The lineage's socket pair is kept: this process may ask on it, and
/// may have to serve it once the parent is gone. Only a child of the serving process closes it:
/// in a grandchild the service is still its grandparent's, whose descriptor the child closed
/// already (the number may have been reused by the program meanwhile). Nothing is written here
/// but the descriptor table: a page written in the child costs it a copy.
#[link_section = "colo_fork_text"]
pub fn atfork_child() {
    if let Some(svc) = service() {
        if svc.pid != colo_sys::host::pid() && svc.pid == colo_sys::host::forked_from() {
            // SAFETY: closing our inherited copy of a descriptor only the parent's service
            // thread uses; nothing in this process refers to it (`svc.pid` is not ours), and the
            // service is our parent's: no process of this line closed it before. By system
            // call: the shim's own `close` would look the number up as the program's.
            unsafe { rustix::io::close(svc.wake.as_raw_fd()) };
        }
    }
}

/// Whether this process holds a service it did not start (inherited with listeners from the
/// process that did): [`before_fork`] has work only then.
pub fn serving_elsewhere() -> bool {
    service().is_some_and(|svc| svc.pid != colo_sys::host::pid())
}

/// Called in the parent before `fork`: a child forked from a process whose offer service is gone
/// should find a live one (ours) without each child starting its own first. Costs one load
/// unless this process holds listeners it did not open itself.
pub fn before_fork() {
    let Some(svc) = service() else { return };
    if svc.pid != colo_sys::host::pid() {
        let seen = svc.lineage.owner();
        if !Lineage::is_alive(seen) {
            orphaned(svc.lineage, seen);
        }
    }
}

/// Asks the service of `lineage` for the offer of `k` (starting one here if it is gone).
pub(super) fn fetch(lineage: &'static Lineage, k: &Key) -> Option<Box<Hello>> {
    let (answer, fds) = match lineage.ask(&offer_key::encode(k), ASK_WAIT, |seen| orphaned(lineage, seen)) {
        Asked::Answer(a, fds) => (a, fds),
        Asked::Nothing(why) => {
            log_debug(format_args!("offer service: {why}"));
            return None;
        }
    };
    if answer.len() != 2 || answer[0] != 1 || fds.len() != 2 {
        return None;
    }
    let mode = if answer[1] == Mode::Direct as u8 { Mode::Direct } else { Mode::Carrier };
    let mut it = fds.into_iter();
    let (control, memfd) = (it.next()?, it.next()?);
    let h = carrier::hello_from_fds(control, memfd, mode).ok().map(Box::new)?;
    if h.key() != Some(*k) {
        carrier::reject(&h.control, Reason::BadMessage);
        log_info(format_args!("offer service answered for another connection than {} -> {}; plain TCP", k.0, k.1));
        return None;
    }
    Some(h)
}
