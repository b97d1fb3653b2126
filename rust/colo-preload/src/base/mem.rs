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
