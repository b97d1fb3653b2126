//! Whether this image's real or effective uid changed since it started: a peer judged us by the
//! credentials of our `connect` or `listen`, taken before any such change.

use std::sync::atomic::{AtomicU64, Ordering};

/// The real and effective uids this image started with (`record_start`, in the constructor), one
/// in each half.
static START_UIDS: AtomicU64 = AtomicU64::new(u64::MAX);

fn uids() -> u64 {
    (u64::from(rustix::process::getuid().as_raw()) << 32) | u64::from(rustix::process::geteuid().as_raw())
}

/// In the shim's constructor: records the uids this image starts with.
pub fn record_start() {
    START_UIDS.store(uids(), Ordering::Relaxed);
}

/// Whether the real or effective uid changed since this image started.
pub fn changed() -> bool {
    START_UIDS.load(Ordering::Relaxed) != uids()
}
