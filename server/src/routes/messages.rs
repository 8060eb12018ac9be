//! `POST /v1/messages` (Anthropic Messages): parse → the chat door's validation → the engine's one call →
//! render a `message` (JSON, or its event stream). Every route answers here as it does on Chat Completions: a
//! label or its reply as the text, a generation streamed; the same admission, tenants, budgets, cache, bound
//! and records. Errors, from any layer of this route, take Anthropic's shape ([`crate::anthropic::reshape`]).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::anthropic::{error_body, stop_reason, MessagesRequest};
use crate::error::ApiError;
use crate::extract::{ApiJson, Asking};
use crate::validate::ValidChat;
use tiergate_engine::answer::{Answer, Body, Delta, Generation, Tokens};
use tiergate_engine::state::AppState;

use super::chat::{in_dialect, validated};
use super::respond::{collected, finish, label_text, refused};

/// The handler.
pub async fn messages(
    State(state): State<Arc<AppState>>,
    asking: Asking,
    ApiJson(req): ApiJson<MessagesRequest>,
) -> Response {
    let stream = req.streams();
    let started = Instant::now();
    let v = match req
        .into_chat()
        .and_then(|chat| validated(&state, &asking, chat, started))
    {
        Ok(v) => in_dialect(v, "msg_", "messages"),
        Err(e) => return e.into_response(),
    };
    match tiergate_engine::answer::answer(&state, &v).await {
        Ok(a) => render(&state, &v, stream, a).await,
        Err(d) => refused(&v, d),
    }
}

/// The `message` for the engine's answer, as JSON or as its event stream.
async fn render(state: &AppState, v: &ValidChat, stream: bool, a: Answer) -> Response {
    let Answer {
        body,
        mut outcome,
        admitted,
    } = a;
    let resp = match body {
        Body::Label(l) => {
            let text = label_text(v, &outcome, &l);
            one_piece(v, stream, text, "stop", l.prompt_tokens, 1)
        }
        Body::Text { text, tokens } => {
            one_piece(v, stream, text, "stop", tokens.prompt, tokens.completion)
        }
        Body::Stream(g) if stream => events(v, *g),
        Body::Stream(g) => match collected(*g, &mut outcome).await {
            Ok((text, end, t)) => one_piece(v, false, text, end.as_str(), t.prompt, t.completion),
            Err(e) => e.into_response(),
        },
    };
    finish(resp, state, &outcome, admitted)
}

/// A `message` object with `text` and no content blocks yet when `text` is `None`.
fn message(v: &ValidChat, text: Option<&str>, end: Option<&str>, t: Tokens) -> Value {
    let content: Vec<Value> = text
        .map(|t| json!({"type": "text", "text": t}))
        .into_iter()
        .collect();
    json!({"id": v.id, "type": "message", "role": "assistant", "model": v.route, "content": content,
           "stop_reason": end.map(stop_reason), "stop_sequence": null,
           "usage": {"input_tokens": t.prompt, "output_tokens": t.completion}})
}

fn event(kind: &str, data: Value) -> Event {
    Event::default().event(kind).data(data.to_string())
}

/// The events that open a message and its one text block.
fn opening(v: &ValidChat, prompt: u32) -> [Event; 3] {
    let start = Tokens {
        prompt,
        completion: 0,
    };
    [
        event(
            "message_start",
            json!({"type": "message_start", "message": message(v, None, None, start)}),
        ),
        event(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        event("ping", json!({"type": "ping"})),
    ]
}

fn text_delta(text: &str) -> Event {
    event(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
    )
}

/// The events that close the text block and the message.
fn closing(end: &str, completion: u32) -> [Event; 3] {
    [
        event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        event(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": stop_reason(end), "stop_sequence": null},
                   "usage": {"output_tokens": completion}}),
        ),
        event("message_stop", json!({"type": "message_stop"})),
    ]
}

/// A one-piece answer: the `message`, or its events.
fn one_piece(
    v: &ValidChat,
    stream: bool,
    text: String,
    end: &str,
    prompt: u32,
    completion: u32,
) -> Response {
    let t = Tokens { prompt, completion };
    if !stream {
        return axum::Json(message(v, Some(&text), Some(end), t)).into_response();
    }
    let all: Vec<Event> = opening(v, prompt)
        .into_iter()
        .chain([text_delta(&text)])
        .chain(closing(end, completion))
        .collect();
    Sse::new(futures_util::stream::iter(
        all.into_iter().map(Ok::<_, Infallible>),
    ))
    .into_response()
}

/// A generation as Messages events, fed by a task that ends (cancelling the job) when the client goes; an
/// error after the start is an `error` event.
fn events(v: &ValidChat, mut g: Generation) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Event>(64);
    let head = opening(v, 0);
    tokio::spawn(async move {
        for e in head {
            if tx.send(e).await.is_err() {
                return;
            }
        }
        while let Some(next) = g.next().await {
            let out: Vec<Event> = match next {
                Ok(Delta::Text(t)) => vec![text_delta(&t)],
                Ok(Delta::End { finish, tokens }) => {
                    closing(finish.as_str(), tokens.completion).into()
                }
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
    Sse::new(futures_util::StreamExt::map(stream, Ok::<_, Infallible>)).into_response()
}
