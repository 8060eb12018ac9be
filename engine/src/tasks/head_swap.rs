//! The live head swap's steps over the server's state ([`crate::routing::heads`] holds the data and the verdict): put
//! a candidate in shadow, shadow a request, judge and promote or refuse, roll back, and share the head in force
//! with the other replicas through the Redis policy store.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tiergate_prefilter::runtime::Prediction;

use crate::metrics as m;
use crate::routing::heads::{
    judge, now_ms, Accuracy, Event, Heads, Holdout, Shadow, ShadowStats, SharedHead, StartError,
    StartRequest, MAX_HOLDOUT_BYTES, MAX_HOLDOUT_ROWS,
};
use crate::state::{AppState, Route};

impl Heads {
    /// Puts `candidate` (loaded from `dir`) in shadow for `route`, judged on `holdout` when given; a timer
    /// abandons it at `heads.shadow_timeout_s` if it has not seen its requests by then, traffic or not.
    pub(crate) fn begin(
        &self,
        state: &Arc<AppState>,
        candidate: Route,
        req: &StartRequest,
        holdout: Option<Holdout>,
    ) -> Result<Arc<Shadow>, StartError> {
        let current = state
            .routing
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
            baseline: current.head_version.clone(),
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
        spawn_accuracy(&current, &shadow, holdout);
        spawn_timer(Arc::downgrade(state), shadow.clone());
        Ok(shadow)
    }

