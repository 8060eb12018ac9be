//! The error bound on the answers Tier-0 gives alone (`routing.max_error`, `mode = "risk"`): per route, the
//! θ chosen by Learn-then-Test (`tiergate_core::risk`) on its head's labelled calibration rows, cached per
//! (ε, confidence), and how it caps the policy's θ. The proof and its conditions are in docs/routing.md.

use std::sync::Mutex;

use serde::Serialize;
use tiergate_config::RoutingConfig;
use tiergate_core::risk::{breach, choose, choose_audited, Audited, Choice, Row};
use tiergate_prefilter::PrefilterHandle;

/// A route's calibration rows and its cached choice.
#[derive(Debug, Default)]
pub(crate) struct RouteRisk {
    ordering: Vec<Row>,
    rows: Vec<Row>,
    /// Labelled audits of this route's live traffic within the feedback window (refreshed every few
    /// seconds from the ledger).
    audits: Mutex<Vec<Audited>>,
    /// Trusted tenants' feedback on Tier-0's lone answers within the window (the same refresh).
    feedback: Mutex<Vec<Audited>>,
    cache: Mutex<Option<(ChoiceKey, Bound)>>,
    /// Why the head's calibration rows are not a sound held-out sample, when they are not.
    flaw: Option<String>,
}

/// Why θ is 0 when a head's flawed calibration rows are refused.
const FLAWED: &str =
    "the head's calibration rows are flawed (see calibration_flaw): the bound is not computed on \
                      them unless routing.allow_flawed_calibration = true; every request escalates";

/// What a cached choice was made for: ε and the confidence (their bits), and whether flawed rows were allowed.
type ChoiceKey = (u64, u64, bool);

/// The bound's θ and its two sources of evidence.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Bound {
    /// On the head's calibration rows.
    pub calibration: Choice,
    /// Of the audits that could be drawn under the calibration rows' θ: how many, how many wrong, and the
    /// p-value of "their error is at most ε" (small: the live traffic breaks the bound there).
    pub check: (u64, u64, f64),
    /// θ chosen on the audits, when they show the bound broken at the calibration rows' θ.
    pub audits: Option<Choice>,
    /// Labelled audits in the window.
    pub n_audits: usize,
    /// The same check and re-choice on trusted feedback (self-selected: it may only lower θ).
    pub feedback_check: (u64, u64, f64),
    pub feedback: Option<Choice>,
}

impl Bound {
    /// θ in force: the smallest of the three (the audits and the trusted feedback can only lower it).
    pub(crate) fn theta(&self) -> f64 {
        [&self.audits, &self.feedback]
            .into_iter()
            .flatten()
            .fold(self.calibration.theta, |t, c| t.min(c.theta))
    }
}

/// What `/admin/routing` and `/info` show of a route's bound.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct RiskView {
    /// ε.
    pub max_error: f64,
    /// 1 − δ.
    pub confidence: f64,
    /// θ the bound allows (0: every request escalates): the smaller of `theta_calibration` and
    /// `theta_audits`.
    pub theta: f64,
    /// θ on the head's calibration rows.
    pub theta_calibration: f64,
    /// θ on the labelled audits of live traffic (`None`: too few of them to show anything yet).
    pub theta_audits: Option<f64>,
    /// Labelled audits within the feedback window.
    pub n_audits: usize,
    /// Of them, those drawn under θ ≥ `theta_calibration` with ambiguity at or below it, and the wrong ones.
    pub audits_at_theta: u64,
    pub audits_wrong_at_theta: u64,
    /// The p-value of "the live error at `theta_calibration` is at most ε" on those audits.
    pub audits_p_value: f64,
    /// θ chosen on trusted feedback while it shows the bound broken (`None` otherwise).
    pub theta_feedback: Option<f64>,
    /// Trusted feedback rows under `theta_calibration`, the wrong ones, and the same p-value on them.
    pub feedback_at_theta: u64,
    pub feedback_wrong_at_theta: u64,
    pub feedback_p_value: f64,
    /// Calibration rows the choice was made on.
    pub n_calibration: usize,
    /// Why those rows are not the held-out sample the bound's proof needs, when they are not; with
    /// `calibration_flaw_allowed` false the bound refuses them (θ = 0).
    pub calibration_flaw: Option<String>,
    pub calibration_flaw_allowed: bool,
    /// Of them, rows with ambiguity ≤ θ, and their errors.
    pub accepted: u64,
    pub errors: u64,
    /// Clopper–Pearson upper bound on those rows' error.
    pub upper_bound: f64,
    /// Why θ is 0, when it is.
    pub note: Option<&'static str>,
    /// The first θ of the grid the fixed-sequence test ran over (`None` without calibration rows): a policy
    /// θ below it (load mode at low load, say) is outside the proof — answers accepted there are a subset the
    /// test never checked — and is flagged, not capped.
    pub grid_start: Option<f64>,
}

