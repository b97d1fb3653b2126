//! Process-wide records below the descriptor table: what the table's entries name and what both
//! a connection's end and the services write to. None of them knows the table or a connection.

pub mod adapt;
pub mod app_nofile;
pub mod handover_file;
pub mod lineage;
pub mod marker;
pub mod relayed;

/// A memfd named `name` for a record that goes on across `exec`: the descriptor to write it by
/// (close-on-exec), and an inheritable read-only one, the only one the next image gets. The
/// file is made mode 0600, so that a program exec'd without the shim under another uid (a
/// child `posix_spawn`ed through `setpriv`, say: no fork handler of ours makes it a file of its
/// own) can read what it inherits but neither write through its descriptor nor open the file
/// again for writing through `/proc/self/fd`; a memfd is made 0777, and its bytes reach
/// every later image of this process and the children it spawns. `None` if either cannot be
/// had (no `/proc`: then no image could find the file either).
pub fn inheritable_memfd(name: &str) -> Option<(colo_sys::OwnedFd, colo_sys::OwnedFd)> {
    use rustix::fs::{Mode, OFlags};
    let w = rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC).ok()?;
    let w = colo_sys::preload::move_above(w, colo::internal::fd_floor()).ok()?;
    rustix::fs::fchmod(&w, Mode::RUSR | Mode::WUSR).ok()?;
    // The path on the stack: `setrlimit` (`app_nofile::set`) may come in a forked child.
    let mut path = [0u8; 32];
    let mut cur = std::io::Cursor::new(&mut path[..31]);
    std::io::Write::write_fmt(&mut cur, format_args!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&w))).ok()?;
    let path = std::ffi::CStr::from_bytes_until_nul(&path).ok()?;
    let r = rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).ok()?;
    let r = colo_sys::preload::move_above(r, colo::internal::fd_floor()).ok()?;
    Some((w, r))
}

/// Whether an inherited descriptor named as one of these records is one an earlier image of
/// ours made (`inheritable_memfd`): a regular file of this uid's or root's (an image exec'd
/// after dropping root reads its parent's), mode 0600. A name proves nothing: a peer names its
/// segment's memfd as it likes, and a server keeps a peer's memfd across `exec` for a
/// connection accepted inheritable, so another user's file can arrive under a record's name.
pub fn inherited_is_ours(fd: colo_sys::BorrowedFd<'_>) -> bool {
    rustix::fs::fstat(fd).is_ok_and(|st| {
        st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_mode & 0o077 == 0 && (st.st_uid == rustix::process::geteuid().as_raw() || st.st_uid == 0)
    })
}

/// Makes `r` (from [`inheritable_memfd`]) inheritable, once the file holds what the next image
/// is to read.
pub fn let_inherit(r: &colo_sys::OwnedFd) -> bool {
    rustix::io::fcntl_setfd(r, rustix::io::FdFlags::empty()).is_ok()
}
