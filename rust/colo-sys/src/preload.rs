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
/// the original; on failure returns `fd` unchanged. Keeps a library's own descriptors out of the
/// low numbers that applications size their tables by.
pub fn move_above(fd: rustix::fd::OwnedFd, floor: i32) -> rustix::fd::OwnedFd {
    use rustix::fd::AsRawFd;
    if floor <= 0 || fd.as_raw_fd() >= floor {
        return fd;
    }
    match rustix::io::fcntl_dupfd_cloexec(&fd, floor) {
        Ok(high) => high,
        Err(_) => fd,
    }
}
