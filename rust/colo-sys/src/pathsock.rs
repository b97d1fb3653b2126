//! What the cross-namespace handshake (spec/WIRE.md section 11) needs from the system: a
//! `SOCK_SEQPACKET` rendezvous bound to a path inside a directory, connected to without following
//! symbolic links, peer credentials that may name a process of another pid namespace, the host's
//! boot id, random nonces, and a bounded wait on a TCP socket.

use rustix::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use rustix::net::{self, AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
use std::io;
use std::path::Path;
use std::time::Duration;

/// Whether `name` may name a rendezvous inside a directory: 1 to 64 bytes of `[A-Za-z0-9._-]`,
/// not `.` or `..` (so no separator and no way out of the directory).
pub fn valid_name(name: &[u8]) -> bool {
    (1..=64).contains(&name.len())
        && name != b"."
        && name != b".."
        && name.iter().all(|c| c.is_ascii_alphanumeric() || b"._-".contains(c))
}

/// Binds a non-blocking, close-on-exec `SOCK_SEQPACKET` listener at `dir/name` (a stale socket
/// file of that name, which nobody accepts on, is replaced), readable and connectable by every
/// user who can reach the directory: the directory's mounts decide who can.
pub fn listen_at(dir: &Path, name: &str) -> io::Result<OwnedFd> {
    if !valid_name(name.as_bytes()) {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    let path = dir.join(name);
    let fd = net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC | SocketFlags::NONBLOCK, None)?;
    let addr = SocketAddrUnix::new(&path)?;
    match net::bind(&fd, &addr) {
        Ok(()) => {}
        Err(rustix::io::Errno::ADDRINUSE) => {
            // Ours (the name carries our pid) from an earlier image of this pid, or a dead one.
            let probe = net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?;
            if net::connect(&probe, &addr).is_ok() {
                return Err(io::ErrorKind::AddrInUse.into());
            }
            std::fs::remove_file(&path)?;
            net::bind(&fd, &addr)?;
        }
        Err(e) => return Err(e.into()),
    }
    open_to_all(&path)?;
    net::listen(&fd, 1024)?;
    Ok(fd)
}

/// Sets mode 0666 on the socket file just bound at `path`, never on anything else: whoever may
/// write in the directory can rename the socket away and put a symbolic link to any file under
/// its name between the `bind` and this call, and `chmod(2)` by name follows links. So the
/// entry is opened without following one (`O_PATH | O_NOFOLLOW`), must be a socket with one link
/// (a hard link of another socket, where the system allows linking others' files, has two) owned
/// by us, and its mode is set through that open descriptor (`/proc/self/fd/N` reaches exactly
/// the opened inode). Another socket of ours swapped in meanwhile gets the mode, harmlessly; the
/// server's own socket then keeps the mode `bind` gave it and the peer check refuses a stranger's.
fn open_to_all(path: &Path) -> io::Result<()> {
    use rustix::fs::{self, FileType, Mode, OFlags};
    let f = fs::open(path, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?;
    let st = fs::fstat(&f)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Socket || st.st_nlink != 1 || st.st_uid != rustix::process::geteuid().as_raw() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "the rendezvous socket was replaced after bind"));
    }
    fs::chmod(format!("/proc/self/fd/{}", f.as_raw_fd()).as_str(), Mode::from_raw_mode(0o666))?;
    Ok(())
}

