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
/// the original: [`move_all_above`] for one descriptor.
pub fn move_above(fd: rustix::fd::OwnedFd, floor: i32) -> io::Result<rustix::fd::OwnedFd> {
    let mut fds = [fd];
    move_all_above(&mut fds, floor)?;
    let [fd] = fds;
    Ok(fd)
}

/// A floor (for [`move_all_above`]) meaning: out of the application's way, as its limit of open
/// files stands at the time of the move. Above its soft limit when the hard limit leaves room
/// (and a helper task can run: see below), so that the library's descriptors never use up any the
/// application would have had. Else (a fixed limit) the library may hold as many numbers below
/// the limit as the top sixteenth of it has, or as lie above its first 16384 if that leaves more,
/// never more than half of it ([`allowance`]): under a fixed limit every descriptor of the
/// library is one the application cannot have, and an application that uses most of its limit
/// (redis-benchmark `-c 900` under 1024) must still get every socket it would get without colo.
/// Those numbers are the lowest free from 1024 up ([`LOW`]; from the start of the top band if that
/// is lower), not the top band itself: every `fork` copies the kernel's descriptor table up to
/// the highest number open and every exit walks it, so a descriptor at 16384 makes each fork of
/// the application copy 32768 slots. A set-up that finds no number free, or the allowance used
/// up, is a resource failure ([`shortage`] says which). Never above 32768. Worked out at each
/// move from the limit as last read, which follows limits the application sets itself (redis and
/// nginx do at start): read again after a change through the shim, a second after the last read,
/// and when a move under the old one fails.
pub const OUT_OF_THE_WAY: i32 = i32::MAX;

/// Clone of the helper task was refused (a sandbox that allows only threads, or a process
/// limit): descriptors then stay within the limit, as with no room above it.
static HELPER_REFUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The floor [`OUT_OF_THE_WAY`] stands for under a soft limit `soft`.
fn out_of_the_way(soft: u64, room_above: bool) -> i32 {
    let floor = if room_above { soft.clamp(64, 1 << 15) } else { top_band(soft).min(LOW) };
    floor as i32
}

/// The lowest number the library places its descriptors at under a fixed limit: `FD_SETSIZE`,
/// so that none of them takes a number a program could hand to `select`, or one it `dup2`s onto
/// believing it free (a shell redirection, `dup2(s, 100)`), while the kernel's descriptor table
/// stays at 2048 slots.
const LOW: u64 = 1024;

/// When the record was last looked over for numbers closed past it (monotonic ms; see
/// [`used_up`]).
static LOOKED_OVER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Whether `n` more numbers would take the library past `allowed`. The record may still count
/// numbers closed past it (`crate::placed`): a full record is looked over (an `fstat` a number)
/// at most once a second, so that a process at its allowance, whose connections all stay plain
/// TCP, does not pay for it at every connection.
fn used_up(allowed: usize, n: usize) -> bool {
    use std::sync::atomic::Ordering::Relaxed;
    if crate::placed::held() + n <= allowed {
        return false;
    }
    let now = crate::host::monotonic_ns(true) / 1_000_000;
    let last = LOOKED_OVER.load(Relaxed);
    // Relaxed: the stamp orders nothing; of two threads one looks over the record.
    if now.saturating_sub(last) < 1000 || LOOKED_OVER.compare_exchange(last, now.max(1), Relaxed, Relaxed).is_err() {
        return true;
    }
    crate::placed::live() + n > allowed
}

/// How many numbers below a fixed soft limit `soft` the library may hold: as many as the top
/// band has.
fn allowance(soft: u64) -> usize {
    usize::try_from(soft.saturating_sub(top_band(soft))).unwrap_or(usize::MAX)
}

