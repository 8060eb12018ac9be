//! The console's time series: every 5 s the server keeps what an operator watches while tuning — θ_eff (each
//! cascade stage's too), the
//! escalated and degraded shares, each channel's P95 of the last minute, the brownout step — for the last
//! 15 minutes (180 points), served with `/admin/console` and drawn by the page.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::model::outcome::{Channel, Decision};

/// Time between points.
pub(crate) const PERIOD: Duration = Duration::from_secs(5);
/// Points kept (15 minutes).
pub(crate) const KEEP: usize = 180;

/// One point of the series.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Point {
    /// Unix time, milliseconds.
    pub t_ms: u64,
    pub theta_eff: f64,
    /// Each cascade stage's θ_eff (stages after the first), by `route/stage`.
    pub stage_theta: BTreeMap<String, f64>,
    pub escalated_share: f64,
    /// Degraded answers among the decisions of the last minute.
    pub degraded_share: f64,
    /// Each channel's P95 over the last minute, ms (`null`: no answer in it).
    pub p95_ms: BTreeMap<&'static str, Option<f64>>,
    pub brownout: u8,
}

/// The series.
#[derive(Debug, Default)]
pub(crate) struct History {
    points: Mutex<VecDeque<Point>>,
    last: Mutex<Option<Instant>>,
}

/// Each channel's P95 latency among `recent` decisions younger than `window`, ms.
pub(crate) fn p95_by_channel(
    recent: &[Decision],
    now: Instant,
    window: Duration,
) -> BTreeMap<&'static str, Option<f64>> {
    Channel::ALL
        .iter()
        .map(|c| {
            let v: Vec<f64> = recent
                .iter()
                .filter(|d| d.channel == c.as_str() && d.age(now) < window)
                .map(|d| d.latency_ms)
                .collect();
            (c.as_str(), tiergate_core::stats::quantile(v, 0.95))
        })
        .collect()
}

impl History {
    /// Whether a point is due at `now` (the first at once, then every [`PERIOD`]).
    pub(crate) fn due(&self, now: Instant) -> bool {
        self.last
            .lock()
            .is_ok_and(|l| l.is_none_or(|t| now.saturating_duration_since(t) >= PERIOD))
    }

    /// Adds a point taken at `now`; the oldest goes past [`KEEP`].
    pub(crate) fn push(&self, now: Instant, mut p: Point) {
        p.t_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        if let Ok(mut l) = self.last.lock() {
            *l = Some(now);
        }
        if let Ok(mut q) = self.points.lock() {
            if q.len() == KEEP {
                q.pop_front();
            }
            q.push_back(p);
        }
    }

    /// The points, oldest first.
    pub(crate) fn points(&self) -> Vec<Point> {
        self.points
            .lock()
            .map(|q| q.iter().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(theta: f64) -> Point {
        Point {
            t_ms: 0,
            theta_eff: theta,
            stage_theta: BTreeMap::new(),
            escalated_share: 0.0,
            degraded_share: 0.0,
            p95_ms: BTreeMap::new(),
            brownout: 0,
        }
    }

    #[test]
    fn a_point_every_period_and_fifteen_minutes_kept() {
        let h = History::default();
        let t0 = Instant::now();
        assert!(h.due(t0), "the first at once");
        h.push(t0, point(0.1));
        assert!(!h.due(t0 + Duration::from_secs(4)));
        assert!(h.due(t0 + PERIOD));
        for i in 0..KEEP + 5 {
            h.push(t0, point(i as f64));
        }
        let p = h.points();
        assert_eq!(p.len(), KEEP);
        assert_eq!(p[0].theta_eff, 5.0, "the oldest went first");
        assert!(p[0].t_ms > 0);
    }
}
