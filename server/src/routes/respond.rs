//! The Chat Completions rendering of an engine [`Answer`]: a label or a one-piece text as JSON or a short SSE
//! stream, a generation streamed as chunks or collected into one body, and the headers that say which tier
//! answered (read off the [`Outcome`]). The response body holds the request's admission permit to its last
//! byte.

use std::convert::Infallible;

use axum::http::HeaderValue;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::openai::{Logprobs, TokenLogprob, TopLogprob, Usage};
use crate::validate::ValidChat;
use tiergate_config::RouteKind;
use tiergate_core::outcome::header;
use tiergate_engine::answer::{
    Admitted, Answer, Body, Delta, Finish, Generation, Labelled, Tokens,
};
use tiergate_engine::model::outcome::Outcome;
use tiergate_engine::model::request::ToolCall;
use tiergate_engine::Engine;
use tiergate_telemetry::TARGET;
use tracing::Instrument;

/// The response to `v` for the engine's answer.
pub(super) async fn render(engine: &Engine, v: &ValidChat, a: Answer) -> Response {
    let Answer {
        body,
        outcome,
        admitted,
    } = a;
    let (resp, outcome) = match body {
        Body::Label(l) if v.stream => {
            let (content, logprobs) = label_content(v, &outcome, &l);
            let usage = Usage::new(l.prompt_tokens, 1);
            (sse_one_piece(v, content, logprobs, usage), outcome)
        }
        Body::Text { text, tokens } if v.stream => {
            (sse_one_piece(v, text, None, usage(tokens)), outcome)
        }
        Body::Stream(g) if v.stream => (stream(v, *g, every(engine)), outcome),
        body => match completion(v, body, outcome).await {
            Ok((json, outcome)) => (axum::Json(json).into_response(), outcome),
            Err(e) => return e.into_response(),
        },
    };
    let mut resp = hold(resp, admitted);
    apply_headers(&mut resp, &outcome);
    resp
}

/// The engine's answer to `v` as the door renders it (`draw`), or its refusal in the door's error shape —
/// behind an early head when `v` streams and is slow to start ([`crate::early`]) — with the request's own
/// marks ([`crate::adapt::mark_request`]): every door's one engine call.
pub(super) async fn answered<D, Fut>(
    engine: &Engine,
    v: &ValidChat,
    dialect: crate::early::Dialect,
    draw: D,
) -> Response
where
    D: FnOnce(Engine, ValidChat, Answer) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Response> + Send,
{
    answered_admitted(engine, v, None, dialect, draw).await
}

/// [`answered`] holding the permit the door took early ([`Engine::admit_early`]), when it took one.
pub(super) async fn answered_admitted<D, Fut>(
    engine: &Engine,
    v: &ValidChat,
    early: Option<tiergate_engine::answer::Admitted>,
    dialect: crate::early::Dialect,
    draw: D,
) -> Response
where
    D: FnOnce(Engine, ValidChat, Answer) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Response> + Send,
{
    let run = {
        let (engine, v) = (engine.clone(), v.clone());
        async move {
            let answer = match early {
                Some(a) => engine.answer_admitted(&v, a).await,
                None => engine.answer(&v).await,
            };
            match answer {
                Ok(a) => draw(engine, v, a).await,
                Err(d) => refused(d),
            }
        }
    };
    let resp = crate::early::answered(&engine.config().server, v.stream, dialect, run).await;
    crate::adapt::mark_request(resp, v)
}