/// Whether the helper may go above the soft limit: the hard limit leaves room, and the helper
/// was never refused.
fn room_above(lim: &rustix::process::Rlimit) -> bool {
    let soft = lim.current.unwrap_or(1 << 20);
    lim.maximum.is_none_or(|max| max > soft) && !HELPER_REFUSED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Where the band of the library's descriptors within a soft limit `soft` begins.
fn top_band(soft: u64) -> u64 {
    (soft / 2).max((soft - soft / 16).min(1 << 14)).clamp(64, 1 << 15)
}

/// How many descriptor numbers the library may hold out of the application's way
/// ([`OUT_OF_THE_WAY`]) under the limit as it stands: under a fixed limit its allowance, else the
/// numbers from its floor above the soft limit up to the hard limit (at most 65536, as a move
/// goes no further). A connection of another user may hold no more than its share of them
/// (`colo::budget`), as no more than its share of the segments.
pub fn band() -> usize {
    let lim = nofile(false);
    let soft = lim.current.unwrap_or(1 << 20);
    if !room_above(&lim) {
        return allowance(soft);
    }
    let floor = out_of_the_way(soft, true) as u64;
    let top = floor.saturating_add(1 << 16);
    let top = lim.maximum.map_or(top, |max| max.min(top));
    usize::try_from(top.saturating_sub(floor)).unwrap_or(usize::MAX)
}

/// How many descriptors this process holds (through rustix: the shim must not reach its own
/// wrappers of libc's calls).
fn open_count() -> usize {
    let Ok(dir) = rustix::fs::open("/proc/self/fd", rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty()) else {
        return 0;
    };
    let Ok(entries) = rustix::fs::Dir::read_from(&dir) else { return 0 };
    // Less ".", "..", and the directory's own descriptor.
    entries.filter(|e| e.is_ok()).count().saturating_sub(3)
}

/// What a failed move with floor [`OUT_OF_THE_WAY`] ran out of, for a log line: the limit of
/// open files, the band the library keeps to within it, and how many descriptors the process
/// holds.
pub fn shortage() -> String {
    let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let fmt = |v: Option<u64>| v.map_or_else(|| "unlimited".to_string(), |v| v.to_string());
    let open = open_count();
    let soft = lim.current.unwrap_or(1 << 20);
    let room = room_above(&lim);
    let band = if room {
        format!("the numbers from {} up to the hard limit", soft.clamp(64, 1 << 15))
    } else {
        format!("at most {} numbers, the lowest free from {} up; it holds {}", allowance(soft), out_of_the_way(soft, false), crate::placed::held())
    };
    format!("no descriptor number free for it (RLIMIT_NOFILE soft {} hard {}; colo keeps to {band}; {open} open)", fmt(lim.current), fmt(lim.maximum))
}

/// Moves each of `fds` to the lowest free descriptor number at or above `floor` (close-on-exec),
/// closing the originals. Keeps a library's own descriptors out of the numbers an application
/// uses (see [`OUT_OF_THE_WAY`]).
///
/// A floor at or above the soft limit cannot be reached by `F_DUPFD` in this process, and
/// raising the process's soft limit around the call let other threads' allocations exceed the
/// application's limit meanwhile, and a child forked meanwhile keep the raised limit. So the
/// duplication is done by a helper task that shares this process's memory and descriptor table
/// but not its resource limits (`clone` without `CLONE_THREAD`): it raises its own soft limit
/// and duplicates; the application's limit never changes. One task per batch of descriptors
/// (docs/ARCHITECTURE.md has its cost).
///
/// Fails (the caller falls back, as for any resource failure) when no number at or above
/// `floor` can be had; `fds` is then unchanged.
pub fn move_all_above(fds: &mut [rustix::fd::OwnedFd], floor: i32) -> io::Result<()> {
    if floor <= 0 {
        return Ok(());
    }
    match move_with(fds, floor, nofile(false)) {
        // A limit changed where the shim does not see it (another process's `prlimit`, a raw
        // system call) fails the move, or is a second old: look again.
        Err(_) => move_with(fds, floor, nofile(true)),
        done => done,
    }
}

/// The process's `RLIMIT_NOFILE` as last read, with the [`nofile_changed`] count at the time
/// and when it was read.
static NOFILE: std::sync::Mutex<Option<(u64, std::time::Instant, rustix::process::Rlimit)>> = std::sync::Mutex::new(None);

/// Counts the changes of `RLIMIT_NOFILE` made through the shim (see [`nofile_changed`]).
static NOFILE_CHANGES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How long a read of the limit stands for a change the shim does not see.
const NOFILE_FOR: std::time::Duration = std::time::Duration::from_secs(1);

/// Raises the soft limit of open files to the hard limit (thousands of connections need it).
pub fn raise_fd_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut lim = getrlimit(Resource::Nofile);
    if lim.current < lim.maximum {
        lim.current = lim.maximum;
        let _ = setrlimit(Resource::Nofile, lim);
        nofile_changed();
    }
}

