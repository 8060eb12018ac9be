//! `POST /v1/messages` (Anthropic Messages): parse → the chat door's validation → the engine's one call →
//! render a `message` (JSON, or its event stream). Every route answers here as it does on Chat Completions: a
//! label or its reply as the text, a generation streamed; the same admission, tenants, budgets, cache, bound
//! and records. Errors, from any layer of this route, take Anthropic's shape ([`crate::anthropic::reshape`]).

use std::convert::Infallible;
use std::time::Instant;

use axum::extract::State;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::anthropic::{error_body, stop_reason, MessagesRequest};
use crate::early::Dialect;
use crate::error::ApiError;
use crate::extract::{ApiJson, Asking};
use crate::validate::ValidChat;
use tiergate_engine::answer::{Answer, Body, Delta, Generation, Tokens};
use tiergate_engine::model::request::ToolCall;
use tiergate_engine::Engine;

use super::chat::{in_dialect, validated};
use super::respond::{answered, collected, every, finish, label_text, refused};

/// The handler.
pub async fn messages(
    State(engine): State<Engine>,
    asking: Asking,
    ApiJson(req): ApiJson<MessagesRequest>,
) -> Response {
    let started = Instant::now();
    let v = match req.into_chat().and_then(|mut chat| {
        // Claude Code's session id, a session key of its conversation.
        let header = crate::adapt::header_text(&asking.headers, "x-claude-code-session-id");
        chat.client_sessions.splice(0..0, header);
        validated(&engine, &asking, chat, started)
    }) {
        Ok(v) => in_dialect(v, "msg_", "messages"),
        Err(e) => return e.into_response(),
    };
    answered(&engine, &v, Dialect::Messages, |engine, v, a| async move {
        render(&engine, &v, a).await
    })
    .await
}

/// `POST /v1/messages/count_tokens`: the request's input tokens by the tokenizer of what would answer it
/// ([`tiergate_engine::Engine::count_tokens`]; `x-tiergate-stage` and `x-tiergate-backend` say whose).
pub async fn count_tokens(
    State(engine): State<Engine>,
    asking: Asking,
    ApiJson(mut req): ApiJson<MessagesRequest>,
) -> Response {
    req.max_tokens = req.max_tokens.or(Some(1));
    req.stream = None;
    let started = Instant::now();
    let v = match req
        .into_chat()
        .and_then(|chat| validated(&engine, &asking, chat, started))
    {
        Ok(v) => in_dialect(v, "msg_", "count_tokens"),
        Err(e) => return e.into_response(),
    };
    let resp = match engine.count_tokens(&v).await {
        Ok((n, outcome, admitted)) => finish(
            axum::Json(json!({"input_tokens": n})).into_response(),
            &outcome,
            admitted,
        ),
        Err(d) => refused(d),
    };
    crate::adapt::mark_request(resp, &v)
}

/// The `message` for the engine's answer, as JSON or as its event stream.
async fn render(engine: &Engine, v: &ValidChat, a: Answer) -> Response {
    let stream = v.stream;
    let Answer {
        body,
        mut outcome,
        admitted,
    } = a;
    let resp = match body {
        Body::Label(l) => {
            let text = label_text(v, &outcome, &l);
            one_piece(v, stream, Whole::text(text, "stop", l.prompt_tokens, 1))
        }
        Body::Text { text, tokens } => one_piece(
            v,
            stream,
            Whole::text(text, "stop", tokens.prompt, tokens.completion),
        ),
        Body::Stream(g) if stream => events(v, *g, every(engine)),
        Body::Stream(g) => match collected(*g).await {
            Ok(c) => {
                outcome = c.outcome;
                let whole = Whole {
                    text: c.text,
                    calls: c.calls,
                    end: c.finish.as_str(),
                    tokens: c.tokens,
                    stop: c.stop_sequence,
                };
                one_piece(v, false, whole)
            }
            Err(e) => e.into_response(),
        },
    };
    finish(resp, &outcome, admitted)
}

/// A whole answer: its text, its tool calls, why it ended, its tokens.
struct Whole {
    text: String,
    calls: Vec<ToolCall>,
    end: &'static str,
    tokens: Tokens,
    /// The stop sequence that ended it (`stop_reason` `stop_sequence`), when the engine says which.
    stop: Option<String>,
}

impl Whole {
    fn text(text: String, end: &'static str, prompt: u32, completion: u32) -> Self {
        Self {
            text,
            calls: Vec::new(),
            end,
            tokens: Tokens {
                prompt,
                completion,
                cached: 0,
            },
            stop: None,
        }
    }
}

/// A `tool_use` block for a call (its input parsed back into JSON; text that is not JSON stays a string).
fn tool_use(c: &ToolCall) -> Value {
    let input = serde_json::from_str::<Value>(&c.arguments)
        .unwrap_or_else(|_| Value::String(c.arguments.clone()));
    json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input})
}

/// A `message` object with its content blocks (a text block unless the text is empty and there are calls).
fn message(v: &ValidChat, w: Option<&Whole>, t: Tokens) -> Value {
    let mut content = Vec::new();
    if let Some(w) = w {
        if !w.text.is_empty() || w.calls.is_empty() {
            content.push(json!({"type": "text", "text": w.text}));
        }
        content.extend(w.calls.iter().map(tool_use));
    }
    json!({"id": v.id, "type": "message", "role": "assistant", "model": v.route, "content": content,
           "stop_reason": w.map(|w| stop_reason(w.end, w.stop.as_deref())),
           "stop_sequence": w.and_then(|w| w.stop.as_deref()), "usage": usage(t)})
}

