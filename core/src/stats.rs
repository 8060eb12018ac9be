//! Statistics used on the request path, in the policy, in evaluation and in the bench: nearest-rank quantiles,
//! softmax, argmax, EWMA, and the one windowed service-time estimate ([`ServiceTimes`]) that deadline
//! prediction, backend selection, the brownout ladder and the console read.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The 0-based index of the `q` quantile by nearest rank among `n` sorted values (`n` ≥ 1): the smallest
/// value with at least a fraction `q` of the values at or below it. `q` is clamped to [0, 1].
pub fn rank_index(n: usize, q: f64) -> usize {
    ((q.clamp(0.0, 1.0) * n as f64).ceil() as usize).clamp(1, n.max(1)) - 1
}

/// The `q` quantile (nearest rank) of `sorted` (ascending), or `None` when it is empty.
pub fn quantile_sorted<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    (!sorted.is_empty()).then(|| sorted[rank_index(sorted.len(), q)])
}

/// The `q` quantile (nearest rank) of `values` in any order (a selection, not a sort), or `None` when empty.
pub fn quantile(mut values: Vec<f64>, q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let at = rank_index(values.len(), q);
    let (_, v, _) = values.select_nth_unstable_by(at, f64::total_cmp);
    Some(*v)
}

/// Softmax of `logits / temperature`.
pub fn softmax(logits: &[f32], temperature: f64) -> Vec<f32> {
    let t = temperature as f32;
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = logits.iter().map(|&z| ((z - max) / t).exp()).collect();
    let sum: f32 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

/// Index and value of the largest entry, the first on ties (`(0, −∞)` for an empty slice).
pub fn argmax(p: &[f32]) -> (usize, f32) {
    p.iter()
        .copied()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |best, (i, v)| {
            if v > best.1 {
                (i, v)
            } else {
                best
            }
        })
}

/// One step of an exponentially weighted moving average: `alpha` of the new sample, the rest of the old
/// value; the first sample (`old` = `None`) is taken as it is.
pub fn ewma(old: Option<f64>, x: f64, alpha: f64) -> f64 {
    match old {
        Some(o) => alpha * x + (1.0 - alpha) * o,
        None => x,
    }
}

/// Samples kept per job kind.
pub const WINDOW: usize = 128;
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

    /// Whether the window holds [`MIN_SAMPLES`] samples younger than [`MAX_AGE`]: the estimate is measured,
    /// not the prior.
    pub fn measured(&self) -> bool {
        let now = Instant::now();
        self.window.lock().is_ok_and(|w| {
            w.iter()
                .filter(|(at, _)| now.saturating_duration_since(*at) <= MAX_AGE)
                .count()
                >= MIN_SAMPLES
        })
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

/// (mean, P95) of a non-empty set of durations.
fn mean_p95(mut v: Vec<Duration>) -> (Duration, Duration) {
    if v.is_empty() {
        return (Duration::ZERO, Duration::ZERO);
    }
    let mean = v.iter().sum::<Duration>() / v.len() as u32;
    // The nearest-rank P95 by selection (linear), not a sort: this runs per alternative per escalation.
    let at = rank_index(v.len(), 0.95);
    let (_, p95, _) = v.select_nth_unstable(at);
    (mean, *p95)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn nearest_rank_quantiles() {
        let v: Vec<u32> = (1..=10).collect();
        assert_eq!(quantile_sorted(&v, 0.5), Some(5));
        assert_eq!(quantile_sorted(&v, 0.95), Some(10));
        assert_eq!(quantile_sorted(&v, 0.0), Some(1));
        assert_eq!(quantile_sorted(&v, 1.0), Some(10));
        assert_eq!(quantile_sorted(&v, 7.0), Some(10));
        assert_eq!(quantile_sorted::<u32>(&[], 0.5), None);
        let shuffled = vec![3.0, 9.0, 1.0, 10.0, 2.0, 8.0, 4.0, 7.0, 5.0, 6.0];
        assert_eq!(quantile(shuffled, 0.9), Some(9.0));
        assert_eq!(quantile(Vec::new(), 0.5), None);
        assert_eq!(rank_index(1, 0.99), 0);
    }

    #[test]
    fn softmax_argmax_ewma() {
        let p = softmax(&[1.0, 2.0, 3.0], 1.0);
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(p[2] > p[1] && p[1] > p[0]);
        let flat = softmax(&[1.0, 2.0, 3.0], 1e6);
        assert!(flat.iter().all(|x| (x - 1.0 / 3.0).abs() < 1e-4));
        assert_eq!(argmax(&[0.1, 0.5, 0.5]), (1, 0.5));
        assert_eq!(argmax(&[]).0, 0);
        assert_eq!(ewma(None, 4.0, 0.3), 4.0);
        assert!((ewma(Some(10.0), 0.0, 0.3) - 7.0).abs() < 1e-12);
    }
}
