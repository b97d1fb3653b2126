//! The holders page of a connection: one page of shared memory that every process holding the
//! connection maps (the list of holders, the writers' turn, the socket's own flags: see
//! `Conn`), as a kernel socket's state is one for every process holding it.
//!
//! A fork copy shares the page by inheriting the mapping. A copy handed over across `exec`
//! shares it through a memfd: a connection inheritable from the start (its socket was not
//! close-on-exec when it was made, or it was made inheritable before any other process held
//! it) keeps its page in a memfd, whose descriptor is inherited beside the connection's and
//! named in the handover file, and the next image maps the same page. A connection made
//! inheritable only after a fork keeps its anonymous page (the fork copies' page cannot be
//! reached through a descriptor): the images exec'd from it start pages of their own.

use colo_sys::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

/// The page's size in bytes.
pub const PAGE: usize = 4096;

// The page's layout, in 32-bit words.
/// Words 0 to `HOLDERS - 1`: the pids of the processes holding the connection (0: free); a copy
/// closed while another process still holds it is released quietly (`Conn`'s `Drop`).
pub const HOLDERS: usize = 64;
/// The writers' turn (`turns`) and how many wait for it.
pub const TURN: usize = HOLDERS;
pub const TURN_WAITERS: usize = HOLDERS + 1;
/// The socket's own flags (`Conn::socket_flags`).
pub const SOCKET_FLAGS: usize = HOLDERS + 2;
/// A lock (`turns`) and its waiters' count, held while a holder decides whether it is the last
/// (`Page::leave`): of two holders leaving at once, one sees the other gone.
const LEAVING: usize = HOLDERS + 4;
const LEAVING_WAITERS: usize = HOLDERS + 5;
/// `RELAY_SLOTS` pairs of words from here: a relayed program's pid and its relay's
/// (`Page::claim_relay`).
const RELAYS: usize = HOLDERS + 8;
const RELAY_SLOTS: usize = 4;

/// How long a write waits at most for a relay to forward what its exited program wrote
/// (`Page::wait_forwarded`): a relay that holds on (a process the program left behind keeps its
/// standard output open) costs the first write after it that long, once.
const FORWARD_WAIT: std::time::Duration = std::time::Duration::from_secs(1);
/// How long one sleep of that wait lasts before the relay's life is checked again.
const FORWARD_CHECK: std::time::Duration = std::time::Duration::from_millis(5);

/// The memfd's name (`/proc/PID/fd` shows it).
const NAME: &str = "colo-holders";

pub struct Page {
    words: *const AtomicU32,
    /// The memfd behind the page (-1: an anonymous page, not shared across `exec`).
    fd: AtomicI32,
}

// SAFETY: `words` points into a mapping this value owns; all accesses through it are atomic.
unsafe impl Send for Page {}
// SAFETY: as for `Send`: what the pointer reaches is only ever accessed atomically.
unsafe impl Sync for Page {}

