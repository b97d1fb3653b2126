//! Bytes a closed connection leaves unread by a peer of another user are kept for a bounded
//! time, as TCP drops an orphaned socket's unsent bytes on a timer (spec/WIRE.md section 8,
//! "Orphaned bytes"). Their pages, in a memfd the peer holds, are charged to this process's
//! memory cgroup for as long as they exist, and the peer decides how long that is by reading
//! them or not: a side that let go of a connection (its last close) keeps such a segment mapped
//! here, one thread per process looks at each every [`LOOK`], gives back the pages of the bytes
//! read since, and lets the segment go once they are all read or the peer hung up (it keeps
//! the control socket for that, shut down for writing: `Segment::keep_control`). A peer that read none of them
//! for [`IDLE`], or that has held them for [`MOST`], loses them: the ring is marked RESET and
//! DROPPED (it reads a reset, never the zeros of a page given back) and every page of it goes.
//! What is kept is still counted in the budgets (its lease), which bound how much may be. At
//! most [`WATCHED`] kept segments hold a descriptor (the control socket, or the memfd): the rest
//! hold none and go by the timers alone, so that a peer's closed connections cannot use up our
//! limit of open files (an orphaned TCP socket holds no descriptor of its program's).

use crate::fork;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A peer that reads none of the bytes for this long loses them.
const IDLE: Duration = Duration::from_secs(60);
/// However it reads them (a byte a minute), a peer loses the bytes left after this long.
const MOST: Duration = Duration::from_secs(600);
/// How often the kept segments are looked at.
pub(crate) const LOOK: Duration = Duration::from_secs(5);
/// At most this many kept segments keep a descriptor (to see their peer's hang-up by, or to
/// read through): a sixteenth of a limit of 1024 open files.
const WATCHED: usize = 64;

/// What a look at the peer's progress decided.
pub(crate) enum Look {
    /// Nothing moved, and there is time left.
    Keep,
    /// The peer read some: give back the pages of what it read.
    Moved,
    /// The peer read them all (or the words no longer say bytes are unread).
    Done,
    /// The peer loses the bytes left (`IDLE` without a byte read, or `MOST` in all).
    Expired,
}

/// The peer's `ring_tail` at the last look, when it last moved, and when the bytes were left.
pub(crate) struct Watch {
    tail: u64,
    moved: Instant,
    kept: Instant,
}

impl Watch {
    pub(crate) fn new(tail: u64) -> Watch {
        let now = Instant::now();
        Watch { tail, moved: now, kept: now }
    }

    /// A look at the peer's tail now (`None`: nothing left unread).
    pub(crate) fn look(&mut self, tail: Option<u64>) -> Look {
        let Some(tail) = tail else { return Look::Done };
        let now = Instant::now();
        let moved = tail != self.tail;
        if moved {
            self.tail = tail;
            self.moved = now;
        }
        if now.duration_since(self.moved) >= IDLE || now.duration_since(self.kept) >= MOST {
            Look::Expired
        } else if moved {
            Look::Moved
        } else {
            Look::Keep
        }
    }
}

/// What this module keeps: a segment let go of with bytes its peer has yet to read
/// (`crate::segment::Segment`, which keeps itself here from its drop).
pub(crate) trait Unread: Send {
    /// The peer's `ring_tail` of the ring we wrote, while bytes in it are unread (`None`: none).
    fn outgoing_tail(&self) -> Option<u64>;
    /// Whether the peer hung up (nobody reads the bytes any more).
    fn peer_hung_up(&self) -> bool;
    /// Gives back the pages of the bytes the peer read since.
    fn give_back_read(&self);
    /// Marks the ring RESET and DROPPED and gives back every page of the unread bytes.
    fn drop_unread(&mut self);
    /// Whether it holds a descriptor (its control socket or its memfd).
    fn holds_descriptor(&self) -> bool;
    /// Closes the descriptor it holds: from then on only the timers end it, never the peer's
    /// hang-up.
    fn close_descriptor(&mut self);
    /// The thread lets go of it, nothing being left to read at its last look: its drop gives
    /// back every page and keeps it no more, whatever the peer's words say then (else a peer
    /// that moves them back would have it kept again, on fresh timers, for ever).
    fn let_go_final(&mut self);
    /// In a fork child: lets go of this process's copy (its mapping and descriptors) without
    /// touching what the parent, which keeps the segment, still watches, and without freeing
    /// memory (a fork that ran past libc's handlers may have left the allocator locked).
    fn let_go_in_child(&mut self);
}

struct Orphan {
    seg: Box<dyn Unread>,
    watch: Watch,
}

/// The kept segments, the pid whose thread looks at them (a forked child's copy is its
/// parent's), and whether that thread runs.
struct Kept {
    pid: u32,
    list: Vec<Orphan>,
    running: bool,
    /// How many of `list` hold a descriptor (at most `WATCHED`).
    watched: usize,
}

// Locked at every fork: kept with what the fork handlers write (see `colo_sys::host`).
#[link_section = "colo_fork"]
static KEPT: Mutex<Kept> = Mutex::new(Kept { pid: 0, list: Vec::new(), running: false, watched: 0 });

static LOCKS: fork::Locks = fork::Locks { take: fork_guard, in_child: Some(forked) };

fn fork_guard(held: &mut fork::Held) {
    held.hold(KEPT.lock().unwrap_or_else(|e| e.into_inner()));
}