/// A `usage` object: the backend's own counts — the prompt tokens it found in its prompt cache as
/// `cache_read_input_tokens`, the rest as `input_tokens` (Anthropic's split); nothing is counted as written to
/// a cache (`cache_creation_input_tokens` 0: a backend's prefix cache is not billed apart).
fn usage(t: Tokens) -> Value {
    let cached = t.cached.min(t.prompt);
    json!({"input_tokens": t.prompt - cached, "output_tokens": t.completion,
           "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached})
}

fn event(kind: &str, data: Value) -> Event {
    Event::default().event(kind).data(data.to_string())
}

/// The events that open a message.
fn opening(v: &ValidChat, prompt: u32) -> [Event; 2] {
    let start = Tokens {
        prompt,
        completion: 0,
        cached: 0,
    };
    [
        event(
            "message_start",
            json!({"type": "message_start", "message": message(v, None, start)}),
        ),
        event("ping", json!({"type": "ping"})),
    ]
}

/// The content blocks of a stream, opened and closed in order: a text block while text comes, a
/// `tool_use` block per call (its input as one `input_json_delta`).
#[derive(Default)]
struct Blocks {
    /// Blocks opened so far.
    opened: usize,
    /// A text block is open.
    in_text: bool,
}

impl Blocks {
    fn text(&mut self, text: &str) -> Vec<Event> {
        let mut out = Vec::new();
        if !self.in_text {
            out.push(event(
                "content_block_start",
                json!({"type": "content_block_start", "index": self.opened, "content_block": {"type": "text", "text": ""}}),
            ));
            self.opened += 1;
            self.in_text = true;
        }
        out.push(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": self.opened - 1, "delta": {"type": "text_delta", "text": text}}),
        ));
        out
    }

    fn call(&mut self, c: &ToolCall) -> Vec<Event> {
        let mut out = self.close();
        let index = self.opened;
        self.opened += 1;
        let input = tool_use(c)["input"].to_string();
        out.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index,
                   "content_block": {"type": "tool_use", "id": c.id, "name": c.name, "input": {}}}),
        ));
        out.push(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": input}}),
        ));
        out.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        out
    }

    /// Closes an open text block.
    fn close(&mut self) -> Vec<Event> {
        if !std::mem::take(&mut self.in_text) {
            return Vec::new();
        }
        vec![event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": self.opened - 1}),
        )]
    }

    /// Closes the last block and the message (its usage whole: the prompt's tokens are known only now).
    fn end(&mut self, end: &str, tokens: Tokens, stop: Option<&str>) -> Vec<Event> {
        let mut out = if self.opened == 0 {
            self.text("") // a message has at least one block
        } else {
            Vec::new()
        };
        out.extend(self.close());
        out.push(event(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": stop_reason(end, stop), "stop_sequence": stop},
                   "usage": usage(tokens)}),
        ));
        out.push(event("message_stop", json!({"type": "message_stop"})));
        out
    }
}

/// A one-piece answer: the `message`, or its events.
fn one_piece(v: &ValidChat, stream: bool, w: Whole) -> Response {
    if !stream {
        return axum::Json(message(v, Some(&w), w.tokens)).into_response();
    }
    let mut blocks = Blocks::default();
    let mut all: Vec<Event> = opening(v, w.tokens.prompt).into();
    if !w.text.is_empty() || w.calls.is_empty() {
        all.extend(blocks.text(&w.text));
    }
    for c in &w.calls {
        all.extend(blocks.call(c));
    }
    all.extend(blocks.end(w.end, w.tokens, w.stop.as_deref()));
    Sse::new(futures_util::stream::iter(
        all.into_iter().map(Ok::<_, Infallible>),
    ))
    .into_response()
}

/// A generation as Messages events, fed by a task that ends (cancelling the job) when the client goes; an
/// error after the start is an `error` event.
fn events(v: &ValidChat, mut g: Generation, quiet: std::time::Duration) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Event>(64);
    let head = opening(v, 0);
    tokio::spawn(async move {
        for e in head {
            if tx.send(e).await.is_err() {
                return;
            }
        }
        let mut blocks = Blocks::default();
        while let Some(next) = g.next().await {
            let out: Vec<Event> = match next {
                Ok(Delta::Text(t)) => blocks.text(&t),
                Ok(Delta::ToolCall(c)) => blocks.call(&c),
                Ok(Delta::End {
                    finish,
                    tokens,
                    stop_sequence,
                }) => blocks.end(finish.as_str(), tokens, stop_sequence.as_deref()),
                Ok(_) => continue,
                Err(e) => {
                    let e = ApiError::from(e);
                    let status = e.parts().0.as_u16();
                    vec![event("error", error_body(status, &e.to_string()))]
                }
            };
            for e in out {
                if tx.send(e).await.is_err() {
                    return; // client gone: dropping the generation cancels the job
                }
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let ping = event("ping", json!({"type": "ping"}));
    Sse::new(futures_util::StreamExt::map(stream, Ok::<_, Infallible>))
        .keep_alive(super::respond::keep_alive(quiet, Some(ping)))
        .into_response()
}
