//! Threads asleep in the kernel's `accept` while a connection is held (`held`). A blocking accept
//! waits on the listener and its held set together (`api::fds::accept_netns`), but a thread that
//! went into the kernel's accept before the set had anything, or that lost the race for a queued
//! connection to another thread after its wait reported the listener, sleeps there: the kernel
//! wakes it only for a connection of its own queue. If every accepting thread of the process
//! sleeps so (or is away with a connection of its own), nobody would move the held connections
//! on, and one resolved would wait for the next real connection.
//!
//! So while a thread of this process sleeps in the kernel's accept and the set holds anything,
//! a watcher thread of the set's (started at the first such sleep, one per set) moves the held
//! connections on; when one is ready and no accepting thread waits on the set, it wakes a
//! sleeper with a connection of its own to the listener, closed once made: the sleeper's accept
//! takes it, knows it by its address (`Sleepers::is_wake`), closes it, and returns the held
//! connection instead. The kernel may give that connection to a thread of another process
//! accepting on the same socket (a forked worker; the kernel wakes its longest sleeper first):
//! a process of the same lineage knows it too (the records are in the lineage's shared page),
//! drops it and sleeps again; any other sees a client that sent nothing and closed. The watcher
//! tries again every 10 ms (each try wakes the next sleeper), and after half a second every
//! second, until a thread of this process is awake or the connection is taken.
//!
//! One wake-up connection of a set is outstanding at a time: the next is made once an accept
//! of the lineage took the last one back. One that left the listener's queue without being
//! taken back (two looks 10 ms apart) went to a process outside the lineage that accepts on the
//! same socket (one the socket was passed to, a hot restart's successor): that is logged, and
//! the set's next tries come a second apart. So such a process sees at most one client that
//! connects and closes at once per sleeper of its own, then one a second, while a connection
//! held here waits for a thread of this process, as a TCP health check would show it.
//!
//! A held connection can be handed out by its own process only. So a thread of a process that
//! holds connections, waiting on the listener and the set together, leaves the listener's
//! queue to the lineage's other processes while one of them sleeps in the kernel's accept on
//! that socket (`Held::others_asleep`; counted in the lineage's shared page by process, whose
//! count goes with it if it dies there): had it taken a queued connection, its held ones would
//! wait until its application came back to accept.

use colo_sys::{AsFd, OwnedFd};
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::net::{AddressFamily, SocketFlags, SocketType};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The wait for a woken sleeper to take the ready connection before another wake-up
/// connection is made, for the first [`QUICK_TRIES`] (a process of the lineage that the kernel
/// gave one to drops it and sleeps again, behind the others: the next goes to the next
/// sleeper); then [`LAST_RETRY`] (a process outside the lineage accepts on the socket too).
const QUICK_RETRY: Duration = Duration::from_millis(10);
const QUICK_TRIES: u32 = 50;
const LAST_RETRY: Duration = Duration::from_secs(1);
/// How long a wake-up connection's record is kept for its accept (one that a process outside
/// the lineage took is never accepted back).
const WAKE_LIFE: Duration = Duration::from_secs(5);

/// A set's threads in the kernel's accept and waiting on it, and its watcher.
pub struct Sleepers {
    /// Where a wake-up connection goes: the listener's address (loopback for a wildcard).
    target: SocketAddr,
    /// Threads of this process in the kernel's accept on the listener.
    asleep: AtomicU32,
    /// Threads of this process waiting on the listener and the set together.
    watching: AtomicU32,
    /// Wakes the watcher (an eventfd).
    kick: OwnedFd,
    started: AtomicBool,
    /// The set was let go: the watcher ends.
    closed: AtomicBool,
    /// Wake-up connections not accepted back yet, the lineage's (shared by the processes that
    /// accept on the listener: one another process takes, it knows and drops): the local port,
    /// and when it was made (monotonic ms) above it; 0 is a free slot.
    wakes: &'static [AtomicU64; 8],
    /// This set's wake-up connection not yet taken back (its record in `wakes`; 0: none), and
    /// how many looks in a row found it gone from the listener's queue meanwhile.
    last: AtomicU64,
    unseen: AtomicU32,
    /// A wake-up connection of this set's went to a process outside the lineage (logged once).
    lost: AtomicBool,
    /// The lineage's threads asleep in the kernel's accept, by process and listening socket
    /// (`Shared::asleep`, `slot_key`).
    everyone: &'static [AtomicU64; 8],
}