fn lock() -> std::sync::MutexGuard<'static, Kept> {
    fork::protect(fork::Rank::Orphan, &LOCKS);
    KEPT.lock().unwrap_or_else(|e| e.into_inner())
}

/// In a forked child: the kept segments are the parent's to look at, and the child's copies of
/// their mappings and descriptors go now (a child that neither execs nor exits soon, a prefork
/// worker, would hold them for life, and with them the peer's memory).
fn forked() {
    let mut k = lock();
    let_go_of_parents(&mut k, colo_sys::host::pid());
}

/// Lets go of a parent's list copied into this child (`me`) by a fork.
fn let_go_of_parents(k: &mut Kept, me: u32) {
    if k.pid == me {
        return;
    }
    k.pid = me;
    k.running = false;
    k.watched = 0;
    for o in &mut k.list {
        o.seg.let_go_in_child();
    }
    // Their memory is left as it is: freeing it could wait on an allocator lock a thread of the
    // parent held at the fork.
    std::mem::forget(std::mem::take(&mut k.list));
}

/// Keeps `seg` (let go of, its written ring holding unread bytes or its pool messages the peer
/// holds; `tail`: the peer's progress then, as `Unread::outgoing_tail` says it) until its peer
/// read or released them or lost them. Without the thread (it cannot start), they are dropped
/// at once.
pub(crate) fn keep(mut seg: Box<dyn Unread>, tail: u64) {
    let me = colo_sys::host::pid();
    let mut k = lock();
    // A fork that ran no handlers (the handler is `forked`).
    let_go_of_parents(&mut k, me);
    if !k.running {
        if colo_sys::host::spawn("colo-orphans", move || run(me)).is_err() {
            drop(k);
            seg.drop_unread();
            return;
        }
        k.running = true;
    }
    if seg.holds_descriptor() {
        if k.watched < WATCHED {
            k.watched += 1;
        } else {
            seg.close_descriptor();
        }
    }
    k.list.push(Orphan { seg, watch: Watch::new(tail) });
}

/// Takes kept segment `i` out of the list.
fn remove(k: &mut Kept, i: usize) -> Orphan {
    let o = k.list.swap_remove(i);
    if o.seg.holds_descriptor() {
        k.watched -= 1;
    }
    o
}

fn run(me: u32) {
    loop {
        std::thread::sleep(LOOK);
        let mut done = Vec::new();
        let mut k = lock();
        if k.pid != me {
            return;
        }
        let mut i = 0;
        while i < k.list.len() {
            let o = &mut k.list[i];
            if o.seg.peer_hung_up() {
                o.seg.drop_unread();
                done.push(remove(&mut k, i));
                continue;
            }
            match o.watch.look(o.seg.outgoing_tail()) {
                Look::Keep => {}
                Look::Moved => o.seg.give_back_read(),
                Look::Done => {
                    o.seg.let_go_final();
                    done.push(remove(&mut k, i));
                    continue;
                }
                Look::Expired => {
                    o.seg.drop_unread();
                    done.push(remove(&mut k, i));
                    continue;
                }
            }
            i += 1;
        }
        if k.list.is_empty() {
            // Kept under this lock: with none kept, none is coming to this thread once it is
            // marked stopped.
            k.running = false;
        }
        let stop = !k.running;
        drop(k);
        // Unmapped (and their leases given back) outside the lock.
        drop(done);
        if stop {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{keep, Unread};
    use colo_sys::{AsRawFd, OwnedFd};

    /// Bytes never read: kept until they expire, holding a descriptor as a segment holds its own.
    struct Unreadable {
        fd: Option<OwnedFd>,
    }

    impl Unread for Unreadable {
        fn outgoing_tail(&self) -> Option<u64> {
            Some(0)
        }
        fn peer_hung_up(&self) -> bool {
            false
        }
        fn give_back_read(&self) {}
        fn drop_unread(&mut self) {}
        fn holds_descriptor(&self) -> bool {
            true
        }
        fn close_descriptor(&mut self) {}
        fn let_go_final(&mut self) {}
        fn let_go_in_child(&mut self) {
            self.fd = None;
        }
    }

    /// A fork child lets go of its copies of what its parent keeps (a prefork worker would
    /// otherwise hold them, and the peer's memory with them, for life); the parent keeps them.
    #[test]
    fn a_fork_child_lets_go_of_its_parents_kept_segments() {
        // SAFETY: eventfd(2) with no memory passed; the descriptor is owned once, here.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor nothing else owns.
        let owned = unsafe { <OwnedFd as colo_sys::FromRawFd>::from_raw_fd(fd) };
        let raw = owned.as_raw_fd();
        keep(Box::new(Unreadable { fd: Some(owned) }), 0);
        // SAFETY: the child only makes system calls and exits without unwinding.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: fcntl(2) on a number; _exit(2) ends the child without running the parent's code.
            unsafe { libc::_exit(i32::from(libc::fcntl(raw, libc::F_GETFD) != -1)) };
        }
        assert!(pid > 0);
        let mut status = 0;
        // SAFETY: waits for our own child; `status` is a valid place to write.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status));
        assert_eq!(libc::WEXITSTATUS(status), 0, "the child still held its parent's kept segment");
        // SAFETY: fcntl(2) on a number.
        assert_ne!(unsafe { libc::fcntl(raw, libc::F_GETFD) }, -1, "the parent let go of what it keeps");
    }
}
