//! HTTP endpoints, one file each, and the router that ties them together.

pub mod admin;
pub mod audits;
pub mod cache;
pub mod chat;
mod escalate;
pub mod feedback;
pub mod heads;
pub mod ops;
mod respond;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::error::ApiError;
use tiergate_engine::state::AppState;

/// The public router: the OpenAI API behind the admission limit (bodies read in full, within a total deadline,
/// before a permit is taken), and the probes and metrics outside it (a liveness probe never gets 429).
pub fn router(state: Arc<AppState>) -> Router {
    router_with(state, &[])
}

/// The public router with the routes of `products` beside the OpenAI API.
pub fn router_with(state: Arc<AppState>, products: &[Arc<dyn crate::product::Product>]) -> Router {
    let api = Router::new()
        .route("/v1/chat/completions", post(chat::chat))
        .route("/v1/models", get(ops::models))
        .route("/v1/feedback", post(feedback::feedback))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            admission,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authenticate,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            read_body,
        ))
        .layer(axum::middleware::from_fn(crate::trace::request));
    let products = products.iter().fold(Router::new(), |r, p| {
        r.merge(
            p.routes()
                .layer(axum::middleware::from_fn_with_state(
                    state.clone(),
                    authenticate,
                ))
                .layer(axum::middleware::from_fn(crate::trace::request)),
        )
    });
    let public = Router::new()
        .merge(api)
        .merge(products)
        .route("/metrics", get(ops::metrics))
        .route("/health", get(ops::health))
        .route("/ready", get(ops::ready))
        .fallback(|| async { ApiError::NotFound("no such endpoint".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            lame_duck,
        ));
    outer_layers(public, state)
}

/// What both listeners do to every request: the head limits, the request id, the body limit.
fn outer_layers(router: Router<Arc<AppState>>, state: Arc<AppState>) -> Router {
    let limit = state.config.server.max_body_bytes;
    router
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            header_limits,
        ))
        .layer(axum::middleware::from_fn(too_large_and_request_id))
        .layer(axum::extract::DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// Headers a request may carry.
pub const MAX_HEADERS: usize = 100;

/// 431 in the OpenAI error shape for a request head over the limits (`server.max_header_bytes`,
/// [`MAX_HEADERS`]).
async fn header_limits(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let headers = req.headers();
    let bytes: usize = req.uri().path_and_query().map_or(0, |p| p.as_str().len())
        + headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 4)
            .sum::<usize>();
    let max = state.config.server.max_header_bytes;
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
pub fn admin_router(state: Arc<AppState>) -> Router {
    admin_router_with(state, &[])
}

/// The admin router with the admin routes of `products`.
pub fn admin_router_with(
    state: Arc<AppState>,
    products: &[Arc<dyn crate::product::Product>],
) -> Router {
    let products = products
        .iter()
        .fold(Router::new(), |r, p| r.merge(p.admin_routes()));
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
        .merge(products)
        .fallback(|| async { ApiError::NotFound("no such admin endpoint".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            read_body,
        ));
    outer_layers(admin, state)
}

/// Reads the whole request body within `server.body_timeout_ms` in total (a body trickled a byte at a time
/// does not reset the clock) and at most `server.max_body_bytes`, before any admission permit is taken: a
/// stalled upload holds a connection, never a share of the server.
async fn read_body(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let limit = state.config.server.max_body_bytes;
    let declared = req
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return ApiError::TooLarge.into_response();
    }
    let deadline = std::time::Duration::from_millis(state.config.server.body_timeout_ms);
    let (parts, body) = req.into_parts();
    match tokio::time::timeout(deadline, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => next.run(Request::from_parts(parts, bytes.into())).await,
        Ok(Err(e)) => {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if too_large {
                ApiError::TooLarge.into_response()
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

/// The one admission point: every API request takes a permit or gets 429. The permit lives as long as the
/// response body, so a streamed (SSE) answer counts against the limit until its last byte or its client's
/// disconnect.
async fn admission(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let Ok(permit) = state.admission.clone().try_acquire_owned() else {
        return ApiError::Overloaded {
            message: "server at its in-flight limit; retry shortly".into(),
            retry_after_s: 1,
        }
        .into_response();
    };
    next.run(req).await.map(|body| {
        axum::body::Body::new(Held {
            body,
            _permit: permit,
        })
    })
}

/// A response body that holds an admission permit until it is finished or dropped.
struct Held {
    body: axum::body::Body,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl http_body::Body for Held {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// During the lame-duck period after SIGTERM every response says `Connection: close`, so keep-alive clients
/// reconnect (to another replica, once the load balancer has seen `/ready` turn 503) instead of sending on a
/// connection that is about to close.
async fn lame_duck(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    if state.draining.load(std::sync::atomic::Ordering::Acquire) {
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
        resp = ApiError::TooLarge.into_response();
    }
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
}

/// The public API's gate: the tenant goes into the request's extensions for the handlers (route permission,
/// metrics). A request that already carries one (an in-process caller: the batch runner) passes as it.
pub async fn authenticate(
    State(state): State<Arc<AppState>>,
    mut req: Request,
    next: Next,
) -> Response {
    if req
        .extensions()
        .get::<tiergate_engine::tenants::TenantId>()
        .is_none()
    {
        match crate::adapt::identify(&state.tenants(), req.headers(), std::time::Instant::now()) {
            Ok(Some(t)) => {
                req.extensions_mut().insert(t.id.clone());
            }
            Ok(None) => {
                req.extensions_mut()
                    .insert(tiergate_engine::tenants::TenantId::anonymous());
            }
            Err(e) => return e.into_response(),
        }
    }
    next.run(req).await
}
