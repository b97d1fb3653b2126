//! Facts about this host that the rendezvous needs (spec/WIRE.md sections 2 and 9).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub use crate::socket::{canonical, TcpSocket};

/// Addresses of local interfaces, refreshed at most once a second. The caches here are only ever
/// `try_lock`ed: a fork child inherits a lock another thread held as held forever, and a cache
/// miss costs only the lookup.
static LOCAL: Mutex<Option<(Instant, Vec<IpAddr>)>> = Mutex::new(None);

fn interface_addresses() -> Vec<IpAddr> {
    let mut out = Vec::new();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a linked list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return out;
    }
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, valid until freeifaddrs.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points to a sockaddr whose family says which struct it is.
            let family = unsafe { (*ifa.ifa_addr).sa_family } as i32;
            if family == libc::AF_INET {
                // SAFETY: family AF_INET means a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                out.push(IpAddr::from(u32::from_be(sin.sin_addr.s_addr).to_be_bytes()));
            } else if family == libc::AF_INET6 {
                // SAFETY: family AF_INET6 means a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                out.push(IpAddr::from(sin6.sin6_addr.s6_addr));
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `list` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(list) };
    out
}

/// Whether `ip` is an address of this host (loopback, unspecified, or a local interface's).
pub fn is_local(ip: IpAddr) -> bool {
    let ip = canonical(ip);
    if ip.is_loopback() || ip.is_unspecified() {
        return true;
    }
    let Ok(mut cache) = LOCAL.try_lock() else { return interface_addresses().contains(&ip) };
    let fresh = matches!(&*cache, Some((at, _)) if at.elapsed() < Duration::from_secs(1));
    if !fresh {
        *cache = Some((Instant::now(), interface_addresses()));
    }
    cache.as_ref().is_some_and(|(_, list)| list.contains(&ip))
}

/// The sockets listed in one of the texts of `/proc/net/tcp` (IPv4) or `/proc/net/tcp6`; lines
/// that do not parse are skipped.
pub fn parse_tcp_table(text: &str) -> Vec<TcpSocket> {
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().take(8).collect();
        if f.len() < 8 {
            continue;
        }
        let (Some(local), Some(remote), Ok(uid)) = (proc_addr(f[1]), proc_addr(f[2]), f[7].parse()) else { continue };
        out.push(TcpSocket { local, remote, listening: f[3] == "0A", uid, device: None, v6only: local.is_ipv4().then_some(false) });
    }
    out
}

/// An address as `/proc/net/tcp{,6}` prints it: the address as native-endian 32-bit words in
/// hex (one for IPv4, four for IPv6), a colon, the port in hex.
fn proc_addr(text: &str) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| ip.get(i * 8..i * 8 + 8).and_then(|w| u32::from_str_radix(w, 16).ok()).map(u32::to_ne_bytes);
    let ip: IpAddr = match ip.len() {
        8 => word(0)?.into(),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            b.into()
        }
        _ => return None,
    };
    Some(SocketAddr::new(canonical(ip), port))
}

/// The listening TCP sockets of this network namespace: from the kernel's `sock_diag`
/// (one netlink round trip), or, where that is refused, from `/proc/net/tcp{,6}`.
pub fn tcp_listeners() -> Vec<TcpSocket> {
    crate::diag::listeners().unwrap_or_else(|_| tcp_sockets().into_iter().filter(|s| s.listening).collect())
}

/// The uid owning the TCP socket (not a listener) whose local address is `local` and remote
/// address `remote`: from the kernel's `sock_diag` lookup, or, where that is refused, from
/// `/proc/net/tcp{,6}` ([`tcp_owner`]). `None`: there is none (or, in the table, several
/// that disagree).
pub fn connection_owner(local: SocketAddr, remote: SocketAddr) -> Option<u32> {
    match crate::diag::connection(local, remote) {
        Ok(found) => found.map(|s| s.uid),
        Err(_) => tcp_owner(local, remote, &tcp_sockets()),
    }
}

/// Every TCP socket of this network namespace (`/proc/net/tcp` and `/proc/net/tcp6`).
pub fn tcp_sockets() -> Vec<TcpSocket> {
    let mut out = Vec::new();
    for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(file) {
            out.extend(parse_tcp_table(&text));
        }
    }
    out
}

