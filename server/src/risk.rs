//! The error bound on the answers Tier-0 gives alone (`routing.max_error`, `mode = "risk"`): per route, the
//! θ chosen by Learn-then-Test (`tiergate_core::risk`) on its head's labelled calibration rows, cached per
//! (ε, confidence), and how it caps the policy's θ. The proof and its conditions are in docs/routing.md.

use std::sync::Mutex;

use serde::Serialize;
use tiergate_config::{RoutingConfig, RoutingMode};
use tiergate_core::risk::{choose, Choice, Row};
use tiergate_prefilter::PrefilterHandle;

/// A route's calibration rows and its cached choice.
#[derive(Debug, Default)]
pub struct RouteRisk {
    ordering: Vec<Row>,
    rows: Vec<Row>,
    cache: Mutex<Option<((u64, u64), Choice)>>,
}

/// What `/admin/routing` and `/info` show of a route's bound.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RiskView {
    /// ε.
    pub max_error: f64,
    /// 1 − δ.
    pub confidence: f64,
    /// θ the bound allows (0: every request escalates).
    pub theta: f64,
    /// Calibration rows the choice was made on.
    pub n_calibration: usize,
    /// Of them, rows with ambiguity ≤ θ, and their errors.
    pub accepted: u64,
    pub errors: u64,
    /// Clopper–Pearson upper bound on those rows' error.
    pub upper_bound: f64,
    /// Why θ is 0, when it is.
    pub note: Option<&'static str>,
}

impl RouteRisk {
    /// The rows of a route's head (`calibration.json`; none for a checkpoint or few-shot head).
    pub fn of_head(prefilter: Option<&PrefilterHandle>) -> Self {
        let cal = prefilter.and_then(PrefilterHandle::calibration);
        Self {
            ordering: cal.map(|c| c.ordering_rows()).unwrap_or_default(),
            rows: cal.map(|c| c.calibration_rows()).unwrap_or_default(),
            cache: Mutex::new(None),
        }
    }

    /// Calibration rows.
    pub fn rows(&self) -> usize {
        self.rows.len()
    }

    /// The choice for (`eps`, `confidence`), computed once per pair.
    pub fn choice(&self, eps: f64, confidence: f64) -> Choice {
        let key = (eps.to_bits(), confidence.to_bits());
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        match &*cache {
            Some((k, c)) if *k == key => c.clone(),
            _ => {
                let c = choose(&self.ordering, &self.rows, eps, 1.0 - confidence);
                if c.reason.is_some() {
                    tracing::warn!(
                        eps,
                        confidence,
                        rows = self.rows.len(),
                        reason = c.reason,
                        "risk bound: every request escalates"
                    );
                }
                *cache = Some((key, c.clone()));
                c
            }
        }
    }

    /// The θ the bound allows under `cfg`, when it sets one (`max_error`).
    pub fn theta(&self, cfg: &RoutingConfig) -> Option<f64> {
        cfg.max_error.map(|e| self.choice(e, cfg.confidence).theta)
    }

    /// The view of the bound under `cfg`, when it sets one.
    pub fn view(&self, cfg: &RoutingConfig) -> Option<RiskView> {
        let eps = cfg.max_error?;
        let c = self.choice(eps, cfg.confidence);
        Some(RiskView {
            max_error: eps,
            confidence: cfg.confidence,
            theta: c.theta,
            n_calibration: self.rows.len(),
            accepted: c.accepted,
            errors: c.errors,
            upper_bound: c.upper_bound,
            note: c.reason,
        })
    }
}

/// Starts each classified route's breach counter at 0 for both actions, so that a rate over it (the alert in
/// deploy/prometheus/rules.yml) has data before the first breach.
pub fn zero_counters(routes: &std::collections::HashMap<String, crate::app::Route>) {
    for (name, _) in routes.iter().filter(|(_, r)| r.prefilter.is_some()) {
        for action in ["degrade", "reject"] {
            metrics::counter!(crate::metrics::RISK_BREACHES_TOTAL, "route" => name.clone(), "action" => action)
                .increment(0);
        }
    }
}

/// θ in force for a request: the policy's `theta` capped by the bound's θ (`risk` mode's own θ is θ_max, so
/// there the bound's θ is θ_eff: the fewest escalations that hold it), with the bound's θ when one is set.
pub fn cap(theta: f64, bound: Option<f64>) -> f64 {
    bound.map_or(theta, |b| theta.min(b))
}

/// `risk` mode's θ before the cap: the policy's highest.
pub fn uncapped(cfg: &RoutingConfig) -> Option<f64> {
    (cfg.mode == RoutingMode::Risk).then_some(cfg.theta_max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn risk(rows: Vec<Row>) -> RouteRisk {
        RouteRisk {
            ordering: rows.clone(),
            rows,
            cache: Mutex::new(None),
        }
    }

    #[test]
    fn the_bound_caps_theta_and_is_computed_once_per_setting() {
        // Wrong only above ambiguity 0.5: ε = 5% allows θ near 0.5, never above.
        let rows: Vec<Row> = (0..2000)
            .map(|i| Row {
                ambiguity: f64::from(i) / 2000.0,
                wrong: i >= 1000,
            })
            .collect();
        let r = risk(rows);
        let cfg = RoutingConfig {
            mode: RoutingMode::Risk,
            max_error: Some(0.05),
            ..RoutingConfig::default()
        };
        let t = r.theta(&cfg).unwrap();
        assert!(t > 0.45 && t < 0.53, "{t}");
        assert_eq!(
            cap(uncapped(&cfg).unwrap(), Some(t)),
            t,
            "risk mode: θ_eff is the bound's θ"
        );
        assert_eq!(cap(0.3, Some(t)), 0.3, "a lower θ (more escalation) stands");
        assert_eq!(
            cap(0.9, Some(t)),
            t,
            "under load θ never rises above the bound's"
        );
        let v = r.view(&cfg).unwrap();
        assert!(v.upper_bound <= 0.05 && v.note.is_none(), "{v:?}");
        // No max_error: no bound.
        assert_eq!(r.theta(&RoutingConfig::default()), None);
        // A head without calibration rows escalates everything under a bound, and says why.
        let none = RouteRisk::default();
        let v = none.view(&cfg).unwrap();
        assert_eq!((v.theta, v.n_calibration), (0.0, 0));
        assert!(v.note.is_some());
    }
}