/// This process's `RLIMIT_NOFILE` changed (a wrapper of `setrlimit` or `prlimit` changed it):
/// the next move reads it again.
pub fn nofile_changed() {
    // SeqCst, with the load in `nofile`: a read of the limit that began before this change
    // is tagged with an older count, so never used after it.
    NOFILE_CHANGES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

/// The process's `RLIMIT_NOFILE`: read once for every move cost a system call each; read again
/// after a change through the shim ([`nofile_changed`]), after a second, and when `fresh`.
/// Another thread holding the record (or one that held it at a fork) means a fresh read.
fn nofile(fresh: bool) -> rustix::process::Rlimit {
    use std::sync::atomic::Ordering::SeqCst;
    let changes = NOFILE_CHANGES.load(SeqCst);
    let Ok(mut rec) = NOFILE.try_lock() else {
        return rustix::process::getrlimit(rustix::process::Resource::Nofile);
    };
    if let Some((at, when, lim)) = rec.as_ref() {
        if !fresh && *at == changes && when.elapsed() < NOFILE_FOR {
            return *lim;
        }
    }
    let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    *rec = Some((changes, std::time::Instant::now(), lim));
    lim
}

/// [`move_all_above`] under the limit `lim`.
fn move_with(fds: &mut [rustix::fd::OwnedFd], floor: i32, lim: rustix::process::Rlimit) -> io::Result<()> {
    use rustix::fd::{AsRawFd, FromRawFd};
    let soft = lim.current.unwrap_or(1 << 20);
    let room = room_above(&lim);
    let bounded = floor == OUT_OF_THE_WAY && !room;
    let floor = if floor == OUT_OF_THE_WAY { out_of_the_way(soft, room) } else { floor };
    if bounded && used_up(allowance(soft), fds.len()) {
        return Err(io::Error::from_raw_os_error(libc::EMFILE));
    }
    if fds.iter().all(|fd| fd.as_raw_fd() >= floor) {
        crate::placed::note(fds);
        return Ok(());
    }
    let below_limit = (floor as u64) < soft;
    if fds.len() > JOB_MAX {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut job = Job { fds: [-1; JOB_MAX], n: fds.len(), floor, limit: 0, raised: false, out: [-1; JOB_MAX] };
    for (i, fd) in fds.iter().enumerate() {
        job.fds[i] = fd.as_raw_fd();
    }
    if below_limit {
        dup_all(&mut job);
    } else {
        // Room above the soft limit: the hard limit, or 64k numbers past the floor.
        let room = u64::try_from(floor).unwrap_or(0).saturating_add(1 << 16);
        job.limit = lim.maximum.map_or(room, |max| max.min(room));
        if job.limit <= floor as u64 {
            return Err(io::Error::from_raw_os_error(libc::EMFILE));
        }
        let ran = in_helper(&mut job);
        if ran.is_err() || !job.raised {
            // Refused (a sandbox that allows only threads or denies `prlimit64`, or a process
            // limit): stay within the limit from now on.
            HELPER_REFUSED.store(true, std::sync::atomic::Ordering::Relaxed);
            return Err(ran.err().unwrap_or_else(|| io::Error::from_raw_os_error(libc::EPERM)));
        }
    }
    if job.out[..job.n].iter().any(|&fd| fd < 0) {
        for &fd in job.out[..job.n].iter().filter(|&&fd| fd >= 0) {
            // SAFETY: a duplicate made above, owned by nobody else.
            drop(unsafe { rustix::fd::OwnedFd::from_raw_fd(fd) });
        }
        return Err(io::Error::from_raw_os_error(libc::EMFILE));
    }
    for (fd, &high) in fds.iter_mut().zip(&job.out) {
        // SAFETY: a duplicate made above; the original closes as it is replaced.
        *fd = unsafe { rustix::fd::OwnedFd::from_raw_fd(high) };
    }
    crate::placed::note(fds);
    Ok(())
}

/// Most descriptors one [`move_all_above`] takes.
const JOB_MAX: usize = 8;

/// What the helper task does: duplicate `fds[..n]` at or above `floor` into `out` (-1: failed),
/// with its soft limit raised to `limit` first (0: not; `raised` tells whether it could).
#[repr(C)]
struct Job {
    fds: [i32; JOB_MAX],
    n: usize,
    floor: i32,
    limit: u64,
    raised: bool,
    out: [i32; JOB_MAX],
}

fn dup_all(job: &mut Job) {
    for i in 0..job.n {
        // SAFETY: the caller's descriptors, open for the duration of the job.
        let fd = unsafe { BorrowedFd::borrow_raw(job.fds[i]) };
        job.out[i] = match rustix::io::fcntl_dupfd_cloexec(fd, job.floor) {
            Ok(high) => rustix::fd::IntoRawFd::into_raw_fd(high),
            Err(_) => -1,
        };
    }
}

/// The helper's entry (see `move_all_above`): raw system calls only (it runs on its own stack,
/// with the suspended caller's thread pointer, so nothing that touches thread-local state).
extern "C" fn helper(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: the caller passed its `Job`, which it does not touch until the helper has exited
    // (CLONE_VFORK).
    let job = unsafe { &mut *arg.cast::<Job>() };
    let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let raised = rustix::process::Rlimit { current: Some(job.limit), maximum: lim.maximum };
    if rustix::process::setrlimit(rustix::process::Resource::Nofile, raised).is_ok() {
        job.raised = true;
        dup_all(job);
    }
    0
}

/// Runs `helper` on `job` in a task that shares our memory and descriptor table (not our
/// limits), and waits for it. The task is a process of its own for a few microseconds: an
/// application thread waiting with `__WALL` may reap it (harmless: the wait below then finds
/// nothing), and `strace -f` shows it.
fn in_helper(job: &mut Job) -> io::Result<()> {
    const STACK: usize = 64 * 1024;
    let mut stack = vec![0u8; STACK];
    // SAFETY: the top of our buffer, 16-byte aligned, for the helper's stack.
    let top = unsafe { stack.as_mut_ptr().add(STACK) }.map_addr(|a| a & !15);
    let flags = libc::CLONE_VM | libc::CLONE_FILES | libc::CLONE_VFORK;
    // The task inherits the application's handlers: with signals blocked, none runs in it (a
    // process-group signal would otherwise run the application's handler on the task's stack).
    let quiet = crate::host::quiet_signals();
    // SAFETY: plain signal-mask calls on local sets.
    let old = unsafe {
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &quiet, &mut old);
        old
    };
    // SAFETY: `helper` runs on `stack`, which outlives it (CLONE_VFORK: clone returns after the
    // helper exited); it only reads and writes `job`, which we do not touch meanwhile. No exit
    // signal: the application's SIGCHLD handling never sees it, and `__WCLONE` reaps it.
    let pid = unsafe { libc::clone(helper, top.cast(), flags, (job as *mut Job).cast()) };
    let err = io::Error::last_os_error();
    if pid > 0 {
        let mut status = 0;
        // SAFETY: reaping our own helper (through the shim's `syscall`, which passes wait4 on).
        unsafe { libc::syscall(libc::SYS_wait4, pid, &mut status as *mut i32, libc::__WCLONE, std::ptr::null_mut::<libc::rusage>()) };
    }
    // SAFETY: restoring the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    drop(stack);
    if pid < 0 {
        return Err(err);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fd::AsRawFd;
    use rustix::process::{setrlimit, Resource, Rlimit};

    /// In a fork child (the limit is the process's): a change through the shim is seen at once,
    /// one it does not see fails the move with the old limit, and the move reads the limit again.
    #[test]
    fn moves_follow_the_limit_however_it_changed() {
        // SAFETY: the child makes system calls only, then `_exit`s.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: no alarm handler: the default action ends a child that hangs.
            unsafe { libc::alarm(10) };
            let ok = (|| {
                let lim = |n| Rlimit { current: Some(n), maximum: Some(n) };
                setrlimit(Resource::Nofile, lim(4096)).ok()?;
                nofile_changed();
                let _ = nofile(false);
                let seen = nofile(false).current == Some(4096);
                let mut a = [crate::doorbell::create().ok()?];
                move_all_above(&mut a, OUT_OF_THE_WAY).ok()?;
                let first = (LOW as i32..2048).contains(&a[0].as_raw_fd());
                // Unseen by the record: its band's start (3840) is now above the soft limit.
                setrlimit(Resource::Nofile, lim(1024)).ok()?;
                let mut b = [crate::doorbell::create().ok()?];
                move_all_above(&mut b, OUT_OF_THE_WAY).ok()?;
                let second = (top_band(1024) as i32..1024).contains(&b[0].as_raw_fd());
                Some(seen && first && second)
            })();
            // SAFETY: ends the child without running the parent's destructors.
            unsafe { libc::_exit(if ok == Some(true) { 0 } else { 1 }) };
        }
        assert!(pid > 0, "fork");
        let mut status = 0;
        // SAFETY: reaping our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "status {status:#x}");
    }

    /// In a fork child: under a fixed limit the library's descriptors take the lowest numbers
    /// free from `LOW` up (a fork copies the kernel's table no further than the highest open),
    /// as many as the allowance, and a number closed past the record counts no more.
    #[test]
    fn under_a_fixed_limit_descriptors_stay_low_and_within_the_allowance() {
        // SAFETY: the child makes system calls only, then `_exit`s.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: no alarm handler: the default action ends a child that hangs.
            unsafe { libc::alarm(10) };
            let code = (|| {
                let lim = Rlimit { current: Some(4096), maximum: Some(4096) };
                setrlimit(Resource::Nofile, lim).ok()?;
                nofile_changed();
                let null = || rustix::fs::open("/dev/null", rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty()).ok();
                let room = allowance(4096) - crate::placed::live();
                let mut kept = Vec::new();
                for _ in 0..room {
                    let fd = move_above(null()?, OUT_OF_THE_WAY).ok()?;
                    if !(LOW as i32..2048).contains(&fd.as_raw_fd()) {
                        return Some(2);
                    }
                    kept.push(fd);
                }
                if move_above(null()?, OUT_OF_THE_WAY).map_err(|e| e.raw_os_error()).err() != Some(Some(libc::EMFILE)) {
                    return Some(3);
                }
                // Closed without telling the record: the record is looked over again (at most
                // once a second: the last look is forgotten here), and the move goes through.
                drop(kept.pop());
                if move_above(null()?, OUT_OF_THE_WAY).is_ok() {
                    return Some(4);
                }
                LOOKED_OVER.store(0, std::sync::atomic::Ordering::Relaxed);
                move_above(null()?, OUT_OF_THE_WAY).ok()?;
                Some(0)
            })();
            // SAFETY: ends the child without running the parent's destructors.
            unsafe { libc::_exit(code.unwrap_or(1)) };
        }
        assert!(pid > 0, "fork");
        let mut status = 0;
        // SAFETY: reaping our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "status {status:#x}");
    }
}
