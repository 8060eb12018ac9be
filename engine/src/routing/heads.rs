//! A checked live head swap. `POST /admin/heads/{route}` names a trained head folder; the server loads it
//! beside the head in force ([`crate::state::AppState::candidate_route`]: its own prefilter, fusion and
//! out-of-scope files) and runs it in shadow on live Tier-0 traffic: each shadowed request costs the candidate
//! one forward, off the response path, and none while the prefilter's queue is above half full. After
//! `heads.shadow_requests` requests it is judged ([`judge`]) — held-out accuracy, the share it would escalate,
//! its forward's p50 — and promoted only if every check passes: the route is swapped whole
//! ([`crate::routing::route_table::RouteTable::swap`]), so a request sees one head or the other, never half of each.
//! The head it replaced is kept for `POST /admin/heads/{route}/rollback`. Every step is an [`Event`] (the
//! audit trail at `GET /admin/heads`), a log line and a count in `tiergate_head_swaps_total`; with the Redis
//! policy store the promoted head's version and folder are published for the other replicas. What touches
//! the state (start, shadow, promote, roll back, share) is in [`crate::tasks::head_swap`]; this file holds the data and
//! the verdict.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tiergate_config::HeadsConfig;
use tiergate_prefilter::runtime::Prediction;

use crate::metrics as m;
use crate::routing::route::Route;

/// Events kept for `GET /admin/heads`.
const HISTORY: usize = 64;

/// The most requests a shadow may be asked to see (each costs the candidate one forward).
pub(crate) const MAX_SHADOW_REQUESTS: usize = 100_000;
/// The largest holdout file read (both heads classify each of its rows).
pub(crate) const MAX_HOLDOUT_BYTES: u64 = 8 << 20;
/// The most rows a holdout file may have.
pub(crate) const MAX_HOLDOUT_ROWS: usize = 20_000;

/// How the candidate's held-out accuracy is known.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct Accuracy {
    /// `holdout` (both heads scored on the rows of a labelled file) or `dev` (the dev accuracy each head
    /// recorded on the same draw of rows).
    pub source: String,
    /// Whether this server measured it (a holdout), or it is what each head's training recorded of itself:
    /// the candidate's own claim.
    pub measured: bool,
    pub rows: usize,
    pub current: f64,
    pub candidate: f64,
}

/// What the shadow saw so far.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub(crate) struct ShadowStats {
    /// Requests both heads classified.
    pub requests: usize,
    /// Of them, the ones where both gave the same top label.
    pub agreed: usize,
    /// Of them, the ones each head would escalate at the θ the request was decided with.
    pub escalated_current: usize,
    pub escalated_candidate: usize,
    /// Requests not shadowed because the prefilter's queue was above half full.
    pub skipped_busy: usize,
    #[serde(skip)]
    infer_ms_current: Vec<f64>,
    #[serde(skip)]
    infer_ms_candidate: Vec<f64>,
    #[serde(skip)]
    pub(crate) in_flight: usize,
}

impl ShadowStats {
    /// One request both heads classified.
    pub(crate) fn add(
        &mut self,
        current: &Prediction,
        candidate: &Prediction,
        theta: f64,
        agreed: bool,
    ) {
        self.requests += 1;
        self.agreed += usize::from(agreed);
        let esc = |p: &Prediction| 1.0 - f64::from(p.confidence) > theta;
        self.escalated_current += usize::from(esc(current));
        self.escalated_candidate += usize::from(esc(candidate));
        // Per row of its batch: the heads batch apart (the one in force with the live traffic, the candidate
        // with the shadowed requests), and a batch's forward grows with its rows.
        let per_row =
            |p: &Prediction| p.timings.infer.as_secs_f64() * 1e3 / p.batch_size.max(1) as f64;
        self.infer_ms_current.push(per_row(current));
        self.infer_ms_candidate.push(per_row(candidate));
    }

    /// The forwards' p50s per row of their batch, current and candidate, milliseconds.
    pub(crate) fn p50s(&self) -> (f64, f64) {
        (p50(&self.infer_ms_current), p50(&self.infer_ms_candidate))
    }
}

fn p50(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// One check of the verdict.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct Check {
    pub name: &'static str,
    pub passed: bool,
    pub detail: String,
}

