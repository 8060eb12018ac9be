//! A checked live head swap. `POST /admin/heads/{route}` names a trained head folder; the server loads it
//! beside the head in force ([`crate::state::AppState::candidate_route`]: its own prefilter, fusion and
//! out-of-scope files) and runs it in shadow on live Tier-0 traffic: each shadowed request costs the candidate
//! one forward, off the response path, and none while the prefilter's queue is above half full. After
//! `heads.shadow_requests` requests it is judged ([`judge`]) — held-out accuracy, the share it would escalate,
//! its forward's p50 — and promoted only if every check passes: the route is swapped whole
//! ([`crate::route_table::RouteTable::swap`]), so a request sees one head or the other, never half of each.
//! The head it replaced is kept for `POST /admin/heads/{route}/rollback`. Every step is an [`Event`] (the
//! audit trail at `GET /admin/heads`), a log line and a count in `tiergate_head_swaps_total`; with the Redis
//! policy store the promoted head's version and folder are published for the other replicas ([`sync_heads`]).

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tiergate_config::HeadsConfig;
use tiergate_prefilter::runtime::Prediction;

use crate::metrics as m;
use crate::state::{AppState, Route};

/// Events kept for `GET /admin/heads`.
const HISTORY: usize = 64;

/// How the candidate's held-out accuracy is known.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Accuracy {
    /// `holdout` (both heads scored on the rows of a labelled file) or `dev` (the dev accuracy each head
    /// recorded on the same draw of rows).
    pub source: String,
    pub rows: usize,
    pub current: f64,
    pub candidate: f64,
}

/// What the shadow saw so far.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ShadowStats {
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
    in_flight: usize,
}

impl ShadowStats {
    /// One request both heads classified.
    pub fn add(&mut self, current: &Prediction, candidate: &Prediction, theta: f64, agreed: bool) {
        self.requests += 1;
        self.agreed += usize::from(agreed);
        let esc = |p: &Prediction| 1.0 - f64::from(p.confidence) > theta;
        self.escalated_current += usize::from(esc(current));
        self.escalated_candidate += usize::from(esc(candidate));
        self.infer_ms_current
            .push(current.timings.infer.as_secs_f64() * 1e3);
        self.infer_ms_candidate
            .push(candidate.timings.infer.as_secs_f64() * 1e3);
    }

    /// The forwards' p50s, current and candidate, milliseconds.
    pub fn p50s(&self) -> (f64, f64) {
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
pub struct Check {
    pub name: &'static str,
    pub passed: bool,
    pub detail: String,
}

/// Judges a shadow: every check must pass for the candidate to be promoted. The p50 check allows the ratio
/// or 0.5 ms, whichever is more (sub-millisecond forwards jitter by more than 20%).
pub fn judge(cfg: &HeadsConfig, s: &ShadowStats, accuracy: Result<&Accuracy, &str>) -> Vec<Check> {
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
                "held-out accuracy {:.4} against {:.4} in force ({}, {} rows; may drop {})",
                a.candidate, a.current, a.source, a.rows, cfg.max_accuracy_drop
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
                "forward p50 {p_cand:.3} ms against {p_cur:.3} ms (at most ×{})",
                cfg.max_p50_ratio
            ),
        },
    ]
}

/// A candidate in shadow.
pub struct Shadow {
    pub route: String,
    pub dir: PathBuf,
    pub candidate: Arc<Route>,
    pub target: usize,
    started: Instant,
    timeout: Duration,
    stats: Mutex<ShadowStats>,
    /// The held-out accuracy once known (computed in the background at start), or why it cannot be.
    accuracy: Mutex<Option<Result<Accuracy, String>>>,
    notes: Vec<String>,
}

/// A step in a route's head history.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Event {
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
struct Slot {
    shadow: Option<Arc<Shadow>>,
    /// The head the last promotion (or rollback) replaced, for a rollback.
    previous: Option<Arc<Route>>,
    /// The folder of the head in force, when it came through here.
    dir: Option<PathBuf>,
}

