//! Operations endpoints: `/v1/models`, `/metrics`, `/health`, `/ready`, `/info`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use tiergate_engine::model::request::TenantId;
use tiergate_engine::Engine;

/// `GET /v1/models`: the routes the caller may use.
pub async fn models(
    State(engine): State<Engine>,
    tenant: Option<axum::Extension<TenantId>>,
) -> Response {
    let tenant = tenant.map_or_else(TenantId::anonymous, |t| t.0);
    let data = engine.models(&tenant);
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /metrics`: Prometheus text.
pub async fn metrics(State(engine): State<Engine>) -> Response {
    match engine.render_metrics() {
        Some(text) => ([("content-type", "text/plain; version=0.0.4")], text).into_response(),
        None => (StatusCode::NOT_FOUND, "metrics are disabled").into_response(),
    }
}

/// `GET /health`: the process is up.
pub async fn health() -> Response {
    axum::Json(json!({"status": "ok"})).into_response()
}

/// `GET /ready`: 200 when the engine is ready ([`Engine::readiness`]), else 503, with the detail.
pub async fn ready(State(engine): State<Engine>) -> Response {
    let (ok, detail) = engine.readiness();
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(detail)).into_response()
}

/// `GET /info`: the effective config, secrets redacted, and what is in force.
pub async fn info(
    State(engine): State<Engine>,
    crate::auth::Peer(peer): crate::auth::Peer,
    headers: axum::http::HeaderMap,
) -> Response {
    // The effective config names paths and worker arguments: admin credentials, as for /admin/routing.
    if let Err(e) = crate::auth::authorize_admin(engine.admin_token(), &headers, peer) {
        return e.into_response();
    }
    axum::Json(engine.info()).into_response()
}
