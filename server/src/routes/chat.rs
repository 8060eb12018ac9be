//! `POST /v1/chat/completions`: validate, classify (Tier-0), decide, escalate or answer, respond (JSON or SSE).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tiergate_config::{FailureMode, RouteKind};
use tiergate_prefilter::Prediction;
use tiergate_queue::{Event, Job, Message, QueueError, Reply, Sampling};

use crate::app::{AppState, Route};
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::llm::Refused;
use crate::metrics as m;
use crate::openai::{ChatRequest, Logprobs, TokenLogprob, TopLogprob, Usage};
use crate::outcome::{DegradeReason, Outcome, Tier};
use crate::validate::{validate, ValidChat};
use tiergate_core::outcome::header;
use tiergate_telemetry::TARGET;
use tracing::Instrument;

use super::escalate::{decide, escalate_answer, escalate_rerank};

/// What the response headers report.
#[derive(Debug, Clone, Default)]
pub(super) struct Meta {
    pub(super) tier: Tier,
    pub(super) confidence: Option<f32>,
    pub(super) threshold: Option<f64>,
    /// θ came from the request (admin override): kept out of the policy's statistics.
    pub(super) forced: bool,
    pub(super) degraded: Option<DegradeReason>,
    pub(super) prefilter_ms: f64,
    /// The encoder's forward pass (Tier-0's model time).
    pub(super) infer_ms: f64,
    pub(super) queue_ms: f64,
    pub(super) rerank_ms: f64,
    /// A collected generation, from submit to its last token (the LLM's time).
    pub(super) generation_ms: f64,
}

impl Meta {
    /// The request's outcome as the response says it; `label` for a label answer.
    fn outcome(&self, label: Option<String>) -> Outcome {
        Outcome {
            tier: self.tier,
            degraded: self.degraded,
            confidence: self.confidence,
            threshold: self.threshold,
            label,
        }
    }

    /// Time spent in models (Tier-0's forward, the LLM's rerank or collected generation), as known when the
    /// headers are written: everything else is the serving overhead.
    fn model_ms(&self) -> f64 {
        self.infer_ms + self.rerank_ms + self.generation_ms
    }
}

/// The handler.
pub async fn chat(
    State(state): State<Arc<AppState>>,
    batch_line: Option<axum::Extension<crate::priority::BatchLine>>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<ChatRequest>,
) -> Response {
    let started = Instant::now();
    let validated = tracing::info_span!(target: TARGET, "validate")
        .in_scope(|| validate(req, |name| state.routes.get(name).map(|r| r.kind)));
    let mut valid = match validated {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    valid.batch = batch_line.map(|e| e.0);
    let route = valid.route.clone();
    tracing::debug!(route = %route, user = valid.user.as_deref().unwrap_or(""), stream = valid.stream, "chat request");
    let variant = state
        .experiments
        .assign(&route, valid.user.as_deref(), &headers);
    let result = match valid.kind {
        RouteKind::Generate => {
            let span = tracing::info_span!(target: TARGET, "generation");
            generate(&state, valid, started).instrument(span).await
        }
        RouteKind::Classify | RouteKind::Answer => {
            classified(&state, valid, &headers, started).await
        }
    };
    let mut resp = match result {
        Ok((resp, outcome)) => {
            // The bench's channels: Tier-0 answers, escalations the LLM answered, escalations degraded to Tier-0.
            let (tier, channel) = (outcome.tier.as_str(), outcome.channel().as_str());
            metrics::counter!(m::REQUESTS_TOTAL, "route" => route.clone(), "tier" => tier, "channel" => channel, "outcome" => "ok").increment(1);
            metrics::histogram!(m::REQUEST_SECONDS, "route" => route.clone(), "tier" => tier, "channel" => channel)
                .record(started.elapsed().as_secs_f64());
            crate::console::record(&state, &route, &outcome, started.elapsed());
            resp
        }
        Err(e) => {
            let code = e.parts().0.as_u16().to_string();
            metrics::counter!(m::REQUESTS_TOTAL, "route" => route.clone(), "tier" => "none", "channel" => "error", "outcome" => code).increment(1);
            e.into_response()
        }
    };
    // A latency experiment's delay comes last, out of the request metrics above (its own metrics have it).
    if let Some(v) = &variant {
        crate::experiments::apply(v, &route, &mut resp, started).await;
    }
    resp
}

fn completion_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "chatcmpl-{:x}{:06x}",
        crate::util::unix_now_s(),
        N.fetch_add(1, Ordering::Relaxed) & 0xff_ffff
    )
}

