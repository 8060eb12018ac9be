//! The routing policy: escalate iff ambiguity > θ_eff. The policy fields are swapped atomically and
//! versioned; the live state (utilisation, recent ambiguity, escalation shares, escalated latencies) feeds the
//! `load`, `target` and `slo` modes. Pure logic: every method takes `now`, so tests drive it directly.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde::Serialize;
use tiergate_config::{RoutingConfig, RoutingMode};

/// A policy version: the fields and their version number.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Versioned {
    /// The fields.
    pub cfg: RoutingConfig,
    /// Starts at 1; +1 per accepted change.
    pub version: u64,
}

#[derive(Debug, Default)]
struct Live {
    utilization: f64,
    source: &'static str,
    ambiguity: VecDeque<(Instant, f64)>,
    decisions: VecDeque<(Instant, bool)>,
    escalated_ms: VecDeque<(Instant, f64)>,
    slo_theta: Option<f64>,
    /// `target` mode's θ: (computed at, policy version, θ), recomputed at most every [`TARGET_REFRESH`].
    target_theta: Option<(Instant, u64, f64)>,
}

/// How long `target` mode's θ is reused: the quantile of up to [`MAX_SAMPLES`] samples is computed a few
/// times a second, not under the lock of every request.
const TARGET_REFRESH: Duration = Duration::from_millis(100);

const WINDOW: Duration = Duration::from_secs(60);
const MAX_SAMPLES: usize = 20_000;

/// Shared policy state.
pub(crate) struct Policy {
    current: RwLock<Arc<Versioned>>,
    live: Mutex<Live>,
}

/// The live part of `GET /admin/routing`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct LiveView {
    /// θ in force now.
    pub theta_eff: f64,
    /// Smoothed utilisation u.
    pub utilization: f64,
    /// Where u comes from now.
    pub utilization_in_use: &'static str,
    /// Share of classified requests escalated in the last 10 s.
    pub escalated_share_10s: f64,
    /// … in the last 60 s.
    pub escalated_share_60s: f64,
}

fn prune<T>(q: &mut VecDeque<(Instant, T)>, now: Instant) {
    while q
        .front()
        .is_some_and(|(t, _)| now.saturating_duration_since(*t) > WINDOW)
        || q.len() > MAX_SAMPLES
    {
        q.pop_front();
    }
}

pub(crate) use tiergate_core::stats::quantile;

impl Policy {
    /// A policy at version 1.
    pub(crate) fn new(cfg: RoutingConfig) -> Self {
        Self {
            current: RwLock::new(Arc::new(Versioned { cfg, version: 1 })),
            live: Mutex::new(Live {
                source: "none",
                ..Live::default()
            }),
        }
    }

    /// The policy in force.
    pub(crate) fn current(&self) -> Arc<Versioned> {
        self.current
            .read()
            .map_or_else(|p| p.into_inner().clone(), |g| g.clone())
    }

    /// Installs a policy decided elsewhere (the shared store) at `version`, if it is newer than the one in
    /// force (or unconditionally with `adopt`: a replica's first read of the store); returns whether it was
    /// installed. Versions never go back otherwise.
    pub(crate) fn install(&self, cfg: RoutingConfig, version: u64, adopt: bool) -> bool {
        let mut guard = self.current.write().unwrap_or_else(|p| p.into_inner());
        if !adopt && version <= guard.version {
            return false;
        }
        *guard = Arc::new(Versioned { cfg, version });
        drop(guard);
        if let Ok(mut live) = self.live.lock() {
            live.slo_theta = None;
        }
        true
    }

    /// Replaces the fields if `if_match` (when given) equals the current version; returns (old, new).
    pub(crate) fn replace(
        &self,
        cfg: RoutingConfig,
        if_match: Option<u64>,
    ) -> Result<(Arc<Versioned>, Arc<Versioned>), u64> {
        let mut guard = self.current.write().unwrap_or_else(|p| p.into_inner());
        let old = guard.clone();
        if if_match.is_some_and(|v| v != old.version) {
            return Err(old.version);
        }
        let new = Arc::new(Versioned {
            cfg,
            version: old.version + 1,
        });
        *guard = new.clone();
        drop(guard);
        if let Ok(mut live) = self.live.lock() {
            live.slo_theta = None;
        }
        Ok((old, new))
    }