/// A TCP listening address and who owns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listening {
    /// The address the listening socket is bound to (canonical; unspecified for a wildcard).
    pub addr: SocketAddr,
    /// Its owner's uid; `None` when sockets of several uids listen there (each bound to a
    /// device, which the table does not show): nobody's claim to it can be checked.
    pub uid: Option<u32>,
}

/// The listening socket the kernel hands a connection to `dialed` to, among `sockets`: one
/// bound to exactly that address (IPv4-mapped counted as IPv4), else the wildcard of the same
/// family, else, for an IPv4 address, the IPv6 wildcard (a dual-stack listener; one that is
/// `IPV6_V6ONLY` refuses the connection itself: see `TcpSocket::v6only`).
/// A dial to the unspecified address reaches the loopback address, as `connect(2)` does.
pub fn kernel_listener(dialed: SocketAddr, sockets: &[TcpSocket]) -> Option<Listening> {
    use std::net::{Ipv4Addr, Ipv6Addr};
    let port = dialed.port();
    let ip = match canonical(dialed.ip()) {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    let mut candidates = vec![ip];
    match ip {
        IpAddr::V4(_) => candidates.extend([IpAddr::V4(Ipv4Addr::UNSPECIFIED), IpAddr::V6(Ipv6Addr::UNSPECIFIED)]),
        IpAddr::V6(_) => candidates.push(IpAddr::V6(Ipv6Addr::UNSPECIFIED)),
    }
    candidates.into_iter().find_map(|want| {
        let addr = SocketAddr::new(want, port);
        let mut owners = sockets.iter().filter(|s| s.listening && s.local == addr).map(|s| s.uid);
        let first = owners.next()?;
        Some(Listening { addr, uid: owners.all(|u| u == first).then_some(first) })
    })
}

/// The uid owning the TCP socket (any state) whose local address is `local` and remote address
/// `remote`, among `sockets` (addresses compared in canonical form); `None` if there is none,
/// or several that disagree.
pub fn tcp_owner(local: SocketAddr, remote: SocketAddr, sockets: &[TcpSocket]) -> Option<u32> {
    let c = |a: SocketAddr| SocketAddr::new(canonical(a.ip()), a.port());
    let (local, remote) = (c(local), c(remote));
    let mut owners = sockets.iter().filter(|s| !s.listening && s.local == local && s.remote == remote).map(|s| s.uid);
    let first = owners.next()?;
    owners.all(|u| u == first).then_some(first)
}

/// The process's soft limit of open files (`RLIMIT_NOFILE`), if it has one.
pub fn open_files_soft() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// Our own uid.
pub fn uid() -> u32 {
    rustix::process::getuid().as_raw()
}

/// What the fork handlers here write at every fork. Each page a process writes after a `fork`
/// costs it a copy-on-write fault (in the parent as in the child), and a server that forks per
/// connection pays those per connection: so every static written at every fork, here and in
/// the crates above (this, the locks taken around a fork and the holder of their guards in
/// `colo::fork`, the shim's), is placed in the linker section `colo_fork`, which the linker keeps
/// whole: they share a page instead of taking one each (the shim's build script starts the
/// section on a page of its own). Aligned to its size, so that it never spans two pages.
#[repr(C, align(32))]
struct ForkPage {
    /// This process's pid, once asked (0: not yet, or forgotten by a fork).
    pid: AtomicU32,
    /// The pid this process image was forked from, as its cache held it at the fork (0: none
    /// seen, see [`forked_from`]).
    parent: AtomicU32,
    /// See [`forks`].
    forks: AtomicU64,
    /// See [`last_fork_ms`].
    last_fork_ms: AtomicU64,
    /// The fork count at which a fork child's handler last renewed `pid` (see
    /// [`renew_pid_after_fork`]).
    renewed_at: AtomicU64,
}

#[link_section = "colo_fork"]
static FORK_PAGE: ForkPage = ForkPage { pid: AtomicU32::new(0), parent: AtomicU32::new(0), forks: AtomicU64::new(0), last_fork_ms: AtomicU64::new(0), renewed_at: AtomicU64::new(0) };

/// Nanoseconds on the monotonic clock (the same in every process of the host); `coarse`: the
/// clock of the last tick (a few ms), cheaper to read. Through libc's vDSO call: rustix's own
/// vDSO lookup crashes under valgrind.
pub fn monotonic_ns(coarse: bool) -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    let clock = if coarse { libc::CLOCK_MONOTONIC_COARSE } else { libc::CLOCK_MONOTONIC };
    // SAFETY: writes one timespec we own.
    unsafe { libc::clock_gettime(clock, &mut t) };
    (t.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(t.tv_nsec as u64)
}

/// The first `max` bytes (or fewer) of the command line of process `pid` (`None`: this one), as
/// `/proc/<pid>/cmdline` has it. Bounded: another user's process may have a command line of
/// megabytes, which the kernel copies out of its memory for a whole read.
pub fn cmdline_head(pid: Option<u32>, max: usize) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let f = match pid {
        None => std::fs::File::open("/proc/self/cmdline")?,
        Some(pid) => std::fs::File::open(format!("/proc/{pid}/cmdline"))?,
    };
    let mut head = Vec::with_capacity(max.min(4096));
    f.take(max as u64).read_to_end(&mut head)?;
    Ok(head)
}

