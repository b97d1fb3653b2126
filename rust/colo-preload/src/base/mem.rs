//! Slices over the application's buffers, and the lock that is never waited for.

/// A lock that is not waited for: a fork child inherits the locks other threads of its parent
/// held, and must not hang on them. The shim's small tables take it and, when it is busy, carry
/// on as if they were empty.
pub fn try_lock<T>(m: &std::sync::Mutex<T>) -> Option<std::sync::MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// `n` elements at `p` (empty for a null `p` or `n == 0`).
///
/// # Safety
/// A non-null `p` points to `n` initialized elements that stay valid and unwritten for `'a`.
pub unsafe fn slice<'a, T>(p: *const T, n: usize) -> &'a [T] {
    if n == 0 || p.is_null() {
        return &[];
    }
    // SAFETY: the caller's contract: `n` valid elements at the non-null `p`.
    unsafe { std::slice::from_raw_parts(p, n) }
}

/// `n` writable elements at `p` (empty for a null `p` or `n == 0`).
///
/// # Safety
/// A non-null `p` points to `n` writable elements that nothing else touches for `'a`.
pub unsafe fn slice_mut<'a, T>(p: *mut T, n: usize) -> &'a mut [T] {
    if n == 0 || p.is_null() {
        return &mut [];
    }
    // SAFETY: the caller's contract: `n` writable, unaliased elements at the non-null `p`.
    unsafe { std::slice::from_raw_parts_mut(p.cast(), n) }
}

/// The `int` at the application's address `p`, or `None` where this process cannot read one
/// there (the kernel's `EFAULT` for the call that passed it). Read by `process_vm_readv` of this
/// process, which fails where a load would fault.
pub fn app_int(p: libc::c_ulong) -> Option<libc::c_int> {
    let mut v: libc::c_int = 0;
    let size = std::mem::size_of::<libc::c_int>();
    let local = libc::iovec { iov_base: std::ptr::from_mut(&mut v).cast(), iov_len: size };
    let remote = libc::iovec { iov_base: p as *mut libc::c_void, iov_len: size };
    // SAFETY: writes at most `size` bytes into `v`, which we own; the remote range is only read,
    // by the kernel, which fails the call instead of faulting where it is not mapped.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    (n == size as isize).then_some(v)
}

/// Writes `v` as the `int` at the application's address `p`; false where this process cannot
/// write one there (the kernel's `EFAULT` for the call that passed it). Written by
/// `process_vm_writev` of this process, which fails where a store would fault.
pub fn put_app_int(p: libc::c_ulong, v: libc::c_int) -> bool {
    let size = std::mem::size_of::<libc::c_int>();
    let local = libc::iovec { iov_base: std::ptr::from_ref(&v).cast_mut().cast(), iov_len: size };
    let remote = libc::iovec { iov_base: p as *mut libc::c_void, iov_len: size };
    // SAFETY: reads `size` bytes of `v`, which we own; the remote range is only written, by the
    // kernel, which fails the call instead of faulting where it is not mapped or not writable.
    let n = unsafe { libc::process_vm_writev(libc::getpid(), &local, 1, &remote, 1, 0) };
    n == size as isize
}
