//! Respond: every chat response is built here from the validated request, what became of it ([`Meta`], the
//! [`Outcome`]) and its timings — one-piece answers as JSON or a short SSE stream, LLM generations streamed or
//! collected, the headers that tell the client which tier answered.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::http::HeaderValue;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tiergate_queue::{Event, QueueError, Reply};

use crate::error::ApiError;
use crate::openai::{Logprobs, Usage};
use crate::validate::ValidChat;
use tiergate_core::outcome::header;
use tiergate_engine::cascade::Meta;
use tiergate_engine::metrics as m;
use tiergate_engine::state::AppState;
use tiergate_telemetry::TARGET;
use tracing::Instrument;

pub(super) fn apply_headers(resp: &mut Response, state: &AppState, meta: &Meta) {
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
    if let Some(v) = &meta.head {
        put(header::HEAD_VERSION, v.clone());
    }
    if let Some(d) = meta.degraded {
        put(header::DEGRADED, d.as_str().to_string());
    }
    if let Some(st) = &meta.stage {
        put(header::STAGE, st.clone());
    }
    if let Some(b) = &meta.backend {
        put(header::BACKEND, b.clone());
    }
    if let Some(c) = &meta.cache {
        put(header::CACHE, c.kind.as_str().to_string());
        put(header::CACHE_SIMILARITY, format!("{:.4}", c.similarity));
    }
    if let Some(s) = meta.oos_score {
        put(header::OOS_SCORE, format!("{s:.4}"));
    }
    if meta.out_of_scope {
        put(header::OUT_OF_SCOPE, "1".to_string());
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

/// A one-piece answer (Tier-0, reranked): JSON, or a short SSE stream.
pub(super) fn respond_text(
    state: &AppState,
    v: &ValidChat,
    content: String,
    logprobs: Option<Logprobs>,
    usage: Usage,
    meta: Meta,
) -> Response {
    let id = v.id.clone();
    let created = tiergate_engine::util::unix_now_s();
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

/// An LLM generation: streamed as SSE, or collected into one JSON response.
/// A generation's handle and the slot it holds until its last token.
struct Running {
    handle: tiergate_queue::JobHandle,
    slot: tiergate_engine::fair::Slot,
}

/// Answers with a generation that has produced its first event ([`super::attempt::first_event`]): streamed,
/// or collected into one body.
pub(super) async fn respond_started(
    state: &Arc<AppState>,
    v: &ValidChat,
    gen: tiergate_engine::attempt::Started<'_>,
    mut meta: Meta,
    extra_prompt_tokens: u32,
    started: Instant,
    keep: Option<tiergate_engine::cached::KeepWritten>,
) -> Result<Response, ApiError> {
    let tiergate_engine::attempt::Started {
        handle,
        slot,
        held: _held,
        first,
        waited,
    } = gen;
    meta.queue_ms = waited.as_secs_f64() * 1e3;
    metrics::histogram!(m::QUEUE_WAIT_SECONDS).record(waited.as_secs_f64());
    if matches!(first, Event::Chunk(_)) {
        metrics::histogram!(m::TTFT_SECONDS).record(started.elapsed().as_secs_f64());
    }
    let out = Generation {
        id: v.id.clone(),
        created: tiergate_engine::util::unix_now_s(),
        route: v.route.clone(),
        extra_prompt_tokens,
        keep,
    };
    let t = Instant::now();
    let mut resp = if v.stream {
        stream(out, Running { handle, slot }, first, v.include_usage)
    } else {
        let resp = collect(out, &handle, first).await?;
        meta.generation_ms = (waited + t.elapsed()).as_secs_f64() * 1e3;
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
    /// Keeps the whole text in the answer cache once the generation has ended well.
    keep: Option<tiergate_engine::cached::KeepWritten>,
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
    mut g: Generation,
    handle: &tiergate_queue::JobHandle,
    first: Event,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut ev = first;
    let usage = loop {
        match ev {
            Event::Chunk(c) => text.push_str(&c),
            Event::Reply(Reply::Generated(u)) => {
                if let Some(k) = g.keep.take() {
                    k.keep(text.clone(), finish_reason(&u), u.completion_tokens);
                }
                break u;
            }
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
fn stream(mut g: Generation, running: Running, first: Event, include_usage: bool) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<SseEvent>(64);
    tokio::spawn(
        async move {
            let Running {
                handle,
                slot: _slot,
            } = running;
            let mut keep = g.keep.take();
            let send = |delta: Value, finish: Option<&str>| {
                chunk(&g.id, g.created, &g.route, delta, finish, None)
            };
            let _ = tx
                .send(send(json!({"role": "assistant", "content": ""}), None))
                .await;
            let mut ev = first;
            let mut text = String::new();
            loop {
                match ev {
                    Event::Chunk(c) => {
                        if keep.is_some() {
                            text.push_str(&c);
                        }
                        if tx.send(send(json!({"content": c}), None)).await.is_err() {
                            return; // client gone: dropping the handle cancels the job
                        }
                    }
                    Event::Reply(Reply::Generated(u)) => {
                        if let Some(k) = keep.take() {
                            k.keep(
                                std::mem::take(&mut text),
                                finish_reason(&u),
                                u.completion_tokens,
                            );
                        }
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