    /// Records a utilisation sample (already smoothed by the sampler) and its source.
    pub(crate) fn set_utilization(&self, u: f64, source: &'static str) {
        if let Ok(mut live) = self.live.lock() {
            live.utilization = if u.is_finite() {
                u.clamp(0.0, 1.0)
            } else {
                0.0
            };
            live.source = source;
        }
    }

    /// Where u comes from now (`workers`, `nvml`, `prometheus`, `manual`, `none`).
    pub(crate) fn utilization_source(&self) -> &'static str {
        self.live.lock().map_or("none", |l| l.source)
    }

    /// θ_eff now.
    pub(crate) fn theta_eff(&self, now: Instant) -> f64 {
        let p = self.current();
        let c = &p.cfg;
        let Ok(mut live) = self.live.lock() else {
            return c.theta_base;
        };
        let clamp = |t: f64| t.clamp(c.theta_min, c.theta_max);
        match c.mode {
            RoutingMode::Static => clamp(c.theta_base),
            RoutingMode::Load => clamp(c.theta_base + c.k * live.utilization),
            RoutingMode::Target => {
                if let Some((at, version, theta)) = live.target_theta {
                    if version == p.version && now.saturating_duration_since(at) < TARGET_REFRESH {
                        return theta;
                    }
                }
                prune(&mut live.ambiguity, now);
                let recent: Vec<f64> = live.ambiguity.iter().map(|(_, a)| *a).collect();
                let theta = if recent.len() < 20 {
                    clamp(c.theta_base)
                } else {
                    quantile(recent, 1.0 - c.target_share).map_or(c.theta_base, clamp)
                };
                live.target_theta = Some((now, p.version, theta));
                theta
            }
            RoutingMode::Slo => clamp(*live.slo_theta.get_or_insert(c.theta_base)),
            // The route caps it with the bound's θ (`crate::routing::risk::cap`): the fewest escalations that hold it.
            RoutingMode::Risk => c.theta_max,
        }
    }

    /// The ambiguities of the last 60 s of (not forced) decisions.
    pub(crate) fn recent_ambiguity(&self, now: Instant) -> Vec<f64> {
        let Ok(mut live) = self.live.lock() else {
            return Vec::new();
        };
        prune(&mut live.ambiguity, now);
        live.ambiguity.iter().map(|(_, a)| *a).collect()
    }

    /// Records a routing decision on a request with ambiguity `a`.
    pub(crate) fn record_decision(&self, now: Instant, a: f64, escalated: bool) {
        if let Ok(mut live) = self.live.lock() {
            live.ambiguity.push_back((now, a));
            live.decisions.push_back((now, escalated));
            prune(&mut live.ambiguity, now);
            prune(&mut live.decisions, now);
        }
    }

    /// Records the end-to-end latency of an escalated request; in `slo` mode nudges θ (bounded steps): up by
    /// 0.02 while the p95 is over target (escalate less), down by 0.01 when it is under 80% of target.
    pub(crate) fn record_escalated_latency(&self, now: Instant, ms: f64) {
        let p = self.current();
        let c = &p.cfg;
        let Ok(mut live) = self.live.lock() else {
            return;
        };
        live.escalated_ms.push_back((now, ms));
        prune(&mut live.escalated_ms, now);
        if c.mode != RoutingMode::Slo {
            return;
        }
        let recent: Vec<f64> = live.escalated_ms.iter().map(|(_, v)| *v).collect();
        if let Some(p95) = quantile(recent, 0.95) {
            let theta = live.slo_theta.unwrap_or(c.theta_base);
            let next = if p95 > c.slo_p95_ms {
                theta + 0.02
            } else if p95 < 0.8 * c.slo_p95_ms {
                theta - 0.01
            } else {
                theta
            };
            live.slo_theta = Some(next.clamp(c.theta_min, c.theta_max));
        }
    }

    /// The live view.
    pub(crate) fn live_view(&self, now: Instant) -> LiveView {
        let theta_eff = self.theta_eff(now);
        let Ok(mut live) = self.live.lock() else {
            return LiveView {
                theta_eff,
                utilization: 0.0,
                utilization_in_use: "none",
                escalated_share_10s: 0.0,
                escalated_share_60s: 0.0,
            };
        };
        prune(&mut live.decisions, now);
        let share = |window: Duration| {
            let (mut n, mut e) = (0usize, 0usize);
            for (t, esc) in live.decisions.iter().rev() {
                if now.saturating_duration_since(*t) > window {
                    break;
                }
                n += 1;
                e += usize::from(*esc);
            }
            if n == 0 {
                0.0
            } else {
                e as f64 / n as f64
            }
        };
        LiveView {
            theta_eff,
            utilization: live.utilization,
            utilization_in_use: live.source,
            escalated_share_10s: share(Duration::from_secs(10)),
            escalated_share_60s: share(WINDOW),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiergate_config::RoutingConfig;

    fn cfg(mode: RoutingMode) -> RoutingConfig {
        RoutingConfig {
            mode,
            ..RoutingConfig::default()
        }
    }

    #[test]
    fn load_mode_follows_the_design_formula() {
        let p = Policy::new(cfg(RoutingMode::Load));
        let now = Instant::now();
        assert!((p.theta_eff(now) - 0.65).abs() < 1e-12);
        p.set_utilization(0.85, "workers");
        assert!(
            (p.theta_eff(now) - (0.65 + 0.15 * 0.85)).abs() < 1e-12,
            "≈ 0.77 at 85%"
        );
        let mut c = cfg(RoutingMode::Load);
        c.theta_max = 0.7;
        p.replace(c, None).unwrap();
        assert!(
            (p.theta_eff(now) - 0.7).abs() < 1e-12,
            "clamped to theta_max"
        );
    }

    #[test]
    fn target_mode_escalates_the_requested_share() {
        let mut c = cfg(RoutingMode::Target);
        c.target_share = 0.2;
        let p = Policy::new(c);
        let now = Instant::now();
        for i in 0..100 {
            p.record_decision(now, i as f64 / 100.0, false);
        }
        let theta = p.theta_eff(now);
        let escalated = (0..100).filter(|i| *i as f64 / 100.0 > theta).count();
        assert_eq!(escalated, 20, "θ = {theta}");
        // Reused for a moment (not recomputed per request), then recomputed from the new samples.
        for _ in 0..100 {
            p.record_decision(now, 0.99, false);
        }
        assert_eq!(p.theta_eff(now), theta);
        let later = now + TARGET_REFRESH;
        assert!(p.theta_eff(later) > theta);
    }

    #[test]
    fn quantile_is_nearest_rank() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(quantile(v.clone(), 0.5), Some(5.0));
        assert_eq!(quantile(v.clone(), 0.95), Some(10.0));
        assert_eq!(quantile(v, 0.0), Some(1.0));
        assert_eq!(quantile(vec![], 0.5), None);
    }

    #[test]
    fn slo_mode_raises_theta_while_over_target_and_stays_bounded() {
        let mut c = cfg(RoutingMode::Slo);
        c.slo_p95_ms = 1000.0;
        c.theta_max = 0.9;
        let p = Policy::new(c);
        let now = Instant::now();
        let start = p.theta_eff(now);
        for _ in 0..10 {
            p.record_escalated_latency(now, 3000.0);
        }
        let up = p.theta_eff(now);
        assert!(up > start + 0.1, "{start} -> {up}");
        for _ in 0..1000 {
            p.record_escalated_latency(now, 3000.0);
        }
        assert!(
            (p.theta_eff(now) - 0.9).abs() < 1e-9,
            "bounded by theta_max"
        );
    }

    #[test]
    fn versions_and_if_match() {
        let p = Policy::new(cfg(RoutingMode::Static));
        assert_eq!(p.current().version, 1);
        assert_eq!(p.replace(cfg(RoutingMode::Load), Some(7)).unwrap_err(), 1);
        let (old, new) = p.replace(cfg(RoutingMode::Load), Some(1)).unwrap();
        assert_eq!((old.version, new.version), (1, 2));
        assert_eq!(p.current().cfg.mode, RoutingMode::Load);
    }

    #[test]
    fn escalation_shares_over_windows() {
        let p = Policy::new(cfg(RoutingMode::Static));
        let t0 = Instant::now();
        for i in 0..10 {
            p.record_decision(t0, 0.5, i < 5);
        }
        let later = t0 + Duration::from_secs(30);
        for _ in 0..10 {
            p.record_decision(later, 0.1, false);
        }
        let v = p.live_view(later);
        assert!((v.escalated_share_10s - 0.0).abs() < 1e-12);
        assert!((v.escalated_share_60s - 0.25).abs() < 1e-12);
    }
}
