//! How long a side spins before it sleeps (spec/WIRE.md section 9). Never busy-polls by default.

use std::time::{Duration, Instant};

/// The spin setting of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpinMode {
    /// Sleep at once.
    Never,
    /// Spin up to this long, then sleep; adaptive (stops spinning while spins keep failing).
    For(Duration),
    /// Spin and never sleep (busy polling; burns a CPU while waiting).
    Always,
}

/// The default spin: 5 us, adaptive.
pub const DEFAULT_SPIN: SpinMode = SpinMode::For(Duration::from_micros(5));

impl SpinMode {
    /// Parses a `COLO_SPIN_US` value: microseconds, `0` (never), `inf` or `-1` (always).
    ///
    /// ```
    /// use colo_ring::spin::SpinMode;
    /// assert_eq!(SpinMode::parse("0"), Some(SpinMode::Never));
    /// assert_eq!(SpinMode::parse("inf"), Some(SpinMode::Always));
    /// assert!(SpinMode::parse("fast").is_none());
    /// ```
    pub fn parse(s: &str) -> Option<SpinMode> {
        match s.trim() {
            "inf" | "-1" | "always" => Some(SpinMode::Always),
            "0" | "never" => Some(SpinMode::Never),
            t => t.parse::<u64>().ok().map(|us| SpinMode::For(Duration::from_micros(us))),
        }
    }
}

/// After this many spins in a row that ended in a long sleep, spin only on every `PROBE_EVERY`-th
/// wait. A sleep counts as long when it lasted more than `LONG_SLEEP` times the spin budget: a
/// longer spin would not have caught it. Short sleeps (the peer answered soon, just not within the
/// spin) reset the count, so two peers that both stopped spinning start again.
const GIVE_UP_AFTER: u32 = 8;
const PROBE_EVERY: u32 = 16;
const LONG_SLEEP: u32 = 20;

/// Per-connection spin state.
#[derive(Debug, Clone)]
pub struct Spinner {
    mode: SpinMode,
    failures: u32,
    waits: u32,
}

impl Spinner {
    /// A spinner with the given mode.
    pub fn new(mode: SpinMode) -> Self {
        Spinner { mode, failures: 0, waits: 0 }
    }

    /// The configured mode.
    pub fn mode(&self) -> SpinMode {
        self.mode
    }

    /// Spins until `ready()` returns true or the budget is spent; returns whether it was ready.
    /// In [`SpinMode::Always`] it only returns when ready.
    pub fn spin(&mut self, mut ready: impl FnMut() -> bool) -> bool {
        let budget = match self.mode {
            SpinMode::Never => return false,
            SpinMode::Always => loop {
                for _ in 0..64 {
                    if ready() {
                        return true;
                    }
                    crate::sync::spin_hint();
                }
                std::thread::yield_now();
            },
            SpinMode::For(d) => d,
        };
        self.waits = self.waits.wrapping_add(1);
        if self.failures >= GIVE_UP_AFTER && self.waits % PROBE_EVERY != 0 {
            return false;
        }
        let start = Instant::now();
        loop {
            for _ in 0..32 {
                if ready() {
                    self.failures = 0;
                    return true;
                }
                crate::sync::spin_hint();
            }
            if start.elapsed() >= budget {
                self.failures = self.failures.saturating_add(1);
                return false;
            }
        }
    }

    /// Reports how long the sleep after a failed spin lasted.
    pub fn slept(&mut self, d: Duration) {
        if let SpinMode::For(budget) = self.mode {
            if d < budget * LONG_SLEEP {
                self.failures = 0;
            }
        }
    }
}
