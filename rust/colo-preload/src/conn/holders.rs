//! The holders page of a connection: one page of shared memory that every process holding the
//! connection maps (the list of holders, the writers' turn, the socket's own flags: see
//! `Conn`), as a kernel socket's state is one for every process holding it.
//!
//! The pages live in this process's holders file (`holders_file`), one memfd for all its
//! connections: a fork copy shares a page by inheriting the file's mapping, a copy handed over
//! across `exec` by the page's index, named in the handover file, in the same file, which the
//! next image inherits and maps. A connection whose page could not be had there (no file, or
//! every page in use) has an anonymous page of its own: fork copies share it, images exec'd
//! from it start pages of their own.

use crate::conn::holders_file::{self, HOLDERS, SLOT};
use colo_sys::host::{alive, running};
use colo_sys::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

/// A memory page: the size of the anonymous mapping a page outside the holders file takes.
const MAPPED: usize = 4096;

// The page's layout, in 32-bit words, within `SLOT` bytes. Words 0 to `HOLDERS - 1`: the pids
// of the processes holding the connection (0: free); a copy closed while another process still
// holds it is released quietly (`Conn`'s `Drop`).
/// The writers' turn (`turns`) and how many wait for it.
pub const TURN: usize = HOLDERS;
pub const TURN_WAITERS: usize = HOLDERS + 1;
/// The socket's own flags (`Conn::socket_flags`).
pub const SOCKET_FLAGS: usize = HOLDERS + 2;
/// Non-zero once a second process held the connection (`Page::ever_shared`): sticky, as holder
/// words are freed and reused in any order.
const SHARED: usize = HOLDERS + 3;
/// A lock (`turns`) and its waiters' count, held while a holder decides whether it is the last
/// (`Page::leave`): of two holders leaving at once, one sees the other gone.
const LEAVING: usize = HOLDERS + 4;
const LEAVING_WAITERS: usize = HOLDERS + 5;
/// The readers' turn (`turns`) and how many wait for it: the incoming ring has one tail, and
/// two processes consuming at once would each take the same bytes.
pub const READ_TURN: usize = HOLDERS + 6;
pub const READ_TURN_WAITERS: usize = HOLDERS + 7;
/// `RELAY_SLOTS` pairs of words from here: a relayed program's pid and its relay's
/// (`Page::claim_relay`).
const RELAYS: usize = HOLDERS + 8;
const RELAY_SLOTS: usize = 4;
/// `RELAY_SLOTS` words from here: for each slot, the slots whose program had exited when it was
/// claimed (a bit each): the only ones its relay waits for (`Page::wait_forwarded`).
const RELAY_BEFORE: usize = RELAYS + 2 * RELAY_SLOTS;
/// The relay that keeps the bytes its program leaves unread in the ring (`service::downward`):
/// its pid, 0 for none. One at a time: the ring has one tail, and two relays peeking ahead of it
/// would both hand the same bytes on.
const LAZY: usize = RELAY_BEFORE + RELAY_SLOTS;
/// Non-zero: a relay beside it asked the one in `LAZY` to hand bytes on as they come instead.
const LAZY_YIELD: usize = LAZY + 1;
/// `RELAY_SLOTS` words from here: for each slot, its program's pid until the relay has taken
/// off the incoming ring exactly what the program read (`Page::relay_read_done`), which a
/// holder's read waits for (`Page::wait_read`).
const RELAY_READS: usize = LAZY_YIELD + 1;
/// The socket's `SO_RCVLOWAT` (`Conn::lowat`; 0 in a fresh page: the default, 1).
pub const LOWAT: usize = RELAY_READS + RELAY_SLOTS;
/// The socket's `SO_RCVTIMEO` and `SO_SNDTIMEO` (`options::set_timeout`).
pub const RCVTIMEO: usize = LOWAT + 1;
pub const SNDTIMEO: usize = LOWAT + 2;
/// What the socket's `SO_SNDBUF` lets a non-blocking writer queue (`Conn::set_send_limit`; 0 in
/// a fresh page: the ring).
pub const SNDBUF: usize = LOWAT + 3;
const _: () = assert!(SNDBUF < SLOT / 4);