fn apply_headers(resp: &mut Response, state: &AppState, meta: &Meta) {
    let h = resp.headers_mut();
    let mut put = |k: &'static str, v: String| {
        if let Ok(v) = HeaderValue::from_str(&v) {
            h.insert(k, v);
        }
    };
    put(header::TIER, meta.tier.as_str().to_string());
    if let Some(c) = meta.confidence {
        put(header::CONFIDENCE, format!("{c:.4}"));
    }
    if let Some(t) = meta.threshold {
        put(header::THRESHOLD, format!("{t:.4}"));
    }
    put(
        "x-tiergate-policy-version",
        state.policy.current().version.to_string(),
    );
    if let Some(d) = meta.degraded {
        put(header::DEGRADED, d.as_str().to_string());
    }
    put(
        "server-timing",
        format!(
            "prefilter;dur={:.3}, infer;dur={:.3}, queue;dur={:.3}, rerank;dur={:.3}, model;dur={:.3}",
            meta.prefilter_ms,
            meta.infer_ms,
            meta.queue_ms,
            meta.rerank_ms,
            meta.model_ms()
        ),
    );
}

fn queue_error_reason(e: &QueueError) -> DegradeReason {
    match e {
        QueueError::Full { .. } => DegradeReason::QueueFull,
        QueueError::WorkerDown(_) => DegradeReason::WorkerDown,
        QueueError::DeadlineExceeded => DegradeReason::Deadline,
        _ => DegradeReason::LlmError,
    }
}

async fn classified(
    state: &Arc<AppState>,
    v: ValidChat,
    headers: &HeaderMap,
    started: Instant,
) -> Result<(Response, Outcome), ApiError> {
    let route = state
        .routes
        .get(&v.route)
        .ok_or_else(|| ApiError::UnknownModel(v.route.clone()))?;
    let prefilter = route
        .prefilter
        .as_ref()
        .ok_or_else(|| ApiError::Internal("route without a classifier".into()))?;
    let span = tracing::info_span!(target: TARGET, "prefilter");
    let at = std::time::SystemTime::now();
    let pred = prefilter.classify(&v.text).instrument(span.clone()).await?;
    crate::trace::prefilter_steps(&span, at, &pred);
    drop(span);
    metrics::histogram!(m::PREFILTER_BATCH_SIZE).record(pred.batch_size as f64);
    metrics::histogram!(m::PREFILTER_SECONDS).record(pred.timings.infer.as_secs_f64());
    metrics::histogram!(m::PREFILTER_QUEUE_SECONDS).record(pred.timings.queue.as_secs_f64());
    let mut meta = Meta {
        tier: Tier::Tier0,
        confidence: Some(pred.confidence),
        prefilter_ms: started.elapsed().as_secs_f64() * 1e3,
        infer_ms: pred.timings.infer.as_secs_f64() * 1e3,
        ..Meta::default()
    };
    let d = decide(state, pred, headers, &mut meta)?;
    // Tier-0's answer is also the degraded fallback.
    let mut final_probs = d.top.clone();
    if d.escalate {
        let span = tracing::info_span!(target: TARGET, "escalation");
        let answered = escalate_answer(state, route, &v, &d, &mut meta, started)
            .instrument(span.clone())
            .await?;
        if let Some(resp) = answered {
            return Ok((resp, meta.outcome(None)));
        }
        let reranked = escalate_rerank(state, route, &v, &d, &mut meta)
            .instrument(span)
            .await?;
        if let Some(fused) = reranked {
            final_probs = fused;
        }
        if !meta.forced {
            state
                .policy
                .record_escalated_latency(Instant::now(), started.elapsed().as_secs_f64() * 1e3);
        }
    }
    tracing::info_span!(target: TARGET, "response")
        .in_scope(|| respond_label(state, route, &v, &d.pred, final_probs, meta))
}