/// Whether the fork child handler that renews the cache is registered (`pid`): a pid is cached
/// only then, so that no child inherits one it would not renew.
static HANDLER_IN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Our own pid. Cached, as connection set-up asks for it several times: `fork` makes the child
/// cache its own at once (a `pthread_atfork` child handler, registered by the first call). A
/// child made without running those handlers (a raw `clone`, `vfork`, `_Fork`) sees its parent's
/// pid until it calls [`renew_pid`]; colo, like glibc before 2.25, expects such a child to
/// `exec` or `_exit`, but for a raw `fork`, or a raw `clone` that copies the process as `fork`
/// does, through libc's `syscall`, around which the LD_PRELOAD shim runs the handlers
/// ([`run_fork_handlers`]). The cache is never left empty in a process that has asked once (a `vfork`
/// child that asked first would leave its own pid in the memory it shares with its parent: the
/// LD_PRELOAD shim asks in its constructor, and a fork child's cache is filled in its handler,
/// before the child runs anything else).
#[inline]
pub fn pid() -> u32 {
    let cached = FORK_PAGE.pid.load(Ordering::Relaxed);
    if cached != 0 {
        return cached;
    }
    pid_slow()
}

/// [`pid`] when nothing is cached: asks the kernel, and registers the fork handlers first.
#[cold]
fn pid_slow() -> u32 {
    let pid = rustix::process::getpid().as_raw_nonzero().get() as u32;
    // Registered by whichever thread gets here first, without a lock or a `Once` (a child forked
    // while another thread held one would wait for it forever); the others do not cache.
    // Relaxed: the flag orders nothing but this registration, which `pthread_atfork` serialises.
    static REGISTERED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !REGISTERED.swap(true, Ordering::Relaxed) {
        at_fork(before_fork, after_fork, in_child);
        // SYNC POINT with the Acquire load below.
        HANDLER_IN.store(true, Ordering::Release);
    }
    // SYNC POINT with the Release store above: cache only once the child handler is in place.
    if HANDLER_IN.load(Ordering::Acquire) {
        FORK_PAGE.pid.store(pid, Ordering::Relaxed);
    }
    pid
}

// Relaxed, the counter and the time: read by this process's threads after the fork returns,
// which orders them; a thread racing a fork compares the counter before and after its work.
extern "C" fn before_fork() {
    FORK_PAGE.forks.fetch_add(1, Ordering::Relaxed);
}

extern "C" fn after_fork() {
    FORK_PAGE.forks.fetch_add(1, Ordering::Relaxed);
    FORK_PAGE.last_fork_ms.store(monotonic_ns(false) / 1_000_000, Ordering::Relaxed);
}

#[link_section = "colo_fork_text"]
extern "C" fn in_child() {
    let forks = FORK_PAGE.forks.fetch_add(1, Ordering::Relaxed) + 1;
    renew_pid();
    FORK_PAGE.renewed_at.store(forks, Ordering::Relaxed);
}

/// [`renew_pid`] for other fork child handlers, which may run before or after this module's:
/// asks the kernel only if this module's handler has not renewed the cache in this fork yet
/// (it stamps the count it moved on to, which no earlier renewal can have: the count only
/// grows, and moved on in `prepare` too).
#[link_section = "colo_fork_text"]
pub extern "C" fn renew_pid_after_fork() {
    if FORK_PAGE.renewed_at.load(Ordering::Relaxed) != FORK_PAGE.forks.load(Ordering::Relaxed) {
        renew_pid();
    }
}

