//! `/admin/cache`: the answer cache (Tier −1). `GET` shows its size, bounds and the guards' coverage; `DELETE`
//! drops every entry, here and in the shared store's namespace (another replica's in-process entries stay
//! until their TTL or its own `DELETE`).

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
    }))
    .into_response()
}

/// `DELETE /admin/cache`: 200 with what was dropped; 404 when the cache is off.
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
    axum::Json(json!({"cleared": here, "shared_cleared": shared})).into_response()
}
