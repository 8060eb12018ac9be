//! `/admin/cache`: the answer cache (Tier −1). `GET` shows its size, bounds, the guards' coverage and the last
//! clear's removal of shared keys; `DELETE` drops every entry here and moves the shared store's epoch on, so
//! no replica reads a verdict stored before it (another replica's in-process entries stay until their TTL or
//! its own `DELETE`): 200 when the old shared keys are gone too, 202 while their removal goes on in the
//! background (`GET` follows it), 503 when the shared store did not answer (nothing there changed).

use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::auth::{authorize_admin, Peer};
use crate::error::ApiError;
use tiergate_engine::state::AppState;

/// `GET /admin/cache`.
pub async fn show(State(state): State<Arc<AppState>>, peer: Peer, headers: HeaderMap) -> Response {
    if let Err(e) = authorize_admin(state.admin_token(), &headers, peer.0) {
        return e.into_response();
    }
    let c = &state.config.cache;
    let Some(cache) = &state.cache else {
        return axum::Json(json!({"enabled": false})).into_response();
    };
    let (entries, bytes) = cache.size();
    axum::Json(json!({
        "enabled": true, "kind": c.kind, "entries": entries, "bytes": bytes, "max_bytes": c.max_bytes,
        "ttl_s": c.ttl_s, "semantic": c.semantic, "tau": c.tau, "bucket_cap": c.bucket_cap,
        "shared_up": cache.shared_up(), "guards_cover": cache.covers(),
        "shared_removal": cache.removal(),
    }))
    .into_response()
}

/// `DELETE /admin/cache`: what was dropped and where the shared removal stands; 404 when the cache is off.
pub async fn clear(State(state): State<Arc<AppState>>, peer: Peer, headers: HeaderMap) -> Response {
    if let Err(e) = authorize_admin(state.admin_token(), &headers, peer.0) {
        return e.into_response();
    }
    let Some(cache) = &state.cache else {
        return ApiError::NotFound("the answer cache is off ([cache] enabled = false)".into())
            .into_response();
    };
    let (here, shared) = cache.clear().await;
    tracing::info!(target: "tiergate::audit", entries = here, shared = ?shared, "answer cache cleared");
    match shared {
        None => axum::Json(json!({"cleared": here})).into_response(),
        Some(None) => ApiError::Unavailable(format!(
            "cleared {here} entries here; the shared store did not answer, so its entries stay readable: retry"
        ))
        .into_response(),
        Some(Some(c)) => {
            let status = if c.removal.state == "running" {
                axum::http::StatusCode::ACCEPTED
            } else {
                axum::http::StatusCode::OK
            };
            let body = json!({"cleared": here, "shared": {"epoch": c.epoch, "removal": c.removal}});
            (status, axum::Json(body)).into_response()
        }
    }
}
