//! The environment flags the shim reads once (`COLO_DISABLE`, and the spin mode that
//! `colo::Options` reads from `COLO_SPIN_US`).

use std::sync::OnceLock;

pub fn disabled() -> bool {
    static D: OnceLock<bool> = OnceLock::new();
    *D.get_or_init(|| std::env::var("COLO_DISABLE").is_ok_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes")))
}

pub fn spin() -> colo::SpinMode {
    static S: OnceLock<colo::SpinMode> = OnceLock::new();
    *S.get_or_init(|| colo::Options::new().spin_mode())
}
