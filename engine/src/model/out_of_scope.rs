//! A route's out-of-scope outcome and the three-way decision: answer in scope, escalate, or answer that no
//! label covers the query. Pure logic; the chat handler applies it (routes/escalate.rs).

use tiergate_config::OutOfScopeConfig;
use tiergate_prefilter::oos::OosMethod;

/// The candidate index that stands for "none of these" in fused candidate lists.
pub const NONE: usize = usize::MAX;

/// A route's out-of-scope outcome, resolved against its head.
#[derive(Debug, Clone, PartialEq)]
pub struct OutOfScopeRoute {
    /// The label answered.
    pub label: String,
    /// The reply (answer routes); the label when unset.
    pub reply: Option<String>,
    /// The route's own threshold: configured, else the head's fitted one.
    pub threshold: f64,
    /// The score the head serves (`knn` from `oos.json`, else `msp`).
    pub method: OosMethod,
    /// The LLM's extra candidate.
    pub none_candidate: String,
}

impl OutOfScopeRoute {
    /// Resolves `cfg` against the head's fitted scorer (`None`: the head has no `oos.json`, so it is scored by
    /// 1 − max p and needs a configured threshold).
    pub fn resolve(
        route: &str,
        cfg: &OutOfScopeConfig,
        fitted: Option<(OosMethod, f32)>,
    ) -> anyhow::Result<Self> {
        let method = fitted.map_or(OosMethod::Msp, |(m, _)| m);
        let threshold = match (cfg.threshold, fitted) {
            (Some(t), _) => t,
            (None, Some((_, t))) => f64::from(t),
            (None, None) => anyhow::bail!(
                "route `{route}`: out_of_scope.threshold is required: its head has no fitted out-of-scope \
                 threshold (oos.json, written by `tiergate train`), so it is scored by 1 - max p"
            ),
        };
        Ok(Self {
            label: cfg.label.clone(),
            reply: cfg.reply.clone(),
            threshold,
            method,
            none_candidate: cfg.none_candidate.clone(),
        })
    }
}

/// Tier-0's out-of-scope call on one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Call {
    /// The score.
    pub score: f32,
    /// The threshold in force (the route's, or the policy's live override).
    pub threshold: f64,
    /// The uncertain band's half-width (`routing.oos_margin`).
    pub margin: f64,
}

impl Call {
    /// Above the threshold: out of scope (compared in f32, the precision scores and fitted thresholds have).
    pub(crate) fn out_of_scope(&self) -> bool {
        self.score > self.threshold as f32
    }

    /// Within the margin of the threshold: a call the LLM should check.
    pub(crate) fn uncertain(&self) -> bool {
        self.margin > 0.0 && (f64::from(self.score) - self.threshold).abs() <= self.margin
    }

    /// The mass Tier-0 gives "none of these" among the LLM's candidates: a ramp across the uncertain band
    /// (0 at its lower edge, ½ at the threshold, 1 at its upper edge); 0 or 1 without a band.
    pub(crate) fn none_mass(&self) -> f32 {
        let d = f64::from(self.score) - self.threshold;
        if self.margin > 0.0 {
            (0.5 + d / (2.0 * self.margin)).clamp(0.0, 1.0) as f32
        } else if d > 0.0 {
            1.0
        } else {
            0.0
        }
    }
}

/// Tier-0's candidates with "none of these" ([`NONE`]) among them, as the LLM and the fusion see them: the
/// labels share 1 − [`Call::none_mass`] in proportion to their probabilities; "none of these" comes first when
/// Tier-0 calls the query out of scope (it is Tier-0's answer then), else last.
pub fn with_none(top: &[(usize, f32)], call: &Call) -> Vec<(usize, f32)> {
    let none = call.none_mass();
    let sum: f32 = top.iter().map(|(_, p)| p).sum::<f32>().max(1e-12);
    let labels = top.iter().map(|&(i, p)| (i, (1.0 - none) * p / sum));
    if call.out_of_scope() {
        std::iter::once((NONE, none)).chain(labels).collect()
    } else {
        labels.chain(std::iter::once((NONE, none))).collect()
    }
}

/// What Tier-0's view of a request leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Tier-0 answers with its label.
    Answer,
    /// The LLM is asked (ambiguous label, or an uncertain out-of-scope call).
    Escalate,
    /// Tier-0 answers that no label covers the query.
    OutOfScope,
}

impl Verdict {
    /// The trace attribute's value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Verdict::Answer => "answer",
            Verdict::Escalate => "escalate",
            Verdict::OutOfScope => "out_of_scope",
        }
    }
}

