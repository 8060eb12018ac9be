//! The LLM's second opinion on audited answers (`[feedback] audit_llm`): an answer drawn for audit is also
//! handed, without waiting, to a small background queue; one task scores it with the route's first-stage LLM
//! — the same rerank job an escalation would send, over Tier-0's candidates — and counts whether the LLM's
//! best candidate is the label Tier-0 answered. This is agreement, a proxy: it is reported beside the
//! labelled audits, never as accuracy and never as evidence for the error bound.
//!
//! The queue and the counts live here; the task that scores is [`crate::tasks::second_opinion`]. Audits are the first
//! work shed. An item is scored only when a backend of the stage has a worker slot to
//! spare after taking one ([`crate::backends::fair::Share::try_spare`]: nobody waiting, at least one slot left free for
//! escalations), its breaker is closed and the brownout ladder is at `normal`; otherwise it is dropped and
//! counted `shed`. A scoring job whose backend gets a waiting request while it runs is cancelled (`shed`
//! too). A backend with one worker slot never scores audits.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::Serialize;

use crate::metrics as m;

/// Items waiting to be scored at most; beyond, an item is shed at once.
const QUEUE: usize = 32;

/// One audited answer to score.
pub(crate) struct Item {
    pub route: String,
    pub text: String,
    /// Tier-0's candidates by label, most likely first.
    pub top: Vec<(String, f32)>,
    /// The label Tier-0 answered.
    pub answered: String,
}

/// One route's counts since this replica started.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct Agreement {
    /// Scored, and how many of those the LLM's best candidate was Tier-0's answer.
    pub scored: u64,
    pub agreed: u64,
    /// Dropped: no headroom, the queue full, or cancelled for a waiting request.
    pub shed: u64,
    /// The LLM failed or answered out of shape.
    pub failed: u64,
}

impl Agreement {
    /// Share of the scored items the LLM agreed on.
    pub(crate) fn rate(&self) -> Option<f64> {
        (self.scored > 0).then(|| self.agreed as f64 / self.scored as f64)
    }

    /// The JSON `/admin/feedback` and the console show.
    pub(crate) fn view(&self) -> serde_json::Value {
        serde_json::json!({
            "scored": self.scored, "agreed": self.agreed, "shed": self.shed, "failed": self.failed,
            "agreement": self.rate(),
            "note": "agreement between the LLM and Tier-0 on audited answers: a proxy, not accuracy",
        })
    }
}

/// How one item ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scored {
    Agreed,
    Disagreed,
    Shed,
    Failed,
}

impl Scored {
    fn as_str(self) -> &'static str {
        match self {
            Scored::Agreed => "agree",
            Scored::Disagreed => "disagree",
            Scored::Shed => "shed",
            Scored::Failed => "failed",
        }
    }
}

/// The queue's sending end and the counts.
pub(crate) struct Auditor {
    tx: flume::Sender<Item>,
    rx: Mutex<Option<flume::Receiver<Item>>>,
    counts: Mutex<BTreeMap<String, Agreement>>,
}

impl Default for Auditor {
    fn default() -> Self {
        let (tx, rx) = flume::bounded(QUEUE);
        Self {
            tx,
            rx: Mutex::new(Some(rx)),
            counts: Mutex::new(BTreeMap::new()),
        }
    }
}

impl Auditor {
    /// Hands `item` over without waiting; a full queue sheds it.
    pub(crate) fn offer(&self, item: Item) {
        if let Err(e) = self.tx.try_send(item) {
            let item = e.into_inner();
            self.count(&item.route, Scored::Shed);
        }
    }

    /// Every route's counts.
    pub(crate) fn counts(&self) -> BTreeMap<String, Agreement> {
        self.counts.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// The queue's receiving end, once (the scoring task takes it).
    pub(crate) fn take_queue(&self) -> Option<flume::Receiver<Item>> {
        self.rx.lock().ok().and_then(|mut r| r.take())
    }

    /// Counts how one item of `route` ended.
    pub(crate) fn count(&self, route: &str, s: Scored) {
        metrics::counter!(m::AUDIT_LLM_TOTAL, "route" => route.to_string(), "result" => s.as_str())
            .increment(1);
        let Ok(mut c) = self.counts.lock() else {
            return;
        };
        let a = c.entry(route.to_string()).or_default();
        match s {
            Scored::Agreed => {
                a.scored += 1;
                a.agreed += 1;
            }
            Scored::Disagreed => a.scored += 1,
            Scored::Shed => a.shed += 1,
            Scored::Failed => a.failed += 1,
        }
        if let Some(r) = a.rate() {
            metrics::gauge!(m::AUDIT_LLM_AGREEMENT, "route" => route.to_string()).set(r);
        }
    }
}

/// The LLM's best candidate: the first of the highest scores (a tie goes to Tier-0's more likely one).
pub(crate) fn best(scores: &[f32]) -> Option<usize> {
    scores
        .iter()
        .enumerate()
        .fold(None, |b: Option<(usize, f32)>, (i, &s)| match b {
            Some((_, top)) if s <= top => b,
            _ => Some((i, s)),
        })
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_best_candidate_is_the_first_highest_score() {
        assert_eq!(best(&[0.1, 0.7, 0.2]), Some(1));
        assert_eq!(
            best(&[0.5, 0.5, 0.2]),
            Some(0),
            "a tie goes to Tier-0's order"
        );
        assert_eq!(best(&[0.0, 0.0, 0.9, 0.9]), Some(2));
        assert_eq!(best(&[]), None);
    }

    #[test]
    fn a_full_queue_sheds_and_counts() {
        let a = Auditor::default();
        for _ in 0..QUEUE + 3 {
            a.offer(Item {
                route: "classify".into(),
                text: "x".into(),
                top: vec![("a".into(), 0.9)],
                answered: "a".into(),
            });
        }
        let c = a.counts();
        assert_eq!(c["classify"].shed, 3, "the queue holds {QUEUE}");
        assert_eq!(c["classify"].scored, 0);
        assert_eq!(c["classify"].rate(), None);
    }
}
