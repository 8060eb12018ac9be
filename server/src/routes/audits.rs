//! `/admin/audits`: the answers Tier-0 gave alone that were drawn for audit (`routing.audit_rate`), waiting
//! for a true label, and `POST /admin/audits/{id}` to give it (the first label stands); `/admin/feedback`:
//! per route, Tier-0's silent error from the labelled audits with a Clopper–Pearson interval, and feedback
//! per channel (trusted and untrusted apart). Admin token required.

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::auth::{authorize_admin, Peer};
use crate::error::ApiError;
use crate::extract::ApiJson;
use tiergate_engine::Engine;

/// `GET /admin/audits?route=&limit=&head=any`: pending items of each route's head in force (`head=any`: of
/// every head), oldest first (default 50, at most 1000).
pub async fn list(
    State(engine): State<Engine>,
    peer: Peer,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let run = async {
        authorize_admin(engine.admin_token(), &headers, peer.0)?;
        let limit = match q.get("limit") {
            None => 50,
            Some(v) => v
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=1000).contains(n))
                .ok_or_else(|| ApiError::invalid("limit", "must be an integer in [1, 1000]"))?,
        };
        let any_head = match q.get("head").map(String::as_str) {
            Some("any") => true,
            None => false,
            Some(_) => return Err(ApiError::invalid("head", "only `any` (every head's items)")),
        };
        let body = engine
            .audits(q.get("route").cloned(), any_head, limit)
            .await?;
        Ok::<_, ApiError>(axum::Json(body).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// The body of `POST /admin/audits/{id}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelRequest {
    /// The true label.
    pub label: String,
}

/// `POST /admin/audits/{id}`: the item's true label.
pub async fn label(
    State(engine): State<Engine>,
    peer: Peer,
    headers: HeaderMap,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<LabelRequest>,
) -> Response {
    let run = async {
        authorize_admin(engine.admin_token(), &headers, peer.0)?;
        let body = engine.label_audit(&id, &req.label).await?;
        Ok::<_, ApiError>(axum::Json(body).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// `GET /admin/feedback`: per route, the silent error from audits and feedback per channel, read now.
pub async fn summary(State(engine): State<Engine>, peer: Peer, headers: HeaderMap) -> Response {
    let run = async {
        authorize_admin(engine.admin_token(), &headers, peer.0)?;
        let body = engine.feedback_summary().await?;
        Ok::<_, ApiError>(axum::Json(body).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}
