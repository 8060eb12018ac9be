//! `/admin/cache`: the answer cache (Tier −1). `GET` shows its size, bounds, the guards' coverage and the last
//! clear's removal of shared keys; `DELETE` drops every entry here and moves the shared store's epoch on, so
//! no replica reads a verdict stored before it (another replica's in-process entries stay until their TTL or
//! its own `DELETE`): 200 when the old shared keys are gone too, 202 while their removal goes on in the
//! background (`GET` follows it), 503 when the shared store did not answer (nothing there changed).

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};

use crate::auth::{authorize_admin, Peer};
use crate::error::ApiError;
use tiergate_engine::Engine;

/// `GET /admin/cache`.
pub async fn show(State(engine): State<Engine>, peer: Peer, headers: HeaderMap) -> Response {
    if let Err(e) = authorize_admin(engine.admin_token(), &headers, peer.0) {
        return e.into_response();
    }
    axum::Json(engine.cache_view()).into_response()
}

/// `DELETE /admin/cache`: what was dropped and where the shared removal stands (202 while it runs); 404 when
/// the cache is off, 503 when the shared store did not answer.
pub async fn clear(State(engine): State<Engine>, peer: Peer, headers: HeaderMap) -> Response {
    if let Err(e) = authorize_admin(engine.admin_token(), &headers, peer.0) {
        return e.into_response();
    }
    match engine.clear_cache().await {
        Ok((body, running)) => {
            let status = if running {
                axum::http::StatusCode::ACCEPTED
            } else {
                axum::http::StatusCode::OK
            };
            (status, axum::Json(body)).into_response()
        }
        Err(e) => ApiError::from(e).into_response(),
    }
}
