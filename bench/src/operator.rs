//! The operator's side of a run on labelled traffic: feedback posted for a share of the answers
//! (`--feedback`), the server's pending audits labelled with the workload's gold labels as they appear
//! (`--label-audits`), and drifting traffic (`--drift-at N`: from the N-th request on each query keeps a random
//! half of its words). With them, the scrapes carry the server's estimate of Tier-0's silent error and the
//! error bound's θ, and the report shows both as the run goes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use hyper::Method;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::http::HttpClient;

/// What the operator does during the run.
#[derive(Debug, Default)]
pub struct Operator {
    /// Share of labelled answers the bench posts feedback on (`POST /v1/feedback` with the gold label).
    pub feedback: f64,
    /// Label the server's pending audits (`/admin/audits`) with the gold label of their text.
    pub label_audits: bool,
    /// From this request on, each query keeps a random half of its words.
    pub drift_at: Option<u64>,
    /// The gold label of every text sent (drifted ones included), for the audits.
    gold: Mutex<HashMap<String, String>>,
    counts: Counts,
}

/// What the operator did.
#[derive(Debug, Default)]
struct Counts {
    feedback: AtomicU64,
    feedback_failed: AtomicU64,
    audits_labelled: AtomicU64,
    audits_unknown: AtomicU64,
    label_failed: AtomicU64,
}

/// The counts, for the report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Done {
    pub feedback_posted: u64,
    pub feedback_failed: u64,
    pub audits_labelled: u64,
    /// Pending audits whose text the workload does not hold (left for a person).
    pub audits_unknown: u64,
    pub label_failed: u64,
}

impl Operator {
    /// An operator posting feedback on `feedback` of the answers, labelling audits or not, drifting the
    /// traffic from request `drift_at` on.
    pub fn new(feedback: f64, label_audits: bool, drift_at: Option<u64>) -> Self {
        Self {
            feedback,
            label_audits,
            drift_at,
            ..Self::default()
        }
    }

    /// Whether it does anything.
    pub fn active(&self) -> bool {
        self.feedback > 0.0 || self.label_audits || self.drift_at.is_some()
    }

    /// The text request `n` sends: `text`, or after `drift_at` a random half of its words; its gold label is
    /// kept for the audits.
    pub fn text(&self, text: &str, label: Option<&str>, seed: u64, n: u64) -> String {
        let out = match self.drift_at {
            Some(at) if n >= at => terse(text, seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            _ => text.to_string(),
        };
        if let (true, Some(l)) = (self.label_audits, label) {
            if let Ok(mut g) = self.gold.lock() {
                g.insert(out.clone(), l.to_string());
            }
        }
        out
    }

    /// Whether request `n` gets feedback.
    pub fn gives_feedback(&self, seed: u64, n: u64) -> bool {
        self.feedback > 0.0
            && unit(seed ^ 0xfeed ^ n.wrapping_mul(0x2545_f491_4f6c_dd1d)) < self.feedback
    }

    /// Posts feedback on completion `id`: its gold `label`.
    pub async fn post_feedback(&self, client: &HttpClient, id: &str, label: &str) {
        let body = json!({"id": id, "label": label});
        let ok = matches!(
            client
                .json(Method::POST, "/v1/feedback", client.api_key(), Some(&body))
                .await,
            Ok((200, _))
        );
        let c = if ok {
            &self.counts.feedback
        } else {
            &self.counts.feedback_failed
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Labels the pending audits of `route` every `every` until `stop`, and once more at the end.
    pub async fn label_loop(
        &self,
        admin: HttpClient,
        token: Option<String>,
        route: String,
        every: Duration,
        mut stop: watch::Receiver<bool>,
    ) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.changed() => {}
            }
            self.label_pending(&admin, token.as_deref(), &route).await;
            if *stop.borrow() {
                return;
            }
        }
    }