/// The label answer (classify), or the label's reply (answer route, not escalated or degraded).
fn respond_label(
    state: &AppState,
    route: &Route,
    v: &ValidChat,
    pred: &Prediction,
    final_probs: Vec<(usize, f32)>,
    mut meta: Meta,
) -> Result<(Response, Outcome), ApiError> {
    let prefilter = route
        .prefilter
        .as_ref()
        .ok_or_else(|| ApiError::Internal("route without a classifier".into()))?;
    let labels = prefilter.labels();
    let (best, best_p) = final_probs
        .first()
        .copied()
        .unwrap_or((pred.label, pred.confidence));
    if meta.tier == Tier::Llm {
        meta.confidence = Some(best_p);
    }
    let label = labels[best].clone();
    let content = if v.json_object {
        json!({
            "label": label,
            "confidence": best_p,
            "tier": meta.tier.as_str(),
            "candidates": final_probs.iter().map(|(i, p)| json!({"label": labels[*i], "p": p})).collect::<Vec<_>>(),
        })
        .to_string()
    } else if v.kind == RouteKind::Answer {
        prefilter
            .replies()
            .get(best)
            .cloned()
            .flatten()
            .unwrap_or_else(|| label.clone())
    } else {
        label.clone()
    };
    let logprobs = v
        .logprobs
        .then(|| label_logprobs(pred, labels, &label, best_p, &final_probs, v.top_logprobs));
    let outcome = meta.outcome(Some(label));
    let resp = respond_text(
        state,
        v,
        content,
        logprobs,
        Usage::new(pred.tokens as u32, 1),
        meta,
    );
    Ok((resp, outcome))
}

pub(super) fn degrade(state: &AppState, meta: &mut Meta, e: &QueueError) -> Result<(), ApiError> {
    tracing::warn!(error = %e, "escalation failed: answering with Tier-0");
    if state.config.server.on_escalation_failure == FailureMode::Reject {
        return Err(ApiError::from(e.clone()));
    }
    meta.tier = Tier::Tier0;
    meta.degraded = Some(queue_error_reason(e));
    crate::trace::degraded(queue_error_reason(e).as_str());
    Ok(())
}

fn label_logprobs(
    pred: &Prediction,
    labels: &[String],
    label: &str,
    p: f32,
    final_probs: &[(usize, f32)],
    k: usize,
) -> Logprobs {
    let ln = |p: f32| f64::from(p.max(1e-12)).ln();
    let alts: Vec<(usize, f32)> = if final_probs.len() >= k {
        final_probs.to_vec()
    } else {
        pred.top.clone()
    };
    Logprobs {
        content: vec![TokenLogprob {
            token: label.to_string(),
            logprob: ln(p),
            bytes: Some(label.as_bytes().to_vec()),
            top_logprobs: alts
                .iter()
                .take(k)
                .map(|(i, p)| TopLogprob {
                    token: labels[*i].clone(),
                    logprob: ln(*p),
                    bytes: Some(labels[*i].as_bytes().to_vec()),
                })
                .collect(),
        }],
    }
}

pub(super) fn sampling(v: &ValidChat) -> Sampling {
    Sampling {
        max_tokens: v.max_tokens,
        temperature: v.temperature,
        top_p: v.top_p,
        stop: v.stop.clone(),
        seed: v.seed,
    }
}

