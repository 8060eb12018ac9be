//! What the ledger says per route: Tier-0's silent error from labelled audits (an unbiased sample of its lone
//! answers) with a Clopper–Pearson interval, and feedback per channel (self-selected: reported beside the
//! audits, never mixed into their estimate), trusted and untrusted apart.

use std::collections::BTreeMap;

use serde::Serialize;

/// Confidence of the reported intervals.
pub const CONFIDENCE: f64 = 0.95;

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
    /// Accuracy by all feedback on the channel (`None` without any).
    pub fn accuracy(&self) -> Option<f64> {
        let n = self.trusted_n + self.untrusted_n;
        (n > 0).then(|| (self.trusted_correct + self.untrusted_correct) as f64 / n as f64)
    }
}

/// One route's figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RouteSummary {
    /// Decision records kept (joinable now).
    pub decisions: u64,
    /// Audit items waiting for a label.
    pub audits_pending: u64,
    /// Labelled audit items, and how many of them Tier-0 got wrong.
    pub audits_labelled: u64,
    pub audits_wrong: u64,
    /// Feedback by channel.
    pub feedback: BTreeMap<String, FeedbackCounts>,
}

/// Tier-0's silent error from labelled audits: the estimate and its two-sided Clopper–Pearson interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SilentError {
    pub estimate: f64,
    pub lower: f64,
    pub upper: f64,
    pub confidence: f64,
    /// Labelled audits it rests on.
    pub n: u64,
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

    /// The silent error, once an audit is labelled.
    pub fn silent_error(&self) -> Option<SilentError> {
        let (k, n) = (self.audits_wrong, self.audits_labelled);
        (n > 0).then(|| {
            let (lower, upper) = tiergate_core::risk::clopper_pearson(k, n, CONFIDENCE);
            SilentError {
                estimate: k as f64 / n as f64,
                lower,
                upper,
                confidence: CONFIDENCE,
                n,
            }
        })
    }

    /// The JSON the console and `/admin/feedback` show.
    pub fn view(&self) -> serde_json::Value {
        let feedback: serde_json::Map<String, serde_json::Value> = self
            .feedback
            .iter()
            .map(|(ch, c)| {
                (
                    ch.clone(),
                    serde_json::json!({
                        "n": c.trusted_n + c.untrusted_n, "accuracy": c.accuracy(),
                        "trusted_n": c.trusted_n, "trusted_correct": c.trusted_correct,
                        "untrusted_n": c.untrusted_n, "untrusted_correct": c.untrusted_correct,
                    }),
                )
            })
            .collect();
        serde_json::json!({
            "decisions": self.decisions,
            "audits": {"pending": self.audits_pending, "labelled": self.audits_labelled, "wrong": self.audits_wrong},
            "silent_error": self.silent_error(),
            "feedback": feedback,
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
    fn the_silent_error_has_an_exact_interval() {
        let mut r = RouteSummary::default();
        assert_eq!(r.silent_error(), None);
        r.audits_labelled = 100;
        r.audits_wrong = 5;
        let e = r.silent_error().unwrap();
        assert!((e.estimate - 0.05).abs() < 1e-12);
        assert!(
            (e.lower - 0.016_431).abs() < 1e-5 && (e.upper - 0.112_835).abs() < 1e-5,
            "{e:?}"
        );
        r.add_feedback("tier0", true, 3, 2);
        r.add_feedback("tier0", false, 1, 1);
        assert_eq!(r.feedback["tier0"].accuracy(), Some(0.75));
        assert_eq!(r.view()["feedback"]["tier0"]["trusted_n"], 3);
    }
}