    /// On a classified request: the candidate in shadow for `route` classifies the same text off the response
    /// path (one forward), unless its target is met or the prefilter's queue is above half full.
    pub(crate) fn shadow(
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
            return; // its timer ends it
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
        let Some(old) = state.routing.routes.swap(route) else {
            return;
        };
        let start = start_dir(state, &name);
        let cleared = self.slot(&name, |s| {
            s.previous = Some(old.clone());
            s.previous_dir = s.dir.take().or(start);
            s.dir = Some(dir.clone());
            s.shadow.take()
        });
        // A shadow of another head (an adoption or a rollback came first) was judged against a head no longer
        // in force: it ends, and says so.
        if let Some(other) = cleared.filter(|o| o.candidate.head_version != version) {
            self.log(Event {
                at_ms: now_ms(),
                route: name.clone(),
                action: "refused".into(),
                version: other.candidate.head_version.clone(),
                dir: Some(other.dir.clone()),
                replaced: String::new(),
                reason: format!(
                    "head {version} was {action} while this one was in shadow: its slot was cleared, it was \
                     judged against a head no longer in force"
                ),
            });
        }
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

    /// Puts the head the last swap replaced back in force here (the shared record is the caller's:
    /// [`roll_back_shared`], or a replica following one); returns the version now in force and the replaced.
    pub(crate) fn roll_back(&self, state: &AppState, route: &str) -> Option<(String, String)> {
        let previous = self.slot(route, |s| s.previous.take())?;
        let version = previous.head_version.clone();
        let old = state.routing.routes.swap(previous)?;
        self.slot(route, |s| {
            s.previous = Some(old.clone());
            std::mem::swap(&mut s.dir, &mut s.previous_dir);
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
        Some((version, old.head_version.clone()))
    }
}

impl Holdout {
    /// Reads `path`, refusing a file over the bounds before its rows are parsed (the size) or classified (the
    /// rows).
    pub(crate) fn read(path: &std::path::Path) -> Result<Self, String> {
        let bytes = std::fs::metadata(path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .len();
        if bytes > MAX_HOLDOUT_BYTES {
            return Err(format!(
                "{}: {bytes} bytes, more than the {MAX_HOLDOUT_BYTES} a holdout may have",
                path.display()
            ));
        }
        let rows = crate::tasks::utilization::labelled_rows(path)?;
        if rows.is_empty() {
            return Err(format!("{}: no labelled row", path.display()));
        }
        if rows.len() > MAX_HOLDOUT_ROWS {
            return Err(format!(
                "{}: {} rows, more than the {MAX_HOLDOUT_ROWS} a holdout may have",
                path.display(),
                rows.len()
            ));
        }
        Ok(Self {
            path: path.to_path_buf(),
            rows,
        })
    }
}

/// The folder of the head `route` started with, when it is a trained head's.
fn start_dir(state: &AppState, route: &str) -> Option<PathBuf> {
    let r = state
        .routing
        .resolved
        .routes
        .iter()
        .find(|r| r.name == route)?;
    match &r.head {
        tiergate_config::HeadConfig::Trained(t) => Some(t.dir.clone()),
        _ => None,
    }
}

/// `POST /admin/heads/{route}/rollback`: the replaced head goes back in force here and, with the Redis policy
/// store, in the shared record with its folder (so a replica that never held it can load it) — written only
/// if the record still names the head in force here (compare-and-set: a replica that promoted meanwhile
/// wins, and this one is told). Returns the version now in force and the replaced.
pub(crate) async fn roll_back_shared(
    state: &Arc<AppState>,
    route: &str,
) -> Result<(String, String), StartError> {
    let heads = &state.routing.heads;
    let no_previous = || {
        StartError::Conflict(format!(
            "route `{route}` has no replaced head to roll back to"
        ))
    };
    let version = heads.previous_version(route).ok_or_else(no_previous)?;
    let in_force = state
        .routing
        .routes
        .get(route)
        .map(|r| r.head_version.clone())
        .ok_or_else(|| StartError::Invalid(format!("no route `{route}`")))?;
    let rec = SharedHead {
        version,
        dir: heads.previous_dir(route),
        at_ms: now_ms(),
    };
    publish_over(state, route, &in_force, &rec).await?;
    heads.roll_back(state, route).ok_or_else(no_previous)
}

/// Writes `rec` as `route`'s shared head if the shared record still names `expected` (or none was written);
/// nothing to do without the Redis policy store.
async fn publish_over(
    state: &AppState,
    route: &str,
    expected: &str,
    rec: &SharedHead,
) -> Result<(), StartError> {
    let Some(store) = state.routing.store.clone() else {
        return Ok(());
    };
    match store.swap_head(route, expected, rec).await {
        Ok(None) => Ok(()),
        Ok(Some(other)) => Err(StartError::Conflict(format!(
            "another replica put head {} in force on route `{route}` first (this replica judged against {expected})",
            other.version
        ))),
        Err(e) => Err(StartError::Unavailable(format!(
            "the shared policy store did not answer, nothing changed: {e}"
        ))),
    }
}

/// Abandons `shadow` at its timeout unless it has seen its requests (then [`finish`] judges it, itself bounded
/// by the same timeout).
fn spawn_timer(state: Weak<AppState>, shadow: Arc<Shadow>) {
    tokio::spawn(async move {
        tokio::time::sleep(shadow.timeout).await;
        let Some(state) = state.upgrade() else { return };
        let s = shadow.stats();
        if s.requests < shadow.target {
            let why = format!(
                "saw {} of {} requests in {} s",
                s.requests,
                shadow.target,
                shadow.timeout.as_secs()
            );
            state.routing.heads.end(&shadow, "abandoned", why);
        }
    });
}

/// Works out the candidate's held-out accuracy against the head in force, in the background: on `holdout`'s
/// rows when given (both heads classify each row once), else from the dev accuracy both heads recorded on the
/// same draw of rows.
fn spawn_accuracy(current: &Arc<Route>, shadow: &Arc<Shadow>, holdout: Option<Holdout>) {
    let (Some(cur), Some(cand)) = (
        current.prefilter.clone(),
        shadow.candidate.prefilter.clone(),
    ) else {
        return;
    };
    let shadow = shadow.clone();
    tokio::spawn(async move {
        let got = match holdout {
            Some(h) => on_rows(&cur, &cand, &h).await,
            None => recorded(&cur, &cand),
        };
        *shadow.accuracy.lock().unwrap_or_else(|p| p.into_inner()) = Some(got);
    });
}

/// Both heads' accuracy on the holdout's labelled rows.
async fn on_rows(
    cur: &tiergate_prefilter::runtime::PrefilterHandle,
    cand: &tiergate_prefilter::runtime::PrefilterHandle,
    holdout: &Holdout,
) -> Result<Accuracy, String> {
    let rows = &holdout.rows;
    let (mut a, mut b) = (0usize, 0usize);
    for (text, label) in rows {
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
        source: format!("holdout {}", holdout.path.display()),
        measured: true,
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
            source: "dev accuracy each head's training recorded on the same draw of rows".into(),
            measured: false,
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
    if !checks.iter().all(|c| c.passed) {
        state.routing.heads.end(&shadow, "refused", reason);
        return;
    }
    if let Err(why) = still_judged(&state, &shadow).await {
        state
            .routing
            .heads
            .end(&shadow, "refused", format!("{reason}; {why}"));
        return;
    }
    state.routing.heads.promote(
        &state,
        shadow.candidate.clone(),
        shadow.dir.clone(),
        "promoted",
        reason,
    );
}

/// Whether `shadow` may still be promoted after its checks passed: it is still its route's shadow (no timer,
/// adoption or rollback cleared the slot), the head in force is still the baseline it was judged against, and
/// the shared record (Redis policy store) moved from that baseline to it — compare-and-set, so of two replicas
/// promoting at once one wins and the other is refused here, saying which head won.
async fn still_judged(state: &Arc<AppState>, shadow: &Arc<Shadow>) -> Result<(), String> {
    if !state.routing.heads.holds(shadow) {
        return Err(
            "its slot was cleared (a timeout, an adopted head or a rollback) before the verdict"
                .into(),
        );
    }
    let in_force = state
        .routing
        .routes
        .get(&shadow.route)
        .map(|r| r.head_version.clone())
        .unwrap_or_default();
    if in_force != shadow.baseline {
        return Err(format!(
            "the head in force changed from {} to {in_force} during the shadow: it was judged against a head no longer in force",
            shadow.baseline
        ));
    }
    let rec = SharedHead {
        version: shadow.candidate.head_version.clone(),
        dir: Some(shadow.dir.clone()),
        at_ms: now_ms(),
    };
    publish_over(state, &shadow.route, &shadow.baseline, &rec)
        .await
        .map_err(|e| e.to_string())
}

/// Every `policy_store.sync_ms`: a route whose shared head is not the one in force here adopts it from its
/// folder (the promoting replica checked it), or keeps its own and says so (`tiergate_head_behind`, a warning
/// once per version) when this replica lacks the files; `/ready` is not affected.
pub(crate) async fn sync_heads(
    store: Arc<crate::routing::store::RedisStore>,
    state: Weak<AppState>,
) {
    let mut warned: HashMap<String, String> = HashMap::new();
    loop {
        let Some(s) = state.upgrade() else { return };
        for name in s.routing.route_order.clone() {
            let Some(route) = s.routing.routes.get(&name) else {
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
    if s.routing.heads.previous_version(name).as_deref() == Some(shared.version.as_str()) {
        s.routing.heads.roll_back(s, name);
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
            s.routing.heads.promote(
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