/// Judges a shadow: every check must pass for the candidate to be promoted. The p50 check allows the ratio
/// or 0.5 ms, whichever is more (sub-millisecond forwards jitter by more than 20%).
pub(crate) fn judge(
    cfg: &HeadsConfig,
    s: &ShadowStats,
    accuracy: Result<&Accuracy, &str>,
) -> Vec<Check> {
    let n = s.requests.max(1) as f64;
    let (cur, cand) = (
        s.escalated_current as f64 / n,
        s.escalated_candidate as f64 / n,
    );
    let (p_cur, p_cand) = s.p50s();
    let accuracy = match accuracy {
        Ok(a) => Check {
            name: "accuracy",
            passed: a.candidate >= a.current - cfg.max_accuracy_drop,
            detail: format!(
                "{} accuracy {:.4} against {:.4} in force ({}, {} rows; may drop {})",
                if a.measured {
                    "held-out"
                } else {
                    "recorded (the heads' own claim, not measured here)"
                },
                a.candidate,
                a.current,
                a.source,
                a.rows,
                cfg.max_accuracy_drop
            ),
        },
        Err(why) => Check {
            name: "accuracy",
            passed: false,
            detail: why.to_string(),
        },
    };
    vec![
        accuracy,
        Check {
            name: "escalated_share",
            passed: cand <= cur + cfg.max_escalated_increase,
            detail: format!(
                "would escalate {:.1}% of {} requests against {:.1}% (may rise {:.1} points)",
                cand * 100.0,
                s.requests,
                cur * 100.0,
                cfg.max_escalated_increase * 100.0
            ),
        },
        Check {
            name: "p50",
            passed: p_cand <= (p_cur * cfg.max_p50_ratio).max(p_cur + 0.5),
            detail: format!(
                "forward p50 {p_cand:.3} ms a row against {p_cur:.3} ms (at most ×{})",
                cfg.max_p50_ratio
            ),
        },
    ]
}

/// A candidate in shadow.
pub(crate) struct Shadow {
    pub route: String,
    pub dir: PathBuf,
    pub candidate: Arc<Route>,
    /// The head in force it is judged against: promoted only while that is still the one in force.
    pub baseline: String,
    pub target: usize,
    pub(crate) started: Instant,
    pub(crate) timeout: Duration,
    pub(crate) stats: Mutex<ShadowStats>,
    /// The held-out accuracy once known (computed in the background at start), or why it cannot be.
    pub(crate) accuracy: Mutex<Option<Result<Accuracy, String>>>,
    pub(crate) notes: Vec<String>,
}

/// A step in a route's head history.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Event {
    pub at_ms: u64,
    pub route: String,
    /// `shadow`, `promoted`, `refused`, `abandoned`, `rolled_back`, `adopted`.
    pub action: String,
    /// The head version the event is about.
    pub version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
    /// The version in force before it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub replaced: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

#[derive(Default)]
pub(crate) struct Slot {
    pub(crate) shadow: Option<Arc<Shadow>>,
    /// A start is loading a candidate (concurrent starts are refused before they load one).
    pub(crate) starting: bool,
    /// The head the last promotion (or rollback) replaced, for a rollback.
    pub(crate) previous: Option<Arc<Route>>,
    /// Its folder, published with a rollback so that a replica that never held it can load it.
    pub(crate) previous_dir: Option<PathBuf>,
    /// The folder of the head in force, when it came through here.
    pub(crate) dir: Option<PathBuf>,
}

/// A route's start in progress: while it lives, other starts on the route are refused.
pub(crate) struct Starting<'a> {
    heads: &'a Heads,
    route: String,
}

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        self.heads.slot(&self.route, |s| s.starting = false);
    }
}

/// The live head swaps of every route.
#[derive(Default)]
pub(crate) struct Heads {
    slots: Mutex<HashMap<String, Slot>>,
    history: Mutex<VecDeque<Event>>,
    /// Whether any route has a shadow: without one, a classified request takes no lock here.
    shadowing: std::sync::atomic::AtomicBool,
}

/// Why a head cannot be put in shadow.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StartError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Conflict(String),
    /// The shared store did not answer: nothing changed (replicas must not diverge).
    #[error("{0}")]
    Unavailable(String),
}

