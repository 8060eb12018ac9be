//! HTTP endpoints, one file each, and the router that ties them together.

pub mod admin;
pub mod audits;
pub mod batches;
pub mod cache;
pub mod chat;
pub mod feedback;
pub mod heads;
pub mod in_process;
pub mod messages;
pub mod ops;
mod respond;
pub mod responses;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::error::ApiError;
use tiergate_engine::batch::BatchService;
use tiergate_engine::Engine;

/// The public router: the OpenAI API (bodies read in full, within a total deadline, before the engine admits a
/// request), and the probes and metrics (a liveness probe never gets 429).
pub fn router(engine: Engine) -> Router {
    router_with(engine, None, None)
}

/// The public router with the Batch API's routes beside the OpenAI API when a service is wired in, and the
/// durable store of the Responses API the binary hands over (`None`: in memory, or Redis).
pub fn router_with(
    engine: Engine,
    batches: Option<&Arc<dyn BatchService>>,
    responses_store: Option<Arc<dyn tiergate_engine::answer::stored::ResponseStore>>,
) -> Router {
    // The Responses API's store (`[responses] store`); one that cannot be opened leaves it off, said once.
    let stored: responses::Store = engine.responses_store(responses_store).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "the Responses store is unavailable: responses are not kept");
        None
    });
    let api = Router::new()
        .route("/v1/chat/completions", post(chat::chat))
        .route("/v1/responses", post(responses::responses))
        .route("/v1/responses/{id}", get(responses::retrieve))
        .route("/v1/models", get(ops::models))
        .route("/v1/feedback", post(feedback::feedback));
    let api = api_layers(api, &engine).layer(axum::Extension(stored));
    // Anthropic's door: the same layers, and every error leaving it (auth, limits, the body, the handler)
    // reshaped into Anthropic's error shape.
    let messages = api_layers(
        Router::new()
            .route("/v1/messages", post(messages::messages))
            .route("/v1/messages/count_tokens", post(messages::count_tokens)),
        &engine,
    )
    .layer(axum::middleware::map_response(crate::anthropic::reshape));
    let batch_api = batches.map_or_else(Router::new, |b| {
        batches::routes(b.clone())
            .layer(axum::middleware::from_fn_with_state(
                engine.clone(),
                authenticate,
            ))
            .layer(axum::middleware::from_fn(crate::trace::request))
    });
    let public = Router::new()
        .merge(api)
        .merge(messages)
        .merge(batch_api)
        .route("/metrics", get(ops::metrics))
        .route("/health", get(ops::health))
        .route("/ready", get(ops::ready))
        .fallback(|| async { ApiError::NotFound("no such endpoint".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(axum::middleware::from_fn_with_state(
            engine.clone(),
            lame_duck,
        ));
    outer_layers(public, engine)
}

/// What every API route goes through: the tenant's key and rate, the body's limits and time, the trace.
fn api_layers(router: Router<Engine>, engine: &Engine) -> Router<Engine> {
    router
        .layer(axum::middleware::from_fn_with_state(
            engine.clone(),
            authenticate,
        ))
        .layer(axum::middleware::from_fn_with_state(
            engine.clone(),
            read_body,
        ))
        .layer(axum::middleware::from_fn(crate::trace::request))
}

/// What both listeners do to every request: the head limits, the request id, the body limit.
fn outer_layers(router: Router<Engine>, engine: Engine) -> Router {
    let limit = engine.config().server.max_body_bytes;
    router
        .layer(axum::middleware::from_fn_with_state(
            engine.clone(),
            header_limits,
        ))
        .layer(axum::middleware::from_fn(too_large_and_request_id))
        .layer(axum::extract::DefaultBodyLimit::max(limit))
        .with_state(engine)
}

/// Headers a request may carry.
pub const MAX_HEADERS: usize = 100;

/// 431 in the OpenAI error shape for a request head over the limits (`server.max_header_bytes`,
/// [`MAX_HEADERS`]).
async fn header_limits(State(engine): State<Engine>, req: Request, next: Next) -> Response {
    let headers = req.headers();
    let bytes: usize = req.uri().path_and_query().map_or(0, |p| p.as_str().len())
        + headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 4)
            .sum::<usize>();
    let max = engine.config().server.max_header_bytes;
    if headers.len() > MAX_HEADERS || bytes > max {
        return ApiError::HeadersTooLarge(format!(
            "request head of {} headers and {bytes} bytes; the limits are {MAX_HEADERS} headers and {max} \
             bytes (server.max_header_bytes)",
            headers.len()
        ))
        .into_response();
    }
    next.run(req).await
}

/// The admin router, served on its own listener (`server.admin_listen`, loopback by default): the live policy
/// and the effective config.
pub fn admin_router(engine: Engine) -> Router {
    admin_router_with(engine, None)
}

/// The admin router with the Batch API's admin route when a service is wired in.
pub fn admin_router_with(engine: Engine, batches: Option<&Arc<dyn BatchService>>) -> Router {
    let batch_admin = batches.map_or_else(Router::new, |b| batches::admin_routes(b.clone()));
    let admin = Router::new()
        .route(
            "/admin/routing",
            get(admin::get_routing)
                .patch(admin::patch_routing)
                .put(admin::put_routing),
        )
        .route(
            "/admin/experiments",
            get(admin::get_experiments).put(admin::put_experiments),
        )
        .route("/admin/tenants", get(admin::get_tenants))
        .route("/admin/audits", get(audits::list))
        .route("/admin/audits/{id}", post(audits::label))
        .route("/admin/feedback", get(audits::summary))
        .route("/admin/cache", get(cache::show).delete(cache::clear))
        .route("/admin/heads", get(heads::list))
        .route("/admin/heads/{route}", post(heads::start))
        .route("/admin/heads/{route}/rollback", post(heads::rollback))
        .route("/admin/tenants/reload", post(admin::reload_tenants))
        .route("/info", get(ops::info))
        .route("/admin/console", get(crate::console::data))
        .route("/console", get(crate::console::page))
        .route("/health", get(ops::health))
        .merge(batch_admin)
        .fallback(|| async { ApiError::NotFound("no such admin endpoint".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(axum::middleware::from_fn_with_state(
            engine.clone(),
            read_body,
        ));
    outer_layers(admin, engine)
}

/// Reads the whole request body within `server.body_timeout_ms` in total (a body trickled a byte at a time
/// does not reset the clock) and at most `server.max_body_bytes`, before any admission permit is taken: a
/// stalled upload holds a connection, never a share of the server.
async fn read_body(State(engine): State<Engine>, req: Request, next: Next) -> Response {
    let limit = engine.config().server.max_body_bytes;
    let declared = req
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return ApiError::too_large(Some(limit)).into_response();
    }
    let deadline = std::time::Duration::from_millis(engine.config().server.body_timeout_ms);
    let (parts, body) = req.into_parts();
    match tokio::time::timeout(deadline, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => next.run(Request::from_parts(parts, bytes.into())).await,
        Ok(Err(e)) => {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if too_large {
                ApiError::too_large(Some(limit)).into_response()
            } else {
                ApiError::invalid("body", format!("cannot read the request body: {e}"))
                    .into_response()
            }
        }
        Err(_) => ApiError::BodyTimeout(format!(
            "the request body did not arrive within {} ms (server.body_timeout_ms)",
            deadline.as_millis()
        ))
        .into_response(),
    }
}

/// During the lame-duck period after SIGTERM every response says `Connection: close`, so keep-alive clients
/// reconnect (to another replica, once the load balancer has seen `/ready` turn 503) instead of sending on a
/// connection that is about to close.
async fn lame_duck(State(engine): State<Engine>, req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    if engine.draining() {
        resp.headers_mut()
            .insert("connection", HeaderValue::from_static("close"));
    }
    resp
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
        resp = ApiError::too_large(None).into_response();
    }
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
}

/// The public API's gate: the tenant goes into the request's extensions for the handlers (route permission,
/// metrics). (The batch runner's lines come in-process, `routes/in_process.rs`, never through here.)
pub async fn authenticate(State(engine): State<Engine>, mut req: Request, next: Next) -> Response {
    let key = crate::auth::api_key(req.headers());
    match engine.identify(key, std::time::Instant::now()) {
        Ok(t) => {
            req.extensions_mut().insert(t);
        }
        Err(e) => return ApiError::from(e).into_response(),
    }
    next.run(req).await
}