    async fn label_pending(&self, admin: &HttpClient, token: Option<&str>, route: &str) {
        let path = format!("/admin/audits?route={route}&limit=1000");
        let Ok((200, v)) = admin.json(Method::GET, &path, token, None).await else {
            self.counts.label_failed.fetch_add(1, Ordering::Relaxed);
            return;
        };
        for item in v["data"].as_array().into_iter().flatten() {
            let (Some(id), Some(text)) = (item["id"].as_str(), item["text"].as_str()) else {
                continue;
            };
            let gold = self.gold.lock().ok().and_then(|g| g.get(text).cloned());
            let Some(label) = gold else {
                self.counts.audits_unknown.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let body = json!({ "label": label });
            let got = admin
                .json(
                    Method::POST,
                    &format!("/admin/audits/{id}"),
                    token,
                    Some(&body),
                )
                .await;
            let c = match got {
                Ok((200, _)) => &self.counts.audits_labelled,
                _ => &self.counts.label_failed,
            };
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// What it did.
    pub fn done(&self) -> Done {
        let c = &self.counts;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Done {
            feedback_posted: n(&c.feedback),
            feedback_failed: n(&c.feedback_failed),
            audits_labelled: n(&c.audits_labelled),
            audits_unknown: n(&c.audits_unknown),
            label_failed: n(&c.label_failed),
        }
    }
}

/// The server's figures on Tier-0's lone answers for one route, read with a scrape.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Quality {
    /// Labelled audits, and the silent error they show with its 95% interval.
    pub audits_labelled: Option<u64>,
    pub silent_error: Option<f64>,
    pub silent_lower: Option<f64>,
    pub silent_upper: Option<f64>,
    /// The bound's θ in force, and its parts: on the head's calibration rows, on the audits (set while they
    /// show a breach).
    pub risk_theta: Option<f64>,
    pub theta_calibration: Option<f64>,
    pub theta_audits: Option<f64>,
}

impl Quality {
    /// From `GET /admin/feedback` and `GET /admin/routing` for `route`.
    pub fn of(feedback: &Value, routing: &Value, route: &str) -> Self {
        let f = &feedback["routes"][route];
        let r = &routing["risk"][route];
        Self {
            audits_labelled: f["audits"]["labelled"].as_u64(),
            silent_error: f["silent_error"]["estimate"].as_f64(),
            silent_lower: f["silent_error"]["lower"].as_f64(),
            silent_upper: f["silent_error"]["upper"].as_f64(),
            risk_theta: r["theta"].as_f64(),
            theta_calibration: r["theta_calibration"].as_f64(),
            theta_audits: r["theta_audits"].as_f64(),
        }
    }
}

/// `text` with a random half of its words kept, in order (one at least).
pub fn terse(text: &str, seed: u64) -> String {
    let words: Vec<&str> = text.split_whitespace().collect();
    let keep = words.len().div_ceil(2).max(1);
    let mut idx: Vec<(u64, usize)> = (0..words.len())
        .map(|i| (splitmix(seed ^ i as u64), i))
        .collect();
    idx.sort_unstable();
    let mut chosen: Vec<usize> = idx.iter().take(keep).map(|(_, i)| *i).collect();
    chosen.sort_unstable();
    chosen
        .iter()
        .filter_map(|&i| words.get(i).copied())
        .collect::<Vec<_>>()
        .join(" ")
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A uniform draw in [0, 1) from `x`.
fn unit(x: u64) -> f64 {
    (splitmix(x) >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terse_keeps_half_the_words_in_order_and_is_repeatable() {
        let t = "my card has still not arrived after two weeks";
        let a = terse(t, 7);
        assert_eq!(a.split_whitespace().count(), 5);
        let words: Vec<&str> = t.split_whitespace().collect();
        let mut at = 0;
        for w in a.split_whitespace() {
            let p = words[at..].iter().position(|x| *x == w).unwrap();
            at += p + 1;
        }
        assert_eq!(a, terse(t, 7));
        assert_ne!(a, terse(t, 8));
        assert_eq!(terse("one", 3), "one");
    }

    #[test]
    fn drift_starts_at_its_request_and_gold_labels_follow_the_text_sent() {
        let op = Operator {
            label_audits: true,
            drift_at: Some(2),
            ..Operator::default()
        };
        let t = "I lost my card yesterday in town";
        assert_eq!(op.text(t, Some("lost_card"), 1, 1), t);
        let drifted = op.text(t, Some("lost_card"), 1, 2);
        assert_eq!(drifted.split_whitespace().count(), 4);
        let g = op.gold.lock().unwrap();
        assert_eq!(g.get(t).map(String::as_str), Some("lost_card"));
        assert_eq!(g.get(&drifted).map(String::as_str), Some("lost_card"));
    }

    #[test]
    fn the_feedback_share_is_drawn_per_request() {
        let op = Operator {
            feedback: 0.2,
            ..Operator::default()
        };
        let n = (0..10_000).filter(|&n| op.gives_feedback(5, n)).count();
        assert!((1_800..2_200).contains(&n), "{n}");
        assert!(!Operator::default().gives_feedback(5, 1));
    }

    #[test]
    fn quality_reads_the_route_from_both_views() {
        let fb = json!({"routes": {"classify": {"audits": {"labelled": 40},
            "silent_error": {"estimate": 0.05, "lower": 0.01, "upper": 0.17}}}});
        let routing = json!({"risk": {"classify": {"theta": 0.2, "theta_calibration": 0.35, "theta_audits": 0.2}}});
        let q = Quality::of(&fb, &routing, "classify");
        assert_eq!(q.audits_labelled, Some(40));
        assert_eq!(q.silent_upper, Some(0.17));
        assert_eq!((q.risk_theta, q.theta_audits), (Some(0.2), Some(0.2)));
        assert_eq!(Quality::of(&fb, &routing, "other"), Quality::default());
    }
}
