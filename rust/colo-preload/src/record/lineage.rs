//! The offer service's *lineage*: what the process that called `listen(2)` shares, by
//! inheritance alone, with every process forked from it (multi-worker servers accept in forked
//! workers, which must get each connection's offer from the process that collected it).
//!
//! - a shared anonymous page ([`Shared`]): how many offers the service holds, whether it is
//!   taking some in, how connections ended (the short-lived markers), and the *owner word*;
//! - a `SOCK_SEQPACKET` socket pair, close-on-exec, made at `listen` before any fork. A process
//!   that accepted a TCP connection sends `{4-tuple, a fresh reply socket by SCM_RIGHTS}` on one
//!   end (`ask`); the serving process's service thread receives on the other (`serve`) and
//!   answers on the reply socket.
//!
//! Nothing here has a name: a socket pair cannot be bound, connected to or squatted by anyone,
//! and only a process that inherited an end (or was handed one by a process that did) can reach
//! it. Trust in the hand-over is therefore exactly trust in the process lineage, which holds the
//! listening socket, and so every connection, anyway (docs/SAFETY.md).
//!
//! Which process serves is decided in the owner word, with the kernel's robust-futex protocol: the
//! serving thread registers the word in its robust list and stores its thread id there; when the
//! thread ends (its process exits, is killed or `exec`s) the kernel replaces the id with
//! `FUTEX_OWNER_DIED`. A process of the lineage that finds the word so (a daemonized server's
//! master is gone) starts a service thread of its own, which takes the word over with a
//! compare-and-swap from the value found: exactly one process wins and serves the same socket
//! pair; the others keep asking on `ask`.

use crate::base::log::log_info;
use crate::record::marker;
use colo_sys::{seqpacket, AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// (listening port, client program) pairs whose endings an offer service tracks.
pub const MARKED_PORTS: usize = 64;

/// What the serving process tells the other processes of its lineage (multi-worker servers,
/// whose workers accept), in a page they share: with no offer held or on its way, a worker knows
/// an accepted connection is plain without asking (a connection per request must cost no more
/// than plain TCP).
pub struct Shared {
    /// Offers held (received, or connections whose HELLO has not arrived yet).
    pub offers: AtomicU32,
    /// Nonzero while the service is between accepting rendezvous connections and counting their
    /// offers in `offers`.
    pub busy: AtomicU32,
    /// The thread id of the service thread that serves, or `FUTEX_OWNER_DIED` once it ended (the
    /// kernel writes it), or 0 before the first one started.
    owner: AtomicU32,
    /// How accelerated connections to each listening port from each client program ended,
    /// recorded by whichever process served them, read by the service thread.
    pub ends: [marker::ListenerEnds; MARKED_PORTS],
    /// The wake-up connections that held sets' watchers of the lineage's processes made to
    /// their listeners and that no accept took back yet (`service::server::sleepers`), so that
    /// whichever process of the lineage the kernel gives one to knows it: 0, or the connection's
    /// local port with the monotonic clock's milliseconds above it.
    pub wakes: [std::sync::atomic::AtomicU64; 8],
    /// Threads of the lineage's processes asleep in the kernel's accept, by process and
    /// listening socket (`service::server::sleepers`): the pid above 32 bits, the socket's tag
    /// (`held::socket_tag`) in the next 16, the count below; 0 is a free slot (freed when its
    /// count drops to 0, or by any process once the one named is gone).
    pub asleep: [std::sync::atomic::AtomicU64; 8],
}

const FUTEX_OWNER_DIED: u32 = 0x4000_0000;
const FUTEX_TID_MASK: u32 = 0x3fff_ffff;

/// Whether owner word value `w` names a live service thread.
fn alive(w: u32) -> bool {
    w & FUTEX_TID_MASK != 0 && w & FUTEX_OWNER_DIED == 0
}

pub struct Lineage {
    pub shared: &'static Shared,
    /// Requests are sent here (non-blocking: a full queue is an answer, "no offer").
    ask: OwnedFd,
    /// The serving process's service thread receives requests here (non-blocking).
    serve: OwnedFd,
    /// The inodes of `ask` and `serve`: a program that closes every descriptor it does not
    /// know (daemons do, after `fork`) may have reused the numbers; nothing is sent on, or
    /// served from, a number that no longer holds the pair.
    ino: (u64, u64),
}

impl std::fmt::Debug for Lineage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lineage(ask {}, serve {})", self.ask.as_raw_fd(), self.serve.as_raw_fd())
    }
}

