//! Whether this is a child that runs in its parent's memory (`vfork`, `posix_spawn`'s child,
//! `clone(CLONE_VM)`): what such a child does to the shim's state, it does to its parent's.

/// True in a child that shares this process's memory without being this process (a `vfork` or
/// `clone(CLONE_VM)` child): the cached pid is the parent's.
pub fn borrowed_memory() -> bool {
    rustix::process::getpid().as_raw_nonzero().get() as u32 != colo_sys::host::pid()
}

/// True in a child that shares this process's memory (`vfork`, `posix_spawn`'s child,
/// `clone(CLONE_VM)`), as the kernel says (`kcmp(KCMP_VM)`): unlike `borrowed_memory`, false in a
/// child with a copy of its own made by a raw `clone` past the fork handlers (vsftpd's), whose
/// cached pid is stale too. Once the kernel said so, the child remembers it (`SHARING`): after it
/// becomes another user (a `vfork` child's `setuid` before its `exec`) `kcmp` refuses to compare
/// it with its parent. False where the kernel will not say and never said (`EPERM`, no `kcmp`).
pub fn shares_memory() -> bool {
    let me = rustix::process::getpid().as_raw_nonzero().get();
    let cached = colo_sys::host::pid() as libc::pid_t;
    if me == cached {
        return false;
    }
    // SAFETY: kcmp(2) takes two pids, a type and two numbers; it touches no memory of ours.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, me, cached, 1 /* KCMP_VM */, 0, 0) };
    if r == 0 {
        // Relaxed: written and read by this child's one thread. In the parent's memory (it is
        // shared), where no process but this child has its pid.
        SHARING.store(me, std::sync::atomic::Ordering::Relaxed);
        return true;
    }
    // Only a refusal falls back on what the kernel said before: "different" is the answer
    // (a raw-clone child whose pid an earlier vfork child of this memory had is not sharing).
    r < 0 && SHARING.load(std::sync::atomic::Ordering::Relaxed) == me
}

/// The pid of the last child found sharing this memory (`shares_memory`).
static SHARING: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