/// A number that changes around every fork of this process once [`pid`] was first asked: it
/// grows before the fork, and after it in the parent and in the child (a value taken before a
/// fork differs from every value after it, on both sides). Something made while it held one
/// value, and found with another, may have been made before a fork: another process may hold
/// a copy of it.
#[inline]
pub fn forks() -> u64 {
    pid();
    FORK_PAGE.forks.load(Ordering::Relaxed)
}

/// When this process last forked (monotonic ms, as the parent's handler saw it; 0:
/// never since [`pid`] was first asked).
#[inline]
pub fn last_fork_ms() -> u64 {
    FORK_PAGE.last_fork_ms.load(Ordering::Relaxed)
}

/// The pid of the process this image was forked from, as its pid cache held it at the fork
/// (0: not forked since [`pid`] was first asked, or by a child made without the fork handlers).
#[inline]
pub fn forked_from() -> u32 {
    FORK_PAGE.parent.load(Ordering::Relaxed)
}

/// Caches this process's own pid afresh (`getpid` is async-signal-safe): for fork child
/// handlers, and a child made without them. Empty if no handler would renew it in a child.
/// The value cached before, if it was another process's (in a fork child: the parent's), is
/// kept as [`forked_from`]. Writes only what changed (the pid cache shares its page with the
/// other state the fork handlers write: see `ForkPage`).
#[link_section = "colo_fork_text"]
pub extern "C" fn renew_pid() {
    // SYNC POINT with the Release store in `pid`: cache only once the child handler is in place.
    let pid = if HANDLER_IN.load(Ordering::Acquire) { rustix::process::getpid().as_raw_nonzero().get() as u32 } else { 0 };
    let old = FORK_PAGE.pid.load(Ordering::Relaxed);
    if old != pid {
        if old != 0 && pid != 0 {
            FORK_PAGE.parent.store(old, Ordering::Relaxed);
        }
        FORK_PAGE.pid.store(pid, Ordering::Relaxed);
    }
}

/// Whether this process and process `peer` can only run on one CPU between them (their affinity
/// masks have a union of one CPU): spinning there only steals time from the peer.
pub fn share_one_cpu(peer: u32) -> bool {
    // Remembered per peer for a second: connections to the same process come in bursts.
    static SEEN: Mutex<Option<(Instant, u32, bool)>> = Mutex::new(None);
    let Ok(mut seen) = SEEN.try_lock() else { return affinity_union_is_one(peer) };
    if let Some((at, pid, answer)) = *seen {
        if pid == peer && at.elapsed() < Duration::from_secs(1) {
            return answer;
        }
    }
    let answer = affinity_union_is_one(peer);
    *seen = Some((Instant::now(), peer, answer));
    answer
}

fn affinity_union_is_one(peer: u32) -> bool {
    use rustix::thread::{sched_getaffinity, CpuSet, Pid};
    let own = sched_getaffinity(None);
    let other = Pid::from_raw(peer as i32).map(|p| sched_getaffinity(Some(p)));
    let (Ok(own), Some(Ok(other))) = (own, other) else { return false };
    let union = (0..CpuSet::MAX_CPU).filter(|&c| own.is_set(c) || other.is_set(c)).count();
    union <= 1
}

/// Whether more threads are runnable on this host than it has CPUs online, so that some wait for
/// one: a thread that spins then only holds off the thread it waits for (nginx with 2 workers and
/// its load generator on 2 CPUs). The running count of `/proc/loadavg` is an instant sample (a
/// file opened, read and closed); one is taken at most every [`SAMPLE_EVERY`] (spec section 9, as
/// the Go implementation) by whichever thread asks first, and folded into a moving average over the last few samples:
/// the host counts as oversubscribed while that average exceeds the CPUs by half a thread. A lone
/// sample would misjudge a two-process ping-pong (its two spinners plus any thread that happens to
/// run at that instant) and stop its spinning for a tick. False when `/proc` cannot be read.
pub fn cpus_oversubscribed() -> bool {
    use std::sync::atomic::AtomicU64;
    // Coarse-clock nanoseconds of the last sample, shifted left by one, with the answer in bit 0.
    static LAST: AtomicU64 = AtomicU64::new(0);
    // The moving average of the running count, in 1/256ths.
    static AVERAGE: AtomicU32 = AtomicU32::new(0);
    let stamp = monotonic_ns(true) << 1;
    let last = LAST.load(Ordering::Relaxed);
    // One thread samples per period: the one whose exchange moves the stamp.
    let due = stamp.wrapping_sub(last & !1) >= SAMPLE_EVERY.as_nanos() as u64 * 2;
    if !due || LAST.compare_exchange(last, stamp | (last & 1), Ordering::Relaxed, Ordering::Relaxed).is_err() {
        return last & 1 == 1;
    }
    let Some(running) = sample_running() else { return false };
    // avg += (sample - avg) / 4, in fixed point.
    let old = AVERAGE.load(Ordering::Relaxed) as i64;
    let avg = old + ((i64::from(running) << 8) - old) / 4;
    AVERAGE.store(avg.max(0) as u32, Ordering::Relaxed);
    let crowded = avg > (i64::from(online_cpus()) << 8) + 128;
    LAST.store(stamp | u64::from(crowded), Ordering::Relaxed);
    crowded
}