/// An open directory (`O_PATH`) and its owner's uid.
pub fn open_dir(dir: &Path) -> io::Result<(OwnedFd, u32)> {
    use rustix::fs::{self, Mode, OFlags};
    let fd = fs::open(dir, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    let st = fs::fstat(&fd)?;
    Ok((fd, st.st_uid))
}

/// Suffix of the file whose lock says that the rendezvous of the same name is served.
pub const LIVE_SUFFIX: &str = ".live";

/// Creates (or reuses) `dir/name.live` and holds a write lock on all of it, an open file
/// description lock (`F_OFD_SETLK`, `F_WRLCK`), for as long as the returned descriptor is open in
/// any process: the kernel drops the lock when the server dies, so a client tells a served
/// rendezvous from a stale socket file without connecting to it. A write lock needs a descriptor
/// open for writing, which only a writer of the directory's file gets: a reader of a read-only
/// mount can take `flock` locks and read locks on a dead server's file, never this one. And
/// since such a read lock on the file a dead server of the same name left (a container's server
/// is pid 1 at every start) would keep this lock from being had, the file is a fresh one, locked
/// under a name of its own and then renamed over `name.live`.
pub fn hold_live(dir: &Path, name: &str) -> io::Result<OwnedFd> {
    use rustix::fs::{self, Mode, OFlags};
    let path = dir.join(format!("{name}{LIVE_SUFFIX}"));
    let mut tries = 0;
    loop {
        let mut r = [0u8; 8];
        random(&mut r)?;
        let tmp = dir.join(format!("{name}{LIVE_SUFFIX}.{}", u64::from_ne_bytes(r)));
        let fd = fs::open(&tmp, OFlags::CREATE | OFlags::EXCL | OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW, Mode::from_raw_mode(0o644))?;
        let mut lock = whole_file(libc::F_WRLCK);
        // SAFETY: F_OFD_SETLK reads the `flock` we own; `fd` is open for the call.
        let locked = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &mut lock) } == 0;
        if !locked {
            // A reader opened the fresh file and read-locked it first: another name.
            let e = io::Error::last_os_error();
            let _ = fs::unlink(&tmp);
            tries += 1;
            if tries < 8 {
                continue;
            }
            return Err(e);
        }
        if let Err(e) = fs::rename(&tmp, &path) {
            let _ = fs::unlink(&tmp);
            return Err(e.into());
        }
        return Ok(fd);
    }
}

/// Removes from `dir` the rendezvous of servers that are gone: each `<prefix>*.live` that no
/// live process holds write-locked ([`hold_live`], whose file is locked before it takes its
/// name), and the socket of the same stem. A killed server leaves both, and every client's
/// connect looks through the directory; a server that binds sweeps them up.
pub fn sweep_stale(dir: &Path, prefix: &str) {
    use rustix::fs::{self, FileType, Mode, OFlags};
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(LIVE_SUFFIX)).filter(|s| s.starts_with(prefix)) else { continue };
        let Ok(f) = fs::open(e.path(), OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC, Mode::empty()) else { continue };
        let regular = fs::fstat(&f).is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::RegularFile);
        if regular && !write_locked(&f) {
            let _ = std::fs::remove_file(dir.join(stem));
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// A lock record of `kind` covering a whole file (`l_len` 0: to its end, however it grows).
fn whole_file(kind: libc::c_int) -> libc::flock {
    // SAFETY: `flock` is plain integers, for which all zeroes is a valid value.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock
}

/// Whether the open file `fd` (read-only is enough) is write-locked by another open file
/// description, as [`hold_live`] locks it: `F_OFD_GETLK` asks whether a read lock could be
/// taken, which only a write lock prevents (read locks and `flock` locks, which anyone who can
/// open the file may take, do not).
pub fn write_locked(fd: impl AsFd) -> bool {
    let mut lock = whole_file(libc::F_RDLCK);
    // SAFETY: F_OFD_GETLK reads and rewrites the `flock` we own; `fd` is open for the call.
    let r = unsafe { libc::fcntl(fd.as_fd().as_raw_fd(), libc::F_OFD_GETLK, &mut lock) };
    r == 0 && lock.l_type == libc::F_WRLCK as libc::c_short
}

/// Whether `dir` holds a served rendezvous named `<prefix><pid>-<port>` (its `.live` file is
/// write-locked by a live process: [`hold_live`]), for `port` or, with `None`, for any port.
pub fn live_listener(dir: &Path, prefix: &str, port: Option<u16>) -> bool {
    use rustix::fs::{self, Mode, OFlags};
    let Ok(entries) = std::fs::read_dir(dir) else { return false };
    entries.flatten().any(|e| {
        let name = e.file_name();
        let Some(stem) = name.to_str().and_then(|n| n.strip_prefix(prefix)).and_then(|n| n.strip_suffix(LIVE_SUFFIX)) else {
            return false;
        };
        let served_port = stem.rsplit_once('-').and_then(|(_, p)| p.parse::<u16>().ok());
        if served_port.is_none() || port.is_some_and(|p| Some(p) != served_port) {
            return false;
        }
        let Ok(fd) = fs::open(e.path(), OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NONBLOCK, Mode::empty()) else {
            return false;
        };
        // Held by its server: write-locked. Free, or locked only by readers: the server is gone.
        write_locked(&fd)
    })
}

/// Connects (blocking, close-on-exec) to the socket `name` inside the open directory `dir`,
/// waiting at most `timeout` for room in its backlog (`TimedOut` then: anyone who can reach the
/// socket can fill its backlog with connections the server has not accepted yet): `name` must
/// be a [`valid_name`], and the entry a socket itself, not a symbolic link (checked with
/// `AT_SYMLINK_NOFOLLOW`, then reached through `/proc/self/fd/<dir>/<name>`, so nothing above
/// the directory is resolved again). Whoever can write in the directory could swap the entry
/// between the two steps: the directory's owner, whose server the peer check then admits.
pub fn connect_at(dir: BorrowedFd<'_>, name: &[u8], timeout: Duration) -> io::Result<OwnedFd> {
    use rustix::fs::{self, AtFlags, FileType};
    if !valid_name(name) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "rendezvous name outside the directory"));
    }
    let name = std::str::from_utf8(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let st = fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Socket {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "rendezvous is not a socket"));
    }
    let path = format!("/proc/self/fd/{}/{name}", dir.as_raw_fd());
    let fd = net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?;
    // A client's control socket receives no descriptor, ever (answers and rings carry none):
    // refused before the connect, so that not even a listener that sends at once can queue one.
    crate::gift::refuse_rights(&fd);
    // A Unix socket's connect to a full backlog waits for room, and that wait is bounded by
    // SO_SNDTIMEO alone (a non-blocking connect fails at once with EAGAIN, and there is nothing
    // to poll for); the timeout is cleared again once connected.
    net::sockopt::set_socket_timeout(&fd, net::sockopt::Timeout::Send, Some(timeout.max(Duration::from_millis(1))))?;
    let addr = SocketAddrUnix::new(path.as_str())?;
    loop {
        match net::connect(&fd, &addr) {
            Ok(()) => break,
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::AGAIN) => return Err(io::Error::new(io::ErrorKind::TimedOut, "rendezvous backlog full")),
            Err(e) => return Err(e.into()),
        }
    }
    net::sockopt::set_socket_timeout(&fd, net::sockopt::Timeout::Send, None)?;
    Ok(fd)
}

