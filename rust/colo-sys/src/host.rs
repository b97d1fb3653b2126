//! Facts about this host that the rendezvous needs (spec/WIRE.md sections 2 and 9).

use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

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

/// IPv4-mapped IPv6 addresses as IPv4; everything else unchanged.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// The uid owning a TCP socket listening on `port` in this network namespace, from
/// `/proc/net/tcp` and `/proc/net/tcp6` (state `0A`).
pub fn tcp_listener_uid(port: u16) -> Option<u32> {
    for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(file) else { continue };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 || f[3] != "0A" {
                continue;
            }
            let local_port = f[1].rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
            if local_port == Some(port) {
                return f[7].parse().ok();
            }
        }
    }
    None
}

/// Our own uid.
pub fn uid() -> u32 {
    rustix::process::getuid().as_raw()
}

/// This process's pid, once asked (0: not yet, or forgotten by a fork).
static PID: AtomicU32 = AtomicU32::new(0);

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

/// The command line of process `pid` (`None`: this one), as `/proc/<pid>/cmdline` has it.
pub fn cmdline(pid: Option<u32>) -> std::io::Result<Vec<u8>> {
    match pid {
        None => std::fs::read("/proc/self/cmdline"),
        Some(pid) => std::fs::read(format!("/proc/{pid}/cmdline")),
    }
}

/// Our own pid. Cached, as connection set-up asks for it several times: `fork` makes the child
/// forget it (a `pthread_atfork` child handler, registered by the first call). A child made
/// without running those handlers (a raw `clone`, `vfork`, `_Fork`) sees its parent's pid until it
/// calls [`forget_pid`]; colo, like glibc before 2.25, expects such a child to `exec` or `_exit`.
/// (A `vfork` child that asks first, before its parent ever did, would leave its own pid in the
/// shared cache: the LD_PRELOAD shim asks in its constructor.)
pub fn pid() -> u32 {
    let cached = PID.load(Ordering::Relaxed);
    if cached != 0 {
        return cached;
    }
    let pid = rustix::process::getpid().as_raw_nonzero().get() as u32;
    // Registered by whichever thread gets here first, without a lock or a `Once` (a child forked
    // while another thread held one would wait for it forever); the others do not cache.
    // Relaxed: the flag orders nothing but this registration, which `pthread_atfork` serialises.
    static REGISTERED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    static HANDLER_IN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !REGISTERED.swap(true, Ordering::Relaxed) {
        at_fork(nothing, nothing, forget_pid);
        HANDLER_IN.store(true, Ordering::Release);
    }
    // SYNC POINT with the Release store above: cache only once the child handler is in place.
    if HANDLER_IN.load(Ordering::Acquire) {
        PID.store(pid, Ordering::Relaxed);
    }
    pid
}

extern "C" fn nothing() {}

/// Makes the next [`pid`] ask the kernel: for fork child handlers that run before `pid`'s own.
pub extern "C" fn forget_pid() {
    PID.store(0, Ordering::Relaxed);
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
/// its load generator on 2 CPUs). The running count of `/proc/loadavg` is an instant sample (about
/// 3 us to open, read and close); one is taken at most every [`SAMPLE_EVERY`] (spec section 9, as
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

/// Raises the soft limit of open files to the hard limit (thousands of connections need it).
pub fn raise_fd_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut lim = getrlimit(Resource::Nofile);
    if lim.current < lim.maximum {
        lim.current = lim.maximum;
        let _ = setrlimit(Resource::Nofile, lim);
    }
}

/// Registers fork handlers: `prepare` runs in the forking thread before the fork, `parent` and
/// `child` after it on each side (`pthread_atfork`).
pub fn at_fork(prepare: extern "C" fn(), parent: extern "C" fn(), child: extern "C" fn()) {
    // SAFETY: registering plain functions; pthread_atfork copies the pointers.
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_running_count_is_the_fourth_field() {
        assert_eq!(super::running_of_loadavg(b"0.52 0.58 0.59 3/467 1234\n"), Some(3));
        assert_eq!(super::running_of_loadavg(b"garbage"), None);
        assert!(super::online_cpus() >= 1);
        let running = super::sample_running().expect("/proc/loadavg of this host");
        assert!(running >= 1, "the test itself is running");
    }
}