/// A one-piece answer (Tier-0, reranked): JSON, or a short SSE stream.
fn respond_text(
    state: &AppState,
    v: &ValidChat,
    content: String,
    logprobs: Option<Logprobs>,
    usage: Usage,
    meta: Meta,
) -> Response {
    let id = completion_id();
    let created = crate::util::unix_now_s();
    let mut resp = if v.stream {
        let mut events = vec![
            chunk(
                &id,
                created,
                &v.route,
                json!({"role": "assistant", "content": ""}),
                None,
                None,
            ),
            chunk(
                &id,
                created,
                &v.route,
                json!({"content": content}),
                None,
                logprobs.as_ref(),
            ),
            chunk(&id, created, &v.route, json!({}), Some("stop"), None),
        ];
        if v.include_usage {
            events.push(usage_chunk(&id, created, &v.route, &usage));
        }
        events.push(SseEvent::default().data("[DONE]"));
        let stream = futures_util::stream::iter(events.into_iter().map(Ok::<_, Infallible>));
        Sse::new(stream).into_response()
    } else {
        axum::Json(json!({
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": v.route,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "logprobs": logprobs, "finish_reason": "stop"}],
            "usage": usage,
        }))
        .into_response()
    };
    apply_headers(&mut resp, state, &meta);
    resp
}

fn chunk(
    id: &str,
    created: u64,
    model: &str,
    delta: serde_json::Value,
    finish: Option<&str>,
    logprobs: Option<&Logprobs>,
) -> SseEvent {
    SseEvent::default().data(
        json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
               "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]})
        .to_string(),
    )
}

fn usage_chunk(id: &str, created: u64, model: &str, usage: &Usage) -> SseEvent {
    SseEvent::default().data(
        json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
               "choices": [], "usage": usage})
        .to_string(),
    )
}

async fn generate(
    state: &Arc<AppState>,
    v: ValidChat,
    started: Instant,
) -> Result<(Response, Outcome), ApiError> {
    let messages = v
        .messages
        .iter()
        .map(|m| Message {
            role: m.role.clone(),
            content: m.content.clone(),
        })
        .collect();
    let job = Job::Generate {
        messages,
        sampling: sampling(&v),
    };
    let submitted = match crate::llm::submit(state, &job, v.batch.as_ref()).await {
        Ok(s) => s,
        Err(Refused::NoLlm) => {
            return Err(ApiError::Unavailable(
                "this server runs no LLM workers".into(),
            ))
        }
        Err(Refused::Queue(e)) => return Err(ApiError::from(e)),
    };
    let meta = Meta {
        tier: Tier::Llm,
        ..Meta::default()
    };
    let outcome = meta.outcome(None);
    let resp = stream_or_collect(state, &v, submitted.handle, meta, 0, started).await?;
    Ok((resp, outcome))
}

/// An LLM generation: streamed as SSE, or collected into one JSON response.
pub(super) async fn stream_or_collect(
    state: &Arc<AppState>,
    v: &ValidChat,
    handle: tiergate_queue::JobHandle,
    mut meta: Meta,
    extra_prompt_tokens: u32,
    started: Instant,
) -> Result<Response, ApiError> {
    // Wait for the first event before answering, so errors before any token still get a proper status.
    let t = Instant::now();
    let first = next_event(&handle).await?;
    meta.queue_ms = t.elapsed().as_secs_f64() * 1e3;
    metrics::histogram!(m::QUEUE_WAIT_SECONDS).record(t.elapsed().as_secs_f64());
    if let Event::Error(e) = first {
        return Err(ApiError::from(e));
    }
    if matches!(first, Event::Chunk(_)) {
        metrics::histogram!(m::TTFT_SECONDS).record(started.elapsed().as_secs_f64());
    }
    let out = Generation {
        id: completion_id(),
        created: crate::util::unix_now_s(),
        route: v.route.clone(),
        extra_prompt_tokens,
    };
    let mut resp = if v.stream {
        stream(out, handle, first, v.include_usage)
    } else {
        let resp = collect(out, &handle, first).await?;
        meta.generation_ms = t.elapsed().as_secs_f64() * 1e3;
        resp
    };
    apply_headers(&mut resp, state, &meta);
    Ok(resp)
}