/// The live head swaps of every route.
#[derive(Default)]
pub struct Heads {
    slots: Mutex<HashMap<String, Slot>>,
    history: Mutex<VecDeque<Event>>,
}

/// Why a head cannot be put in shadow.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Conflict(String),
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

fn now_ms() -> u64 {
    crate::ledger::now_ms()
}

impl Heads {
    fn slot<T>(&self, route: &str, f: impl FnOnce(&mut Slot) -> T) -> T {
        let mut g = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        f(g.entry(route.to_string()).or_default())
    }

    fn log(&self, e: Event) {
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
    pub fn history(&self) -> Vec<Event> {
        let h = self.history.lock().unwrap_or_else(|p| p.into_inner());
        h.iter().cloned().collect()
    }

    /// The shadow of `route`, when one runs.
    pub fn shadow_of(&self, route: &str) -> Option<Arc<Shadow>> {
        self.slot(route, |s| s.shadow.clone())
    }

    /// The folder of `route`'s head in force, when it came through a swap.
    pub fn dir_of(&self, route: &str) -> Option<PathBuf> {
        self.slot(route, |s| s.dir.clone())
    }

    /// The version of the head a rollback of `route` would put back.
    pub fn previous_version(&self, route: &str) -> Option<String> {
        self.slot(route, |s| {
            s.previous.as_ref().map(|p| p.head_version.clone())
        })
    }

    /// Whether `route` has a head to roll back to.
    pub fn can_roll_back(&self, route: &str) -> bool {
        self.slot(route, |s| s.previous.is_some())
    }

    /// Puts `candidate` (loaded from `dir`) in shadow for `route`.
    pub fn begin(
        &self,
        state: &Arc<AppState>,
        candidate: Route,
        req: &StartRequest,
    ) -> Result<Arc<Shadow>, StartError> {
        let current = state
            .routes
            .get(&candidate.name)
            .ok_or_else(|| StartError::Invalid(format!("no route `{}`", candidate.name)))?;
        let (Some(cur), Some(cand)) = (&current.prefilter, &candidate.prefilter) else {
            return Err(StartError::Invalid("this route has no head".into()));
        };
        let mut want: Vec<&String> = cur.labels().iter().collect();
        let mut got: Vec<&String> = cand.labels().iter().collect();
        want.sort();
        got.sort();
        if want != got {
            return Err(StartError::Invalid(format!(
                "the head's labels are not the route's: {} against {} (a head swap keeps the labels)",
                got.len(),
                want.len()
            )));
        }
        if candidate.head_version == current.head_version {
            return Err(StartError::Conflict(format!(
                "head {} is already in force on route `{}`",
                candidate.head_version, candidate.name
            )));
        }
        let notes = cand.trained().map(|t| t.notes.clone()).unwrap_or_default();
        let shadow = Arc::new(Shadow {
            route: candidate.name.clone(),
            dir: req.dir.clone(),
            target: req
                .requests
                .unwrap_or(state.config.heads.shadow_requests)
                .max(1),
            started: Instant::now(),
            timeout: Duration::from_secs(state.config.heads.shadow_timeout_s),
            stats: Mutex::new(ShadowStats::default()),
            accuracy: Mutex::new(None),
            notes,
            candidate: Arc::new(candidate),
        });
        let taken = self.slot(&shadow.route, |s| match &s.shadow {
            Some(other) => Err(other.candidate.head_version.clone()),
            None => {
                s.shadow = Some(shadow.clone());
                Ok(())
            }
        });
        if let Err(v) = taken {
            return Err(StartError::Conflict(format!(
                "head {v} is already in shadow on route `{}`: wait for its verdict",
                shadow.route
            )));
        }
        self.log(Event {
            at_ms: now_ms(),
            route: shadow.route.clone(),
            action: "shadow".into(),
            version: shadow.candidate.head_version.clone(),
            dir: Some(shadow.dir.clone()),
            replaced: current.head_version.clone(),
            reason: format!("{} requests", shadow.target),
        });
        spawn_accuracy(state, &current, &shadow, req.holdout.clone());
        Ok(shadow)
    }

    /// On a classified request: the candidate in shadow for `route` classifies the same text off the response
    /// path (one forward), unless its target is met or the prefilter's queue is above half full.
    pub fn shadow(
        &self,
        state: &Arc<AppState>,
        route: &Route,
        text: &str,
        pred: &Prediction,
        theta: Option<f64>,
    ) {
        let Some(shadow) = self.slot(&route.name, |s| s.shadow.clone()) else {
            return;
        };
        if shadow.started.elapsed() > shadow.timeout {
            let why = format!(
                "saw {} of {} requests in {} s",
                shadow.stats().requests,
                shadow.target,
                shadow.timeout.as_secs()
            );
            self.end(&shadow, "abandoned", why);
            return;
        }
        let (Some(cur), Some(cand)) = (&route.prefilter, &shadow.candidate.prefilter) else {
            return;
        };
        let busy =
            |p: &tiergate_prefilter::runtime::PrefilterHandle| p.queue_depth() * 2 > p.capacity();
        {
            let mut st = shadow.stats.lock().unwrap_or_else(|p| p.into_inner());
            if st.requests + st.in_flight >= shadow.target {
                return;
            }
            if busy(cur) || busy(cand) {
                st.skipped_busy += 1;
                metrics::counter!(m::SHADOW_SKIPPED_TOTAL, "route" => route.name.clone())
                    .increment(1);
                return;
            }
            st.in_flight += 1;
        }
        let top = cur.labels().get(pred.label).cloned();
        let (cand, current, text) = (cand.clone(), pred.clone(), text.to_string());
        let theta = theta.unwrap_or(1.0);
        let weak = Arc::downgrade(state);
        tokio::spawn(async move {
            let got = cand.classify(&text).await;
            let done = {
                let mut st = shadow.stats.lock().unwrap_or_else(|p| p.into_inner());
                st.in_flight -= 1;
                if let Ok(p) = &got {
                    let agreed = cand.labels().get(p.label) == top.as_ref();
                    st.add(&current, p, theta, agreed);
                }
                st.requests >= shadow.target && st.in_flight == 0
            };
            if done {
                finish(weak, shadow).await;
            }
        });
    }

    /// Ends `shadow` without promoting it.
    fn end(&self, shadow: &Arc<Shadow>, action: &str, reason: String) {
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

    /// Puts `route` in force (promoted from its shadow, or adopted from the shared store); the replaced head
    /// is kept for a rollback.
    fn promote(
        &self,
        state: &AppState,
        route: Arc<Route>,
        dir: PathBuf,
        action: &str,
        reason: String,
    ) {
        let name = route.name.clone();
        let version = route.head_version.clone();
        let Some(old) = state.routes.swap(route) else {
            return;
        };
        self.slot(&name, |s| {
            s.shadow = None;
            s.previous = Some(old.clone());
            s.dir = Some(dir.clone());
        });
        self.log(Event {
            at_ms: now_ms(),
            route: name,
            action: action.into(),
            version,
            dir: Some(dir),
            replaced: old.head_version.clone(),
            reason,
        });
    }

    /// Puts the head the last swap replaced back in force; returns the version now in force.
    pub fn roll_back(&self, state: &AppState, route: &str) -> Option<(String, String)> {
        let previous = self.slot(route, |s| s.previous.take())?;
        let version = previous.head_version.clone();
        let old = state.routes.swap(previous)?;
        self.slot(route, |s| {
            s.previous = Some(old.clone());
            s.dir = None;
        });
        self.log(Event {
            at_ms: now_ms(),
            route: route.to_string(),
            action: "rolled_back".into(),
            version: version.clone(),
            dir: None,
            replaced: old.head_version.clone(),
            reason: String::new(),
        });
        publish(state, route, &version, None);
        Some((version, old.head_version.clone()))
    }
}

impl Shadow {
    /// What it saw so far.
    pub fn stats(&self) -> ShadowStats {
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The held-out accuracy, once known.
    pub fn accuracy(&self) -> Option<Result<Accuracy, String>> {
        self.accuracy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Its state for `GET /admin/heads`.
    pub fn view(&self) -> serde_json::Value {
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

/// Works out the candidate's held-out accuracy against the head in force, in the background: on `holdout`'s
/// rows when given (both heads classify each row once), else from the dev accuracy both heads recorded on the
/// same draw of rows.
fn spawn_accuracy(
    state: &Arc<AppState>,
    current: &Arc<Route>,
    shadow: &Arc<Shadow>,
    holdout: Option<PathBuf>,
) {
    let (Some(cur), Some(cand)) = (
        current.prefilter.clone(),
        shadow.candidate.prefilter.clone(),
    ) else {
        return;
    };
    let shadow = shadow.clone();
    let _ = state;
    tokio::spawn(async move {
        let got = match holdout {
            Some(path) => on_rows(&cur, &cand, &path).await,
            None => recorded(&cur, &cand),
        };
        *shadow.accuracy.lock().unwrap_or_else(|p| p.into_inner()) = Some(got);
    });
}

/// Both heads' accuracy on the labelled rows of `path`.
async fn on_rows(
    cur: &tiergate_prefilter::runtime::PrefilterHandle,
    cand: &tiergate_prefilter::runtime::PrefilterHandle,
    path: &std::path::Path,
) -> Result<Accuracy, String> {
    let p = path.to_path_buf();
    let rows = tokio::task::spawn_blocking(move || crate::util::labelled_rows(&p))
        .await
        .map_err(|e| e.to_string())??;
    if rows.is_empty() {
        return Err(format!("{}: no labelled row", path.display()));
    }
    let (mut a, mut b) = (0usize, 0usize);
    for (text, label) in &rows {
        let right = |h: &tiergate_prefilter::runtime::PrefilterHandle, p: &Prediction| {
            h.labels().get(p.label) == Some(label)
        };
        let x = cur.classify(text).await.map_err(|e| e.to_string())?;
        let y = cand.classify(text).await.map_err(|e| e.to_string())?;
        a += usize::from(right(cur, &x));
        b += usize::from(right(cand, &y));
    }
    let n = rows.len() as f64;
    Ok(Accuracy {
        source: format!("holdout {}", path.display()),
        rows: rows.len(),
        current: a as f64 / n,
        candidate: b as f64 / n,
    })
}

/// The dev accuracies both heads recorded, when they were measured on the same draw of rows.
fn recorded(
    cur: &tiergate_prefilter::runtime::PrefilterHandle,
    cand: &tiergate_prefilter::runtime::PrefilterHandle,
) -> Result<Accuracy, String> {
    let (Some(a), Some(b)) = (cur.trained(), cand.trained()) else {
        return Err(
            "the head in force is not a trained head: give `holdout` (labelled rows) to compare on"
                .into(),
        );
    };
    match (a.split, b.split) {
        (Some(x), Some(y)) if x == y => Ok(Accuracy {
            source: "dev (the same draw of rows)".into(),
            rows: 0,
            current: a.dev_accuracy,
            candidate: b.dev_accuracy,
        }),
        _ => Err("the two heads' dev rows are not the same draw: give `holdout` (labelled rows) to compare on".into()),
    }
}

/// Judges a shadow that has seen its requests, once its accuracy is known, and promotes or refuses it.
async fn finish(state: Weak<AppState>, shadow: Arc<Shadow>) {
    let accuracy = loop {
        if let Some(a) = shadow.accuracy() {
            break a;
        }
        if shadow.started.elapsed() > shadow.timeout {
            break Err("the held-out accuracy was not known in time".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let Some(state) = state.upgrade() else { return };
    let checks = judge(
        &state.config.heads,
        &shadow.stats(),
        accuracy.as_ref().map_err(String::as_str),
    );
    let reason = checks
        .iter()
        .map(|c| {
            format!(
                "{} {}: {}",
                c.name,
                if c.passed { "ok" } else { "FAILED" },
                c.detail
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    if checks.iter().all(|c| c.passed) {
        let version = shadow.candidate.head_version.clone();
        state.heads.promote(
            &state,
            shadow.candidate.clone(),
            shadow.dir.clone(),
            "promoted",
            reason,
        );
        publish(&state, &shadow.route, &version, Some(&shadow.dir));
    } else {
        state.heads.end(&shadow, "refused", reason);
    }
}

/// What the shared store says is in force on a route.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SharedHead {
    pub version: String,
    /// The head's folder (`None`: the head the server started with, after a rollback to it).
    pub dir: Option<PathBuf>,
    pub at_ms: u64,
}

/// Publishes `route`'s head in force to the shared store (Redis policy store only).
fn publish(state: &AppState, route: &str, version: &str, dir: Option<&std::path::Path>) {
    let Some(store) = state.store.clone() else {
        return;
    };
    let rec = SharedHead {
        version: version.to_string(),
        dir: dir.map(std::path::Path::to_path_buf),
        at_ms: now_ms(),
    };
    let route = route.to_string();
    tokio::spawn(async move {
        if let Err(e) = store.set_head(&route, &rec).await {
            tracing::warn!(route, error = %e, "the promoted head was not published to the policy store");
        }
    });
}

/// Every `policy_store.sync_ms`: a route whose shared head is not the one in force here adopts it from its
/// folder (the promoting replica checked it), or keeps its own and says so (`tiergate_head_behind`, a warning
/// once per version) when this replica lacks the files; `/ready` is not affected.
pub async fn sync_heads(store: Arc<crate::store::RedisStore>, state: Weak<AppState>) {
    let mut warned: HashMap<String, String> = HashMap::new();
    loop {
        let Some(s) = state.upgrade() else { return };
        for name in s.route_order.clone() {
            let Some(route) = s.routes.get(&name) else {
                continue;
            };
            if route.prefilter.is_none() {
                continue;
            }
            let Ok(Some(shared)) = store.get_head(&name).await else {
                continue;
            };
            if shared.version == route.head_version {
                metrics::gauge!(m::HEAD_BEHIND, "route" => name.clone()).set(0.0);
                continue;
            }
            adopt(&s, &name, &shared, &mut warned).await;
        }
        let period = store.period();
        drop(s);
        tokio::time::sleep(period).await;
    }
}

async fn adopt(
    s: &Arc<AppState>,
    name: &str,
    shared: &SharedHead,
    warned: &mut HashMap<String, String>,
) {
    // A rollback elsewhere: the head this replica replaced is the one in force there.
    if s.heads.previous_version(name).as_deref() == Some(shared.version.as_str()) {
        s.heads.roll_back(s, name);
        metrics::gauge!(m::HEAD_BEHIND, "route" => name.to_string()).set(0.0);
        return;
    }
    let loaded = match &shared.dir {
        Some(dir) if dir.join("head.json").is_file() => {
            let (st, n, d) = (s.clone(), name.to_string(), dir.clone());
            match tokio::task::spawn_blocking(move || st.candidate_route(&n, &d)).await {
                Ok(Ok(r)) if r.head_version == shared.version => Ok(r),
                Ok(Ok(r)) => Err(format!(
                    "{} holds head {}, not {}",
                    dir.display(),
                    r.head_version,
                    shared.version
                )),
                Ok(Err(e)) => Err(format!("{}: {e}", dir.display())),
                Err(e) => Err(e.to_string()),
            }
        }
        Some(dir) => Err(format!("{}: no head.json on this replica", dir.display())),
        None => Err("the shared store names the start head of another replica".into()),
    };
    match loaded {
        Ok(r) => {
            let dir = shared.dir.clone().unwrap_or_default();
            s.heads.promote(
                s,
                Arc::new(r),
                dir,
                "adopted",
                "from the shared policy store".into(),
            );
            metrics::gauge!(m::HEAD_BEHIND, "route" => name.to_string()).set(0.0);
        }
        Err(why) => {
            metrics::gauge!(m::HEAD_BEHIND, "route" => name.to_string()).set(1.0);
            if warned.get(name) != Some(&shared.version) {
                tracing::warn!(route = name, version = %shared.version, "the promoted head is not served here, this replica keeps its own: {why}");
                warned.insert(name.to_string(), shared.version.clone());
            }
        }
    }
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