/// A holdout file's labelled rows, read within [`MAX_HOLDOUT_BYTES`] and [`MAX_HOLDOUT_ROWS`]
/// (`Holdout::read`, in [`crate::tasks::head_swap`]).
#[derive(Debug, Clone)]
pub(crate) struct Holdout {
    pub path: PathBuf,
    pub rows: Vec<(String, String)>,
}

/// What `POST /admin/heads/{route}` asks.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartRequest {
    /// A `tiergate train` / `distill` folder on this server.
    pub dir: PathBuf,
    /// Requests to shadow (default `heads.shadow_requests`).
    #[serde(default)]
    pub requests: Option<usize>,
    /// A labelled file (CSV `text,category` or JSONL `text`,`label`) both heads are scored on.
    #[serde(default)]
    pub holdout: Option<PathBuf>,
}

pub(crate) fn now_ms() -> u64 {
    crate::model::request::unix_ms()
}

impl Heads {
    /// Claims `route` for a start before its candidate is loaded: refused while a shadow runs or another start
    /// loads one.
    pub(crate) fn claim(&self, route: &str) -> Result<Starting<'_>, StartError> {
        self.slot(route, |s| match (&s.shadow, s.starting) {
            (Some(other), _) => Err(StartError::Conflict(format!(
                "head {} is already in shadow on route `{route}`: wait for its verdict",
                other.candidate.head_version
            ))),
            (None, true) => Err(StartError::Conflict(format!(
                "another start on route `{route}` is loading its head"
            ))),
            (None, false) => {
                s.starting = true;
                Ok(())
            }
        })?;
        Ok(Starting {
            heads: self,
            route: route.to_string(),
        })
    }

    /// Whether `shadow` is still the one in its route's slot (not ended, timed out or cleared by an adoption).
    pub(crate) fn holds(&self, shadow: &Arc<Shadow>) -> bool {
        self.peek(&shadow.route, |s| {
            s.shadow.as_ref().is_some_and(|x| Arc::ptr_eq(x, shadow))
        })
        .unwrap_or(false)
    }

    /// The folder a rollback of `route` would return to, when known.
    pub(crate) fn previous_dir(&self, route: &str) -> Option<PathBuf> {
        self.peek(route, |s| s.previous_dir.clone()).flatten()
    }

    /// Changes `route`'s slot (and keeps [`Heads::shadowing`] in step).
    pub(crate) fn slot<T>(&self, route: &str, f: impl FnOnce(&mut Slot) -> T) -> T {
        let mut g = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let out = f(g.entry(route.to_string()).or_default());
        let any = g.values().any(|s| s.shadow.is_some());
        self.shadowing
            .store(any, std::sync::atomic::Ordering::Release);
        out
    }

    /// Reads `route`'s slot (nothing created for a route that has none).
    fn peek<T>(&self, route: &str, f: impl FnOnce(&Slot) -> T) -> Option<T> {
        let g = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        g.get(route).map(f)
    }

    pub(crate) fn log(&self, e: Event) {
        let outcome = e.action.clone();
        tracing::info!(target: "tiergate::audit", route = %e.route, action = %e.action, version = %e.version,
            replaced = %e.replaced, reason = %e.reason, "head");
        if outcome != "shadow" {
            metrics::counter!(m::HEAD_SWAPS_TOTAL, "route" => e.route.clone(), "outcome" => outcome)
                .increment(1);
        }
        let mut h = self.history.lock().unwrap_or_else(|p| p.into_inner());
        if h.len() == HISTORY {
            h.pop_front();
        }
        h.push_back(e);
    }

    /// The events so far, oldest first.
    pub(crate) fn history(&self) -> Vec<Event> {
        let h = self.history.lock().unwrap_or_else(|p| p.into_inner());
        h.iter().cloned().collect()
    }

    /// The shadow of `route`, when one runs.
    pub(crate) fn shadow_of(&self, route: &str) -> Option<Arc<Shadow>> {
        if !self.shadowing.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        self.peek(route, |s| s.shadow.clone()).flatten()
    }

    /// The folder of `route`'s head in force, when it came through a swap.
    pub(crate) fn dir_of(&self, route: &str) -> Option<PathBuf> {
        self.peek(route, |s| s.dir.clone()).flatten()
    }

    /// The version of the head a rollback of `route` would put back.
    pub(crate) fn previous_version(&self, route: &str) -> Option<String> {
        self.peek(route, |s| {
            s.previous.as_ref().map(|p| p.head_version.clone())
        })
        .flatten()
    }

    /// Whether `route` has a head to roll back to.
    pub(crate) fn can_roll_back(&self, route: &str) -> bool {
        self.peek(route, |s| s.previous.is_some()).unwrap_or(false)
    }

    /// Ends `shadow` without promoting it.
    pub(crate) fn end(&self, shadow: &Arc<Shadow>, action: &str, reason: String) {
        let ours = self.slot(&shadow.route, |s| {
            let ours = s.shadow.as_ref().is_some_and(|x| Arc::ptr_eq(x, shadow));
            if ours {
                s.shadow = None;
            }
            ours
        });
        if ours {
            self.log(Event {
                at_ms: now_ms(),
                route: shadow.route.clone(),
                action: action.into(),
                version: shadow.candidate.head_version.clone(),
                dir: Some(shadow.dir.clone()),
                replaced: String::new(),
                reason,
            });
        }
    }
}