/// The answer as one `chat.completion`, with what became of the request (a generation's, collected, has its
/// generation time).
pub(super) async fn completion(
    v: &ValidChat,
    body: Body,
    o: Outcome,
) -> Result<(Value, Outcome), ApiError> {
    let mut o = o;
    let (content, calls, logprobs, finish, usage) = match body {
        Body::Label(l) => {
            let (content, logprobs) = label_content(v, &o, &l);
            (
                content,
                vec![],
                logprobs,
                "stop",
                Usage::new(l.prompt_tokens, 1),
            )
        }
        Body::Text { text, tokens } => (text, vec![], None, "stop", usage(tokens)),
        Body::Stream(g) => {
            let c = collect(*g).await?;
            o = c.outcome;
            (c.text, c.calls, None, c.finish.as_str(), usage(c.tokens))
        }
    };
    let mut message = json!({"role": "assistant", "content": content});
    if !calls.is_empty() {
        if message["content"] == "" {
            message["content"] = Value::Null;
        }
        message["tool_calls"] = calls.iter().map(crate::openai_tools::call_json).collect();
    }
    let c = Chunks::of(v);
    let json = json!({
        "id": c.id, "object": "chat.completion", "created": c.created, "model": c.model,
        "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}],
        "usage": usage,
    });
    Ok((json, o))
}

/// A generation collected whole: its text, its tool calls, why it ended and its tokens.
pub(super) struct Collected {
    pub text: String,
    pub calls: Vec<ToolCall>,
    pub finish: Finish,
    pub tokens: Tokens,
    /// The stop sequence that ended it, when the engine says which.
    pub stop_sequence: Option<String>,
    /// What became of the request, its generation time included.
    pub outcome: Outcome,
}

fn usage(t: Tokens) -> Usage {
    Usage::new(t.prompt, t.completion).cached(t.cached)
}

/// `resp` as another door renders it: holding the admission permit to its last byte, with the outcome's
/// headers.
pub(super) fn finish(resp: Response, outcome: &Outcome, admitted: Admitted) -> Response {
    let mut resp = hold(resp, admitted);
    apply_headers(&mut resp, outcome);
    resp
}

/// A generation collected whole, for another door.
pub(super) async fn collected(g: Generation) -> Result<Collected, ApiError> {
    collect(g).await
}

/// A label answer's text as the chat door gives it (the label, an answer route's reply, or the JSON label
/// object).
pub(super) fn label_text(v: &ValidChat, o: &Outcome, l: &Labelled) -> String {
    label_content(v, o, l).0
}

/// The response body, holding the admission permit until it is finished or dropped.
fn hold(resp: Response, admitted: Admitted) -> Response {
    resp.map(|body| {
        axum::body::Body::new(Held {
            body,
            _admitted: admitted,
        })
    })
}

