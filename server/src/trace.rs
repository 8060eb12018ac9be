//! The request's trace: a span per request continuing the client's W3C `traceparent` (a new trace without
//! one), its trace id in `x-tiergate-trace-id` and in every log line inside it, and the steps as child spans:
//! validate → prefilter (tokenise, queue_wait, infer) → decision → escalation (its job's context handed to the
//! worker through the queue) → response. Spans of target [`TARGET`] only; see `tiergate-telemetry`.

use std::time::{Duration, SystemTime};

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use tiergate_prefilter::Prediction;
use tiergate_queue::TraceParent;
use tiergate_telemetry::{record_child, set_attribute, w3c, KeyValue, TARGET};
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

/// The prefilter's steps, measured by its batching thread, as children of `span` (which began at `start`).
pub fn prefilter_steps(span: &tracing::Span, start: SystemTime, pred: &Prediction) {
    let t = &pred.timings;
    let tokenised = start + t.tokenize;
    let dequeued = tokenised + t.queue;
    record_child(
        span,
        "tokenise",
        start,
        tokenised,
        vec![KeyValue::new("tokens", pred.tokens as i64)],
    );
    record_child(span, "queue_wait", tokenised, dequeued, Vec::new());
    record_child(
        span,
        "infer",
        dequeued,
        dequeued + t.infer.max(Duration::from_nanos(1)),
        vec![KeyValue::new("batch.size", pred.batch_size as i64)],
    );
    set_attribute(
        span,
        KeyValue::new("tiergate.confidence", f64::from(pred.confidence)),
    );
    set_attribute(span, KeyValue::new("tiergate.truncated", pred.truncated));
}

/// The decision's attributes on `span`.
pub fn decision(span: &tracing::Span, d: &Decision) {
    for kv in [
        KeyValue::new("tiergate.ambiguity", d.ambiguity),
        KeyValue::new("tiergate.theta_eff", d.theta),
        KeyValue::new("tiergate.mode", d.mode),
        KeyValue::new("tiergate.policy_version", d.version as i64),
        KeyValue::new("tiergate.escalated", d.escalated),
        KeyValue::new("tiergate.forced", d.forced),
    ] {
        set_attribute(span, kv);
    }
    if let Some(score) = d.oos_score {
        set_attribute(span, KeyValue::new("tiergate.oos_score", f64::from(score)));
        set_attribute(span, KeyValue::new("tiergate.verdict", d.verdict));
    }
}

/// What a decision span reports.
pub struct Decision {
    /// a = 1 − confidence.
    pub ambiguity: f64,
    /// θ_eff (or the permitted override).
    pub theta: f64,
    /// The policy's mode.
    pub mode: &'static str,
    /// The policy's version.
    pub version: u64,
    /// a > θ.
    pub escalated: bool,
    /// θ came from the request.
    pub forced: bool,
    /// Tier-0's out-of-scope score (routes with an out-of-scope outcome).
    pub oos_score: Option<f32>,
    /// `answer`, `escalate` or `out_of_scope`.
    pub verdict: &'static str,
}

/// The mode's config spelling.
pub fn mode_name(m: tiergate_config::RoutingMode) -> &'static str {
    use tiergate_config::RoutingMode::*;
    match m {
        Static => "static",
        Load => "load",
        Target => "target",
        Slo => "slo",
        Risk => "risk",
    }
}

/// The current span's context, for the job it submits (the worker's spans become its children).
pub fn job_parent() -> Option<TraceParent> {
    tiergate_telemetry::context_of(&tracing::Span::current()).map(|c| TraceParent {
        traceparent: c.traceparent,
        tracestate: c.tracestate,
    })
}

/// Notes on the current span why an escalation fell back to Tier-0.
pub fn degraded(reason: &'static str) {
    set_attribute(
        &tracing::Span::current(),
        KeyValue::new("tiergate.degraded", reason),
    );
}