/// How long a write waits at most for a relay to forward what its exited program wrote
/// (`Page::wait_forwarded`): a relay that holds on (a process the program left behind keeps its
/// standard output open) costs the first write after it that long, once.
const FORWARD_WAIT: std::time::Duration = std::time::Duration::from_secs(1);
/// How long one sleep of that wait lasts before the relay's life is checked again.
const FORWARD_CHECK: std::time::Duration = std::time::Duration::from_millis(5);

pub struct Page {
    words: *const AtomicU32,
    /// The page's index in the holders file (`holders_file`); 0: an anonymous page of its own.
    index: u32,
}

// SAFETY: `words` points into a mapping that lives as long as this value (the holders file's,
// never unmapped, or an anonymous one this value owns); all accesses through it are atomic.
unsafe impl Send for Page {}
// SAFETY: as for `Send`: what the pointer reaches is only ever accessed atomically.
unsafe impl Sync for Page {}

impl Page {
    /// A zeroed page: one of the holders file's, or else an anonymous one.
    pub fn new() -> std::io::Result<Page> {
        if let Some((index, words)) = holders_file::alloc() {
            return Ok(Page { words, index });
        }
        // SAFETY: a fresh anonymous shared mapping of a page, unmapped by `Drop`.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), MAPPED, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1, 0)
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Page { words: p as *const AtomicU32, index: 0 })
    }

    /// Page `index` of the holders file an earlier image handed over (`holders_file::adopt`),
    /// if it is a page in use.
    pub fn inherited(index: u32) -> Option<Page> {
        holders_file::at(index).map(|words| Page { words, index })
    }

    /// The page's index in the holders file, if it is there (named in the handover record).
    pub fn index(&self) -> Option<u32> {
        Some(self.index).filter(|&i| i != 0)
    }

    /// The connection has ended: no process holds it any more. The page goes back to the
    /// holders file.
    pub fn release(&self) {
        if self.index != 0 {
            holders_file::release(self.index);
        }
    }

    /// Word `i` of the page.
    pub fn word(&self, i: usize) -> &AtomicU32 {
        assert!(i < SLOT / 4);
        // SAFETY: `i` is within the page, mapped while `self` lives.
        unsafe { &*self.words.add(i) }
    }

    /// Whether another process has ever held the connection.
    pub fn ever_shared(&self) -> bool {
        self.word(SHARED).load(Ordering::Relaxed) != 0
    }

    /// Marks the connection shared before another process holds it (before a `fork`): calls
    /// that begin from now on take turns.
    pub fn mark_shared(&self) {
        // SYNC POINT: SeqCst, with the SeqCst count and load of `turns::alone` (see there).
        self.word(SHARED).store(1, Ordering::SeqCst);
    }

    /// The word that says whether the connection was ever shared (see `turns::alone`).
    pub fn shared_word(&self) -> &AtomicU32 {
        self.word(SHARED)
    }

    /// Records that process `pid` holds a copy.
    pub fn add_holder(&self, pid: u32) {
        // Relaxed (all the holder words' accesses): a holder word is the whole message, a pid;
        // nothing else is written before it or read on its strength (whether a process holds
        // the connection is asked of /proc), so atomicity is all it needs.
        if (0..HOLDERS).any(|i| self.word(i).load(Ordering::Relaxed) == pid) {
            return;
        }
        for i in 0..HOLDERS {
            if self.word(i).compare_exchange(0, pid, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
                if (0..HOLDERS).any(|j| j != i && self.word(j).load(Ordering::Relaxed) != 0) {
                    self.word(SHARED).store(1, Ordering::Relaxed);
                }
                return;
            }
        }
    }

    /// Takes `pid` off the list.
    pub fn remove_holder(&self, pid: u32) {
        for i in 0..HOLDERS {
            let _ = self.word(i).compare_exchange(pid, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// Whether a listed process other than `me` still holds the connection: it has the control
    /// socket `control` (ours) open under the same number (a child that exec'd without the
    /// connection, or released its copy, holds nothing). Processes found not to hold it are
    /// taken off the list. (Not the segment memfd: the peer holds the same one, often under the
    /// same number, as both shims move descriptors to the same floor, so a client forked by its
    /// server would take the server for a holder and close without telling it.)
    pub fn others_hold(&self, me: u32, control: RawFd) -> bool {
        // Looked at once another process is listed (most connections have none).
        let own = std::cell::OnceCell::new();
        // SAFETY: the caller's control socket, open during this call.
        let own = || own.get_or_init(|| rustix::fs::fstat(unsafe { colo_sys::BorrowedFd::borrow_raw(control) }).ok());
        let holds = |pid: u32| {
            if let Some(same) = colo_sys::host::holds_same(pid, control) {
                return same;
            }
            match (rustix::fs::stat(format!("/proc/{pid}/fd/{control}")), own()) {
                (Ok(st), Some(own)) => st.st_ino == own.st_ino && st.st_dev == own.st_dev,
                (Err(rustix::io::Errno::NOENT), _) => false,
                // Not allowed to look (another user): fall back to whether it lives.
                _ => alive(pid),
            }
        };
        let mut others = false;
        for i in 0..HOLDERS {
            let p = self.word(i).load(Ordering::Relaxed);
            if p == 0 || p == me {
                continue;
            }
            if holds(p) {
                others = true;
            } else {
                let _ = self.word(i).compare_exchange(p, 0, Ordering::Relaxed, Ordering::Relaxed);
            }
        }
        others
    }

    /// Takes `me` off the list; whether another listed process still holds the connection
    /// (`others_hold`), decided under a lock, so that of two holders leaving at once the second
    /// sees the first gone.
    pub fn leave(&self, me: u32, control: RawFd) -> bool {
        let _decision = crate::conn::turns::take(self.word(LEAVING), self.word(LEAVING_WAITERS));
        let others = self.others_hold(me, control);
        self.remove_holder(me);
        others
    }

    /// A relay (`service::stdio`) is about to carry the standard output of `program` (a pid)
    /// into the rings: the slot it takes, if one is free. Until the relay has forwarded the
    /// program's end of stream and released from the incoming ring exactly what the program
    /// read (`relay_done`), a write or a read of another holder made after the program exited
    /// waits for it (`wait_forwarded`), as over TCP the program's writes were in the socket
    /// before it exited, and the bytes it left unread stayed there.
    pub fn claim_relay(&self, program: u32) -> Option<usize> {
        // Relaxed (the slots' accesses, but for the Release in `relay_done`): the pids are the
        // whole message.
        let slot = (0..RELAY_SLOTS)
            .filter(|&i| self.word(RELAY_READS + i).load(Ordering::Relaxed) == 0)
            .find(|&i| self.word(RELAYS + 2 * i).compare_exchange(0, program, Ordering::Relaxed, Ordering::Relaxed).is_ok())?;
        // No relay yet (the program runs meanwhile: nobody looks at this word).
        self.word(RELAYS + 2 * slot + 1).store(0, Ordering::Relaxed);
        self.word(RELAY_READS + slot).store(program, Ordering::Relaxed);
        // The programs that ended before this one began: over TCP their bytes came first, so
        // this relay waits for theirs; the others ran beside it, and their relays and this one
        // must not wait for each other.
        let before = (0..RELAY_SLOTS)
            .filter(|&j| j != slot)
            .filter(|&j| {
                let p = self.word(RELAYS + 2 * j).load(Ordering::Relaxed);
                p != 0 && !running(p)
            })
            .fold(0u32, |m, j| m | 1 << j);
        self.word(RELAY_BEFORE + slot).store(before, Ordering::Relaxed);
        Some(slot)
    }

    /// The relay process of slot `slot` is `relay` (a pid).
    pub fn relay_started(&self, slot: usize, relay: u32) {
        self.word(RELAYS + 2 * slot + 1).store(relay, Ordering::Relaxed);
    }

    /// The relay of slot `slot`, for `program`, has forwarded all the program wrote (or will
    /// forward nothing more): writers waiting for it go on.
    pub fn relay_done(&self, slot: usize, program: u32) {
        let word = self.word(RELAYS + 2 * slot);
        // SYNC POINT: Release, with the Acquire load in `wait_forwarded`: the forwarded bytes
        // (the relay's writes to the ring, and its writing state) come before.
        if word.compare_exchange(program, 0, Ordering::Release, Ordering::Relaxed).is_ok() {
            colo_sys::futex::wake_all(word);
        }
    }

    /// The relay of slot `slot`, for `program`, has taken off the incoming ring what the program
    /// read, and leaves the rest (or will take nothing more): readers waiting for it go on.
    pub fn relay_read_done(&self, slot: usize, program: u32) {
        let word = self.word(RELAY_READS + slot);
        // SYNC POINT: Release, with the Acquire load in `wait_slots`: the relay's releases of
        // ring bytes (its stores of `ring_tail`) come before.
        if word.compare_exchange(program, 0, Ordering::Release, Ordering::Relaxed).is_ok() {
            colo_sys::futex::wake_all(word);
        }
    }

    /// Waits (at most `FORWARD_WAIT`) until every relay whose program has exited has forwarded
    /// that program's end of stream (`relay_done`), for a write.
    pub fn wait_forwarded(&self) {
        self.wait_slots(|i| RELAYS + 2 * i);
    }

    /// Waits (at most `FORWARD_WAIT`) until every relay whose program has exited has taken off
    /// the incoming ring what that program read (`relay_read_done`), for a read: the bytes the
    /// program left unread are then the next ones.
    pub fn wait_read(&self) {
        self.wait_slots(|i| RELAY_READS + i);
    }

    /// Waits for the relays whose program has exited, by the word `word_of(slot)` holding the
    /// program's pid until the relay is done. A relay whose program still runs is not waited
    /// for: its reads or writes and ours are concurrent, as two processes' on one socket are. A
    /// relay that died, or outlasts the wait, is forgotten (its word cleared).
    fn wait_slots(&self, word_of: impl Fn(usize) -> usize) {
        let mut deadline = None;
        let me = colo_sys::host::pid();
        // A relay (`service::relay` writes through the connection) waits only for the relays of
        // programs that ended before its own began; another holder, for all.
        let mine = (0..RELAY_SLOTS).find(|&i| self.word(RELAYS + 2 * i + 1).load(Ordering::Relaxed) == me);
        let waits_for = mine.map_or(u32::MAX, |k| self.word(RELAY_BEFORE + k).load(Ordering::Relaxed));
        for i in (0..RELAY_SLOTS).filter(|&i| waits_for & 1 << i != 0) {
            let word = self.word(word_of(i));
            loop {
                // SYNC POINT with the Release in `relay_done` or `relay_read_done`.
                let program = word.load(Ordering::Acquire);
                if program == 0 || running(program) {
                    break;
                }
                let relay = self.word(RELAYS + 2 * i + 1).load(Ordering::Relaxed);
                let now = std::time::Instant::now();
                let deadline = *deadline.get_or_insert(now + FORWARD_WAIT);
                if relay != 0 && !alive(relay) || now >= deadline {
                    let _ = word.compare_exchange(program, 0, Ordering::Relaxed, Ordering::Relaxed);
                    break;
                }
                colo_sys::futex::wait(word, program, Some(FORWARD_CHECK.min(deadline - now)));
            }
        }
    }

    /// Whether the relay `me` (of slot `slot`) may keep the bytes its program leaves unread
    /// (`LAZY`): only if no relay of a running program works beside it. A relay that keeps
    /// them already is asked to stop (it then hands bytes on as they come, as both relays do),
    /// and waited for (at most `FORWARD_WAIT`), so that the bytes it handed on are off the ring
    /// before this relay reads.
    pub fn claim_lazy(&self, me: u32, slot: Option<usize>) -> bool {
        let beside = (0..RELAY_SLOTS).filter(|&i| Some(i) != slot).any(|i| {
            let p = self.word(RELAYS + 2 * i).load(Ordering::Relaxed);
            p != 0 && running(p)
        });
        let word = self.word(LAZY);
        let deadline = std::time::Instant::now() + FORWARD_WAIT;
        loop {
            // SYNC POINT: Acquire, with the Release in `drop_lazy`: the bytes the relay that let
            // go took off the ring are off before we read.
            let cur = word.load(Ordering::Acquire);
            if cur == 0 {
                if beside || word.compare_exchange(0, me, Ordering::Relaxed, Ordering::Relaxed).is_err() {
                    return false;
                }
                // A request meant for the relay before (made as it let go) is not for us.
                self.word(LAZY_YIELD).store(0, Ordering::Relaxed);
                return true;
            }
            if cur == me {
                return true;
            }
            if !alive(cur) {
                let _ = word.compare_exchange(cur, 0, Ordering::Relaxed, Ordering::Relaxed);
                continue;
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            self.word(LAZY_YIELD).store(1, Ordering::Relaxed);
            colo_sys::futex::wait(word, cur, Some(FORWARD_CHECK.min(deadline - now)));
            if word.load(Ordering::Acquire) != cur {
                // It let go: both hand bytes on as they come from now on.
                return false;
            }
        }
    }

    /// Whether a relay beside the one that keeps unread bytes asked it to stop (`claim_lazy`).
    pub fn lazy_yield_asked(&self) -> bool {
        self.word(LAZY_YIELD).load(Ordering::Relaxed) != 0
    }

    /// The relay `me` no longer keeps unread bytes in the ring; one waiting for that goes on.
    pub fn drop_lazy(&self, me: u32) {
        // SYNC POINT: Release, with the Acquire loads in `claim_lazy`.
        if self.word(LAZY).compare_exchange(me, 0, Ordering::Release, Ordering::Relaxed).is_ok() {
            self.word(LAZY_YIELD).store(0, Ordering::Relaxed);
            colo_sys::futex::wake_all(self.word(LAZY));
        }
    }

    /// The connection becomes inheritable (or stops being): the holders file's descriptor goes
    /// along across `exec` while any connection of the file is.
    pub fn set_inheritable(&self, on: bool) {
        if self.index != 0 {
            holders_file::inheritable(on);
        }
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        if self.index == 0 {
            // SAFETY: our anonymous mapping, unmapped once; nothing refers to it once `self` is
            // gone. (A page of the holders file stays mapped with the whole file.)
            unsafe { libc::syscall(libc::SYS_munmap, self.words, MAPPED) };
        }
    }
}

/// This process's children (any thread's), from `/proc/self/task/*/children`.
pub fn children() -> Vec<u32> {
    // No child at all (the common case) costs one system call.
    // SAFETY: a zeroed siginfo_t is valid; WNOWAIT leaves any exited child to the application.
    let none = unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOHANG | libc::WNOWAIT) != 0
    };
    if none {
        return Vec::new();
    }
    let mut out = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
        if let Ok(s) = std::fs::read_to_string(t.path().join("children")) {
            out.extend(s.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
        }
    }
    out
}

/// Whether the parent of process `pid` may hold a connection set up by `made_by` (0: handed
/// over across `exec`): unless `pid` set it up itself, which its parent never saw.
pub fn parent_may_hold(made_by: u32, pid: u32) -> bool {
    made_by == 0 || made_by != pid
}

#[cfg(test)]
#[test]
fn only_a_connection_from_elsewhere_may_be_held_by_the_parent() {
    assert!(!parent_may_hold(100, 100), "set up here: the parent never saw it");
    assert!(parent_may_hold(100, 101), "a fork child's copy: the parent holds it");
    assert!(parent_may_hold(0, 100), "handed over across exec: the parent may hold it");
}

/// A timeout as the holders page keeps it: milliseconds, rounded up (the kernel keeps it in
/// jiffies, a millisecond or more), 0 for none.
pub fn millis(t: Option<Duration>) -> u32 {
    t.map_or(0, |d| u32::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u32::MAX))
}

