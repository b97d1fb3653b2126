//! What a [`Listener`](crate::Listener) holds for clients that have not finished their
//! handshake (spec/WIRE.md sections 2 and 3, "Half-open handshakes"): rendezvous connections
//! whose HELLO has not arrived, and CARRIER offers waiting for their TCP connection.
//!
//! Each kind is bounded in count, in all ([`MAX_HALF_OPEN`], or less under a low limit of open
//! files: [`bound`]) and per client uid (a quarter of that), so that one user cannot take every
//! place: a client beyond them
//! gets `REJECT(NO_RESOURCES)` (and uses TCP). Each expires [`HELLO_TIMEOUT`] after it arrived,
//! on a timer (a `timerfd` in the listener's poll set) that fires whether or not another
//! connection comes, and wakes whoever polls the listener.

use crate::carrier::{Hello, Key};
use colo_sys::OwnedFd;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A client that connects to the rendezvous and says nothing, or offers a CARRIER segment and
/// never connects over TCP, is dropped after this long.
pub(crate) const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// At most this many silent rendezvous connections, and as many offers, are kept.
pub(crate) const MAX_HALF_OPEN: usize = 1024;
/// At most this many of each kind from one client uid (under `MAX_HALF_OPEN`).
#[cfg(test)]
const MAX_HALF_OPEN_PER_UID: usize = MAX_HALF_OPEN / 4;

/// How many of each kind a listener keeps: [`MAX_HALF_OPEN`], or an eighth of the soft limit of
/// open files if that is less (at least 16). Each holds descriptors (its control socket; an offer
/// also its memfd), where over TCP a client that has not finished its handshake holds none of
/// the program's: the two kinds together leave most of a limit of 1024 to the program.
pub(crate) fn bound(soft_open_files: Option<u64>) -> usize {
    let eighth = soft_open_files.map_or(usize::MAX, |n| usize::try_from(n / 8).unwrap_or(usize::MAX));
    MAX_HALF_OPEN.min(eighth).max(16)
}
/// At most this many offers for one 4-tuple, each from another uid (see `HalfOpen::rivals`).
const MAX_OFFERS_PER_KEY: usize = 8;

/// A rendezvous connection whose HELLO has not arrived.
pub(crate) struct Pending {
    pub(crate) fd: OwnedFd,
    pub(crate) since: Instant,
    pub(crate) uid: u32,
}

/// A CARRIER offer waiting for its TCP connection.
struct Offered {
    hello: Box<Hello>,
    since: Instant,
    uid: u32,
}

/// Why a half-open handshake was not kept, `most` of each kind being kept.
fn full_reason(kind: &str, total: bool, most: usize) -> String {
    if total {
        format!("{most} {kind} already held; REJECT(NO_RESOURCES)")
    } else {
        format!("{} {kind} of this uid already held; REJECT(NO_RESOURCES)", most / 4)
    }
}

/// Whether one more entry of `uid` fits among `uids`, `most` of them in all (a quarter of them
/// one uid's); `Err(true)`: the total is reached, `Err(false)`: the uid's share.
fn room(mut uids: impl Iterator<Item = u32>, len: usize, uid: u32, most: usize) -> Result<(), bool> {
    if len >= most {
        return Err(true);
    }
    let share = most / 4;
    if uids.by_ref().filter(|u| *u == uid).take(share).count() >= share {
        return Err(false);
    }
    Ok(())
}

/// The half-open handshakes of one listener and the timer that expires them.
pub(crate) struct HalfOpen {
    pub(crate) pending: Vec<Pending>,
    offers: HashMap<Key, Offered>,
    /// Further offers for a 4-tuple `offers` holds one for, each from a uid no other held offer
    /// for it comes from, oldest first. At most one sender owns the connection's client end, and
    /// which one is known only once the TCP connection is accepted; an offer that replaced the
    /// earlier one (anyone can read a connection waiting in the backlog in `/proc/net/tcp`) or
    /// was refused for it would let another user keep the real client off shared memory. The
    /// claim takes them in order and its owner check refuses the others.
    rivals: Vec<(Key, Offered)>,
    timer: Option<OwnedFd>,
    /// The deadline the timer is armed for, if any.
    armed_for: Option<Instant>,
    /// How many of each kind are kept ([`bound`]).
    most: usize,
}

impl std::fmt::Debug for HalfOpen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HalfOpen").field("pending", &self.pending.len()).field("offers", &self.offers.len()).finish()
    }
}

