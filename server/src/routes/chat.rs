//! `POST /v1/chat/completions`: validate the wire request, have the engine answer it, render the answer
//! (JSON or SSE, [`super::respond`]).

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::response::{IntoResponse, Response};

use crate::early::Dialect;
use crate::error::ApiError;
use crate::extract::{ApiJson, Asking};
use crate::openai::ChatRequest;
use crate::validate::{validate, Caller, RouteFacts, ValidChat};
use tiergate_engine::state::AppState;
use tiergate_telemetry::TARGET;
use tracing::Instrument;

use super::respond::{answered, render};

/// The handler.
pub async fn chat(
    State(state): State<Arc<AppState>>,
    asking: Asking,
    ApiJson(req): ApiJson<ChatRequest>,
) -> Response {
    let started = Instant::now();
    let validated = tracing::info_span!(target: TARGET, "validate")
        .in_scope(|| validated(&state, &asking, req, started));
    let v = match validated {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    tracing::debug!(route = %v.route, user = v.user.as_deref().unwrap_or(""), stream = v.stream, "chat request");
    let variant =
        state
            .routing
            .experiments
            .assign(&v.route, v.user.as_deref(), asking.request_id.as_deref());
    let mut resp = answered(&state, &v, Dialect::Chat, |state, v, a| async move {
        let span = tracing::info_span!(target: TARGET, "response");
        render(&state, &v, a).instrument(span).await
    })
    .await;
    // A latency experiment's delay comes last, out of the request metrics above (its own metrics have it).
    if let Some(a) = &variant {
        crate::adapt::apply_variant(a, &v.route, &mut resp, started).await;
    }
    resp
}

/// What validation needs to know of the route `name`.
pub(crate) fn facts(state: &AppState, name: &str) -> Option<RouteFacts> {
    state.routing.routes.get(name).map(|r| RouteFacts {
        kind: r.kind,
        deadline: r.deadline,
        max_deadline: r.max_deadline,
        max_tokens: r.max_tokens,
        max_text_chars: r.max_text_chars,
        name: r.name.clone(),
        schema_decoding: r.schema_decoding,
    })
}

/// A request of any door, in the chat door's terms, validated for the caller `asking` describes.
pub(super) fn validated(
    state: &AppState,
    asking: &Asking,
    mut req: ChatRequest,
    started: Instant,
) -> Result<ValidChat, ApiError> {
    // A model name may be a route's alias, `auto` or unknown to a route that answers unknown names.
    if let Some(route) = state.routing.routes.resolve(&req.model) {
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
    validate(req, |name| facts(state, name), caller)
}

/// `v` as another door answers it: its id in that dialect's form (`msg_…`, `resp_…`: feedback names it so,
/// the records keep it) and the door in its metrics.
pub(super) fn in_dialect(mut v: ValidChat, prefix: &str, door: &'static str) -> ValidChat {
    v.id = format!("{prefix}{}", v.id.trim_start_matches("chatcmpl-"));
    v.door = door;
    v
}
