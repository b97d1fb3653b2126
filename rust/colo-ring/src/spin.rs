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
/// A sleep of at most `NEAR_MISS` times the budget was a near miss: the answer came soon after
/// the spin ended, so the budget doubles, up to `MAX_GROWTH` times the configured spin. Two event
/// loops answering each other in a little more than the spin otherwise settle where each spin
/// just misses, each side sleeps and must be woken, which makes the next wait longer still
/// (docs/ARCHITECTURE.md, "No system call per request in an event loop"). Sleeps longer than
/// that halve it again, back to the configured spin.
const NEAR_MISS: u32 = 4;
const MAX_GROWTH: u32 = 8;

/// Per-connection spin state.
#[derive(Debug, Clone)]
pub struct Spinner {
    mode: SpinMode,
    failures: u32,
    waits: u32,
    /// The current spin budget in `SpinMode::For` (between the configured one and
    /// `MAX_GROWTH` times it).
    budget: Duration,
    /// Asked before each adaptive spin: true when other threads wait for a CPU, so that a spin
    /// would only hold off the thread we wait for (see [`Spinner::yielding_when`]).
    crowded: fn() -> bool,
    /// The last wait did not spin because `crowded` said so: its sleep teaches nothing.
    skipped: bool,
}

impl Spinner {
    /// A spinner with the given mode.
    pub fn new(mode: SpinMode) -> Self {
        let budget = match mode {
            SpinMode::For(d) => d,
            _ => Duration::ZERO,
        };
        Spinner { mode, failures: 0, waits: 0, budget, crowded: || false, skipped: false }
    }

    /// This spinner, but an adaptive spin ([`SpinMode::For`]) is skipped whenever `crowded()`
    /// says other threads are waiting for a CPU (busy polling, [`SpinMode::Always`], still
    /// spins: the user asked for it). `crowded` is called before every spin, so it must be cheap.
    ///
    /// ```
    /// use colo_ring::spin::{SpinMode, Spinner};
    /// let mut s = Spinner::new(SpinMode::For(std::time::Duration::from_millis(1))).yielding_when(|| true);
    /// assert!(!s.spin(|| true), "a crowded host sleeps at once");
    /// ```
    pub fn yielding_when(mut self, crowded: fn() -> bool) -> Self {
        self.crowded = crowded;
        self
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
            SpinMode::For(_) => self.budget,
        };
        self.waits = self.waits.wrapping_add(1);
        self.skipped = false;
        if self.failures >= GIVE_UP_AFTER && !self.waits.is_multiple_of(PROBE_EVERY) {
            return false;
        }
        self.skipped = (self.crowded)();
        if self.skipped {
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

    /// Reports that the sleep after a failed spin was ended by something the spin does not look
    /// at (another file of the same wait): a failure, as a long sleep is, and no reason to
    /// spin longer. A thread whose waits end that way (an event loop woken by its mailbox)
    /// stops spinning, so it does not hold off the thread that would wake it.
    pub fn woken_elsewhere(&mut self) {
        if let SpinMode::For(base) = self.mode {
            if std::mem::take(&mut self.skipped) {
                return;
            }
            self.budget = (self.budget / 2).max(base);
        }
    }

    /// Reports how long the sleep after a failed spin lasted.
    pub fn slept(&mut self, d: Duration) {
        if let SpinMode::For(base) = self.mode {
            if std::mem::take(&mut self.skipped) {
                return;
            }
            if d < self.budget * LONG_SLEEP {
                self.failures = 0;
            }
            self.budget = if d <= self.budget * NEAR_MISS {
                (self.budget * 2).min(base * MAX_GROWTH)
            } else {
                (self.budget / 2).max(base)
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_grows_on_near_misses_and_shrinks_back() {
        let base = Duration::from_micros(5);
        let mut s = Spinner::new(SpinMode::For(base));
        for _ in 0..10 {
            s.slept(Duration::from_micros(12));
        }
        assert_eq!(s.budget, base * MAX_GROWTH, "near misses grow it to the cap, no further");
        for _ in 0..10 {
            s.slept(Duration::from_millis(5));
        }
        assert_eq!(s.budget, base, "long sleeps take it back to the configured spin");
        let mut crowded = Spinner::new(SpinMode::For(base)).yielding_when(|| true);
        assert!(!crowded.spin(|| true), "no adaptive spin on a crowded host");
        crowded.slept(Duration::from_micros(12));
        assert_eq!(crowded.budget, base, "a sleep after a skipped spin teaches nothing");
        let mut busy = Spinner::new(SpinMode::Always).yielding_when(|| true);
        assert!(busy.spin(|| true), "busy polling spins whatever the host runs");
        let mut never = Spinner::new(SpinMode::Never);
        never.slept(Duration::from_micros(1));
        assert!(!never.spin(|| true), "never spins, whatever it slept");
    }

    #[test]
    fn waits_that_other_files_end_stop_the_spin() {
        let base = Duration::from_micros(5);
        let mut s = Spinner::new(SpinMode::For(base));
        // A near miss by the rings grows the budget; a wake-up from elsewhere, however soon,
        // takes it back and never resets the failures.
        s.slept(Duration::from_micros(12));
        assert_eq!(s.budget, base * 2);
        for _ in 0..GIVE_UP_AFTER {
            assert!(!s.spin(|| false));
            s.woken_elsewhere();
        }
        assert_eq!(s.budget, base);
        let mut looked = 0;
        for _ in 1..PROBE_EVERY {
            if s.waits.wrapping_add(1).is_multiple_of(PROBE_EVERY) {
                continue;
            }
            assert!(!s.spin(|| {
                looked += 1;
                false
            }));
            s.woken_elsewhere();
        }
        assert_eq!(looked, 0, "given up: no spin but the probes");
        // A ring that answers soon again brings the spin back.
        while !s.waits.wrapping_add(1).is_multiple_of(PROBE_EVERY) {
            s.spin(|| false);
        }
        assert!(s.spin(|| true), "the probe spins");
        assert!(s.spin(|| true), "and spinning is back");
    }
}