/// The pid and uid of the peer of a Unix socket; the pid is 0 for a process in a pid namespace
/// this one cannot see, and the uid is the overflow uid for one this user namespace does not map.
pub fn peer_cred_any(fd: impl AsFd) -> io::Result<(u32, u32)> {
    let mut c = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED writes at most `len` bytes into `c`, a `ucred` we own.
    let r = unsafe {
        libc::getsockopt(
            fd.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut c as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((c.pid.max(0) as u32, c.uid))
}

/// Fills `buf` from the kernel's random number generator (`getrandom(2)`, blocking only until
/// the generator is first seeded).
pub fn random(buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: writes at most `buf.len() - done` bytes into the rest of `buf`.
        let r = unsafe { libc::getrandom(buf[done..].as_mut_ptr() as *mut libc::c_void, buf.len() - done, 0) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        done += r as usize;
    }
    Ok(())
}

/// The 16 bytes of `/proc/sys/kernel/random/boot_id` (a UUID, new at every boot of the kernel,
/// the same in every namespace of one boot).
pub fn boot_id() -> io::Result<[u8; 16]> {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?;
    let hex: Vec<u8> = text.trim().bytes().filter(|c| *c != b'-').collect();
    let mut id = [0u8; 16];
    if hex.len() != 32 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "boot id is not a UUID"));
    }
    for (i, pair) in hex.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
        id[i] = u8::from_str_radix(s, 16).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    }
    Ok(id)
}