/// What every chunk or body of one generation repeats.
struct Generation {
    id: String,
    created: u64,
    route: String,
    /// Prompt tokens the worker did not see (Tier-0's, for an escalated answer).
    extra_prompt_tokens: u32,
}

impl Generation {
    fn usage(&self, u: &tiergate_queue::Usage) -> Usage {
        Usage::new(
            u.prompt_tokens + self.extra_prompt_tokens,
            u.completion_tokens,
        )
    }
}

fn finish_reason(u: &tiergate_queue::Usage) -> &'static str {
    if u.finish_reason == "length" {
        "length"
    } else {
        "stop"
    }
}

async fn next_event(handle: &tiergate_queue::JobHandle) -> Result<Event, ApiError> {
    handle
        .events
        .recv_async()
        .await
        .map_err(|_| ApiError::Internal("escalation channel closed".into()))
}

/// The whole generation as one `chat.completion`.
async fn collect(
    g: Generation,
    handle: &tiergate_queue::JobHandle,
    first: Event,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut ev = first;
    let usage = loop {
        match ev {
            Event::Chunk(c) => text.push_str(&c),
            Event::Reply(Reply::Generated(u)) => break u,
            Event::Reply(_) => return Err(ApiError::Internal("unexpected reply kind".into())),
            Event::Error(e) => return Err(ApiError::from(e)),
        }
        ev = next_event(handle).await?;
    };
    Ok(axum::Json(json!({
        "id": g.id, "object": "chat.completion", "created": g.created, "model": g.route,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null,
                     "finish_reason": finish_reason(&usage)}],
        "usage": g.usage(&usage),
    }))
    .into_response())
}

/// The generation as server-sent events, fed by a task that ends (cancelling the job) when the client goes.
fn stream(
    g: Generation,
    handle: tiergate_queue::JobHandle,
    first: Event,
    include_usage: bool,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<SseEvent>(64);
    tokio::spawn(
        async move {
            let send = |delta: Value, finish: Option<&str>| {
                chunk(&g.id, g.created, &g.route, delta, finish, None)
            };
            let _ = tx
                .send(send(json!({"role": "assistant", "content": ""}), None))
                .await;
            let mut ev = first;
            loop {
                match ev {
                    Event::Chunk(c) => {
                        if tx.send(send(json!({"content": c}), None)).await.is_err() {
                            return; // client gone: dropping the handle cancels the job
                        }
                    }
                    Event::Reply(Reply::Generated(u)) => {
                        let _ = tx.send(send(json!({}), Some(finish_reason(&u)))).await;
                        if include_usage {
                            let usage = usage_chunk(&g.id, g.created, &g.route, &g.usage(&u));
                            let _ = tx.send(usage).await;
                        }
                        break;
                    }
                    Event::Reply(_) | Event::Error(_) => {
                        let err = match ev {
                            Event::Error(e) => ApiError::from(e),
                            _ => ApiError::Internal("unexpected reply kind".into()),
                        };
                        let _ = tx
                            .send(SseEvent::default().data(err.body().to_string()))
                            .await;
                        break;
                    }
                }
                ev = match handle.events.recv_async().await {
                    Ok(e) => e,
                    Err(_) => Event::Error(QueueError::Cancelled),
                };
            }
            let _ = tx.send(SseEvent::default().data("[DONE]")).await;
        }
        .instrument(tracing::info_span!(target: TARGET, "stream")),
    );
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let stream = futures_util::StreamExt::map(stream, Ok::<_, Infallible>);
    Sse::new(stream).into_response()
}