fn shared_page() -> io::Result<&'static Shared> {
    use rustix::mm::{mmap_anonymous, MapFlags, ProtFlags};
    const _: () = assert!(std::mem::size_of::<Shared>() <= 4096);
    // SAFETY: a new anonymous shared mapping of one page, never unmapped (fork children inherit
    // it as shared). The kernel zeroes it: zero atomics are a valid `Shared` (free slots, no
    // owner yet).
    let p = unsafe { mmap_anonymous(std::ptr::null_mut(), 4096, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED)? };
    // SAFETY: as above; page-aligned, so aligned for `Shared`.
    Ok(unsafe { &*p.cast::<Shared>() })
}

/// A pair of connected, non-blocking, close-on-exec `SOCK_SEQPACKET` sockets.
fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};
    Ok(socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC | SocketFlags::NONBLOCK, None)?)
}

/// What [`Lineage::ask`] got.
pub enum Asked {
    /// The answer: its bytes and descriptors.
    Answer(Vec<u8>, Vec<OwnedFd>),
    /// No answer in time, or the request could not be sent (the log says which).
    Nothing(String),
}

/// One request taken from the `serve` end: the bytes and where to answer.
pub struct Request {
    pub bytes: Vec<u8>,
    pub reply: OwnedFd,
}

impl Lineage {
    /// A new lineage, for the process that is about to serve it (leaked: forked children keep
    /// using it for as long as they live).
    pub fn new() -> io::Result<&'static Lineage> {
        let (ask, serve) = pair()?;
        // Kept for the process's life: out of the numbers the application uses.
        let mut ends = [ask, serve];
        colo_sys::preload::move_all_above(&mut ends, colo::internal::fd_floor())?;
        let [ask, serve] = ends;
        let ino = (rustix::fs::fstat(&ask)?.st_ino, rustix::fs::fstat(&serve)?.st_ino);
        Ok(Box::leak(Box::new(Lineage { shared: shared_page()?, ask, serve, ino })))
    }

    /// Whether both ends are still the pair this lineage made (see `ino`).
    pub fn intact(&self) -> bool {
        let ino = |fd: &OwnedFd| rustix::fs::fstat(fd).map(|st| st.st_ino).ok();
        ino(&self.ask) == Some(self.ino.0) && ino(&self.serve) == Some(self.ino.1)
    }

    /// The number and inode of the end requests are sent on: every process of the lineage that
    /// has not replaced its image holds it (it is close-on-exec), under that number unless it
    /// moved it.
    pub fn ask_end(&self) -> (i32, u64) {
        (self.ask.as_raw_fd(), self.ino.0)
    }

    /// The owner word's value, for [`Lineage::take_over`].
    pub fn owner(&self) -> u32 {
        // SYNC POINT with the compare-and-swap in `take_over` (and the kernel's store at the
        // owner's death): a requester that sees a live owner sends to a service that serves.
        self.shared.owner.load(Ordering::Acquire)
    }

    /// Whether owner word value `w` (from [`Lineage::owner`]) names a live service thread.
    pub fn is_alive(w: u32) -> bool {
        alive(w)
    }

    /// The end a service thread polls for requests.
    pub fn serve_fd(&self) -> BorrowedFd<'_> {
        self.serve.as_fd()
    }

    /// On the calling thread, which must be the service thread and live as long as it serves:
    /// makes it this lineage's owner if the owner word still reads `seen` (a value that names no
    /// live thread). Exactly one of the threads that try with the same `seen` wins.
    pub fn take_over(&self, seen: u32) -> bool {
        if alive(seen) {
            return false;
        }
        if let Err(e) = register_robust(&self.shared.owner) {
            // Without it the kernel cannot report this thread's end: serving still works, but a
            // daemonized server's workers would wait out each request once this process is gone.
            log_info(format_args!("offer service: set_robust_list: {e}; its end will not be noticed by the processes forked from it"));
        }
        let me = rustix::thread::gettid().as_raw_nonzero().get() as u32 & FUTEX_TID_MASK;
        // SYNC POINT with the Acquire load in `owner` (requesters) and with the kernel's
        // compare-and-swap at this thread's end (`handle_futex_death`): the word names a live
        // thread only from here on.
        self.shared.owner.compare_exchange(seen, me, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// Asks the service for `request` and waits up to `wait` for the answer. Each time the
    /// owner word shows no live service, `orphaned` is called with its value (to start one; it
    /// may answer this very request, which waits in the queue).
    pub fn ask(&self, request: &[u8], wait: Duration, mut orphaned: impl FnMut(u32)) -> Asked {
        if !self.intact() {
            return Asked::Nothing("the offer service's socket pair was closed by the program".into());
        }
        let w = self.owner();
        if !alive(w) {
            orphaned(w);
        }
        let (mine, theirs) = match pair() {
            Ok(p) => p,
            Err(e) => return Asked::Nothing(format!("reply socket: {e}")),
        };
        if let Err(e) = send_now(&self.ask, request, &[theirs.as_fd()]) {
            return Asked::Nothing(format!("request: {e}"));
        }
        drop(theirs);
        let deadline = Instant::now() + wait;
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Asked::Nothing("no answer in time".into());
            }
            // Short slices: a service that ends meanwhile is noticed, and replaced, within one.
            let slice = (deadline - now).min(Duration::from_millis(50));
            let mut p = [rustix::event::PollFd::new(&mine, rustix::event::PollFlags::IN)];
            let t = rustix::event::Timespec { tv_sec: 0, tv_nsec: slice.as_nanos() as i64 };
            let _ = rustix::event::poll(&mut p, Some(&t));
            let mut buf = [0u8; 16];
            match seqpacket::recv_own(&mine, &mut buf, true) {
                Ok(mut r) if r.len > 0 && !r.truncated => return Asked::Answer(buf[..r.len].to_vec(), r.take_fds()),
                Ok(_) => return Asked::Nothing("malformed answer".into()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Asked::Nothing(format!("answer: {e}")),
            }
            let w = self.owner();
            if !alive(w) {
                orphaned(w);
            }
        }
    }

    /// The next request waiting at the `serve` end, without blocking. Malformed ones (not
    /// exactly one descriptor) are dropped.
    pub fn next_request(&self) -> Option<Request> {
        loop {
            let mut buf = [0u8; 128];
            let mut r = seqpacket::recv_own(&self.serve, &mut buf, true).ok()?;
            if r.truncated || r.fds.len() != 1 {
                continue;
            }
            let reply = r.take_fds().into_iter().next()?;
            return Some(Request { bytes: buf[..r.len].to_vec(), reply });
        }
    }
}

