//! Deadlines: a request's budget (`x-tiergate-deadline-ms`, or its route's `deadline_ms`, at most the route's
//! `max_deadline_ms`), and the LLM's service times that predict whether an escalation can finish within it.
//! An escalation that cannot is never queued: the answer comes from Tier-0 (`x-tiergate-degraded:
//! deadline_unreachable`), and a generation, which has no Tier-0 answer, is 504.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The request header carrying a budget in milliseconds.
pub const HEADER: &str = "x-tiergate-deadline-ms";

/// Samples kept per job kind.
const WINDOW: usize = 128;
/// Samples before the window replaces the prior.
const MIN_SAMPLES: usize = 4;
/// Samples older than this no longer count: a backend passed over for being slow (or idle a while) goes back
/// to its prior, so selection tries it again instead of remembering a slowdown forever.
pub const MAX_AGE: Duration = Duration::from_secs(60);

/// One job kind's recent service times (the time a job held a worker slot), over a sliding window, with a
/// stated prior until there are a few samples.
#[derive(Debug)]
pub struct ServiceTimes {
    prior: Duration,
    window: Mutex<VecDeque<(Instant, Duration)>>,
    /// The last estimate and when it was made: reused for [`REUSE`] (a new sample drops it), so a prediction
    /// per alternative per escalation does not copy the window each time.
    cached: Mutex<Option<(Instant, (Duration, Duration))>>,
}

/// How long an estimate is reused while no sample comes.
const REUSE: Duration = Duration::from_millis(100);

impl ServiceTimes {
    /// An empty window; `prior` stands for the mean and the P95 until [`MIN_SAMPLES`] samples.
    pub fn new(prior: Duration) -> Self {
        Self {
            prior,
            window: Mutex::new(VecDeque::with_capacity(WINDOW)),
            cached: Mutex::new(None),
        }
    }

    /// Records one job's service time.
    pub fn record(&self, d: Duration) {
        self.record_at(Instant::now(), d);
    }

    /// Records one job's service time, ended at `at`.
    pub fn record_at(&self, at: Instant, d: Duration) {
        if let Ok(mut w) = self.window.lock() {
            if w.len() == WINDOW {
                w.pop_front();
            }
            w.push_back((at, d));
        }
        if let Ok(mut c) = self.cached.lock() {
            *c = None;
        }
    }

    /// (mean, P95) of the window's samples younger than [`MAX_AGE`], or the prior for both while there are
    /// fewer than [`MIN_SAMPLES`] of them.
    pub fn estimate(&self) -> (Duration, Duration) {
        self.estimate_at(Instant::now())
    }

    /// [`ServiceTimes::estimate`] as of `now`.
    pub fn estimate_at(&self, now: Instant) -> (Duration, Duration) {
        if let Ok(c) = self.cached.lock() {
            if let Some((at, e)) = *c {
                if now >= at && now - at < REUSE {
                    return e;
                }
            }
        }
        let e = self.compute(now);
        if let Ok(mut c) = self.cached.lock() {
            *c = Some((now, e));
        }
        e
    }

    fn compute(&self, now: Instant) -> (Duration, Duration) {
        let Ok(w) = self.window.lock() else {
            return (self.prior, self.prior);
        };
        let v: Vec<Duration> = w
            .iter()
            .filter(|(at, _)| now.saturating_duration_since(*at) <= MAX_AGE)
            .map(|(_, d)| *d)
            .collect();
        if v.len() < MIN_SAMPLES {
            return (self.prior, self.prior);
        }
        mean_p95(v)
    }

    /// The P95 of the samples of the last `age` (`None` without any): what the brownout ladder watches, so
    /// slow jobs long gone do not keep it down.
    pub fn recent_p95(&self, age: Duration) -> Option<Duration> {
        let w = self.window.lock().ok()?;
        let v: Vec<Duration> = w
            .iter()
            .filter(|(at, _)| at.elapsed() <= age)
            .map(|(_, d)| *d)
            .collect();
        (!v.is_empty()).then(|| mean_p95(v).1)
    }
}

/// A job's completion from a service estimate (`mean`, `p95`): the wait for a slot ((queued + 1) ÷ capacity
/// mean service times, when all `capacity` slots are busy) plus its own P95 service time.
pub fn completion(
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

/// (mean, P95) of a non-empty set of durations.
fn mean_p95(mut v: Vec<Duration>) -> (Duration, Duration) {
    if v.is_empty() {
        return (Duration::ZERO, Duration::ZERO);
    }
    let mean = v.iter().sum::<Duration>() / v.len() as u32;
    // The nearest-rank P95 by selection (linear), not a sort: this runs per alternative per escalation.
    let rank = ((v.len() as f64 * 0.95).ceil() as usize).clamp(1, v.len()) - 1;
    let (_, p95, _) = v.select_nth_unstable(rank);
    (mean, *p95)
}

/// A job's predicted completion for `tenant` on a backend whose workers' share is `share` (`capacity` slots)
/// and whose service times of the job's kind are `times`, and that P95 service time: what selection and the
/// deadline check use ([`crate::llm::Llm::predict`]).
pub fn predict(
    share: &crate::fair::Share,
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
pub fn left(deadline: Instant) -> Duration {
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
        for _ in 0..WINDOW {
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

    /// A slowdown is not remembered forever: samples older than a minute leave the estimate, and with too few
    /// recent ones the prior stands again (so a backend passed over for being slow is tried again).
    #[test]
    fn old_samples_age_out_of_the_estimate() {
        let s = ServiceTimes::new(Duration::from_millis(300));
        let t0 = Instant::now();
        for _ in 0..8 {
            s.record_at(t0, Duration::from_secs(5));
        }
        assert_eq!(s.estimate_at(t0).1, Duration::from_secs(5));
        let later = t0 + MAX_AGE + Duration::from_secs(1);
        assert_eq!(
            s.estimate_at(later),
            (Duration::from_millis(300), Duration::from_millis(300))
        );
        for _ in 0..4 {
            s.record_at(later, Duration::from_millis(100));
        }
        assert_eq!(
            s.estimate_at(later).1,
            Duration::from_millis(100),
            "only the recent ones"
        );
    }
}
