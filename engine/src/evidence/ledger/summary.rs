//! What the ledger says per route, for the head in force: Tier-0's silent error from labelled audits of the
//! answers it gave alone, weighted by the inverse of each audit's sampling probability (a Horvitz–Thompson
//! ratio estimate of the error over those answers) with a Clopper–Pearson interval on the Kish effective
//! sample size; the degraded answers (escalations that fell back to Tier-0) apart, as their own population;
//! and feedback per channel (self-selected: reported beside the audits, never mixed into their estimate),
//! trusted and untrusted apart, with answers under an operator's forced θ in a channel of their own.
//!
//! Evidence belongs to a head: audits are counted by the head that answered, and every figure is of one head
//! (the one in force), so a head swap starts its evidence anew.

use std::collections::BTreeMap;

use serde::Serialize;
use tiergate_core::risk::WeightedCount;

/// Confidence of the reported intervals.
pub(crate) const CONFIDENCE: f64 = 0.95;

/// The channel of audits of Tier-0's lone answers (the bound's population).
pub(crate) const TIER0: &str = "tier0";
/// The channel of audits of escalations that fell back to Tier-0.
pub(crate) const DEGRADED: &str = "degraded";

/// Feedback counts of one channel.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FeedbackCounts {
    /// Feedback from trusted tenants, and how much of it said the answer was right.
    pub trusted_n: u64,
    pub trusted_correct: u64,
    /// Feedback from the other tenants.
    pub untrusted_n: u64,
    pub untrusted_correct: u64,
}

impl FeedbackCounts {
    /// Accuracy by trusted feedback on the channel (`None` without any): untrusted feedback is reported
    /// apart and never enters it.
    pub(crate) fn accuracy(&self) -> Option<f64> {
        (self.trusted_n > 0).then(|| self.trusted_correct as f64 / self.trusted_n as f64)
    }

    /// Accuracy by untrusted feedback alone.
    pub(crate) fn untrusted_accuracy(&self) -> Option<f64> {
        (self.untrusted_n > 0).then(|| self.untrusted_correct as f64 / self.untrusted_n as f64)
    }
}

/// One route's figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RouteSummary {
    /// Decision records kept (joinable now).
    pub decisions: u64,
    /// Audit items waiting for a label, by the head that answered.
    pub pending: BTreeMap<String, u64>,
    /// Labelled audits by the head that answered, then channel ([`TIER0`], [`DEGRADED`]): weighted counts of
    /// the wrong answers (each weight 1 / the probability the item was drawn with).
    #[serde(skip)]
    pub labelled: BTreeMap<String, BTreeMap<String, WeightedCount>>,
    /// Feedback by channel.
    pub feedback: BTreeMap<String, FeedbackCounts>,
}

/// An error rate estimated from weighted audits: the estimate and its two-sided interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SilentError {
    pub estimate: f64,
    pub lower: f64,
    pub upper: f64,
    pub confidence: f64,
    /// Labelled audits it rests on.
    pub n: u64,
    /// Of them, wrong.
    pub wrong: u64,
    /// Kish's effective sample size the interval is computed on (`n` when every audit was drawn at the same
    /// rate: then the interval is the exact Clopper–Pearson one).
    pub effective_n: f64,
}

impl SilentError {
    fn of(c: &WeightedCount) -> Option<Self> {
        let (estimate, lower, upper) = c.interval(CONFIDENCE)?;
        Some(Self {
            estimate,
            lower,
            upper,
            confidence: CONFIDENCE,
            n: c.n,
            wrong: c.k,
            effective_n: c.effective_n(),
        })
    }
}

impl RouteSummary {
    /// Adds `n` feedback rows (`correct` of them right) on `channel`.
    pub fn add_feedback(&mut self, channel: &str, trusted: bool, n: u64, correct: u64) {
        let c = self.feedback.entry(channel.to_string()).or_default();
        if trusted {
            c.trusted_n += n;
            c.trusted_correct += correct;
        } else {
            c.untrusted_n += n;
            c.untrusted_correct += correct;
        }
    }

    /// Adds `n` audits waiting for a label of `head`'s answers.
    pub fn add_pending(&mut self, head: &str, n: u64) {
        *self.pending.entry(head.to_string()).or_default() += n;
    }

    /// Adds one labelled audit of `head`'s answer on `channel`, drawn with `probability`.
    pub(crate) fn add_audit(&mut self, head: &str, channel: &str, probability: f64, wrong: bool) {
        let w = if probability > 0.0 {
            1.0 / probability
        } else {
            1.0
        };
        self.slot(head, channel).add(w, wrong);
    }

    /// Adds labelled audits of `head`'s answers on `channel`, already summed.
    pub fn add_audits(&mut self, head: &str, channel: &str, c: &WeightedCount) {
        self.slot(head, channel).merge(c);
    }

    fn slot(&mut self, head: &str, channel: &str) -> &mut WeightedCount {
        self.labelled
            .entry(head.to_string())
            .or_default()
            .entry(channel.to_string())
            .or_default()
    }

    /// The labelled audits of `head` (every head's when `None`) on `channel`.
    pub(crate) fn audits(&self, head: Option<&str>, channel: &str) -> WeightedCount {
        let mut out = WeightedCount::default();
        for (h, by) in &self.labelled {
            if head.is_none_or(|want| want == h) {
                if let Some(c) = by.get(channel) {
                    out.merge(c);
                }
            }
        }
        out
    }

    /// Audits waiting for a label, of `head` (every head's when `None`).
    pub fn pending_of(&self, head: Option<&str>) -> u64 {
        self.pending
            .iter()
            .filter(|(h, _)| head.is_none_or(|want| want == h.as_str()))
            .map(|(_, n)| n)
            .sum()
    }