/// Waits until `fd` is readable (or hung up), for at most `timeout`; returns whether it is.
pub fn wait_readable(fd: BorrowedFd<'_>, timeout: Duration) -> io::Result<bool> {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let t = Timespec { tv_sec: timeout.as_secs().min(i64::MAX as u64) as i64, tv_nsec: timeout.subsec_nanos().into() };
    let mut p = [PollFd::new(&fd, PollFlags::IN)];
    loop {
        match poll(&mut p, Some(&t)) {
            Ok(n) => return Ok(n > 0),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// `recv(2)` on a TCP socket without blocking, `peek` leaving the bytes queued. `Ok(0)`: end of
/// stream; `WouldBlock`: nothing queued.
pub fn recv_tcp(fd: BorrowedFd<'_>, buf: &mut [u8], peek: bool) -> io::Result<usize> {
    let mut flags = net::RecvFlags::DONTWAIT;
    if peek {
        flags |= net::RecvFlags::PEEK;
    }
    loop {
        match net::recv(fd, &mut *buf, flags) {
            Ok((n, _)) => return Ok(n),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Sends all of `bytes` on a TCP socket (without `SIGPIPE`), waiting up to `timeout` in all for
/// room: handshake messages are small and go first on a connection, so they fit at once.
pub fn send_tcp(fd: BorrowedFd<'_>, bytes: &[u8], timeout: Duration) -> io::Result<()> {
    let deadline = std::time::Instant::now() + timeout;
    let mut done = 0;
    while done < bytes.len() {
        match net::send(fd, &bytes[done..], net::SendFlags::NOSIGNAL | net::SendFlags::DONTWAIT) {
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::AGAIN) => {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() || !crate::tcp::wait_writable(fd, Some(left))? {
                    return Err(io::ErrorKind::TimedOut.into());
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(5);

    #[test]
    fn names_stay_inside_the_directory() {
        for bad in [&b""[..], b".", b"..", b"../x", b"a/b", b"/etc", b"a\0b", &[b'a'; 65]] {
            assert!(!valid_name(bad), "{bad:?}");
        }
        assert!(valid_name(b"colo-123-6379"));
    }

    #[test]
    fn the_mode_is_set_on_the_bound_socket_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("colo-pathsock-mode-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let _l = listen_at(&dir, "colo-1-1").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&dir.join("colo-1-1")), 0o666);
        // What another writer of the directory puts under the name between bind and chmod.
        let secret = dir.join("secret");
        std::fs::write(&secret, b"x").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(&secret, dir.join("link")).unwrap();
        std::fs::hard_link(dir.join("colo-1-1"), dir.join("hard")).unwrap();
        for name in ["link", "secret", "hard"] {
            assert!(open_to_all(&dir.join(name)).is_err(), "{name}");
        }
        assert_eq!(mode(&secret), 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn connect_at_refuses_symlinks_and_non_sockets() {
        let dir = std::env::temp_dir().join(format!("colo-pathsock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let _l = listen_at(&dir, "colo-1-1").unwrap();
        std::os::unix::fs::symlink(dir.join("colo-1-1"), dir.join("colo-link")).unwrap();
        std::fs::write(dir.join("colo-file"), b"x").unwrap();
        let (d, _) = open_dir(&dir).unwrap();
        assert!(connect_at(d.as_fd(), b"colo-1-1", T).is_ok());
        assert!(connect_at(d.as_fd(), b"colo-link", T).is_err());
        assert!(connect_at(d.as_fd(), b"colo-file", T).is_err());
        assert!(connect_at(d.as_fd(), b"../colo-1-1", T).is_err());
        let live = hold_live(&dir, "colo-1-1").unwrap();
        assert!(live_listener(&dir, "colo-", Some(1)));
        assert!(!live_listener(&dir, "colo-", Some(2)));
        drop(live);
        assert!(!live_listener(&dir, "colo-", None));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Another tenant fills a rendezvous's backlog with connections the server has not
    /// accepted: a client's connect gives up after its timeout instead of waiting for the
    /// server's next accept (watchdog: the connect runs in a thread the test waits 20 s for).
    #[test]
    fn connect_to_a_full_backlog_times_out() {
        let dir = std::env::temp_dir().join(format!("colo-pathsock-full-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let l = net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None).unwrap();
        net::bind(&l, &SocketAddrUnix::new(dir.join("colo-3-80")).unwrap()).unwrap();
        net::listen(&l, 1).unwrap();
        let mut flood = Vec::new();
        loop {
            let s = net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC | SocketFlags::NONBLOCK, None).unwrap();
            match net::connect(&s, &SocketAddrUnix::new(dir.join("colo-3-80")).unwrap()) {
                Ok(()) => flood.push(s),
                Err(rustix::io::Errno::AGAIN) => break,
                Err(e) => panic!("flood: {e}"),
            }
            assert!(flood.len() < 100, "the backlog never filled");
        }
        let (d, _) = open_dir(&dir).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(connect_at(d.as_fd(), b"colo-3-80", Duration::from_millis(100)).map(drop).map_err(|e| e.kind()));
        });
        let r = rx.recv_timeout(Duration::from_secs(20)).expect("connect to a full backlog did not time out");
        assert_eq!(r, Err(io::ErrorKind::TimedOut));
        // Room again (the server accepts one): the next connect goes through.
        drop(net::accept(&l).unwrap());
        let (d, _) = open_dir(&dir).unwrap();
        let c = connect_at(d.as_fd(), b"colo-3-80", Duration::from_secs(5)).unwrap();
        assert_eq!(net::sockopt::socket_timeout(&c, net::sockopt::Timeout::Send).unwrap(), None, "the connect's timeout stays on the socket");
        drop((flood, l));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// An attacker who can only read the directory (a read-only mount, or nobody on a file of
    /// mode 0644) takes every lock a read-only descriptor allows on a dead server's `.live`:
    /// clients must still see no live listener, or they would propose to a plain successor on
    /// that port.
    #[test]
    fn readers_locks_on_a_dead_servers_file_are_not_liveness() {
        use rustix::fs::{self, FlockOperation, Mode, OFlags};
        let dir = std::env::temp_dir().join(format!("colo-pathsock-live-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        drop(hold_live(&dir, "colo-7-6379").unwrap()); // the server died, its file stayed
        let ro = || fs::open(dir.join("colo-7-6379.live"), OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).unwrap();
        let (a, b, c) = (ro(), ro(), ro());
        fs::flock(&a, FlockOperation::NonBlockingLockExclusive).unwrap();
        let mut rd = whole_file(libc::F_RDLCK);
        // SAFETY: F_OFD_SETLK and F_SETLK read the `flock` we own; the descriptors are open.
        assert_eq!(unsafe { libc::fcntl(b.as_raw_fd(), libc::F_OFD_SETLK, &mut rd) }, 0);
        // SAFETY: as above.
        assert_eq!(unsafe { libc::fcntl(c.as_raw_fd(), libc::F_SETLK, &mut rd) }, 0);
        let mut wr = whole_file(libc::F_WRLCK);
        // SAFETY: as above.
        assert_eq!(unsafe { libc::fcntl(c.as_raw_fd(), libc::F_OFD_SETLK, &mut wr) }, -1);
        assert_eq!(io::Error::last_os_error().raw_os_error(), Some(libc::EBADF), "a write lock needs a writable descriptor");
        assert!(!live_listener(&dir, "colo-", Some(6379)), "a reader's lock counted as a live server");
        assert!(!live_listener(&dir, "colo-", None));
        // A successor of the same pid and port (a container's server is pid 1 at every start)
        // is seen again once it locks, the readers' locks still held: its file is a fresh one.
        let live = hold_live(&dir, "colo-7-6379").unwrap();
        assert!(live_listener(&dir, "colo-", Some(6379)));
        drop((a, b, c, live));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_binding_server_sweeps_up_the_files_of_servers_that_are_gone() {
        let dir = std::env::temp_dir().join(format!("colo-pathsock-sweep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dead = listen_at(&dir, "colo-8-80").unwrap();
        drop((dead, hold_live(&dir, "colo-8-80").unwrap())); // killed: both files stay
        let _served = listen_at(&dir, "colo-9-80").unwrap();
        let live = hold_live(&dir, "colo-9-80").unwrap();
        std::fs::write(dir.join("other.live"), b"").unwrap();
        sweep_stale(&dir, "colo-");
        let mut left: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        assert_eq!(left, ["colo-9-80", "colo-9-80.live", "other.live"]);
        drop(live);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
