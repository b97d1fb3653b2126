//! OS calls for CARRIER mode and the LD_PRELOAD shim, made with raw syscalls (never through
//! libc) so that a shim interposing libc's socket functions does not see its own calls.

use rustix::fd::BorrowedFd;
use std::io;

/// Writes all of `buf` to `fd`, waiting (with poll) whenever the socket is non-blocking and
/// full. Returns `buf.len()`.
pub fn write_all_blocking(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match rustix::io::write(fd, &buf[done..]) {
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::AGAIN) => {
                let mut p = [rustix::event::PollFd::new(&fd, rustix::event::PollFlags::OUT)];
                let _ = rustix::event::poll(&mut p, None);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(done)
}

/// Moves `fd` to the lowest free descriptor number at or above `floor` (close-on-exec), closing
/// the original. Keeps a library's own descriptors out of the numbers an application uses: the
/// LD_PRELOAD shim's live at or above the application's limit of open files when the hard limit
/// leaves room above it, and never below half of it.
///
/// The kernel checks the limit only when it gives out a number, so a floor at or above the soft
/// limit is reached by raising the soft limit for the one `F_DUPFD` and putting it back: the
/// descriptor stays valid, and the application's own calls keep failing at its limit as before
/// (code that relies on the usual 1024 to keep its descriptors within `select`'s reach stays
/// safe). Fails (the caller falls back, as for any resource failure) when no number at or above
/// `floor` can be had.
pub fn move_above(fd: rustix::fd::OwnedFd, floor: i32) -> io::Result<rustix::fd::OwnedFd> {
    use rustix::fd::AsRawFd;
    if floor <= 0 || fd.as_raw_fd() >= floor {
        return Ok(fd);
    }
    match rustix::io::fcntl_dupfd_cloexec(&fd, floor) {
        Ok(high) => Ok(high),
        // `floor` is at or above the soft limit.
        Err(rustix::io::Errno::INVAL) => dup_above_limit(&fd, floor),
        Err(e) => Err(e.into()),
    }
}

/// `F_DUPFD` to `floor`, at or above the soft limit of open files, with the soft limit raised
/// for the call (see `move_above`). One thread at a time, so that each puts back what it found.
fn dup_above_limit(fd: &rustix::fd::OwnedFd, floor: i32) -> io::Result<rustix::fd::OwnedFd> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    use std::sync::Mutex;
    static RAISING: Mutex<()> = Mutex::new(());
    // A fork while another thread held it leaves it held in the child: give up there, rather
    // than wait forever (the caller falls back).
    let mut tries = 0;
    let _one = loop {
        match RAISING.try_lock() {
            Ok(g) => break g,
            Err(std::sync::TryLockError::Poisoned(e)) => break e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) if tries < 1000 => {
                tries += 1;
                std::thread::yield_now();
            }
            Err(std::sync::TryLockError::WouldBlock) => return Err(io::Error::from_raw_os_error(libc::EMFILE)),
        }
    };
    let lim = getrlimit(Resource::Nofile);
    let room = u64::try_from(floor).unwrap_or(0).saturating_add(1 << 16);
    let raised = lim.maximum.map_or(room, |max| max.min(room));
    if lim.current.is_none_or(|soft| soft >= raised) || raised <= floor as u64 {
        return Err(io::Error::from_raw_os_error(libc::EMFILE));
    }
    setrlimit(Resource::Nofile, Rlimit { current: Some(raised), maximum: lim.maximum })?;
    let high = rustix::io::fcntl_dupfd_cloexec(fd, floor);
    let _ = setrlimit(Resource::Nofile, lim);
    Ok(high?)
}
