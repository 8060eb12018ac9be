//! The request's span: it continues the client's W3C `traceparent` (a new trace without one) and returns its
//! trace id in `x-tiergate-trace-id`; every log line inside it carries the id. The steps' child spans are the
//! engine's (`tiergate_engine::answer::trace`). Spans of target [`TARGET`] only; see `tiergate-telemetry`.

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use tiergate_telemetry::{set_attribute, w3c, KeyValue, TARGET};
use tracing::Instrument;

/// The response header carrying the request's trace id.
pub const TRACE_ID_HEADER: &str = "x-tiergate-trace-id";

/// The target of the per-request log line (`RUST_LOG=info,tiergate::access=debug` turns it on).
pub const ACCESS_LOG: &str = "tiergate::access";

/// Runs the request inside its span and returns the trace id with the response.
pub async fn request(req: Request, next: Next) -> Response {
    let parent = {
        let header = |k: &str| req.headers().get(k).and_then(|v| v.to_str().ok());
        w3c::extract(header("traceparent"), header("tracestate"))
    };
    let span = tracing::info_span!(
        target: TARGET,
        "request",
        otel.name = %format!("{} {}", req.method(), req.uri().path()),
        otel.kind = "server",
        trace_id = tracing::field::Empty,
    );
    tiergate_telemetry::set_parent(&span, parent);
    let trace_id = tiergate_telemetry::trace_id(&span);
    if let Some(id) = &trace_id {
        span.record("trace_id", id.as_str());
    }
    set_attribute(
        &span,
        KeyValue::new("http.request.method", req.method().to_string()),
    );
    let started = std::time::Instant::now();
    let mut resp = next.run(req).instrument(span.clone()).await;
    let status = resp.status().as_u16();
    set_attribute(
        &span,
        KeyValue::new("http.response.status_code", i64::from(status)),
    );
    if status >= 500 {
        tiergate_telemetry::set_error(&span, &format!("HTTP {status}"));
    }
    span.in_scope(|| {
        tracing::debug!(
            target: ACCESS_LOG,
            status,
            ms = started.elapsed().as_secs_f64() * 1e3,
            "request done"
        )
    });
    if let Some(v) = trace_id.and_then(|id| HeaderValue::from_str(&id).ok()) {
        resp.headers_mut().insert(TRACE_ID_HEADER, v);
    }
    resp
}
