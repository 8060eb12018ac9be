//! The evidence use cases: a client's feedback on one of its answers, the audit queue an operator labels,
//! and the per-route summary of both. Each returns data or an [`EngineError`]; the door adds its auth, its
//! wire shape and its status.

use std::sync::Arc;

use serde_json::{json, Value};

use super::Engine;
use crate::error::EngineError;
use crate::evidence::ledger::{now_ms, Feedback, First, Ledger, Record, StoreError};
use crate::evidence::record::Gold;
use crate::state::AppState;
use crate::tenancy::tenants::TenantId;

/// What a client says of an answer: its true label, or whether it was right (exactly one).
#[derive(Debug, Clone)]
pub enum Verdict {
    Label(String),
    Correct(bool),
}

/// How long after its answer a record may still be on its way to the store: a replica's writer gathers for
/// up to [`crate::evidence::ledger::GATHER`] and then writes (to Redis, for another replica).
const SETTLE: std::time::Duration = std::time::Duration::from_millis(60);

impl Engine {
    /// `tenant`'s feedback on its answer `key` (a completion id, or `batch_id/custom_id`): the first stands
    /// (a repeat says so); another tenant's answer reads as missing. `NotFound` without a ledger.
    pub async fn feedback(
        &self,
        tenant: &TenantId,
        key: &str,
        verdict: Verdict,
    ) -> Result<Value, EngineError> {
        let state = &*self.state;
        let ledger = ledger(state)?;
        let rec = lookup(&ledger, key, tenant).await?;
        let missing = || {
            EngineError::NotFound(format!(
                "no answer `{key}` of this key within the feedback window ({} s)",
                ledger.window_ms() / 1000
            ))
        };
        // Another tenant's answer reads as missing: its existence is not this tenant's to learn.
        let rec = rec.filter(|r| *r.tenant == *tenant.0).ok_or_else(missing)?;
        let correct = verdict_of(state, &rec, &verdict)?;
        let label = match verdict {
            Verdict::Label(l) => Some(l),
            Verdict::Correct(_) => None,
        };
        let trusted = state
            .tenants()
            .named(&tenant.0)
            .is_some_and(|t| t.trusted_feedback);
        let fb = Feedback {
            label,
            correct,
            trusted,
            at_ms: now_ms(),
        };
        let store = ledger.store();
        let id = rec.id.clone();
        let given = fb.clone();
        let first = blocking(move || store.feedback(&id, &given)).await?;
        let (stored, duplicate) = match first {
            First::Written(f) => (f, false),
            First::Already(f) => (f, true),
            // Expired (or swept) between the lookup and the write: as missing as if it had never been.
            First::Gone => return Err(missing()),
        };
        if !duplicate {
            harvest(state, &rec, &stored);
            metrics::counter!(crate::metrics::FEEDBACK_TOTAL, "route" => rec.route.clone(), "channel" => rec.channel.clone(),
                "trusted" => if trusted { "true" } else { "false" }, "correct" => if correct { "true" } else { "false" })
            .increment(1);
        }
        let mut body = json!({
            "object": "feedback", "id": rec.id, "route": rec.route, "channel": rec.channel,
            "answered": rec.label, "label": stored.label, "correct": stored.correct, "trusted": stored.trusted,
            "duplicate": duplicate,
        });
        if duplicate {
            body["note"] = json!("feedback on this answer was already given: the first stands");
        }
        Ok(body)
    }

    /// The pending audit items of `route` (every route's when none), oldest first, at most `limit`: of each
    /// route's head in force, or of every head (`any_head`).
    pub async fn audits(
        &self,
        route: Option<String>,
        any_head: bool,
        limit: usize,
    ) -> Result<Value, EngineError> {
        let state = &*self.state;
        let ledger = ledger(state)?;
        if let Some(r) = &route {
            if !state.routing.routes.contains_key(r) {
                return Err(EngineError::UnknownRoute(r.clone()));
            }
        }
        let heads: Option<crate::evidence::ledger::Heads> = (!any_head).then(|| {
            state
                .routing
                .routes
                .iter()
                .map(|(n, r)| (n, r.head_version.clone()))
                .collect()
        });
        let store = ledger.store();
        let items =
            blocking(move || store.pending(route.as_deref(), heads.as_ref(), limit)).await?;
        Ok(json!({"object": "list", "data": items}))
    }

    /// The true label of audit item `id` (the first label stands; a repeat says so).
    pub async fn label_audit(&self, id: &str, label: &str) -> Result<Value, EngineError> {
        let state = &*self.state;
        let ledger = ledger(state)?;
        let store = ledger.store();
        let lookup = id.to_string();
        let item = blocking(move || store.audit(&lookup))
            .await?
            .ok_or_else(|| EngineError::NotFound(format!("no audit item `{id}`")))?;
        known_label(state, &item.route, label)?;
        let store = ledger.store();
        let (key, given) = (id.to_string(), label.to_string());
        let first = blocking(move || store.label(&key, &given)).await?;
        let (label, duplicate) = match first {
            First::Written(l) => (l, false),
            First::Already(l) => (l, true),
            First::Gone => {
                return Err(EngineError::NotFound(format!(
                    "audit item `{}` expired before its label was written",
                    item.id
                )))
            }
        };
        if let (false, Some(rec), Some(text)) = (duplicate, &state.evidence.recorder, &item.text) {
            rec.write_gold(&Gold {
                source: "audit",
                route: &item.route,
                text,
                label: &label,
                answered: Some(&item.answered),
                ambiguity: Some(item.ambiguity),
                probability: Some(item.probability),
            });
        }
        let mut body = json!({"object": "audit", "id": item.id, "route": item.route, "answered": item.answered,
            "label": label, "wrong": item.answered != label, "duplicate": duplicate});
        if duplicate {
            body["note"] = json!("this item was already labelled: the first label stands");
        }
        Ok(body)
    }