impl Page {
    /// The socket's `SO_RCVTIMEO` (`write`: `SO_SNDTIMEO`) as a holder last set it, in `millis`.
    pub fn timeout_ms(&self, write: bool) -> u32 {
        // Relaxed (and the store in `set_timeout`): the word is the whole message.
        self.word(if write { SNDTIMEO } else { RCVTIMEO }).load(Ordering::Relaxed)
    }

    /// Sets the socket's `SO_RCVTIMEO` (`write`: `SO_SNDTIMEO`) for every process holding it.
    pub fn set_timeout(&self, write: bool, t: Option<Duration>) {
        self.word(if write { SNDTIMEO } else { RCVTIMEO }).store(millis(t), Ordering::Relaxed);
    }
}

/// Set in a relay process (`own_blocking`): its copies block or not as it sets them, and leave
/// the socket's `O_NONBLOCK`, which the program's processes share, as the program set it.
static OWN_BLOCKING: AtomicBool = AtomicBool::new(false);

/// Makes this process a relay's: see `OWN_BLOCKING`.
pub fn own_blocking() {
    OWN_BLOCKING.store(true, Ordering::Relaxed);
}

/// Whether this process's copies keep their blocking to themselves (`own_blocking`).
pub fn blocking_is_own() -> bool {
    OWN_BLOCKING.load(Ordering::Relaxed)
}