/// A response body that holds an admission permit until it is finished or dropped.
struct Held {
    body: axum::body::Body,
    _admitted: Admitted,
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

/// The headers that say how the request was answered, and its `Server-Timing`.
fn apply_headers(resp: &mut Response, o: &Outcome) {
    let h = resp.headers_mut();
    for (k, v) in outcome_headers(o) {
        if let Ok(v) = HeaderValue::from_str(&v) {
            h.insert(k, v);
        }
    }
}

/// The headers an answer carries: which tier answered, θ, the head, why it degraded, the stage, backend and
/// cache, the brownout step, and its `Server-Timing`.
pub(super) fn outcome_headers(o: &Outcome) -> Vec<(&'static str, String)> {
    let mut h = vec![(header::TIER, o.tier.as_str().to_string())];
    let mut put = |k: &'static str, v: Option<String>| h.extend(v.map(|v| (k, v)));
    put(header::CONFIDENCE, o.confidence.map(|c| format!("{c:.4}")));
    put(header::THRESHOLD, o.threshold.map(|t| format!("{t:.4}")));
    put(
        "x-tiergate-policy-version",
        Some(o.policy_version.to_string()),
    );
    put(header::VARIANT, o.variant.clone());
    put(header::HEAD_VERSION, o.head.clone());
    put(header::DEGRADED, o.degraded.map(|d| d.as_str().to_string()));
    put(header::STAGE, o.stage.clone());
    put(header::BACKEND, o.backend.clone());
    put(header::SESSION, o.session.map(str::to_string));
    put(header::SWITCH, o.switch.as_ref().map(ToString::to_string));
    put(
        header::CONTEXT,
        (o.context > 0).then(|| o.context.to_string()),
    );
    put(header::CACHE, o.cache.map(|c| c.kind.as_str().to_string()));
    put(
        header::CACHE_SIMILARITY,
        o.cache.map(|c| format!("{:.4}", c.similarity)),
    );
    put(header::OOS_SCORE, o.oos_score.map(|s| format!("{s:.4}")));
    put(
        header::OUT_OF_SCOPE,
        o.out_of_scope.then(|| "1".to_string()),
    );
    let t = &o.timings;
    let timing = format!(
        "prefilter;dur={:.3}, infer;dur={:.3}, queue;dur={:.3}, rerank;dur={:.3}, model;dur={:.3}",
        t.prefilter_ms,
        t.infer_ms,
        t.queue_ms,
        t.rerank_ms,
        t.model_ms()
    );
    put("server-timing", Some(timing));
    let brownout = o.brownout != tiergate_engine::model::outcome::Step::Normal;
    put(
        header::BROWNOUT,
        brownout.then(|| o.brownout.as_str().to_string()),
    );
    h
}

/// A label answer's content: the JSON label object (`response_format`), an answer route's reply, or the
/// label; and its logprobs when asked.
fn label_content(v: &ValidChat, o: &Outcome, l: &Labelled) -> (String, Option<Logprobs>) {
    let content = if v.json_object {
        json!({
            "label": l.label,
            "confidence": l.p,
            "tier": o.tier.as_str(),
            "out_of_scope": o.out_of_scope,
            "candidates": l.candidates.iter().map(|(n, p)| json!({"label": n, "p": p})).collect::<Vec<_>>(),
        })
        .to_string()
    } else if v.kind == RouteKind::Answer {
        l.reply.clone().unwrap_or_else(|| l.label.clone())
    } else {
        l.label.clone()
    };
    (
        content,
        v.logprobs.then(|| label_logprobs(l, v.top_logprobs)),
    )
}

fn label_logprobs(l: &Labelled, k: usize) -> Logprobs {
    let ln = |p: f32| f64::from(p.max(1e-12)).ln();
    let alts = if l.candidates.len() >= k {
        &l.candidates
    } else {
        &l.tier0_top
    };
    Logprobs {
        content: vec![TokenLogprob {
            token: l.label.clone(),
            logprob: ln(l.p),
            bytes: Some(l.label.as_bytes().to_vec()),
            top_logprobs: alts
                .iter()
                .take(k)
                .map(|(name, p)| TopLogprob {
                    token: name.clone(),
                    logprob: ln(*p),
                    bytes: Some(name.as_bytes().to_vec()),
                })
                .collect(),
        }],
    }
}

/// A one-piece answer as a short SSE stream.
fn sse_one_piece(
    v: &ValidChat,
    content: String,
    logprobs: Option<Logprobs>,
    usage: Usage,
) -> Response {
    let c = Chunks::of(v);
    let mut events = vec![
        c.chunk(json!({"role": "assistant", "content": ""}), None, None),
        c.chunk(json!({"content": content}), None, logprobs.as_ref()),
        c.chunk(json!({}), Some("stop"), None),
    ];
    if v.include_usage {
        events.push(c.usage(&usage));
    }
    events.push(SseEvent::default().data("[DONE]"));
    let stream = futures_util::stream::iter(events.into_iter().map(Ok::<_, Infallible>));
    Sse::new(stream).into_response()
}

/// What every chunk of one answer repeats.
struct Chunks {
    id: String,
    created: u64,
    model: String,
}

impl Chunks {
    fn of(v: &ValidChat) -> Self {
        Self {
            id: v.id.clone(),
            created: crate::validate::unix_now_s(),
            model: v.route.clone(),
        }
    }

    fn chunk(&self, delta: Value, finish: Option<&str>, logprobs: Option<&Logprobs>) -> SseEvent {
        SseEvent::default().data(
            json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                   "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]})
            .to_string(),
        )
    }