/// How often [`cpus_oversubscribed`] samples `/proc/loadavg` (a Linux tick at HZ=250).
pub const SAMPLE_EVERY: Duration = Duration::from_millis(4);

/// The running count of `/proc/loadavg`, opened afresh each time: a descriptor kept open could be
/// closed (and its number reused) by a program that closes all its descriptors.
fn sample_running() -> Option<u32> {
    use rustix::fs::{open, Mode, OFlags};
    let file = open("/proc/loadavg", OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).ok()?;
    let mut buf = [0u8; 128];
    let n = rustix::io::read(&file, &mut buf).ok()?;
    running_of_loadavg(&buf[..n])
}

/// The runnable-thread count of a `/proc/loadavg` line (`0.52 0.58 0.59 3/467 1234`).
fn running_of_loadavg(line: &[u8]) -> Option<u32> {
    let text = std::str::from_utf8(line).ok()?;
    let field = text.split_ascii_whitespace().nth(3)?;
    field.split('/').next()?.parse().ok()
}

/// CPUs online (read once; at least 1). An atomic, not a `OnceLock`: a fork child must never
/// wait for an initialisation another thread had begun.
fn online_cpus() -> u32 {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.load(Ordering::Relaxed);
    if n > 0 {
        return n;
    }
    // SAFETY: sysconf has no preconditions.
    let n = (unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }).max(1) as u32;
    N.store(n, Ordering::Relaxed);
    n
}

/// Every signal but the faults a thread raises itself (which, blocked, would kill the process
/// instead of reaching their handler: SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, and SIGSYS,
/// which a seccomp filter may send for a refused system call).
pub fn quiet_signals() -> libc::sigset_t {
    // SAFETY: plain operations on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        for sig in [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGTRAP, libc::SIGSYS] {
            libc::sigdelset(&mut set, sig);
        }
        set
    }
}

/// Runs `f` with `quiet_signals` blocked in the calling thread, then restores its mask. A
/// thread spawned inside starts with them blocked: a library's background thread must not run
/// the application's handlers (the application's signals are for its own threads).
pub fn with_signals_blocked<T>(f: impl FnOnce() -> T) -> T {
    let quiet = quiet_signals();
    // SAFETY: plain signal-mask calls on local sets.
    let old = unsafe {
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &quiet, &mut old);
        old
    };
    let r = f();
    // SAFETY: restoring the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    r
}

/// Starts a thread of the library's own, named `name`, with [`quiet_signals`] blocked.
pub fn spawn<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> std::io::Result<std::thread::JoinHandle<T>> {
    with_signals_blocked(|| std::thread::Builder::new().name(name.into()).spawn(f))
}

/// Registers fork handlers: `prepare` runs in the forking thread before the fork, `parent` and
/// `child` after it on each side (`pthread_atfork`). They are also kept, in the order given, for
/// [`run_fork_handlers`].
pub fn at_fork(prepare: extern "C" fn(), parent: extern "C" fn(), child: extern "C" fn()) {
    // SAFETY: registering plain functions; pthread_atfork copies the pointers.
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    // Registrations are few (colo's modules register at most one set each) and serialised here,
    // so two made at once take two slots; a set beyond the room is run by libc's fork only.
    // `run_fork_handlers` takes no lock: it reads only sets already counted.
    let _one_at_a_time = KEEPING.lock().unwrap_or_else(|e| e.into_inner());
    let i = KEPT_COUNT.load(Ordering::Relaxed);
    if i < KEPT.len() {
        for (slot, f) in KEPT[i].iter().zip([prepare, parent, child]) {
            slot.store(f as usize, Ordering::Relaxed);
        }
        // SYNC POINT with the Acquire load in `run_fork_handlers`: the set is written before it
        // is counted.
        KEPT_COUNT.store(i + 1, Ordering::Release);
    }
}

