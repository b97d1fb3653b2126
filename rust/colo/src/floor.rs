//! The descriptor floor: the number at or above which colo keeps the descriptors it creates or
//! receives (control sockets, memfds, self bells, wake-up eventfds, the hang-up watcher's). Set
//! by the LD_PRELOAD shim, read wherever a descriptor is made; it depends on nothing else here.

use std::sync::atomic::{AtomicI32, Ordering};

static FD_FLOOR: AtomicI32 = AtomicI32::new(0);

/// Descriptors colo creates or receives (control socket, memfd, self bell), and the other
/// descriptors a connection holds, are moved to numbers at or above `floor` (0: anywhere). The
/// LD_PRELOAD shim sets `colo_sys::preload::OUT_OF_THE_WAY`, so that its descriptors stay out
/// of the application's way.
pub fn set_fd_floor(floor: i32) {
    FD_FLOOR.store(floor, Ordering::Relaxed);
}

/// The floor set by [`set_fd_floor`]: pass it to `colo_sys::preload::move_all_above`, never
/// compare a descriptor with it (the shim's is a marker, `OUT_OF_THE_WAY`, worked out there).
pub fn fd_floor() -> i32 {
    FD_FLOOR.load(Ordering::Relaxed)
}