    fn usage(&self, usage: &Usage) -> SseEvent {
        SseEvent::default().data(
            json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                   "choices": [], "usage": usage})
            .to_string(),
        )
    }
}

/// The whole generation: its text and tool calls, why it ended and its tokens; its time goes into the
/// outcome's model time.
async fn collect(mut g: Generation) -> Result<Collected, ApiError> {
    let mut text = String::new();
    let mut calls = Vec::new();
    let (finish, tokens, stop_sequence) = loop {
        match g.next().await {
            Some(Ok(Delta::Text(c))) => text.push_str(&c),
            Some(Ok(Delta::ToolCall(c))) => calls.push(c),
            Some(Ok(Delta::End {
                finish,
                tokens,
                stop_sequence,
            })) => break (finish, tokens, stop_sequence),
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(ApiError::from(e)),
            None => {
                return Err(ApiError::Internal(
                    "the generation ended without its end".into(),
                ))
            }
        }
    };
    Ok(Collected {
        text,
        calls,
        finish,
        tokens,
        stop_sequence,
        outcome: g.outcome().clone(),
    })
}

/// The generation as server-sent events, fed by a task that ends (cancelling the job) when the client goes.
fn stream(v: &ValidChat, mut g: Generation, quiet: std::time::Duration) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<SseEvent>(64);
    let c = Chunks::of(v);
    let include_usage = v.include_usage;
    let span = tracing::info_span!(target: TARGET, parent: g.span(), "stream");
    tokio::spawn(
        async move {
            let _ = tx
                .send(c.chunk(json!({"role": "assistant", "content": ""}), None, None))
                .await;
            let mut calls = 0usize;
            while let Some(next) = g.next().await {
                let event = match next {
                    Ok(Delta::Text(t)) => c.chunk(json!({"content": t}), None, None),
                    Ok(Delta::ToolCall(t)) => {
                        calls += 1;
                        let call = json!({"index": calls - 1, "id": t.id, "type": "function",
                                          "function": {"name": t.name, "arguments": t.arguments}});
                        c.chunk(json!({"tool_calls": [call]}), None, None)
                    }
                    Ok(Delta::End { finish, tokens, .. }) => {
                        let _ = tx
                            .send(c.chunk(json!({}), Some(finish.as_str()), None))
                            .await;
                        if !include_usage {
                            continue;
                        }
                        c.usage(&usage(tokens))
                    }
                    Ok(_) => continue,
                    Err(e) => SseEvent::default().data(ApiError::from(e).body().to_string()),
                };
                if tx.send(event).await.is_err() {
                    return; // client gone: dropping the generation cancels the job
                }
            }
            let _ = tx.send(SseEvent::default().data("[DONE]")).await;
        }
        .instrument(span),
    );
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let stream = futures_util::StreamExt::map(stream, Ok::<_, Infallible>);
    Sse::new(stream)
        .keep_alive(keep_alive(quiet, None))
        .into_response()
}

/// The quiet time after which a stream sends a keep-alive (`server.keepalive_ms`).
pub(super) fn every(engine: &Engine) -> std::time::Duration {
    std::time::Duration::from_millis(engine.config().server.keepalive_ms)
}

/// While a generation is quiet (a slow step), an SSE comment (or the dialect's own event: Anthropic's
/// `ping`) after every `quiet` without an event, so an agent's idle timeout does not fire and retry.
pub(super) fn keep_alive(
    quiet: std::time::Duration,
    event: Option<SseEvent>,
) -> axum::response::sse::KeepAlive {
    let k = axum::response::sse::KeepAlive::new().interval(quiet);
    match event {
        Some(e) => k.event(e),
        None => k,
    }
}

/// The response to a request the engine declined: its error, counted when it ran, marked with the brownout
/// step.
pub(super) fn refused(d: tiergate_engine::answer::Declined) -> Response {
    let step = d.brownout;
    crate::adapt::mark_brownout(ApiError::from(d.error).into_response(), step)
}