impl Request {
    /// Answers the request (best effort, never blocks: the reply socket is non-blocking and its
    /// queue empty; a requester that gave up has closed its end).
    pub fn answer(&self, bytes: &[u8], fds: &[BorrowedFd<'_>]) {
        let _ = send_now(&self.reply, bytes, fds);
    }
}

/// Sends one datagram with descriptors, never blocking (whatever the socket's mode).
fn send_now(fd: &OwnedFd, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    sendmsg(fd, &[std::io::IoSlice::new(bytes)], &mut control, SendFlags::DONTWAIT | SendFlags::NOSIGNAL)?;
    Ok(())
}

/// The kernel's robust-list records (`struct robust_list`, `struct robust_list_head`).
#[repr(C)]
struct RobustList {
    next: *const RobustList,
}

#[repr(C)]
struct RobustListHead {
    list: RobustList,
    futex_offset: libc::c_long,
    list_op_pending: *const RobustList,
}

/// Registers `word` as the calling thread's only robust futex: when the thread ends, the
/// kernel, finding the thread's id in the word, replaces it with `FUTEX_OWNER_DIED`.
///
/// This replaces the robust list glibc registered for the thread: only a thread that never
/// locks a robust `pthread_mutex` may call it (the service thread runs colo's code alone, whose
/// locks are futex-based `std` mutexes and glibc's non-robust ones).
fn register_robust(word: &'static AtomicU32) -> io::Result<()> {
    let entry: &'static mut RobustList = Box::leak(Box::new(RobustList { next: std::ptr::null() }));
    let head: &'static mut RobustListHead =
        Box::leak(Box::new(RobustListHead { list: RobustList { next: std::ptr::null() }, futex_offset: 0, list_op_pending: std::ptr::null() }));
    // The circular list head -> entry -> head; the word is found at entry + futex_offset.
    head.list.next = entry as *const RobustList;
    entry.next = &head.list as *const RobustList;
    head.futex_offset = (word as *const AtomicU32 as isize - entry as *const RobustList as isize) as libc::c_long;
    // SAFETY: `head` and `entry` are leaked (valid for the rest of the process, as the kernel
    // requires until the thread ends); the word they lead to is 4-byte aligned in a shared
    // mapping that is never unmapped. See the function's comment for whose list this replaces.
    let r = unsafe { libc::syscall(libc::SYS_set_robust_list, head as *const RobustListHead, std::mem::size_of::<RobustListHead>()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