/// A slot of the lineage's table of sleepers (`Shared::asleep`): the process above 32 bits,
/// the listening socket's tag (`held::socket_tag`) in the next 16, how many of its threads are
/// asleep in the kernel's accept on that socket below; 0 is a free slot. Only the process named
/// changes its slot's count; any process frees the slot of one that is gone (killed while
/// asleep there: it never counted itself back).
fn slot_key(pid: u32, sock: u16) -> u64 {
    u64::from(pid) << 32 | u64::from(sock) << 16
}

/// Counts a thread of process `pid` going to sleep in the kernel's accept on the socket tagged
/// `sock` (`up`), or back (the slot freed when none is left); nothing if the table is full
/// (then the lineage's other processes do not count this one asleep there).
fn count_asleep(slots: &[AtomicU64; 8], pid: u32, sock: u16, up: bool) {
    let key = slot_key(pid, sock);
    'again: loop {
        // This process's slot for the socket, if it has one.
        for slot in slots {
            let mut v = slot.load(Ordering::Relaxed);
            while v & !0xFFFF == key {
                let n = v & 0xFFFF;
                let next = match (up, n) {
                    (true, _) => key | (n + 1).min(0xFFFF),
                    (false, 0 | 1) => 0,
                    (false, _) => key | (n - 1),
                };
                match slot.compare_exchange(v, next, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => return,
                    // Another thread of this process counted, or freed the slot: look again.
                    Err(now) => v = now,
                }
            }
        }
        if !up {
            return;
        }
        for slot in slots {
            if slot.compare_exchange(0, key | 1, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
                return;
            }
            if slot.load(Ordering::Relaxed) & !0xFFFF == key {
                // Another thread of this process took a slot meanwhile: count there.
                continue 'again;
            }
        }
        return;
    }
}

/// Whether a thread of a process of the lineage other than `pid` is asleep in the kernel's
/// accept on the socket tagged `sock`. A slot of a process that is gone (or a zombie nobody
/// reaped) is freed.
fn others_asleep_on(slots: &[AtomicU64; 8], pid: u32, sock: u16) -> bool {
    let mut any = false;
    for slot in slots {
        let v = slot.load(Ordering::Relaxed);
        let other = (v >> 32) as u32;
        if v == 0 || (v >> 16) & 0xFFFF != u64::from(sock) || other == pid || v & 0xFFFF == 0 {
            continue;
        }
        if process_gone(other) {
            let _ = slot.compare_exchange(v, 0, Ordering::Relaxed, Ordering::Relaxed);
            continue;
        }
        any = true;
    }
    any
}

/// Whether process `pid` has ended: no such process, or a zombie (its threads are out of
/// every accept; its parent has not reaped it yet).
fn process_gone(pid: u32) -> bool {
    let Some(p) = rustix::process::Pid::from_raw(pid as i32) else { return true };
    if rustix::process::test_kill_process(p) == Err(rustix::io::Errno::SRCH) {
        return true;
    }
    let Ok(stat) = std::fs::read(format!("/proc/{pid}/stat")) else { return false };
    // The state follows the command's closing parenthesis (the command may hold any byte).
    let state = stat.iter().rposition(|&b| b == b')').and_then(|i| stat.get(i + 2)).copied();
    matches!(state, Some(b'Z' | b'X'))
}

/// The monotonic clock in milliseconds (the same in every process).
fn now_ms() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1000 + t.tv_nsec as u64 / 1_000_000
}