impl HalfOpen {
    /// `timer`: a `colo_sys::timer` descriptor the caller polls (None: the caller polls with a
    /// timeout of [`HalfOpen::next_deadline`] instead). `most` of each kind are kept ([`bound`]).
    pub(crate) fn new(timer: Option<OwnedFd>, most: usize) -> HalfOpen {
        HalfOpen { pending: Vec::new(), offers: HashMap::new(), rivals: Vec::new(), timer, armed_for: None, most }
    }

    /// Keeps a silent rendezvous connection, or gives it back (with the reason) if its place
    /// would exceed a bound.
    pub(crate) fn admit_pending(&mut self, p: Pending) -> Result<(), (Pending, String)> {
        if let Err(total) = room(self.pending.iter().map(|p| p.uid), self.pending.len(), p.uid, self.most) {
            return Err((p, full_reason("silent rendezvous connections", total, self.most)));
        }
        self.pending.push(p);
        self.schedule();
        Ok(())
    }

    /// Keeps a CARRIER offer under `key` (replacing an earlier offer for the same 4-tuple from
    /// the same uid; one from another uid is kept beside it, see `rivals`), or gives it back
    /// (with the reason) if its place would exceed a bound.
    pub(crate) fn admit_offer(&mut self, key: Key, hello: Box<Hello>, uid: u32) -> Result<(), (Box<Hello>, String)> {
        let first_is_mine = self.offers.get(&key).is_some_and(|o| o.uid == uid);
        let rival_of_mine = self.rivals.iter().position(|(k, o)| *k == key && o.uid == uid);
        // The offer it replaces does not count.
        let replaced = first_is_mine || rival_of_mine.is_some();
        let skip = |k: &Key, u: u32| replaced && *k == key && u == uid;
        let uids = self.offers.iter().filter(|(k, o)| !skip(k, o.uid)).map(|(_, o)| o.uid);
        let uids = uids.chain(self.rivals.iter().filter(|(k, o)| !skip(k, o.uid)).map(|(_, o)| o.uid));
        let len = self.offers.len() + self.rivals.len() - usize::from(replaced);
        if let Err(total) = room(uids, len, uid, self.most) {
            return Err((hello, full_reason("CARRIER offers", total, self.most)));
        }
        let offered = Offered { hello, since: Instant::now(), uid };
        if let Some(i) = rival_of_mine {
            self.rivals[i].1 = offered;
        } else if self.offers.contains_key(&key) && !first_is_mine {
            if self.rivals.iter().filter(|(k, _)| *k == key).count() + 1 >= MAX_OFFERS_PER_KEY {
                return Err((offered.hello, format!("{MAX_OFFERS_PER_KEY} offers for this connection already held; REJECT(NO_RESOURCES)")));
            }
            self.rivals.push((key, offered));
        } else {
            self.offers.insert(key, offered);
        }
        self.schedule();
        Ok(())
    }

    /// Takes the oldest offer for `key` (the next one for it, if any, moves up).
    pub(crate) fn take_offer(&mut self, key: &Key) -> Option<Box<Hello>> {
        let first = self.offers.remove(key);
        let next = self.rivals.iter().position(|(k, _)| k == key).map(|i| self.rivals.remove(i).1);
        match (first, next) {
            (Some(first), Some(next)) => {
                self.offers.insert(*key, next);
                Some(first.hello)
            }
            (first, next) => first.or(next).map(|o| o.hello),
        }
    }