    /// Per route, the silent error from audits and feedback per channel, and the LLM's agreement, read now.
    pub async fn feedback_summary(&self) -> Result<Value, EngineError> {
        let state = &*self.state;
        let ledger = ledger(state)?;
        let store = ledger.store();
        let s = blocking(move || store.summary(now_ms())).await?;
        let agreement = state.agreement();
        // Each route's figures are of its head in force (a swap starts its evidence anew).
        let head = |r: &str| state.routing.routes.get(r).map(|x| x.head_version.clone());
        let mut routes: serde_json::Map<String, Value> = s
            .routes
            .iter()
            .map(|(r, v)| (r.clone(), v.view(head(r).as_deref())))
            .collect();
        for (r, a) in &agreement {
            let v = routes.entry(r.clone()).or_insert_with(|| {
                crate::evidence::ledger::RouteSummary::default().view(head(r).as_deref())
            });
            v["llm_agreement"] = a.view();
        }
        Ok(json!({"routes": routes, "waiting": ledger.waiting()}))
    }
}

/// The ledger, or `NotFound` on a server without one.
fn ledger(state: &AppState) -> Result<Arc<Ledger>, EngineError> {
    state.evidence.ledger.clone().ok_or_else(|| {
        EngineError::NotFound("feedback is off on this server ([feedback] enabled)".into())
    })
}

/// `label` is one of `route`'s labels, or its out-of-scope label.
fn known_label(state: &AppState, route: &str, label: &str) -> Result<(), EngineError> {
    let r = state.routing.routes.get(route);
    let r = r.as_deref();
    let known = r
        .and_then(|r| r.prefilter.as_ref())
        .is_some_and(|p| p.labels().iter().any(|l| l == label))
        || r.and_then(|r| r.out_of_scope.as_ref())
            .is_some_and(|o| o.label == label);
    if known {
        Ok(())
    } else {
        Err(EngineError::invalid(
            "label",
            format!("`{label}` is not a label of route `{route}`"),
        ))
    }
}

/// Whether the answer was right, from a true label (checked against the route's labels) or `correct`.
fn verdict_of(state: &AppState, rec: &Record, v: &Verdict) -> Result<bool, EngineError> {
    match v {
        Verdict::Label(label) => {
            let Some(answered) = &rec.label else {
                return Err(EngineError::invalid(
                    "label",
                    "this answer has no label (a written answer or a generation): send `correct`",
                ));
            };
            known_label(state, &rec.route, label)?;
            Ok(answered == label)
        }
        Verdict::Correct(c) => Ok(*c),
    }
}

/// Trusted feedback naming the true label of an answer whose text was kept is a gold record for `tiergate
/// distill` (with `server.record_escalations`).
fn harvest(state: &AppState, rec: &Record, fb: &Feedback) {
    if let (true, Some(r), Some(text), Some(label)) =
        (fb.trusted, &state.evidence.recorder, &rec.text, &fb.label)
    {
        r.write_gold(&Gold {
            source: "feedback",
            route: &rec.route,
            text,
            label,
            answered: rec.label.as_deref(),
            ambiguity: rec.ambiguity,
            probability: None,
        });
    }
}

/// The record of `key` when `tenant` owns it, looked up once, after this replica's writer has stored what it
/// was handed before now and, for an answer younger than [`SETTLE`] (its age is in its id), once that age has
/// passed — so that an unknown id, another tenant's id and one's own take the same path in the same time,
/// whether the record exists or not. While the ledger's writer spools (its store failed), every lookup is
/// 503: the record may be among those waiting.
async fn lookup(
    ledger: &Ledger,
    key: &str,
    tenant: &TenantId,
) -> Result<Option<Record>, EngineError> {
    // Records held while the store failed may include this one: not "unknown" until they are written. A
    // remote store's write in flight may take its deadline to end (stored, or spooled).
    let catching_up = |spooled: usize| {
        EngineError::StoreUnavailable(format!(
            "the feedback store cannot be reached yet: {spooled} decision records wait to be written to it; retry"
        ))
    };
    if ledger.spooled() > 0 {
        return Err(catching_up(ledger.spooled()));
    }
    let settled = ledger.written(SETTLE).await
        || match ledger.dependency() {
            Some(d) => ledger.written(d.deadline()).await,
            None => true,
        };
    if ledger.spooled() > 0 || !settled {
        return Err(catching_up(ledger.spooled()));
    }
    if let Some(born) = crate::model::request::born_ms(key) {
        let ready = born.saturating_add(SETTLE.as_millis() as u64);
        let wait = ready
            .saturating_sub(now_ms())
            .min(SETTLE.as_millis() as u64);
        if wait > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
        }
    }
    let store = ledger.store();
    let (k, t) = (key.to_string(), tenant.0.clone());
    blocking(move || store.decision_of(&k, &t, now_ms())).await
}

/// Runs a store call off the async runtime; a store failure is `Unavailable`.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, EngineError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| EngineError::Internal(e.to_string()))?
        .map_err(|e| {
            EngineError::StoreUnavailable(format!("the feedback store cannot be reached: {e}"))
        })
}
