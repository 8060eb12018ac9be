//! `POST /v1/feedback`: a client says whether an answer was right (`correct`) or what it should have been
//! (`label`), naming the answer by its completion id (or a batch line by `batch_id` + `custom_id`). A tenant
//! may only give feedback on its own requests; repeated feedback on one answer is idempotent (the first
//! stands, and the reply says so). Feedback is self-selected: it is reported per channel, apart from the
//! labelled audits that estimate Tier-0's silent error, and only trusted tenants' counts as evidence.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use crate::error::ApiError;
use crate::extract::ApiJson;
use tiergate_engine::evidence::ledger::{now_ms, Feedback, First, Record};
use tiergate_engine::evidence::record::Gold;
use tiergate_engine::state::AppState;
use tiergate_engine::tenancy::tenants::TenantId;

/// The request body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedbackRequest {
    /// The completion id the server returned.
    pub id: Option<String>,
    /// A batch line instead: its batch id …
    pub batch_id: Option<String>,
    /// … and its `custom_id`.
    pub custom_id: Option<String>,
    /// The true label.
    pub label: Option<String>,
    /// Whether the answer was right.
    pub correct: Option<bool>,
}

/// The key the request names: a completion id, or `batch_id/custom_id`.
fn key_of(r: &FeedbackRequest) -> Result<String, ApiError> {
    match (&r.id, &r.batch_id, &r.custom_id) {
        (Some(id), None, None) if !id.is_empty() => Ok(id.clone()),
        (None, Some(b), Some(c)) if !b.is_empty() && !c.is_empty() => Ok(format!("{b}/{c}")),
        _ => Err(ApiError::invalid(
            "id",
            "name the answer by `id` (its completion id), or a batch line by `batch_id` and `custom_id`",
        )),
    }
}

/// Whether the answer was right, from `label` (checked against the route's labels) or `correct`.
fn verdict(state: &AppState, rec: &Record, r: &FeedbackRequest) -> Result<bool, ApiError> {
    match (&r.label, r.correct) {
        (Some(label), None) => {
            let Some(answered) = &rec.label else {
                return Err(ApiError::invalid(
                    "label",
                    "this answer has no label (a written answer or a generation): send `correct`",
                ));
            };
            let route = state.routing.routes.get(&rec.route);
            let route = route.as_deref();
            let known = route
                .and_then(|r| r.prefilter.as_ref())
                .is_some_and(|p| p.labels().contains(label))
                || route
                    .and_then(|r| r.out_of_scope.as_ref())
                    .is_some_and(|o| &o.label == label);
            if !known {
                return Err(ApiError::invalid(
                    "label",
                    format!("`{label}` is not a label of route `{}`", rec.route),
                ));
            }
            Ok(answered == label)
        }
        (None, Some(c)) => Ok(c),
        _ => Err(ApiError::invalid(
            "label",
            "give exactly one of `label` (the true label) and `correct` (true or false)",
        )),
    }
}

/// The handler.
pub async fn feedback(
    State(state): State<Arc<AppState>>,
    tenant: Option<axum::Extension<TenantId>>,
    ApiJson(req): ApiJson<FeedbackRequest>,
) -> Response {
    match give(&state, tenant.map(|t| t.0), req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn give(
    state: &Arc<AppState>,
    tenant: Option<TenantId>,
    req: FeedbackRequest,
) -> Result<Response, ApiError> {
    let ledger = state.evidence.ledger.clone().ok_or_else(|| {
        ApiError::NotFound("feedback is off on this server ([feedback] enabled)".into())
    })?;
    let key = key_of(&req)?;
    let tenant = tenant.unwrap_or_else(TenantId::anonymous);
    let rec = lookup(&ledger, &key, &tenant).await?;
    let missing = || {
        ApiError::NotFound(format!(
            "no answer `{key}` of this key within the feedback window ({} s)",
            ledger.window_ms() / 1000
        ))
    };
    // Another tenant's answer reads as missing: its existence is not this tenant's to learn.
    let rec = rec.filter(|r| *r.tenant == *tenant.0).ok_or_else(missing)?;
    let correct = verdict(state, &rec, &req)?;
    let trusted = state
        .tenants()
        .named(&tenant.0)
        .is_some_and(|t| t.trusted_feedback);
    let fb = Feedback {
        label: req.label.clone(),
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
        metrics::counter!(tiergate_engine::metrics::FEEDBACK_TOTAL, "route" => rec.route.clone(), "channel" => rec.channel.clone(),
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
    Ok(axum::Json(body).into_response())
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

/// How long after its answer a record may still be on its way to the store: a replica's writer gathers for
/// up to [`tiergate_engine::evidence::ledger::GATHER`] and then writes (to Redis, for another replica).
const SETTLE: std::time::Duration = std::time::Duration::from_millis(60);

/// The record of `key` when `tenant` owns it, looked up once, after this replica's writer has stored what it was handed before now
/// and, for an answer younger than [`SETTLE`] (its age is in its id), once that age has passed — so that an
/// unknown id, another tenant's id and one's own take the same path in the same time, whether the record
/// exists or not.
async fn lookup(
    ledger: &tiergate_engine::evidence::ledger::Ledger,
    key: &str,
    tenant: &TenantId,
) -> Result<Option<Record>, ApiError> {
    ledger.written(SETTLE).await;
    if let Some(born) = crate::validate::born_ms(key) {
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

/// Runs a store call off the async runtime; a store failure is 503.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, tiergate_engine::evidence::ledger::StoreError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?
        .map_err(|e| ApiError::Unavailable(format!("the feedback store cannot be reached: {e}")))
}
