//! Copying bytes into and out of a ring, without the one memcpy path that collapses.
//!
//! glibc's `memcpy` moves copies of a few KiB and up with `rep movsb`. On AMD Zen cores (FSRM),
//! `rep movsb` is an order of magnitude slower when the destination starts 1 to 31 bytes after
//! the source modulo 4 KiB than at any other distance (docs/ARCHITECTURE.md, "Ring copies avoid
//! glibc's `rep movsb`", has the figures). That distance is the common case for a ring: its data
//! is page-aligned and a large `malloc` block starts 16 bytes into a page, so reading a ring into
//! a `Vec` would hit it on every call. [`copy`] sends exactly that case through a 16-byte vector
//! loop and everything else to `memcpy`.

/// Copies of at least this many bytes may take glibc's `rep movsb` path.
const REP_MOVSB_MIN: usize = 1024;

/// Distances (destination minus source, modulo 4 KiB) from 1 to below this take the vector loop.
/// The slow window is 1..=31; 64 keeps a margin and is where glibc's own short-distance
/// check ends. Distance 0 (the same page offset) is `rep movsb`'s fast case.
const SHORT_DISTANCE: usize = 64;

/// Copies `len` bytes from `src` to `dst`, as `core::ptr::copy_nonoverlapping`.
///
/// # Safety
/// As `core::ptr::copy_nonoverlapping`: `src..src + len` readable, `dst..dst + len` writable, the
/// two ranges disjoint.
///
/// ```
/// let src: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
/// let mut dst = vec![0u8; 5016];
/// // SAFETY: both ranges are in bounds of their own vectors.
/// unsafe { colo_ring::copy::copy(src.as_ptr(), dst.as_mut_ptr().add(16), src.len()) };
/// assert_eq!(&dst[16..], &src[..]);
/// ```
#[inline]
pub unsafe fn copy(src: *const u8, dst: *mut u8, len: usize) {
    if len >= REP_MOVSB_MIN && (1..SHORT_DISTANCE).contains(&((dst as usize).wrapping_sub(src as usize) % 4096)) {
        // SAFETY: the caller's contract, passed on.
        unsafe { copy_vectors(src, dst, len) }
    } else {
        // SAFETY: the caller's contract, passed on.
        unsafe { core::ptr::copy_nonoverlapping(src, dst, len) }
    }
}

/// 64 bytes per round in four unaligned 16-byte loads and stores (SSE2, always present on
/// x86_64); the last partial round through `memcpy`, which is below `rep movsb` sizes.
#[cfg(target_arch = "x86_64")]
#[cold]
unsafe fn copy_vectors(src: *const u8, dst: *mut u8, len: usize) {
    use core::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_storeu_si128};
    let rounds = len / 64;
    for i in 0..rounds {
        // SAFETY: `i * 64 + 64 <= len`, so all four loads and stores are inside the caller's
        // ranges; the intrinsics take unaligned addresses.
        unsafe {
            let s = src.add(i * 64).cast::<__m128i>();
            let d = dst.add(i * 64).cast::<__m128i>();
            let a = _mm_loadu_si128(s);
            let b = _mm_loadu_si128(s.add(1));
            let c = _mm_loadu_si128(s.add(2));
            let e = _mm_loadu_si128(s.add(3));
            _mm_storeu_si128(d, a);
            _mm_storeu_si128(d.add(1), b);
            _mm_storeu_si128(d.add(2), c);
            _mm_storeu_si128(d.add(3), e);
        }
    }
    let done = rounds * 64;
    // SAFETY: the remaining `len - done < 64` bytes are inside the caller's ranges.
    unsafe { core::ptr::copy_nonoverlapping(src.add(done), dst.add(done), len - done) }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn copy_vectors(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY: the caller's contract, passed on.
    unsafe { core::ptr::copy_nonoverlapping(src, dst, len) }
}

#[cfg(test)]
mod tests {
    use super::{copy, copy_vectors};

    #[test]
    fn every_distance_and_length_copies_exactly() {
        let src: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + 3) as u8).collect();
        for &len in &[0usize, 1, 63, 64, 65, 1023, 1024, 1025, 4096, 5000, 16_383] {
            for shift in [0usize, 1, 15, 16, 31, 63, 64, 100] {
                for vectors in [false, true] {
                    let mut dst = vec![0xAAu8; len + shift + 8];
                    let to = dst.as_mut_ptr().wrapping_add(shift);
                    // SAFETY: `src` holds at least `len` bytes and `dst` `shift + len`.
                    unsafe {
                        if vectors {
                            copy_vectors(src.as_ptr(), to, len)
                        } else {
                            copy(src.as_ptr(), to, len)
                        }
                    };
                    assert_eq!(&dst[shift..shift + len], &src[..len], "len {len} shift {shift}");
                    assert!(dst[..shift].iter().all(|&b| b == 0xAA));
                    assert!(dst[shift + len..].iter().all(|&b| b == 0xAA));
                }
            }
        }
    }
}