fn map(fd: Option<&OwnedFd>, fixed: Option<*mut libc::c_void>) -> std::io::Result<*mut libc::c_void> {
    let (flags, fd) = match fd {
        Some(f) => (libc::MAP_SHARED, f.as_raw_fd()),
        None => (libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1),
    };
    let flags = if fixed.is_some() { flags | libc::MAP_FIXED } else { flags };
    // SAFETY: a fresh shared mapping of a page (of `fd`, which is at least that long, or
    // anonymous); with MAP_FIXED it replaces the page at `fixed`, which the caller owns.
    let p = unsafe {
        libc::mmap(fixed.unwrap_or(std::ptr::null_mut()), PAGE, libc::PROT_READ | libc::PROT_WRITE, flags, fd, 0)
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(p)
}

fn memfd() -> std::io::Result<OwnedFd> {
    let fd = rustix::fs::memfd_create(NAME, rustix::fs::MemfdFlags::CLOEXEC)?;
    let fd = colo_sys::preload::move_above(fd, colo::internal::fd_floor())?;
    rustix::fs::ftruncate(&fd, PAGE as u64)?;
    Ok(fd)
}

impl Page {
    /// A zeroed anonymous page (not shared across `exec` until `share_across_exec`).
    pub fn new() -> std::io::Result<Page> {
        let words = map(None, None)? as *const AtomicU32;
        Ok(Page { words, fd: AtomicI32::new(-1) })
    }

    /// The page an earlier image handed over in `fd` (a memfd of at least a page; anything
    /// else is refused).
    pub fn inherited(fd: OwnedFd) -> std::io::Result<Page> {
        let st = rustix::fs::fstat(&fd)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || (st.st_size as u64) < PAGE as u64 {
            return Err(std::io::Error::other("not a holders page"));
        }
        let _ = rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC);
        let words = map(Some(&fd), None)? as *const AtomicU32;
        Ok(Page { words, fd: AtomicI32::new(std::mem::ManuallyDrop::new(fd).as_raw_fd()) })
    }

    /// Word `i` of the page.
    pub fn word(&self, i: usize) -> &AtomicU32 {
        assert!(i < PAGE / 4);
        // SAFETY: `i` is within the page, mapped while `self` lives.
        unsafe { &*self.words.add(i) }
    }

    /// The memfd behind the page, if it has one.
    pub fn fd(&self) -> Option<RawFd> {
        Some(self.fd.load(Ordering::Relaxed)).filter(|&fd| fd >= 0)
    }

    /// Puts the page into a memfd that an `exec` can hand over, unless it is in one already.
    /// Only for a page no other process maps (`alone`): the copy replaces this process's
    /// mapping, and a fork copy would keep the old one. Best effort: on failure the page stays
    /// as it was.
    pub fn share_across_exec(&self, alone: bool) {
        if self.fd().is_some() || !alone {
            return;
        }
        let Ok(fd) = memfd() else { return };
        let mut copy = [0u8; PAGE];
        for (i, chunk) in copy.chunks_exact_mut(4).enumerate() {
            // Relaxed: nothing else maps the page (`alone`); the words are copied as they are.
            chunk.copy_from_slice(&self.word(i).load(Ordering::Relaxed).to_ne_bytes());
        }
        if rustix::io::pwrite(&fd, &copy, 0).ok() != Some(PAGE) {
            return;
        }
        if map(Some(&fd), Some(self.words as *mut libc::c_void)).is_ok() {
            self.fd.store(std::mem::ManuallyDrop::new(fd).as_raw_fd(), Ordering::Relaxed);
        }
    }

    /// Whether another process has ever held the connection (the second holder word was taken).
    pub fn ever_shared(&self) -> bool {
        self.word(1).load(Ordering::Relaxed) != 0
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

    /// Whether no process but `me` is listed.
    pub fn held_by_me_alone(&self, me: u32) -> bool {
        (0..HOLDERS).map(|i| self.word(i).load(Ordering::Relaxed)).all(|p| p == 0 || p == me)
    }

    /// Whether a listed process other than `me` still holds the connection: it has the control
    /// socket `control` (ours) open under the same number (a child that exec'd without the
    /// connection, or released its copy, holds nothing). Processes found not to hold it are
    /// taken off the list. (Not the segment memfd: the peer holds the same one, often under the
    /// same number, as both shims move descriptors to the same floor, so a client forked by its
    /// server would take the server for a holder and close without telling it.)
    pub fn others_hold(&self, me: u32, control: RawFd) -> bool {
        // SAFETY: the caller's control socket, open during this call.
        let own = rustix::fs::fstat(unsafe { colo_sys::BorrowedFd::borrow_raw(control) }).ok();
        let holds = |pid: u32| match (rustix::fs::stat(format!("/proc/{pid}/fd/{control}")), &own) {
            (Ok(st), Some(own)) => st.st_ino == own.st_ino && st.st_dev == own.st_dev,
            (Err(rustix::io::Errno::NOENT), _) => false,
            // Not allowed to look (another user): fall back to whether it lives.
            _ => alive(pid),
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
    /// program's end of stream (`relay_done`), a write of another holder made after the program
    /// exited waits for it (`wait_forwarded`), as over TCP the program's writes were in the
    /// socket before it exited.
    pub fn claim_relay(&self, program: u32) -> Option<usize> {
        // Relaxed (the slots' accesses, but for the Release in `relay_done`): the pids are the
        // whole message.
        let slot = (0..RELAY_SLOTS)
            .find(|&i| self.word(RELAYS + 2 * i).compare_exchange(0, program, Ordering::Relaxed, Ordering::Relaxed).is_ok())?;
        // No relay yet (the program runs meanwhile: nobody looks at this word).
        self.word(RELAYS + 2 * slot + 1).store(0, Ordering::Relaxed);
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

    /// Waits (at most `FORWARD_WAIT`) until every relay whose program has exited has forwarded
    /// that program's end of stream. A relay whose program still runs is not waited for: its
    /// writes and ours are concurrent, as two processes' writes to one socket are. A relay that
    /// died, or outlasts the wait, is forgotten (its slot freed).
    pub fn wait_forwarded(&self) {
        let mut deadline = None;
        for i in 0..RELAY_SLOTS {
            let word = self.word(RELAYS + 2 * i);
            loop {
                // SYNC POINT with the Release in `relay_done`.
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

    /// Lets the memfd survive `exec` (or not).
    pub fn set_inheritable(&self, on: bool) {
        if let Some(fd) = self.fd() {
            let flags = if on { rustix::io::FdFlags::empty() } else { rustix::io::FdFlags::CLOEXEC };
            // SAFETY: our memfd, open while `self` lives.
            let _ = rustix::io::fcntl_setfd(unsafe { colo_sys::BorrowedFd::borrow_raw(fd) }, flags);
        }
    }
}

/// Whether process `pid` exists (a zombie too).
pub fn alive(pid: u32) -> bool {
    rustix::process::Pid::from_raw(pid as i32)
        .is_some_and(|p| matches!(rustix::process::test_kill_process(p), Ok(()) | Err(rustix::io::Errno::PERM)))
}

/// Whether process `pid` exists and has not exited (not a zombie).
pub fn running(pid: u32) -> bool {
    match std::fs::read(format!("/proc/{pid}/stat")) {
        // "PID (COMM) STATE ...": COMM may hold any byte, so the state follows the last ')'.
        Ok(stat) => stat.iter().rposition(|&b| b == b')').and_then(|i| stat.get(i + 2)).is_some_and(|&st| st != b'Z'),
        Err(_) => false,
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        // SAFETY: our mapping, unmapped once; nothing refers to it once `self` is gone.
        unsafe { libc::syscall(libc::SYS_munmap, self.words, PAGE) };
        if let Some(fd) = self.fd() {
            // SAFETY: our memfd, closed once.
            unsafe { libc::syscall(libc::SYS_close, fd) };
        }
    }
}