impl Shadow {
    /// What it saw so far.
    pub(crate) fn stats(&self) -> ShadowStats {
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The held-out accuracy, once known.
    pub(crate) fn accuracy(&self) -> Option<Result<Accuracy, String>> {
        self.accuracy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Its state for `GET /admin/heads`.
    pub(crate) fn view(&self) -> serde_json::Value {
        let s = self.stats();
        let (p_cur, p_cand) = s.p50s();
        serde_json::json!({
            "version": self.candidate.head_version, "dir": self.dir, "target": self.target,
            "seen": s, "p50_ms": {"current": p_cur, "candidate": p_cand},
            "accuracy": self.accuracy().map(|a| a.map_or_else(|e| serde_json::json!({"error": e}), |a| serde_json::json!(a))),
            "fusion_source": self.candidate.fusion.source, "notes": self.notes,
            "elapsed_s": self.started.elapsed().as_secs_f64(),
        })
    }
}

/// What the shared store says is in force on a route.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct SharedHead {
    pub version: String,
    /// The head's folder (`None`: the head the server started with, after a rollback to it).
    pub dir: Option<PathBuf>,
    pub at_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(n: usize, esc_cur: usize, esc_cand: usize, ms: (f64, f64)) -> ShadowStats {
        ShadowStats {
            requests: n,
            agreed: n,
            escalated_current: esc_cur,
            escalated_candidate: esc_cand,
            infer_ms_current: vec![ms.0; n],
            infer_ms_candidate: vec![ms.1; n],
            ..ShadowStats::default()
        }
    }

    fn acc(current: f64, candidate: f64) -> Accuracy {
        Accuracy {
            source: "dev".into(),
            measured: true,
            rows: 100,
            current,
            candidate,
        }
    }

    fn passed(c: &[Check]) -> Vec<(&'static str, bool)> {
        c.iter().map(|c| (c.name, c.passed)).collect()
    }

    #[test]
    fn each_check_holds_its_margin() {
        let cfg = HeadsConfig::default();
        let good = judge(&cfg, &stats(100, 20, 21, (5.0, 5.9)), Ok(&acc(0.80, 0.795)));
        assert_eq!(
            passed(&good),
            [("accuracy", true), ("escalated_share", true), ("p50", true)],
            "within one point, two points and 20%: {good:?}"
        );
        let worse = judge(&cfg, &stats(100, 20, 23, (5.0, 6.5)), Ok(&acc(0.80, 0.78)));
        assert_eq!(
            passed(&worse),
            [
                ("accuracy", false),
                ("escalated_share", false),
                ("p50", false)
            ],
            "{worse:?}"
        );
        let unknown = judge(&cfg, &stats(10, 0, 0, (1.0, 1.0)), Err("no common rows"));
        assert_eq!(unknown[0].detail, "no common rows");
        assert!(
            !unknown[0].passed,
            "an accuracy that cannot be compared refuses"
        );
        // A sub-millisecond forward may jitter by 0.5 ms.
        let tiny = judge(&cfg, &stats(10, 0, 0, (0.1, 0.5)), Ok(&acc(0.5, 0.5)));
        assert!(tiny[2].passed, "{tiny:?}");
    }
}