/// The handler sets [`at_fork`] registered: prepare, parent, child.
static KEPT: [[AtomicUsize; 3]; 8] = [const { [const { AtomicUsize::new(0) }; 3] }; 8];
static KEPT_COUNT: AtomicUsize = AtomicUsize::new(0);
/// Serialises [`at_fork`]'s registrations.
static KEEPING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Which handlers [`run_fork_handlers`] runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ForkStage {
    Prepare = 0,
    Parent = 1,
    Child = 2,
}

/// Runs the handlers [`at_fork`] registered for `stage` as libc's `fork` does (prepare
/// handlers in the reverse order of registration, the others in order), for a process made by
/// a raw `clone` system call that copies this one's memory as `fork` does (vsftpd's), which
/// libc's handlers never see: its child is then a fork child to colo, with its own pid cached
/// and colo's locks let go of. Call it with `Prepare` just before the `clone`, and with
/// `Parent` or `Child` after it on each side.
pub fn run_fork_handlers(stage: ForkStage) {
    // SYNC POINT with the Release store in `at_fork`.
    let n = KEPT_COUNT.load(Ordering::Acquire);
    let run = |i: usize| {
        let f = KEPT[i][stage as usize].load(Ordering::Relaxed);
        // SAFETY: `f` was stored from an `extern "C" fn()` by `at_fork` (counted after it was
        // written), and functions are never unloaded.
        let f: extern "C" fn() = unsafe { std::mem::transmute::<usize, extern "C" fn()>(f) };
        f();
    };
    if stage == ForkStage::Prepare {
        (0..n).rev().for_each(run);
    } else {
        (0..n).for_each(run);
    }
}

/// Whether descriptor 2 is an internet socket (a connection), where no diagnostic may go: an
/// inetd-style server gives its program the connection as descriptor 2 as well. A Unix socket
/// (journald's) is fine.
pub fn stderr_is_network() -> bool {
    let mut domain: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt(2) of an int into `domain`, whose size `len` says; descriptor 2 may be
    // anything (a non-socket fails with ENOTSOCK).
    let r = unsafe {
        libc::syscall(libc::SYS_getsockopt, 2, libc::SOL_SOCKET, libc::SO_DOMAIN, &mut domain as *mut libc::c_int, &mut len as *mut libc::socklen_t)
    };
    r == 0 && (domain == libc::AF_INET || domain == libc::AF_INET6)
}

/// Whether process `pid` exists (a zombie too).
pub fn alive(pid: u32) -> bool {
    rustix::process::Pid::from_raw(pid as i32)
        .is_some_and(|p| matches!(rustix::process::test_kill_process(p), Ok(()) | Err(rustix::io::Errno::PERM)))
}

/// Whether process `pid` has, under number `fd`, the very file this process has under `fd`
/// (`kcmp(KCMP_FILE)`: one system call, where a `stat` of `/proc/PID/fd/N` walks procfs and makes
/// its entries). `None` when the kernel cannot tell: `kcmp` missing or refused (another user, a
/// sandbox), or our own `fd` not open; the caller then looks at `/proc`. A process gone, or
/// without `fd` open, does not have it.
pub fn holds_same(pid: u32, fd: i32) -> Option<bool> {
    const KCMP_FILE: libc::c_long = 0;
    let me = rustix::process::getpid().as_raw_nonzero().get();
    // SAFETY: kcmp only compares; it reads and writes no memory of ours.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, me as libc::c_long, pid as libc::c_long, KCMP_FILE, fd as libc::c_long, fd as libc::c_long) };
    if r >= 0 {
        return Some(r == 0);
    }
    // EBADF: one of the two numbers is not open; ours is checked here, so that only theirs
    // counts as an answer.
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::ESRCH) => Some(false),
        // SAFETY: only looked at.
        Some(libc::EBADF) if rustix::io::fcntl_getfd(unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) }).is_ok() => Some(false),
        _ => None,
    }
}

