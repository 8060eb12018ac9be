//! HTTP endpoints, one file each, and the router that ties them together.

pub mod admin;
pub mod chat;
mod escalate;
pub mod ops;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::app::AppState;
use crate::error::ApiError;

/// The full router.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.config.server.max_body_bytes;
    Router::new()
        .route("/v1/chat/completions", post(chat::chat))
        .route("/v1/models", get(ops::models))
        .route(
            "/admin/routing",
            get(admin::get_routing)
                .patch(admin::patch_routing)
                .put(admin::put_routing),
        )
        .route("/metrics", get(ops::metrics))
        .route("/health", get(ops::health))
        .route("/ready", get(ops::ready))
        .route("/info", get(ops::info))
        .fallback(|| async { ApiError::NotFound("no such endpoint".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            admission,
        ))
        .layer(axum::middleware::from_fn(too_large_and_request_id))
        .layer(axum::extract::DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// The one admission point: every request takes a permit or gets 429.
async fn admission(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let Ok(_permit) = state.admission.clone().try_acquire_owned() else {
        return ApiError::Overloaded {
            message: "server at its in-flight limit; retry shortly".into(),
            retry_after_s: 1,
        }
        .into_response();
    };
    next.run(req).await
}

/// Adds `x-request-id` to every response (echoing the client's when it sent one) and turns a bare 413 from
/// the body limit into our error shape with the real limit.
async fn too_large_and_request_id(req: Request, next: Next) -> Response {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(1);
    let id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|s| !s.is_empty() && s.len() <= 128)
        .map(str::to_string)
        .unwrap_or_else(|| {
            format!(
                "tg-{:x}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            )
        });
    let mut resp = next.run(req).await;
    if resp.status() == StatusCode::PAYLOAD_TOO_LARGE
        && resp
            .headers()
            .get("content-type")
            .is_none_or(|v| v != "application/json")
    {
        resp = ApiError::TooLarge.into_response();
    }
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
}
