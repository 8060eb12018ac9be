//! Deadlines: a request's budget (`x-tiergate-deadline-ms`, or its route's `deadline_ms`, at most the route's
//! `max_deadline_ms`), and the LLM's service times that predict whether an escalation can finish within it.
//! An escalation that cannot is never queued: the answer comes from Tier-0 (`x-tiergate-degraded:
//! deadline_unreachable`), and a generation, which has no Tier-0 answer, is 504.

use std::time::{Duration, Instant};

pub(crate) use tiergate_core::stats::ServiceTimes;

pub(crate) use tiergate_core::outcome::header::DEADLINE as HEADER;

/// A job's completion from a service estimate (`mean`, `p95`): the wait for a slot ((queued + 1) ÷ capacity
/// mean service times, when all `capacity` slots are busy) plus its own P95 service time.
pub(crate) fn completion(
    mean: Duration,
    p95: Duration,
    queued: usize,
    busy: bool,
    capacity: usize,
) -> Duration {
    let wait = if busy {
        mean.mul_f64((queued + 1) as f64 / capacity.max(1) as f64)
    } else {
        Duration::ZERO
    };
    wait + p95
}

/// A job's predicted completion for `tenant` on a backend whose workers' share is `share` (`capacity` slots)
/// and whose service times of the job's kind are `times`, and that P95 service time: what selection and the
/// deadline check use ([`crate::backends::llm::Llm::predict`]).
pub(crate) fn predict(
    share: &crate::backends::fair::Share,
    times: &ServiceTimes,
    capacity: usize,
    tenant: &str,
) -> (Duration, Duration) {
    let (running, _) = share.load();
    let before = share.ahead(tenant).saturating_sub(running + 1);
    let busy = running >= capacity;
    let (mean, p95) = times.estimate();
    (completion(mean, p95, before, busy, capacity), p95)
}

/// Time left until `deadline` (zero once passed).
pub(crate) fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn predict(s: &ServiceTimes, queued: usize, busy: bool, capacity: usize) -> Duration {
        let (mean, p95) = s.estimate();
        completion(mean, p95, queued, busy, capacity)
    }

    #[test]
    fn predictions_use_the_prior_then_the_window() {
        let s = ServiceTimes::new(Duration::from_millis(1000));
        // No samples: the prior for the mean and the P95.
        assert_eq!(predict(&s, 0, false, 4), Duration::from_millis(1000));
        assert_eq!(predict(&s, 3, true, 4), Duration::from_millis(2000));
        for ms in [100, 100, 100, 100, 100, 100, 100, 100, 100, 500] {
            s.record(Duration::from_millis(ms));
        }
        let (mean, p95) = s.estimate();
        assert_eq!(mean, Duration::from_millis(140));
        assert_eq!(p95, Duration::from_millis(500));
        // A free slot: its own P95; four slots busy, seven waiting: two mean service times more.
        assert_eq!(predict(&s, 0, false, 4), Duration::from_millis(500));
        assert_eq!(predict(&s, 7, true, 4), Duration::from_millis(780));
        // The window slides: old samples leave.
        for _ in 0..tiergate_core::stats::WINDOW {
            s.record(Duration::from_millis(10));
        }
        assert_eq!(
            s.estimate(),
            (Duration::from_millis(10), Duration::from_millis(10))
        );
        assert_eq!(
            s.recent_p95(Duration::from_secs(60)),
            Some(Duration::from_millis(10))
        );
        assert_eq!(
            ServiceTimes::new(Duration::ZERO).recent_p95(Duration::from_secs(1)),
            None
        );
    }
}