    /// Drops what waited [`HELLO_TIMEOUT`] (closing a descriptor also takes it out of every
    /// epoll set) and arms the timer for the next deadline.
    pub(crate) fn expire(&mut self) {
        let now = Instant::now();
        let alive = |since: Instant| now.saturating_duration_since(since) < HELLO_TIMEOUT;
        // Their HELLO never read, they still take descriptors: emptied before their close.
        let (kept, gone): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending).into_iter().partition(|p| alive(p.since));
        self.pending = kept;
        gone.into_iter().for_each(|p| colo_sys::seqpacket::let_go(p.fd));
        self.offers.retain(|_, o| alive(o.since));
        self.rivals.retain(|(_, o)| alive(o.since));
        if self.armed_for.is_some_and(|at| at <= now) {
            self.armed_for = None;
        }
        self.schedule();
    }

    /// The timer fired: consumes it and expires.
    pub(crate) fn fired(&mut self) {
        if let Some(t) = &self.timer {
            colo_sys::timer::drain(t);
        }
        self.armed_for = None;
        self.expire();
    }

    /// When the next half-open handshake expires.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let p = self.pending.iter().map(|p| p.since);
        let o = self.offers.values().map(|o| o.since);
        let r = self.rivals.iter().map(|(_, o)| o.since);
        p.chain(o).chain(r).min().map(|since| since + HELLO_TIMEOUT)
    }

    /// Arms the timer for the next deadline if it is not armed for one as early (one system call
    /// when the first half-open handshake arrives after none, or as each expires; none for the
    /// ones between, which expire later than the deadline armed).
    fn schedule(&mut self) {
        let Some(timer) = &self.timer else { return };
        let Some(next) = self.next_deadline() else { return };
        if self.armed_for.is_some_and(|at| at <= next) {
            return;
        }
        // If arming fails the timer stays as it was; `expire` runs again at each accept.
        if colo_sys::timer::arm(timer, Some(next.saturating_duration_since(Instant::now()))).is_ok() {
            self.armed_for = Some(next);
        }
    }

    /// How many offers are held (for tests and logs).
    #[cfg(test)]
    pub(crate) fn offers(&self) -> usize {
        self.offers.len() + self.rivals.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(uid: u32) -> Pending {
        Pending { fd: colo_sys::doorbell::create().unwrap(), since: Instant::now(), uid }
    }

    #[test]
    fn pending_bounded_per_uid_and_in_all() {
        let mut h = HalfOpen::new(None, MAX_HALF_OPEN);
        for _ in 0..MAX_HALF_OPEN_PER_UID {
            assert!(h.admit_pending(pending(7)).is_ok());
        }
        let (_, why) = h.admit_pending(pending(7)).expect_err("uid 7's share is full");
        assert!(why.contains("of this uid"), "{why}");
        let mut uid = 100;
        while h.pending.len() < MAX_HALF_OPEN {
            assert!(h.admit_pending(pending(uid)).is_ok());
            if h.pending.iter().filter(|p| p.uid == uid).count() == MAX_HALF_OPEN_PER_UID {
                uid += 1;
            }
        }
        let (_, why) = h.admit_pending(pending(9999)).expect_err("the total is reached");
        assert!(why.starts_with(&MAX_HALF_OPEN.to_string()), "{why}");
    }

    #[test]
    fn an_eighth_of_a_low_limit_of_open_files() {
        assert_eq!(bound(Some(1024)), 128);
        assert_eq!(bound(Some(20000)), MAX_HALF_OPEN);
        assert_eq!(bound(None), MAX_HALF_OPEN, "no limit");
        assert_eq!(bound(Some(20)), 16, "at least 16");
        let mut h = HalfOpen::new(None, bound(Some(1024)));
        for _ in 0..32 {
            assert!(h.admit_pending(pending(7)).is_ok());
        }
        let (_, why) = h.admit_pending(pending(7)).expect_err("uid 7's quarter of 128");
        assert!(why.starts_with("32 silent rendezvous connections of this uid"), "{why}");
    }

    #[test]
    fn expiry_frees_places_and_the_timer_fires_without_a_connection() {
        let timer = colo_sys::timer::create().unwrap();
        let raw = colo_sys::AsRawFd::as_raw_fd(&timer);
        let mut h = HalfOpen::new(Some(timer), MAX_HALF_OPEN);
        let old = Instant::now() - HELLO_TIMEOUT + Duration::from_millis(20);
        for _ in 0..MAX_HALF_OPEN_PER_UID {
            h.admit_pending(Pending { since: old, ..pending(7) }).map_err(|_| ()).unwrap();
        }
        assert!(h.admit_pending(pending(7)).is_err());
        assert!(h.next_deadline().is_some_and(|d| d <= Instant::now() + Duration::from_millis(20)));
        // The timer is armed for the oldest deadline: it becomes readable by itself.
        let mut p = [libc::pollfd { fd: raw, events: libc::POLLIN, revents: 0 }];
        // SAFETY: `p` is a valid array of one `struct pollfd` for the call's duration.
        assert_eq!(unsafe { libc::poll(p.as_mut_ptr(), 1, 2000) }, 1, "the timer fired");
        h.fired();
        assert!(h.pending.is_empty());
        assert!(h.admit_pending(pending(7)).is_ok());
        assert_eq!(h.offers(), 0);
    }
}
