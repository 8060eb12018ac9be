//! `POST /v1/feedback`: a client says whether an answer was right (`correct`) or what it should have been
//! (`label`), naming the answer by its completion id (or a batch line by `batch_id` + `custom_id`). A tenant
//! may only give feedback on its own requests; repeated feedback on one answer is idempotent (the first
//! stands, and the reply says so). Feedback is self-selected: it is reported per channel, apart from the
//! labelled audits that estimate Tier-0's silent error, and only trusted tenants' counts as evidence.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::error::ApiError;
use crate::extract::ApiJson;
use tiergate_engine::model::request::TenantId;
use tiergate_engine::{Engine, Verdict};
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

/// The handler.
pub async fn feedback(
    State(engine): State<Engine>,
    tenant: Option<axum::Extension<TenantId>>,
    ApiJson(req): ApiJson<FeedbackRequest>,
) -> Response {
    let run = async {
        let key = key_of(&req)?;
        let verdict =
            match (req.label, req.correct) {
                (Some(label), None) => Verdict::Label(label),
                (None, Some(c)) => Verdict::Correct(c),
                _ => return Err(ApiError::invalid(
                    "label",
                    "give exactly one of `label` (the true label) and `correct` (true or false)",
                )),
            };
        let tenant = tenant.map_or_else(TenantId::anonymous, |t| t.0);
        let body = engine.feedback(&tenant, &key, verdict).await?;
        Ok::<_, ApiError>(axum::Json(body).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}
