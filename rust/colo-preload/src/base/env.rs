//! The environment flags the shim reads once (`COLO_DISABLE`, `COLO_DEFER_ACCEPT`, and the spin
//! mode that `colo::Options` reads from `COLO_SPIN_US`), and the switch that turns the shim off
//! in a process that confines itself.

use std::sync::OnceLock;

/// Set once the process confined itself (`api::confine`): the shim makes nothing new in it.
static OFF: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the shim accelerates nothing new in this process: `COLO_DISABLE`, or [`turn_off`].
pub fn disabled() -> bool {
    static D: OnceLock<bool> = OnceLock::new();
    OFF.load(std::sync::atomic::Ordering::Relaxed)
        || *D.get_or_init(|| std::env::var("COLO_DISABLE").is_ok_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes")))
}

/// From now on [`disabled`].
pub fn turn_off() {
    OFF.store(true, std::sync::atomic::Ordering::Relaxed);
}

pub fn spin() -> colo::SpinMode {
    static S: OnceLock<colo::SpinMode> = OnceLock::new();
    *S.get_or_init(|| colo::Options::new().spin_mode())
}

/// `COLO_DEFER_ACCEPT=ignore`: a socket's `TCP_DEFER_ACCEPT` is kept for `getsockopt` and not
/// given to the kernel (`sockopt::set_defer_accept`), so that its listener accepts a colo client,
/// which sends only once accepted, as it accepts any other: the operator trades the option's
/// protection against plain clients that connect and send nothing for acceleration.
pub fn defer_accept_ignored() -> bool {
    static D: OnceLock<bool> = OnceLock::new();
    *D.get_or_init(|| std::env::var("COLO_DEFER_ACCEPT").is_ok_and(|v| v.eq_ignore_ascii_case("ignore")))
}
