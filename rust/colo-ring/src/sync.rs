//! All atomics of colo come from here, so that `RUSTFLAGS="--cfg loom"` swaps them for loom's
//! model-checked versions. Production code casts shared-memory addresses to these types, which is
//! sound only for the std types (same size and alignment as the integer); loom tests allocate them.

#[cfg(loom)]
pub use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
pub use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// A CPU pause hint inside spin loops (loom: a yield to the model scheduler).
#[inline]
pub fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}