impl RiskView {
    /// Whether a θ in force lies outside the proof: above 0 and below the grid's first θ.
    pub(crate) fn outside_proof(&self, theta: f64) -> bool {
        theta > 0.0 && self.grid_start.is_some_and(|g| theta < g)
    }

    /// The θ in force once the bound caps the policy's `theta_eff`, and whether it is outside the proof.
    pub(crate) fn in_force(&self, theta_eff: f64) -> (f64, bool) {
        let theta = cap(theta_eff, Some(self.theta));
        (theta, self.outside_proof(theta))
    }
}

impl RouteRisk {
    /// The rows of a route's head (`calibration.json`; none for a checkpoint or few-shot head).
    pub(crate) fn of_head(prefilter: Option<&PrefilterHandle>) -> Self {
        let cal = prefilter.and_then(PrefilterHandle::calibration);
        Self {
            ordering: cal.map(|c| c.ordering_rows()).unwrap_or_default(),
            rows: cal.map(|c| c.calibration_rows()).unwrap_or_default(),
            audits: Mutex::new(Vec::new()),
            feedback: Mutex::new(Vec::new()),
            cache: Mutex::new(None),
            flaw: cal.and_then(|c| c.flaw()),
        }
    }

    /// Installs the labelled audits in the window (the cached choice is made again when they changed).
    pub(crate) fn set_audits(&self, audits: Vec<Audited>) {
        self.set(&self.audits, audits);
    }

    /// Installs the trusted feedback in the window.
    pub(crate) fn set_feedback(&self, feedback: Vec<Audited>) {
        self.set(&self.feedback, feedback);
    }