/// The three-way decision: an uncertain out-of-scope call escalates; a sure one is answered out of scope; an
/// in-scope query escalates when its ambiguity is above θ. `call` is `None` on a route without an
/// out-of-scope outcome.
pub(crate) fn verdict(ambiguity: f64, theta: f64, call: Option<&Call>) -> Verdict {
    match call {
        Some(c) if c.uncertain() => Verdict::Escalate,
        Some(c) if c.out_of_scope() => Verdict::OutOfScope,
        _ if ambiguity > theta => Verdict::Escalate,
        _ => Verdict::Answer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(score: f32, threshold: f64, margin: f64) -> Call {
        Call {
            score,
            threshold,
            margin,
        }
    }

    #[test]
    fn three_ways() {
        // No out-of-scope outcome: θ alone decides.
        assert_eq!(verdict(0.2, 0.5, None), Verdict::Answer);
        assert_eq!(verdict(0.6, 0.5, None), Verdict::Escalate);
        // In scope, sure: θ decides.
        let inside = call(0.1, 0.3, 0.0);
        assert_eq!(verdict(0.2, 0.5, Some(&inside)), Verdict::Answer);
        assert_eq!(verdict(0.6, 0.5, Some(&inside)), Verdict::Escalate);
        // Out of scope, no band: answered out of scope even when ambiguous.
        let outside = call(0.5, 0.3, 0.0);
        assert_eq!(verdict(0.9, 0.5, Some(&outside)), Verdict::OutOfScope);
        assert_eq!(verdict(0.1, 0.5, Some(&outside)), Verdict::OutOfScope);
        // At the threshold exactly: in scope (scores above it are out).
        assert_eq!(
            verdict(0.1, 0.5, Some(&call(0.3, 0.3, 0.0))),
            Verdict::Answer
        );
        // Within the band either side: escalated, even when Tier-0's label is sure.
        for s in [0.25f32, 0.3, 0.349] {
            assert_eq!(
                verdict(0.0, 0.5, Some(&call(s, 0.3, 0.05))),
                Verdict::Escalate,
                "{s}"
            );
        }
        // Past the band: Tier-0's call stands.
        assert_eq!(
            verdict(0.0, 0.5, Some(&call(0.36, 0.3, 0.05))),
            Verdict::OutOfScope
        );
        assert_eq!(
            verdict(0.0, 0.5, Some(&call(0.24, 0.3, 0.05))),
            Verdict::Answer
        );
    }

    #[test]
    fn none_mass_ramps_across_the_band() {
        let m = |s: f32| call(s, 0.3, 0.1).none_mass();
        assert_eq!(m(0.1), 0.0);
        assert!((m(0.3) - 0.5).abs() < 1e-6);
        assert!((m(0.35) - 0.75).abs() < 1e-6);
        assert_eq!(m(0.5), 1.0);
        assert_eq!(call(0.31, 0.3, 0.0).none_mass(), 1.0);
        assert_eq!(call(0.29, 0.3, 0.0).none_mass(), 0.0);
    }

    #[test]
    fn none_of_these_joins_the_candidates_first_when_tier0_calls_it() {
        let top = [(2, 0.6f32), (0, 0.2)];
        let same = |a: &[(usize, f32)], b: &[(usize, f32)]| {
            a.len() == b.len()
                && a.iter()
                    .zip(b)
                    .all(|(x, y)| x.0 == y.0 && (x.1 - y.1).abs() < 1e-6)
        };
        let inside = with_none(&top, &call(0.1, 0.3, 0.0));
        assert!(
            same(&inside, &[(2, 0.75), (0, 0.25), (NONE, 0.0)]),
            "{inside:?}"
        );
        let outside = with_none(&top, &call(0.5, 0.3, 0.0));
        assert!(
            same(&outside, &[(NONE, 1.0), (2, 0.0), (0, 0.0)]),
            "{outside:?}"
        );
        // In the band: the ramp's mass, the labels share the rest.
        let near = with_none(&top, &call(0.35, 0.3, 0.1));
        assert_eq!(near[0].0, NONE);
        assert!(
            (near[0].1 - 0.75).abs() < 1e-6 && (near[1].1 - 0.1875).abs() < 1e-6,
            "{near:?}"
        );
    }

    #[test]
    fn a_head_without_a_fit_needs_a_configured_threshold() {
        let mut cfg = OutOfScopeConfig {
            label: "out_of_scope".into(),
            reply: None,
            threshold: None,
            none_candidate: "none of these".into(),
        };
        let e = OutOfScopeRoute::resolve("r", &cfg, None).unwrap_err();
        assert!(e.to_string().contains("out_of_scope.threshold"), "{e}");
        let fitted = OutOfScopeRoute::resolve("r", &cfg, Some((OosMethod::Knn, 0.25))).unwrap();
        assert_eq!((fitted.method, fitted.threshold), (OosMethod::Knn, 0.25));
        cfg.threshold = Some(0.4);
        let set = OutOfScopeRoute::resolve("r", &cfg, None).unwrap();
        assert_eq!((set.method, set.threshold), (OosMethod::Msp, 0.4));
        // A configured threshold wins over the fitted one.
        let both = OutOfScopeRoute::resolve("r", &cfg, Some((OosMethod::Knn, 0.25))).unwrap();
        assert_eq!((both.method, both.threshold), (OosMethod::Knn, 0.4));
    }
}
