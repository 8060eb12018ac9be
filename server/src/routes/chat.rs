//! `POST /v1/chat/completions`: validate the wire request, have the engine answer it, render the answer
//! (JSON or SSE, [`super::respond`]).

use std::time::Instant;

use axum::extract::State;
use axum::response::{IntoResponse, Response};

use crate::early::Dialect;
use crate::error::ApiError;
use crate::extract::{ApiJson, Asking};
use crate::openai::ChatRequest;
use crate::validate::{validate, Caller, ValidChat};
use tiergate_engine::Engine;
use tiergate_telemetry::TARGET;
use tracing::Instrument;

use super::respond::{answered, render};

/// The handler.
pub async fn chat(
    State(engine): State<Engine>,
    asking: Asking,
    ApiJson(req): ApiJson<ChatRequest>,
) -> Response {
    let started = Instant::now();
    let validated = tracing::info_span!(target: TARGET, "validate")
        .in_scope(|| validated(&engine, &asking, req, started));
    let v = match validated {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    tracing::debug!(route = %v.route, user = v.user.as_deref().unwrap_or(""), stream = v.stream, "chat request");
    answered(&engine, &v, Dialect::Chat, |engine, v, a| async move {
        let span = tracing::info_span!(target: TARGET, "response");
        render(&engine, &v, a).instrument(span).await
    })
    .await
}

/// A request of any door, in the chat door's terms, validated for the caller `asking` describes.
pub(super) fn validated(
    engine: &Engine,
    asking: &Asking,
    mut req: ChatRequest,
    started: Instant,
) -> Result<ValidChat, ApiError> {
    // A model name may be a route's alias, `auto` or unknown to a route that answers unknown names.
    let asked = req.model.clone();
    if let Some(route) = engine.resolve_model(&req.model) {
        req.model = route;
    }
    let caller = Caller {
        tenant: asking.tenant.clone(),
        // Batch lines come in-process (`routes/in_process.rs`), never over HTTP.
        batch: None,
        headers: &asking.headers,
        started,
        forced: asking.forced.clone(),
    };
    let mut v = validate(req, |name| engine.route_facts(name), caller)?;
    v.request.asked_model = asked;
    Ok(v)
}

/// `v` as another door answers it: its id in that dialect's form (`msg_…`, `resp_…`: feedback names it so,
/// the records keep it) and the door in its metrics.
pub(super) fn in_dialect(mut v: ValidChat, prefix: &str, door: &'static str) -> ValidChat {
    v.id = format!("{prefix}{}", v.id.trim_start_matches("chatcmpl-"));
    v.door = door;
    v
}