/// Whether process `pid` exists and has not exited (not a zombie).
pub fn running(pid: u32) -> bool {
    match std::fs::read(format!("/proc/{pid}/stat")) {
        // "PID (COMM) STATE ...": COMM may hold any byte, so the state follows the last ')'.
        Ok(stat) => stat.iter().rposition(|&b| b == b')').and_then(|i| stat.get(i + 2)).is_some_and(|&st| st != b'Z'),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::{holds_same, kernel_listener, parse_tcp_table, tcp_owner, Listening};
    use rustix::fd::AsRawFd;

    /// A fork child has the parent's file under the same number until it closes it or puts
    /// another file there; a process gone has nothing.
    #[test]
    fn holds_same_tells_the_very_file_under_a_number() {
        let (a, _b) = rustix::pipe::pipe().unwrap();
        let n = a.as_raw_fd();
        let (to_child, tell_child) = rustix::pipe::pipe().unwrap();
        let (to_parent, tell_parent) = rustix::pipe::pipe().unwrap();
        let mut byte = [0u8];
        // SAFETY: the child makes system calls only, then `_exit`s.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: ends a child that hangs (no handler: the default action).
            unsafe { libc::alarm(10) };
            // First holding the parent's file; then another file under the number.
            let _ = rustix::io::read(&to_child, &mut byte);
            let (other, _o) = rustix::pipe::pipe().unwrap();
            // SAFETY: replaces this child's copy of `n` with another pipe.
            unsafe { libc::dup2(other.as_raw_fd(), n) };
            let _ = rustix::io::write(&tell_parent, b"x");
            let _ = rustix::io::read(&to_child, &mut byte);
            // SAFETY: ends the child without running the parent's destructors.
            unsafe { libc::_exit(0) };
        }
        assert!(pid > 0, "fork");
        let p = pid as u32;
        let kcmp = holds_same(p, n);
        if kcmp.is_some() {
            assert_eq!(kcmp, Some(true), "the child holds the file");
        }
        rustix::io::write(&tell_child, b"x").unwrap();
        rustix::io::read(&to_parent, &mut byte).unwrap();
        if kcmp.is_some() {
            assert_eq!(holds_same(p, n), Some(false), "another file under the number");
        }
        rustix::io::write(&tell_child, b"x").unwrap();
        let mut status = 0;
        // SAFETY: reaping our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        if kcmp.is_some() {
            assert_eq!(holds_same(p, n), Some(false), "a process gone holds nothing");
        }
        assert_eq!(holds_same(std::process::id(), 100_000), None, "our own number not open: not told");
    }
    use std::net::SocketAddr;

    /// A `/proc/net/tcp` text: root (0) on 127.0.0.1:6391 and 0.0.0.0:7000, nobody (65534) on
    /// 127.0.0.2:6391 and 0.0.0.0:7001 and an established connection 127.0.0.1:40001 ->
    /// 127.0.0.1:7000; one garbled line.
    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0200007F:18F7 00000000:0000 0A 00000000:00000000 00:00000000 00000000 65534        0 1001 1 0000000000000000 100 0 0 10 0
   1: 0100007F:18F7 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1002 1 0000000000000000 100 0 0 10 0
   2: 00000000:1B58 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1003 1 0000000000000000 100 0 0 10 0
   3: 00000000:1B59 00000000:0000 0A 00000000:00000000 00:00000000 00000000 65534        0 1004 1 0000000000000000 100 0 0 10 0
   4: 0100007F:9C41 0100007F:1B58 01 00000000:00000000 00:00000000 00000000 65534        0 1005 1 0000000000000000 20 4 0 10 -1
   5: garbage
";
    /// A `/proc/net/tcp6` text: root on [::]:7002 and [::1]:7003, nobody on [::]:6391, and
    /// an IPv4-mapped listener of uid 1000 on [::ffff:127.0.0.3]:7004.
    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1B5A 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2001 1 0000000000000000 100 0 0 10 0
   1: 00000000000000000000000001000000:1B5B 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2002 1 0000000000000000 100 0 0 10 0
   2: 00000000000000000000000000000000:18F7 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000 65534        0 2003 1 0000000000000000 100 0 0 10 0
   3: 0000000000000000FFFF00000300007F:1B5C 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 2004 1 0000000000000000 100 0 0 10 0
