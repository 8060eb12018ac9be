//! The live head swap's steps over the server's state ([`crate::heads`] holds the data and the verdict): put
//! a candidate in shadow, shadow a request, judge and promote or refuse, roll back, and share the head in force
//! with the other replicas through the Redis policy store.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tiergate_prefilter::runtime::Prediction;

use crate::heads::{
    judge, now_ms, Accuracy, Event, Heads, Shadow, ShadowStats, SharedHead, StartError,
    StartRequest,
};
use crate::metrics as m;
use crate::state::{AppState, Route};

impl Heads {
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
        spawn_accuracy(&current, &shadow, req.holdout.clone());
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
        let Some(shadow) = self.shadow_of(&route.name) else {
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
        // Audits and feedback are evidence about the head that answered: the new head's start at none.
        tracing::info!(route = %name, version = %version, replaced = %old.head_version,
            "head in force changed: its silent error and the bound's live evidence start anew");
        self.log(Event {
            at_ms: now_ms(),
            route: name,
            action: action.into(),
            version,
            dir: Some(dir),
            replaced: old.head_version.clone(),
            reason: format!(
                "{reason}; the silent error and the bound's live evidence (audits, trusted feedback) start anew \
                 for this head"
            ),
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

/// Works out the candidate's held-out accuracy against the head in force, in the background: on `holdout`'s
/// rows when given (both heads classify each row once), else from the dev accuracy both heads recorded on the
/// same draw of rows.
fn spawn_accuracy(current: &Arc<Route>, shadow: &Arc<Shadow>, holdout: Option<PathBuf>) {
    let (Some(cur), Some(cand)) = (
        current.prefilter.clone(),
        shadow.candidate.prefilter.clone(),
    ) else {
        return;
    };
    let shadow = shadow.clone();
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
