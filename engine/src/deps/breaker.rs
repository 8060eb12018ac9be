//! A circuit breaker in front of the LLM backend: after `failures` jobs in a row end in a backend failure (the
//! worker died, the engine or upstream answered with an error, a job ran past its deadline), the backend is
//! open for `cooldown` — escalations degrade at once (`x-tiergate-degraded: breaker_open`), generations get
//! 503 with `Retry-After` — then one probe job is let through (half-open): its success closes the breaker, its
//! failure opens it again. A full queue or a budget too short is load, not failure, and does not count. The
//! supervisor's one retry of a crashed worker's job happens below this: a request is failed (and counted)
//! once, after it. `/ready` stays 200 while the breaker is open: Tier-0 still serves.

use std::time::{Duration, Instant};

/// The breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Closed,
    /// Refusing jobs until then.
    Open {
        until: Instant,
    },
    /// One probe job is out since then; the others are refused until it ends (or, should its outcome never
    /// come — its request went away while it waited —, until a cooldown has passed).
    HalfOpen {
        since: Instant,
    },
}

/// A pure state machine over job outcomes.
#[derive(Debug, Clone)]
pub(crate) struct Breaker {
    state: State,
    /// Failures in a row while closed.
    failures: u32,
    threshold: u32,
    cooldown: Duration,
    /// Times it opened.
    trips: u64,
}

impl Breaker {
    /// Opens after `threshold` failures in a row, for `cooldown`.
    pub(crate) fn new(threshold: u32, cooldown: Duration) -> Self {
        Self {
            state: State::Closed,
            failures: 0,
            threshold: threshold.max(1),
            cooldown,
            trips: 0,
        }
    }

    /// Its state.
    pub(crate) fn state(&self) -> State {
        self.state
    }

    /// Times it has opened.
    pub(crate) fn trips(&self) -> u64 {
        self.trips
    }

    /// Whether a job may go to the backend at `now` (an open breaker past its cooldown lets one probe through).
    pub(crate) fn allow(&mut self, now: Instant) -> bool {
        match self.state {
            State::Closed => true,
            State::Open { until } if now >= until => {
                self.state = State::HalfOpen { since: now };
                true
            }
            State::HalfOpen { since } if now.saturating_duration_since(since) >= self.cooldown => {
                self.state = State::HalfOpen { since: now };
                true
            }
            State::Open { .. } | State::HalfOpen { .. } => false,
        }
    }

    /// How long until it lets a probe through (zero unless open).
    pub(crate) fn retry_after(&self, now: Instant) -> Duration {
        match self.state {
            State::Open { until } => until.saturating_duration_since(now),
            _ => Duration::ZERO,
        }
    }

    /// A job the breaker let through answered.
    pub(crate) fn success(&mut self) {
        self.state = State::Closed;
        self.failures = 0;
    }

    /// A job the breaker let through failed at `now`.
    pub(crate) fn failure(&mut self, now: Instant) {
        match self.state {
            State::Closed => {
                self.failures += 1;
                if self.failures >= self.threshold {
                    self.open(now);
                }
            }
            State::HalfOpen { .. } => self.open(now),
            State::Open { .. } => {}
        }
    }

    fn open(&mut self, now: Instant) {
        self.state = State::Open {
            until: now + self.cooldown,
        };
        self.failures = 0;
        self.trips += 1;
    }

    /// A probe let through ended without an outcome (refused before it ran): let another one through.
    pub(crate) fn abandon(&mut self) {
        if matches!(self.state, State::HalfOpen { .. }) {
            self.state = State::Open {
                until: Instant::now(),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_opens_after_failures_in_a_row_and_a_success_resets_the_count() {
        let t0 = Instant::now();
        let mut b = Breaker::new(3, Duration::from_secs(5));
        b.failure(t0);
        b.failure(t0);
        b.success();
        b.failure(t0);
        b.failure(t0);
        assert!(b.allow(t0), "two in a row: still closed");
        b.failure(t0);
        assert_eq!(
            b.state(),
            State::Open {
                until: t0 + Duration::from_secs(5)
            }
        );
        assert!(!b.allow(t0 + Duration::from_secs(1)));
        assert_eq!(
            b.retry_after(t0 + Duration::from_secs(1)),
            Duration::from_secs(4)
        );
        assert_eq!(b.trips(), 1);
    }

    #[test]
    fn after_the_cooldown_one_probe_decides() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(6);
        let mut b = Breaker::new(1, Duration::from_secs(5));
        b.failure(t0);
        // One probe through, the rest refused while it runs.
        assert!(b.allow(later));
        assert!(!b.allow(later));
        // It fails: open again for a full cooldown.
        b.failure(later);
        assert!(!b.allow(later + Duration::from_secs(4)));
        assert_eq!(b.trips(), 2);
        // The next probe answers: closed, every job through.
        assert!(b.allow(later + Duration::from_secs(5)));
        b.success();
        assert!(b.allow(later + Duration::from_secs(5)));
        assert!(b.allow(later + Duration::from_secs(5)));
        assert_eq!(b.state(), State::Closed);
        // A probe refused before it ran hands the turn to the next job.
        b.failure(later);
        let t = later + Duration::from_secs(6);
        assert!(b.allow(t));
        b.abandon();
        assert!(b.allow(t));
        // A probe whose outcome never comes: another goes after a cooldown.
        assert!(!b.allow(t + Duration::from_secs(4)));
        assert!(b.allow(t + Duration::from_secs(5)));
    }
}