    /// Tier-0's silent error on the answers it gave alone, for `head`: labelled audits weighted by their
    /// sampling rate (see the module documentation), once one is labelled.
    pub fn silent_error(&self, head: Option<&str>) -> Option<SilentError> {
        SilentError::of(&self.audits(head, TIER0))
    }

    /// The same on the escalations that degraded back to Tier-0: another population, reported apart.
    pub(crate) fn degraded_error(&self, head: Option<&str>) -> Option<SilentError> {
        SilentError::of(&self.audits(head, DEGRADED))
    }

    /// The JSON the console and `/admin/feedback` show for the head in force (`head`; every head's when
    /// `None`).
    pub(crate) fn view(&self, head: Option<&str>) -> serde_json::Value {
        let feedback: serde_json::Map<String, serde_json::Value> = self
            .feedback
            .iter()
            .map(|(ch, c)| {
                (
                    ch.clone(),
                    serde_json::json!({
                        "n": c.trusted_n, "accuracy": c.accuracy(),
                        "trusted_n": c.trusted_n, "trusted_correct": c.trusted_correct,
                        "untrusted_n": c.untrusted_n, "untrusted_correct": c.untrusted_correct,
                        "untrusted_accuracy": c.untrusted_accuracy(),
                    }),
                )
            })
            .collect();
        let (tier0, degraded) = (self.audits(head, TIER0), self.audits(head, DEGRADED));
        let mut other = WeightedCount::default();
        for ch in [TIER0, DEGRADED] {
            other.merge(&self.audits(None, ch));
        }
        let this = tier0.n + degraded.n;
        serde_json::json!({
            "decisions": self.decisions,
            "head": head,
            "audits": {
                "pending": self.pending_of(head),
                "labelled": tier0.n,
                "wrong": tier0.k,
                "degraded_labelled": degraded.n,
                "degraded_wrong": degraded.k,
                "other_heads_labelled": other.n - this,
                "other_heads_pending": self.pending_of(None) - self.pending_of(head),
            },
            "silent_error": self.silent_error(head),
            "silent_error_population": "Tier-0's lone answers (not escalated) of the head in force, each audit weighted by 1 / its sampling rate; degraded answers apart",
            "degraded_error": self.degraded_error(head),
            "feedback": feedback,
            "feedback_note": "n and accuracy count trusted feedback only; untrusted is reported apart; answers under a forced θ are the `forced` channel",
        })
    }
}

/// Every route's figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    pub routes: BTreeMap<String, RouteSummary>,
}

impl Summary {
    /// Route `name`'s figures, created empty.
    pub fn route(&mut self, name: &str) -> &mut RouteSummary {
        self.routes.entry(name.to_string()).or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_silent_error_has_an_exact_interval_at_a_constant_rate() {
        let mut r = RouteSummary::default();
        assert_eq!(r.silent_error(Some("h1")), None);
        for i in 0..100 {
            r.add_audit("h1", TIER0, 0.25, i % 20 == 0);
        }
        let e = r.silent_error(Some("h1")).unwrap();
        assert!((e.estimate - 0.05).abs() < 1e-12);
        assert!(
            (e.lower - 0.016_431).abs() < 1e-5 && (e.upper - 0.112_835).abs() < 1e-5,
            "{e:?}"
        );
        assert_eq!((e.n, e.wrong), (100, 5));
        r.add_feedback("tier0", true, 3, 2);
        r.add_feedback("tier0", false, 1, 1);
        assert_eq!(
            r.feedback["tier0"].accuracy(),
            Some(2.0 / 3.0),
            "trusted only"
        );
        assert_eq!(r.feedback["tier0"].untrusted_accuracy(), Some(1.0));
        let v = r.view(Some("h1"));
        assert_eq!(v["feedback"]["tier0"]["n"], 3);
        assert_eq!(v["feedback"]["tier0"]["untrusted_n"], 1);
    }

    /// Audits drawn at two rates are weighted: the estimate is the traffic's error, not the sample's share.
    #[test]
    fn audits_at_two_rates_are_weighted() {
        let mut r = RouteSummary::default();
        for _ in 0..50 {
            r.add_audit("h", TIER0, 0.5, false);
        }
        for i in 0..50 {
            r.add_audit("h", TIER0, 0.05, i % 5 == 0);
        }
        let e = r.silent_error(Some("h")).unwrap();
        assert!((e.estimate - 200.0 / 1100.0).abs() < 1e-12, "{e:?}");
        assert!(e.effective_n < 100.0);
    }

    /// Only the head in force counts; degraded answers are apart; a new head starts with no evidence.
    #[test]
    fn evidence_belongs_to_a_head_and_degraded_answers_are_apart() {
        let mut r = RouteSummary::default();
        for i in 0..10 {
            r.add_audit("old", TIER0, 1.0, i < 5);
        }
        r.add_audit("new", TIER0, 1.0, false);
        r.add_audit("new", DEGRADED, 1.0, true);
        r.add_pending("old", 3);
        r.add_pending("new", 1);
        let e = r.silent_error(Some("new")).unwrap();
        assert_eq!((e.n, e.wrong, e.estimate), (1, 0, 0.0));
        assert_eq!(r.silent_error(None).unwrap().n, 11);
        assert_eq!(r.degraded_error(Some("new")).unwrap().wrong, 1);
        assert_eq!(r.silent_error(Some("newer")), None, "a swap starts anew");
        let v = r.view(Some("new"));
        assert_eq!(v["audits"]["labelled"], 1);
        assert_eq!(v["audits"]["degraded_labelled"], 1);
        assert_eq!(v["audits"]["other_heads_labelled"], 10);
        assert_eq!(v["audits"]["pending"], 1);
        assert_eq!(v["audits"]["other_heads_pending"], 3);
    }
}