impl Sleepers {
    /// For the listener on `addr`, whose lineage records wake-up connections in `wakes` and
    /// its threads asleep in the kernel's accept in `everyone`.
    pub fn new(addr: SocketAddr, wakes: &'static [AtomicU64; 8], everyone: &'static [AtomicU64; 8]) -> std::io::Result<Sleepers> {
        let ip = match addr.ip() {
            IpAddr::V4(a) if a.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(a) if a.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        let kick = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK)?;
        Ok(Sleepers {
            target: SocketAddr::new(ip, addr.port()),
            asleep: AtomicU32::new(0),
            watching: AtomicU32::new(0),
            kick: colo_sys::preload::move_above(kick, colo::internal::fd_floor())?,
            started: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            last: AtomicU64::new(0),
            unseen: AtomicU32::new(0),
            lost: AtomicBool::new(false),
            wakes,
            everyone,
        })
    }

    fn ring(&self) {
        let _ = rustix::io::write(&self.kick, &1u64.to_ne_bytes());
    }

    /// A thread waits on the listener and the set together (`false`: no longer).
    pub fn watching(&self, on: bool) {
        // Relaxed: a count the watcher reads as a hint; it looks again after every wait.
        if on {
            self.watching.fetch_add(1, Ordering::Relaxed);
        } else {
            self.watching.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The set was let go (its listener closed here): the watcher ends.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.ring();
    }

    /// Whether the connection `fd` just accepted is a wake-up connection of this set's (its
    /// record is then dropped): the caller closes it and accepts again.
    pub fn is_wake(&self, fd: i32) -> bool {
        if self.wakes.iter().all(|w| w.load(Ordering::Relaxed) == 0) {
            return false;
        }
        // SAFETY: the descriptor the kernel just gave the caller, open for this call.
        let b = unsafe { colo_sys::BorrowedFd::borrow_raw(fd) };
        let Some(peer) = rustix::net::getpeername(b).ok().flatten().and_then(|a| crate::base::addr::sockaddr_of(&a)) else { return false };
        if peer.ip() != self.target.ip() {
            return false;
        }
        self.wakes.iter().any(|w| {
            let v = w.load(Ordering::Relaxed);
            v != 0 && v & 0xFFFF == u64::from(peer.port()) && w.compare_exchange(v, 0, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        })
    }

    /// Connects to the listener and closes the connection once it is made: a thread asleep in
    /// the kernel's accept on it wakes. Recorded first, so that the accept that takes it here
    /// knows it; another process that takes it sees a client that sent nothing and closed.
    fn wake_one(&self) {
        let now = now_ms();
        let expired = |v: u64| v == 0 || now.saturating_sub(v >> 16) > WAKE_LIFE.as_millis() as u64;
        let family = if self.target.is_ipv4() { AddressFamily::INET } else { AddressFamily::INET6 };
        let Ok(s) = rustix::net::socket_with(family, SocketType::STREAM, SocketFlags::NONBLOCK | SocketFlags::CLOEXEC, None) else { return };
        if rustix::net::bind(&s, &SocketAddr::new(self.target.ip(), 0)).is_err() {
            return;
        }
        let Some(local) = rustix::net::getsockname(&s).ok().and_then(|a| crate::base::addr::sockaddr_of(&a)) else { return };
        let value = now.max(1) << 16 | u64::from(local.port());
        // Claimed by an exchange: the lineage's other processes record theirs in the same
        // table, and a record one overwrote would leave its wake-up connection unknown to the
        // accept that takes it (handed to the application as a client that sent nothing).
        let Some(slot) = claim_slot(self.wakes, value, expired) else { return };
        let made = match rustix::net::connect(&s, &self.target) {
            Ok(()) => true,
            Err(e) if e == rustix::io::Errno::INPROGRESS => {
                let mut p = [PollFd::new(&s, PollFlags::OUT)];
                let wait = Timespec { tv_sec: 0, tv_nsec: 100_000_000 };
                matches!(poll(&mut p, Some(&wait)), Ok(1)) && rustix::net::sockopt::socket_error(&s).is_ok_and(|r| r.is_ok())
            }
            Err(_) => false,
        };
        if made {
            self.last.store(value, Ordering::Relaxed);
            self.unseen.store(0, Ordering::Relaxed);
        } else {
            // Never made (a full queue): no accept will take it.
            let _ = slot.compare_exchange(value, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// One try of the watcher's while a held connection is ready and a thread of this process
    /// sleeps in the kernel's accept (the `tries`-th in a row; `lost`: one of them went outside
    /// the lineage): wakes a sleeper if none waits on the set and none of the set's wake-up
    /// connections is outstanding. Returns when to try again.
    fn try_wake(&self, tries: &mut u32, lost: &mut bool) -> Duration {
        if self.watching.load(Ordering::Relaxed) == 0 {
            let fate = self.may_wake();
            *lost |= fate == Outstanding::Lost;
            if fate == Outstanding::None {
                self.wake_one();
            }
        }
        *tries += 1;
        if *tries <= QUICK_TRIES && !*lost {
            QUICK_RETRY
        } else {
            LAST_RETRY
        }
    }

    /// Whether the watcher may make a wake-up connection now (`None`: see the module's
    /// comment): none of this set's is outstanding. `Lost`: the last one is now known lost to
    /// a process outside the lineage (none is made now; the caller's next try comes a second
    /// later).
    fn may_wake(&self) -> Outstanding {
        let v = self.last.load(Ordering::Relaxed);
        if v == 0 {
            return Outstanding::None;
        }
        if !self.wakes.iter().any(|w| w.load(Ordering::Relaxed) == v) {
            // An accept of the lineage took it back.
            self.last.store(0, Ordering::Relaxed);
            return Outstanding::None;
        }
        // Still queued (or another connection is: a sleeper wakes for that one as well), or
        // taken by a thread of the lineage about to look it up: wait.
        if !matches!(colo_sys::diag::accept_queue(self.target), Ok(Some(0))) || self.unseen.fetch_add(1, Ordering::Relaxed) == 0 {
            return Outstanding::Wait;
        }
        for w in self.wakes {
            let _ = w.compare_exchange(v, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
        self.last.store(0, Ordering::Relaxed);
        if !self.lost.swap(true, Ordering::Relaxed) {
            crate::base::log::log_info(format_args!(
                "accept on port {}: a process outside this server's lineage accepts on the same socket and took a wake-up connection (a client that connects and closes); wake-ups for connections held here now come a second apart",
                self.target.port()
            ));
        }
        Outstanding::Lost
    }
}

/// What became of a set's last wake-up connection (`Sleepers::may_wake`).
#[derive(Debug, PartialEq, Eq)]
enum Outstanding {
    /// Taken back, or none made: the next may be made.
    None,
    /// Not known yet: none is made.
    Wait,
    /// Taken outside the lineage: the next may be made a second later.
    Lost,
}

/// Stores `value` in a slot of `wakes` whose content `free` accepts, by an exchange from what
/// was read (no other process's record is overwritten); `None` if none could be had.
fn claim_slot(wakes: &[AtomicU64; 8], value: u64, free: impl Fn(u64) -> bool) -> Option<&AtomicU64> {
    wakes.iter().find(|w| {
        let v = w.load(Ordering::Relaxed);
        free(v) && w.compare_exchange(v, value, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    })
}

/// What the watcher looks after: a process's set of held connections (`super::held::Held`).
pub trait Watched: Send + Sync + 'static {
    /// The set's sleepers.
    fn sleepers(&self) -> &Sleepers;
    /// Whether the set holds any connection.
    fn holds_any(&self) -> bool;
    /// Connections waiting for their first bytes, and whether one is decided and ready.
    fn counts(&self) -> (usize, bool);
    /// The set's epoll fd, readable when a held connection moved.
    fn fd(&self) -> colo_sys::RawFd;
    /// Serves the held connections that moved.
    fn service(&self) -> bool;
    /// Whether the set is this process's (not a forked parent's copy).
    fn own(&self) -> bool;
}

/// A thread of this process goes to sleep in the kernel's accept on the listening socket
/// tagged `sock` (`socket_tag`; `false`: it is back): while the set `w` holds anything, the
/// watcher looks after it.
pub fn asleep<W: Watched>(w: &Arc<W>, on: bool, sock: u16) {
    let s = w.sleepers();
    count_asleep(s.everyone, colo_sys::host::pid(), sock, on);
    // Relaxed: see `watching`.
    if !on {
        s.asleep.fetch_sub(1, Ordering::Relaxed);
        return;
    }
    s.asleep.fetch_add(1, Ordering::Relaxed);
    watch_if_needed(w);
}

/// Whether a thread of another process of the lineage is asleep in the kernel's accept on
/// the listening socket tagged `sock`: a connection queued there is its, and a thread of
/// this process that holds connections had better wait for those than take it (the held
/// ones can go to no other process, and this one would be away with the other). Another
/// socket on the same port (`SO_REUSEPORT`) has a queue of its own, and does not count.
pub fn others_asleep(s: &Sleepers, sock: u16) -> bool {
    others_asleep_on(s.everyone, colo_sys::host::pid(), sock)
}

/// If a thread sleeps in the kernel's accept while the set `w` holds anything: the watcher
/// (started now if it is not yet) looks at the set again. Called where that may have
/// become so (a thread goes to sleep, or leaves the set unwatched).
pub fn watch_if_needed<W: Watched>(w: &Arc<W>) {
    let s = w.sleepers();
    if s.asleep.load(Ordering::Relaxed) == 0 || !w.holds_any() {
        return;
    }
    if !s.started.swap(true, Ordering::Relaxed) {
        let weak = Arc::downgrade(w);
        if colo_sys::host::spawn("colo-held", move || watch(weak)).is_err() {
            s.started.store(false, Ordering::Relaxed);
            return;
        }
    }
    s.ring();
}

/// The watcher of the set `w`: see the module's comment. Holds the set only across one wait,
/// and ends when it is let go.
fn watch<W: Watched>(w: Weak<W>) {
    let mut tries = 0;
    // A wake-up connection of this episode went outside the lineage: tries a second apart.
    let mut lost = false;
    loop {
        let Some(h) = w.upgrade() else { return };
        let s = h.sleepers();
        if s.closed.load(Ordering::Relaxed) || !h.own() {
            return;
        }
        let asleep = s.asleep.load(Ordering::Relaxed) > 0;
        let (waiting, ready) = h.counts();
        let mut timeout = None;
        let on_set = asleep && !ready && waiting > 0;
        if asleep && ready {
            timeout = Some(s.try_wake(&mut tries, &mut lost));
        } else {
            tries = 0;
            lost = false;
        }
        let set = h.fd();
        // SAFETY: the set's epoll fd, open while `h` lives (held across this wait).
        let set = unsafe { colo_sys::BorrowedFd::borrow_raw(set) };
        let mut fds = [PollFd::new(&s.kick, PollFlags::IN), PollFd::new(&set, PollFlags::IN)];
        let n = if on_set { 2 } else { 1 };
        let t = timeout.map(|d| Timespec { tv_sec: d.as_secs() as i64, tv_nsec: i64::from(d.subsec_nanos()) });
        let _ = poll(&mut fds[..n], t.as_ref());
        let set_moved = on_set && fds[1].revents().contains(PollFlags::IN);
        colo_sys::doorbell::drain(s.kick.as_fd());
        if set_moved {
            h.service();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{claim_slot, count_asleep, others_asleep_on, Sleepers};
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A process outside the lineage (here a thread accepting with no knowledge of the wake-up
    /// records) that accepts on the listener, a watcher trying every 10 ms for 300 ms: it
    /// makes no second wake-up connection once the first is known lost (the watcher's next try
    /// comes a second later), so the outsider sees one client that connects and closes.
    /// Watchdog: the outsider's accepts end with the listener's 2 s timeout.
    #[test]
    fn a_wake_up_taken_outside_the_lineage_is_not_repeated_at_once() {
        static WAKES: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];
        static ASLEEP: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let s = Sleepers::new(l.local_addr().unwrap(), &WAKES, &ASLEEP).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let seen = std::thread::scope(|scope| {
            let outsider = scope.spawn(|| {
                l.set_nonblocking(true).unwrap();
                let mut seen = 0;
                let end = std::time::Instant::now() + std::time::Duration::from_secs(2);
                while !stop.load(Ordering::Relaxed) && std::time::Instant::now() < end {
                    match l.accept() {
                        Ok(_) => seen += 1,
                        Err(_) => std::thread::sleep(std::time::Duration::from_millis(1)),
                    }
                }
                seen
            });
            let (mut tries, mut lost) = (0, false);
            let end = std::time::Instant::now() + std::time::Duration::from_millis(300);
            while let Some(left) = end.checked_duration_since(std::time::Instant::now()) {
                let next = s.try_wake(&mut tries, &mut lost);
                std::thread::sleep(next.min(left));
            }
            stop.store(true, Ordering::Relaxed);
            assert!(lost, "the loss was never noticed after {tries} tries");
            outsider.join().unwrap()
        });
        assert_eq!(seen, 1, "the outsider saw {seen} wake-up connections");
        assert!(s.lost.load(Ordering::Relaxed));
    }

    /// A process counted asleep in the kernel's accept on a port counts for the lineage's
    /// other processes while it lives; once it is gone, killed there (here: one that exited
    /// and was reaped, and one left a zombie), it does not, and its slot is freed. A process's
    /// own sleepers never count for it. Watchdog: the children are `sleep 30` at most.
    #[test]
    fn a_dead_sleeper_is_not_counted() {
        let slots: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];
        let me = std::process::id();
        let mut live = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let mut reaped = std::process::Command::new("true").spawn().unwrap();
        let reaped_pid = reaped.id();
        reaped.wait().unwrap();
        let mut zombie = std::process::Command::new("true").spawn().unwrap();
        // Exited, not reaped: wait until the kernel says so.
        let stat = format!("/proc/{}/stat", zombie.id());
        for _ in 0..3000 {
            if std::fs::read_to_string(&stat).unwrap().rsplit(')').next().unwrap().trim_start().starts_with('Z') {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        count_asleep(&slots, me, 80, true);
        assert!(!others_asleep_on(&slots, me, 80), "a process's own sleeper counted as another's");
        for pid in [reaped_pid, zombie.id()] {
            count_asleep(&slots, pid, 80, true);
        }
        assert!(!others_asleep_on(&slots, me, 80), "a dead process's sleeper counted");
        let used = slots.iter().filter(|s| s.load(Ordering::Relaxed) != 0).count();
        assert_eq!(used, 1, "the dead processes' slots were freed");
        count_asleep(&slots, live.id(), 80, true);
        count_asleep(&slots, live.id(), 80, true);
        assert!(others_asleep_on(&slots, me, 80), "a live process's sleeper not counted");
        assert!(!others_asleep_on(&slots, me, 81), "counted on another socket");
        count_asleep(&slots, live.id(), 80, false);
        assert!(others_asleep_on(&slots, me, 80), "one of its two sleepers is still there");
        count_asleep(&slots, live.id(), 80, false);
        assert!(!others_asleep_on(&slots, me, 80), "counted after both came back");
        count_asleep(&slots, me, 80, false);
        assert!(slots.iter().all(|s| s.load(Ordering::Relaxed) == 0), "every slot free again");
        live.kill().unwrap();
        live.wait().unwrap();
        zombie.wait().unwrap();
    }

    /// Eight threads, as eight processes of a lineage, each record a wake-up connection at the
    /// same moment: every record lands in a slot of its own, none overwritten.
    #[test]
    fn records_made_at_once_each_get_a_slot() {
        static WAKES: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];
        let start = std::sync::Barrier::new(8);
        std::thread::scope(|s| {
            for t in 1..=8u64 {
                let start = &start;
                s.spawn(move || {
                    start.wait();
                    assert!(claim_slot(&WAKES, t << 16 | t, |v| v == 0).is_some(), "a free slot was there for record {t}");
                });
            }
        });
        let mut got: Vec<u64> = WAKES.iter().map(|w| w.load(Ordering::Relaxed) & 0xFFFF).collect();
        got.sort_unstable();
        assert_eq!(got, (1..=8).collect::<Vec<_>>());
        assert!(claim_slot(&WAKES, 9 << 16 | 9, |v| v == 0).is_none(), "a full table takes no more");
    }
}
