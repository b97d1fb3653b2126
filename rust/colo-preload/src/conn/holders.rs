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

    /// Lets the memfd survive `exec` (or not).
    pub fn set_inheritable(&self, on: bool) {
        if let Some(fd) = self.fd() {
            let flags = if on { rustix::io::FdFlags::empty() } else { rustix::io::FdFlags::CLOEXEC };
            // SAFETY: our memfd, open while `self` lives.
            let _ = rustix::io::fcntl_setfd(unsafe { colo_sys::BorrowedFd::borrow_raw(fd) }, flags);
        }
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