";

    fn table() -> Vec<super::TcpSocket> {
        let mut t = parse_tcp_table(TCP);
        t.extend(parse_tcp_table(TCP6));
        t
    }

    fn at(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn owned(addr: &str, uid: u32) -> Option<Listening> {
        Some(Listening { addr: at(addr), uid: Some(uid) })
    }

    #[test]
    fn the_table_parses() {
        let t = table();
        assert_eq!(t.len(), 9, "the garbled line is skipped");
        assert_eq!((t[0].local, t[0].listening, t[0].uid), (at("127.0.0.2:6391"), true, 65534));
        assert_eq!((t[4].local, t[4].remote, t[4].listening), (at("127.0.0.1:40001"), at("127.0.0.1:7000"), false));
        assert_eq!(t[6].local, at("[::1]:7003"));
        assert_eq!(t[8].local, at("127.0.0.3:7004"), "IPv4-mapped is IPv4");
    }

    #[test]
    fn the_exact_listener_comes_first_not_the_first_on_the_port() {
        let t = table();
        // nobody's 127.0.0.2:6391 comes first in the table and nobody's [::]:6391 is a
        // wildcard: neither takes a connection to 127.0.0.1:6391.
        assert_eq!(kernel_listener(at("127.0.0.1:6391"), &t), owned("127.0.0.1:6391", 0));
        assert_eq!(kernel_listener(at("[::ffff:127.0.0.1]:6391"), &t), owned("127.0.0.1:6391", 0));
        assert_eq!(kernel_listener(at("127.0.0.2:6391"), &t), owned("127.0.0.2:6391", 65534));
        assert_eq!(kernel_listener(at("127.0.0.9:6391"), &t), owned("[::]:6391", 65534));
        assert_eq!(kernel_listener(at("[::1]:6391"), &t), owned("[::]:6391", 65534));
    }

    #[test]
    fn then_the_wildcards_in_the_kernels_order() {
        let t = table();
        assert_eq!(kernel_listener(at("127.0.0.1:7000"), &t), owned("0.0.0.0:7000", 0));
        assert_eq!(kernel_listener(at("10.1.2.3:7001"), &t), owned("0.0.0.0:7001", 65534));
        assert_eq!(kernel_listener(at("127.0.0.1:7002"), &t), owned("[::]:7002", 0), "dual-stack");
        assert_eq!(kernel_listener(at("[::1]:7000"), &t), None, "an IPv4 wildcard takes no IPv6");
        assert_eq!(kernel_listener(at("[::1]:7003"), &t), owned("[::1]:7003", 0));
        assert_eq!(kernel_listener(at("127.0.0.1:7003"), &t), None);
        assert_eq!(kernel_listener(at("127.0.0.3:7004"), &t), owned("127.0.0.3:7004", 1000));
        assert_eq!(kernel_listener(at("0.0.0.0:6391"), &t), owned("127.0.0.1:6391", 0), "0.0.0.0 is loopback");
        assert_eq!(kernel_listener(at("127.0.0.1:9"), &t), None);
    }

    #[test]
    fn listeners_of_several_uids_at_one_address_prove_nothing() {
        let mut t = table();
        t.push(super::TcpSocket { uid: 7, ..t[1] });
        assert_eq!(kernel_listener(at("127.0.0.1:6391"), &t), Some(Listening { addr: at("127.0.0.1:6391"), uid: None }));
    }

    #[test]
    fn a_connections_owner_is_found_by_its_two_ends() {
        let t = table();
        assert_eq!(tcp_owner(at("127.0.0.1:40001"), at("127.0.0.1:7000"), &t), Some(65534));
        assert_eq!(tcp_owner(at("[::ffff:127.0.0.1]:40001"), at("127.0.0.1:7000"), &t), Some(65534));
        assert_eq!(tcp_owner(at("127.0.0.1:7000"), at("127.0.0.1:40001"), &t), None, "the other end");
        assert_eq!(tcp_owner(at("127.0.0.1:40003"), at("127.0.0.1:7000"), &t), None);
        assert_eq!(tcp_owner(at("0.0.0.0:7000"), at("0.0.0.0:0"), &t), None, "a listener is no connection");
    }

    #[test]
    fn this_hosts_table_reads() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let c = std::net::TcpStream::connect(addr).unwrap();
        let t = super::tcp_sockets();
        assert_eq!(kernel_listener(addr, &t), Some(Listening { addr, uid: Some(super::uid()) }));
        assert_eq!(tcp_owner(c.local_addr().unwrap(), addr, &t), Some(super::uid()));
    }

    #[test]
    fn the_running_count_is_the_fourth_field() {
        assert_eq!(super::running_of_loadavg(b"0.52 0.58 0.59 3/467 1234\n"), Some(3));
        assert_eq!(super::running_of_loadavg(b"garbage"), None);
        assert!(super::online_cpus() >= 1);
        let running = super::sample_running().expect("/proc/loadavg of this host");
        assert!(running >= 1, "the test itself is running");
    }
}
