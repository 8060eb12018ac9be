//! The steps of a request's trace as child spans of the request's span (which the HTTP adapter opens):
//! prefilter (tokenise, queue_wait, infer) → decision → escalation (its job's context handed to the worker
//! through the queue). Spans of target `tiergate_telemetry::TARGET` only.

use std::time::{Duration, SystemTime};

use tiergate_prefilter::Prediction;
use tiergate_queue::TraceParent;
use tiergate_telemetry::{record_child, set_attribute, KeyValue};

/// The prefilter's steps, measured by its batching thread, as children of `span` (which began at `start`).
pub(crate) fn prefilter_steps(span: &tracing::Span, start: SystemTime, pred: &Prediction) {
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
pub(crate) fn decision(span: &tracing::Span, d: &Decision) {
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
pub(crate) struct Decision {
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
pub(crate) fn mode_name(m: tiergate_config::RoutingMode) -> &'static str {
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
pub(crate) fn job_parent() -> Option<TraceParent> {
    tiergate_telemetry::context_of(&tracing::Span::current()).map(|c| TraceParent {
        traceparent: c.traceparent,
        tracestate: c.tracestate,
    })
}

/// Notes on the current span why an escalation fell back to Tier-0.
pub(crate) fn degraded(reason: &'static str) {
    set_attribute(
        &tracing::Span::current(),
        KeyValue::new("tiergate.degraded", reason),
    );
}