    fn set(&self, slot: &Mutex<Vec<Audited>>, rows: Vec<Audited>) {
        let mut held = slot.lock().unwrap_or_else(|p| p.into_inner());
        if *held != rows {
            *held = rows;
            drop(held);
            *self.cache.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }

    /// The bound for (`eps`, `confidence`), computed once per pair and set of audits. Flawed calibration rows
    /// are refused (θ = 0) unless `allow_flawed`.
    pub(crate) fn choice(&self, eps: f64, confidence: f64, allow_flawed: bool) -> Bound {
        let key = (eps.to_bits(), confidence.to_bits(), allow_flawed);
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((k, b)) = &*cache {
            if *k == key {
                return b.clone();
            }
        }
        let delta = 1.0 - confidence;
        let calibration = if self.flaw.is_some() && !allow_flawed {
            Choice {
                theta: 0.0,
                accepted: 0,
                errors: 0,
                upper_bound: 0.0,
                tested: 0,
                reason: Some(FLAWED),
            }
        } else {
            choose(&self.ordering, &self.rows, eps, delta)
        };
        let audits = self.audits.lock().map(|a| a.clone()).unwrap_or_default();
        // The audits check the calibration rows' θ on live traffic; only a breach they show at level δ
        // re-chooses θ on them (a re-choice on few audits would lower θ for lack of power, not of accuracy).
        let recheck = |rows: &[Audited]| {
            let check = breach(rows, calibration.theta, eps);
            let again = (calibration.theta > 0.0 && check.2 <= delta)
                .then(|| choose_audited(&self.ordering, rows, eps, delta));
            (check, again)
        };
        let (check, live) = recheck(&audits);
        let trusted = self.feedback.lock().map(|f| f.clone()).unwrap_or_default();
        let (feedback_check, feedback) = recheck(&trusted);
        let b = Bound {
            calibration,
            check,
            audits: live,
            n_audits: audits.len(),
            feedback_check,
            feedback,
        };
        if b.theta() == 0.0 {
            tracing::warn!(
                eps,
                confidence,
                rows = self.rows.len(),
                audits = b.n_audits,
                reason = b.calibration.reason,
                "risk bound: every request escalates"
            );
        }
        *cache = Some((key, b.clone()));
        b
    }

    /// The θ the bound allows under `cfg`, when it sets one (`max_error`).
    pub(crate) fn theta(&self, cfg: &RoutingConfig) -> Option<f64> {
        cfg.max_error.map(|e| {
            self.choice(e, cfg.confidence, cfg.allow_flawed_calibration)
                .theta()
        })
    }

    /// The view of the bound under `cfg`, when it sets one.
    pub(crate) fn view(&self, cfg: &RoutingConfig) -> Option<RiskView> {
        let eps = cfg.max_error?;
        let b = self.choice(eps, cfg.confidence, cfg.allow_flawed_calibration);
        let c = &b.calibration;
        Some(RiskView {
            max_error: eps,
            confidence: cfg.confidence,
            theta: b.theta(),
            theta_calibration: c.theta,
            theta_audits: b.audits.as_ref().map(|a| a.theta),
            n_audits: b.n_audits,
            audits_at_theta: b.check.0,
            audits_wrong_at_theta: b.check.1,
            audits_p_value: b.check.2,
            theta_feedback: b.feedback.as_ref().map(|f| f.theta),
            feedback_at_theta: b.feedback_check.0,
            feedback_wrong_at_theta: b.feedback_check.1,
            feedback_p_value: b.feedback_check.2,
            n_calibration: self.rows.len(),
            calibration_flaw: self.flaw.clone(),
            calibration_flaw_allowed: cfg.allow_flawed_calibration,
            accepted: c.accepted,
            errors: c.errors,
            upper_bound: c.upper_bound,
            grid_start: (!self.rows.is_empty())
                .then(|| {
                    tiergate_core::risk::grid(&self.ordering, eps)
                        .first()
                        .copied()
                })
                .flatten(),
            note: if b.theta() == 0.0 && c.theta > 0.0 {
                Some("the labelled audits of live traffic do not show the bound at any θ: every request escalates")
            } else {
                c.reason
            },
        })
    }
}

/// θ in force for a request: the policy's `theta` capped by the bound's θ (`risk` mode's own θ is θ_max,
/// `Policy::theta_eff`, so there the bound's θ is θ_eff: the fewest escalations that hold it).
pub(crate) fn cap(theta: f64, bound: Option<f64>) -> f64 {
    bound.map_or(theta, |b| theta.min(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiergate_config::RoutingMode;

    fn risk(rows: Vec<Row>) -> RouteRisk {
        RouteRisk {
            ordering: rows.clone(),
            rows,
            audits: Mutex::new(Vec::new()),
            feedback: Mutex::new(Vec::new()),
            cache: Mutex::new(None),
            flaw: None,
        }
    }

    /// Flawed calibration rows (in-sample halves) are refused unless the config opts in: θ = 0 with the
    /// reason, the flag in the view either way.
    #[test]
    fn flawed_calibration_rows_are_refused_unless_allowed() {
        let rows: Vec<Row> = (0..2000)
            .map(|i| Row {
                ambiguity: f64::from(i) / 2000.0,
                wrong: i >= 1000,
            })
            .collect();
        let mut r = risk(rows);
        r.flaw = Some("in-sample".into());
        let mut cfg = RoutingConfig {
            max_error: Some(0.05),
            ..RoutingConfig::default()
        };
        let v = r.view(&cfg).unwrap();
        assert_eq!(v.theta, 0.0);
        assert_eq!(v.note, Some(FLAWED));
        assert_eq!(
            (v.calibration_flaw.as_deref(), v.calibration_flaw_allowed),
            (Some("in-sample"), false)
        );
        cfg.allow_flawed_calibration = true;
        let v = r.view(&cfg).unwrap();
        assert!(v.theta > 0.45, "{v:?}");
        assert_eq!(
            (v.calibration_flaw.as_deref(), v.calibration_flaw_allowed),
            (Some("in-sample"), true)
        );
        r.flaw = None;
        cfg.allow_flawed_calibration = false;
        assert!(r.view(&cfg).unwrap().calibration_flaw.is_none());
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
            cap(
                crate::routing::policy::Policy::new(cfg.clone())
                    .theta_eff(std::time::Instant::now()),
                Some(t)
            ),
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
        // A θ below the grid's first point is outside the proof (flagged); the bound's own θ and 0 are not.
        let start = v.grid_start.unwrap();
        assert!(start > 0.0 && start <= t, "{v:?}");
        assert!(v.outside_proof(start / 2.0));
        assert!(!v.outside_proof(t) && !v.outside_proof(0.0) && !v.outside_proof(start));
        // Audits of a live traffic that is worse than the calibration rows lower θ; audits agreeing do not
        // raise it.
        let worse: Vec<Audited> = (0..2000)
            .map(|i| Audited {
                row: Row {
                    ambiguity: f64::from(i) / 4000.0,
                    wrong: i % 8 == 0,
                },
                drawn_at: t,
            })
            .collect();
        r.set_audits(worse.clone());
        let v = r.view(&cfg).unwrap();
        assert!(
            v.theta < t && v.theta_audits.is_some() && v.n_audits == 2000,
            "{v:?}"
        );
        assert_eq!(v.theta_calibration, t);
        // Trusted feedback saying the same lowers θ on its own; without either, θ is the calibration's again.
        r.set_audits(Vec::new());
        assert_eq!(r.view(&cfg).unwrap().theta, t);
        r.set_feedback(worse);
        let v = r.view(&cfg).unwrap();
        assert!(
            v.theta < t && v.theta_feedback.is_some() && v.theta_audits.is_none(),
            "{v:?}"
        );
        // No max_error: no bound.
        assert_eq!(r.theta(&RoutingConfig::default()), None);
        // A head without calibration rows escalates everything under a bound, and says why.
        let none = RouteRisk::default();
        let v = none.view(&cfg).unwrap();
        assert_eq!((v.theta, v.n_calibration), (0.0, 0));
        assert!(v.note.is_some());
    }
}
