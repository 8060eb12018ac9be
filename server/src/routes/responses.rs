//! `POST /v1/responses` (OpenAI Responses): parse → the chat door's validation → the engine's one call →
//! render a `response` (JSON, or its semantic events in order). Every route answers here as on Chat
//! Completions: a label, its reply or its JSON object as the output text, a generation streamed as
//! `response.output_text.delta` events; the same admission, tenants, budgets, cache, bound and records.
//! With `[responses] store`, a response is kept with its conversation ([`tiergate_engine::answer::stored`]):
//! `previous_response_id` continues it and `GET /v1/responses/{id}` shows it, for its tenant only.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Path, State};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde_json::{json, Value};

use crate::early::Dialect;
use crate::error::ApiError;
use crate::extract::{ApiJson, Asking};
use crate::openai_responses::{ResponsesRequest, Shapes};
use crate::validate::ValidChat;
use tiergate_engine::answer::stored::{ResponseStore, StoredResponse};
use tiergate_engine::answer::{Answer, Body, Delta, Generation, Tokens};
use tiergate_engine::model::request::TenantId;
use tiergate_engine::model::request::{ToolCall, ToolChoice};
use tiergate_engine::Engine;

use super::chat::{in_dialect, validated};
use super::respond::{answered_admitted, collected, finish, label_text};

/// The store the server was configured with (`[responses] store`), if any.
pub type Store = Option<Arc<dyn ResponseStore>>;

/// How long a response's write to the store may take before the response is answered as not stored.
const STORE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);

/// What a response needs besides the answer: the store, its tenant, the conversation that led to it, the
/// response it continues, and the shapes of the client's tools (its calls are answered in them).
#[derive(Clone)]
struct Keep {
    store: Option<Arc<dyn ResponseStore>>,
    tenant: String,
    turns: Vec<Value>,
    previous: Option<String>,
    shapes: Shapes,
}

impl Keep {
    /// The response object as it is answered: `store` says whether it is to be kept.
    fn response(&self, v: &ValidChat, status: &str, out: Option<&Output>) -> Value {
        let mut r = response(v, status, out, &self.shapes);
        r["store"] = json!(self.store.is_some());
        r["previous_response_id"] = json!(self.previous);
        r
    }

    /// Keeps a finished response with its conversation before it is answered, so that a continuation that
    /// follows at once finds it; a write that fails or misses its deadline (the store's own, Redis's
    /// `responses_store` dependency, within [`STORE_DEADLINE`]) makes the response say `"store": false` —
    /// never an id that was not stored.
    async fn save(&self, v: &ValidChat, out: &Output, response: &mut Value) {
        let Some(store) = self.store.clone() else {
            return;
        };
        let mut messages = self.turns.clone();
        let mut answer = json!({"role": "assistant", "content": out.text});
        if !out.calls.is_empty() {
            answer["tool_calls"] = out
                .calls
                .iter()
                .map(crate::openai_tools::call_json)
                .collect();
        }
        messages.push(answer);
        let r = StoredResponse {
            id: v.id.clone(),
            tenant: self.tenant.clone(),
            at_ms: tiergate_engine::evidence::ledger::now_ms(),
            messages,
            response: response.clone(),
            session: v.session.clone(),
        };
        let id = r.id.clone();
        let write = tokio::task::spawn_blocking(move || store.put(&r));
        let failed = match tokio::time::timeout(STORE_DEADLINE, write).await {
            Ok(Ok(Ok(()))) => return,
            Ok(Ok(Err(e))) => e,
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {STORE_DEADLINE:?}"),
        };
        // Said at debug: a store that is down is said once by its dependency's breaker, not per response.
        tracing::debug!(%id, error = %failed, "a response was not stored: answered with store false");
        response["store"] = json!(false);
    }
}

/// The handler.
pub async fn responses(
    State(engine): State<Engine>,
    Extension(store): Extension<Store>,
    asking: Asking,
    ApiJson(req): ApiJson<ResponsesRequest>,
) -> Response {
    let keep_it = req.store.unwrap_or(true);
    let previous = req.previous_response_id.clone();
    // A continuation reads the store: admitted first, so that a request the server refuses costs no read.
    let early = match previous.as_ref().map(|_| engine.admit_early()).transpose() {
        Ok(a) => a,
        Err(d) => return super::respond::refused(d),
    };
    let (turns, chain) = match continued(store.as_ref(), previous.as_deref(), &asking.tenant).await
    {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let started = Instant::now();
    let (mut v, turns, shapes) = match req.into_chat(turns).and_then(|(mut chat, turns, shapes)| {
        // Codex's session id (its `session-id` header), a session key of its conversation.
        let header = crate::adapt::header_text(&asking.headers, "session-id");
        chat.client_sessions.extend(header);
        Ok((validated(&engine, &asking, chat, started)?, turns, shapes))
    }) {
        Ok((v, turns, shapes)) => (in_dialect(v, "resp_", "responses"), turns, shapes),
        Err(e) => return e.into_response(),
    };
    // Without a key of its own, a kept response's chain is its session: its first response's id.
    let kept = keep_it && store.is_some();
    v.session = v
        .session
        .take()
        .or(chain)
        .or_else(|| kept.then(|| v.id.clone()));
    let keep = Keep {
        store: store.filter(|_| keep_it),
        tenant: asking.tenant.0.to_string(),
        turns,
        previous,
        shapes,
    };
    answered_admitted(
        &engine,
        &v,
        early,
        Dialect::Responses,
        move |engine, v, a| async move { render(&engine, &v, a, keep).await },
    )
    .await
}

/// The conversation `previous` names and its session, when the server stores responses and this tenant
/// stored it.
async fn continued(
    store: Option<&Arc<dyn ResponseStore>>,
    previous: Option<&str>,
    tenant: &TenantId,
) -> Result<(Vec<Value>, Option<String>), ApiError> {
    let Some(id) = previous else {
        return Ok((Vec::new(), None));
    };
    let Some(store) = store else {
        return Err(ApiError::PreviousResponseNotFound(format!(
            "previous response `{id}` not found: this server stores no responses ([responses] store = false); send the whole conversation as `input`"
        )));
    };
    fetch(store, id, tenant)
        .await?
        .map(|r| (r.messages, r.session.or(Some(r.id))))
        .ok_or_else(|| {
            ApiError::PreviousResponseNotFound(format!(
                "previous response `{id}` not found: unknown, expired, or not this key's"
            ))
        })
}

/// `GET /v1/responses/{id}`: a stored response of the caller's; 404 otherwise (another tenant's is not said
/// to exist), and when the server stores none.
pub async fn retrieve(
    Extension(store): Extension<Store>,
    tenant: Option<Extension<TenantId>>,
    Path(id): Path<String>,
) -> Response {
    let tenant = tenant.map_or_else(TenantId::anonymous, |t| t.0);
    let Some(store) = store else {
        return ApiError::NotFound(
            "this server stores no responses ([responses] store = false)".into(),
        )
        .into_response();
    };
    match fetch(&store, &id, &tenant).await {
        Ok(Some(r)) => axum::Json(r.response).into_response(),
        Ok(None) => ApiError::NotFound(format!("no response `{id}`")).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `tenant`'s stored response `id`, read off the async runtime within [`STORE_DEADLINE`] (the store's own
/// deadline, Redis's, is shorter): a store that does not answer is 503, never a wait.
async fn fetch(
    store: &Arc<dyn ResponseStore>,
    id: &str,
    tenant: &TenantId,
) -> Result<Option<StoredResponse>, ApiError> {
    let (store, key, who) = (store.clone(), id.to_string(), tenant.0.to_string());
    let read = tokio::task::spawn_blocking(move || store.get(&key, &who));
    let unreachable = |e: String| {
        ApiError::StoreUnavailable(format!("the response store cannot be reached: {e}"))
    };
    match tokio::time::timeout(STORE_DEADLINE, read).await {
        Ok(r) => r
            .map_err(|e| ApiError::Internal(e.to_string()))?
            .map_err(unreachable),
        Err(_) => Err(unreachable(format!(
            "no answer within {} ms",
            STORE_DEADLINE.as_millis()
        ))),
    }
}

/// The `response` for the engine's answer, as JSON or as its events.
async fn render(engine: &Engine, v: &ValidChat, a: Answer, keep: Keep) -> Response {
    let stream = v.stream;
    let Answer {
        body,
        mut outcome,
        admitted,
    } = a;
    let out = match body {
        Body::Label(l) => {
            let text = label_text(v, &outcome, &l);
            Output::text(text, tokens(l.prompt_tokens, 1))
        }
        Body::Text { text, tokens } => Output::text(text, tokens),
        Body::Stream(g) if stream => {
            let quiet = super::respond::every(engine);
            return finish(events(v, keep, *g, quiet), &outcome, admitted);
        }
        Body::Stream(g) => match collected(*g).await {
            Ok(c) => {
                outcome = c.outcome;
                Output {
                    text: c.text,
                    calls: c.calls,
                    end: c.finish.as_str(),
                    tokens: c.tokens,
                }
            }
            Err(e) => return e.into_response(),
        },
    };
    let resp = if stream {
        one_piece_events(v, &keep, &out).await
    } else {
        let mut r = keep.response(v, "completed", Some(&out));
        keep.save(v, &out, &mut r).await;
        axum::Json(r).into_response()
    };
    finish(resp, &outcome, admitted)
}

fn tokens(prompt: u32, completion: u32) -> Tokens {
    Tokens {
        prompt,
        completion,
        cached: 0,
    }
}

/// What a response says: its text, its function calls, why it ended, its tokens.
#[derive(Default)]
struct Output {
    text: String,
    calls: Vec<ToolCall>,
    end: &'static str,
    tokens: Tokens,
}

impl Output {
    fn text(text: String, tokens: Tokens) -> Self {
        Self {
            text,
            calls: Vec::new(),
            end: "stop",
            tokens,
        }
    }

    /// Whether it has a message item (text, or nothing else to say).
    fn has_message(&self) -> bool {
        !self.text.is_empty() || self.calls.is_empty()
    }

    /// Its output items: the message, then an item per call in its tool's shape.
    fn items(&self, v: &ValidChat, shapes: &Shapes) -> Vec<Value> {
        let message = self
            .has_message()
            .then(|| item(v, "completed", Some(&self.text)));
        message
            .into_iter()
            .chain(self.calls.iter().map(|c| shapes.call_item(c, "completed")))
            .collect()
    }
}

/// The output message item (its text so far, or none yet).
fn item(v: &ValidChat, status: &str, text: Option<&str>) -> Value {
    let content: Vec<Value> = text.map(part).into_iter().collect();
    json!({"type": "message", "id": item_id(v), "status": status, "role": "assistant", "content": content})
}

fn item_id(v: &ValidChat) -> String {
    format!("msg_{}", v.id.trim_start_matches("resp_"))
}

fn part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": []})
}

/// The request's tools and choice as a response echoes them.
fn tools_echo(v: &ValidChat) -> (Value, Value, bool) {
    let Some(t) = &v.tools else {
        return (json!([]), json!("none"), false);
    };
    let list: Vec<Value> = t
        .list
        .iter()
        .map(|f| {
            let parameters = serde_json::from_str::<Value>(&f.parameters).unwrap_or(Value::Null);
            json!({"type": "function", "name": f.name, "description": f.description,
                   "parameters": parameters, "strict": false})
        })
        .collect();
    let choice = match &t.choice {
        ToolChoice::Auto => json!("auto"),
        ToolChoice::None => json!("none"),
        ToolChoice::Required => json!("required"),
        ToolChoice::Function(name) => json!({"type": "function", "name": name}),
    };
    (Value::Array(list), choice, t.parallel)
}

/// A `response` object: `status` `in_progress` (no output yet, `out` none), `failed`, or
/// `completed`/`incomplete`.
fn response(v: &ValidChat, status: &str, out: Option<&Output>, shapes: &Shapes) -> Value {
    let (status, incomplete) = match (status, out.map(|o| o.end)) {
        ("completed", Some("length")) => ("incomplete", json!({"reason": "max_output_tokens"})),
        (s, _) => (s, Value::Null),
    };
    let output = out.map(|o| o.items(v, shapes)).unwrap_or_default();
    let t = out.map(|o| o.tokens).unwrap_or_default();
    let format = if v.json_object { "json_object" } else { "text" };
    let (tools, tool_choice, parallel) = tools_echo(v);
    json!({
        "id": v.id, "object": "response", "created_at": crate::validate::unix_now_s(),
        "status": status, "error": null, "incomplete_details": incomplete, "model": v.route,
        "output": output, "parallel_tool_calls": parallel, "previous_response_id": null,
        "temperature": v.temperature, "top_p": v.top_p, "max_output_tokens": v.max_tokens,
        "tool_choice": tool_choice, "tools": tools, "text": {"format": {"type": format}},
        "truncation": "disabled", "store": false, "metadata": {}, "instructions": null,
        "usage": {"input_tokens": t.prompt, "output_tokens": t.completion,
                  "total_tokens": t.prompt + t.completion,
                  "input_tokens_details": {"cached_tokens": t.cached.min(t.prompt)},
                  "output_tokens_details": {"reasoning_tokens": 0}},
    })
}

/// The events of one response in order (`sequence_number`), its output items opened as they come: the
/// message item at the first text, a `function_call` item per call.
#[derive(Default)]
struct Seq {
    n: u64,
    /// Output items opened so far.
    items: usize,
    /// The output index of the message item, once opened.
    message: Option<usize>,
    /// It is done (a call followed it).
    message_closed: bool,
    /// What was said so far.
    out: Output,
}

impl Seq {
    fn event(&mut self, kind: &str, mut data: Value) -> Event {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.n);
        self.n += 1;
        Event::default().event(kind).data(data.to_string())
    }

    /// `response.created` and `response.in_progress`.
    fn opening(&mut self, v: &ValidChat, keep: &Keep) -> Vec<Event> {
        let r = keep.response(v, "in_progress", None);
        vec![
            self.event("response.created", json!({"response": r})),
            self.event("response.in_progress", json!({"response": r})),
        ]
    }

    /// A text delta (opening the message item and its text part first).
    fn text(&mut self, v: &ValidChat, text: &str) -> Vec<Event> {
        let mut all = Vec::new();
        if self.message_closed {
            self.out.text.push_str(text);
            return all;
        }
        let index = match self.message {
            Some(i) => i,
            None => {
                let i = self.items;
                self.items += 1;
                self.message = Some(i);
                all.push(self.event(
                    "response.output_item.added",
                    json!({"output_index": i, "item": item(v, "in_progress", None)}),
                ));
                all.push(self.event(
                    "response.content_part.added",
                    json!({"item_id": item_id(v), "output_index": i, "content_index": 0, "part": part("")}),
                ));
                i
            }
        };
        self.out.text.push_str(text);
        all.push(self.event(
            "response.output_text.delta",
            json!({"item_id": item_id(v), "output_index": index, "content_index": 0, "delta": text}),
        ));
        all
    }

    /// A function call: the message item done when one is open, then the call's item added, its arguments
    /// (one delta, then done), its item done.
    fn call(&mut self, v: &ValidChat, shapes: &Shapes, c: ToolCall) -> Vec<Event> {
        let mut all = self.message_done(v);
        let i = self.items;
        self.items += 1;
        let id = shapes.item_id(&c);
        all.push(self.event(
            "response.output_item.added",
            json!({"output_index": i, "item": shapes.call_item(&c, "in_progress")}),
        ));
        let done = shapes.call_item(&c, "completed");
        if shapes.is_custom(&c.name) {
            let input = done["input"].clone();
            all.push(self.event(
                "response.custom_tool_call_input.delta",
                json!({"item_id": id, "output_index": i, "delta": input}),
            ));
            all.push(self.event(
                "response.custom_tool_call_input.done",
                json!({"item_id": id, "output_index": i, "input": input}),
            ));
        } else if done["type"] == "function_call" {
            all.push(self.event(
                "response.function_call_arguments.delta",
                json!({"item_id": id, "output_index": i, "delta": c.arguments}),
            ));
            all.push(self.event(
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": i, "arguments": c.arguments}),
            ));
        }
        all.push(self.event(
            "response.output_item.done",
            json!({"output_index": i, "item": done}),
        ));
        self.out.calls.push(c);
        all
    }

    /// The open message item's text, part and item done (nothing when none is open). Text after it opens
    /// no second item: it is in the finished response.
    fn message_done(&mut self, v: &ValidChat) -> Vec<Event> {
        let Some(i) = self.message.filter(|_| !self.message_closed) else {
            return Vec::new();
        };
        self.message_closed = true;
        let text = self.out.text.clone();
        vec![
            self.event(
                "response.output_text.done",
                json!({"item_id": item_id(v), "output_index": i, "content_index": 0, "text": text}),
            ),
            self.event(
                "response.content_part.done",
                json!({"item_id": item_id(v), "output_index": i, "content_index": 0, "part": part(&text)}),
            ),
            self.event(
                "response.output_item.done",
                json!({"output_index": i, "item": item(v, "completed", Some(&text))}),
            ),
        ]
    }

    /// The message item done (when one was opened, or nothing was said), then `response.completed` (or
    /// `response.incomplete`). The finished response is kept (`[responses] store`) as it is announced.
    async fn closing(
        &mut self,
        v: &ValidChat,
        keep: &Keep,
        end: &'static str,
        t: Tokens,
    ) -> Vec<Event> {
        self.out.end = end;
        self.out.tokens = t;
        let mut all = Vec::new();
        if self.message.is_none() && self.out.calls.is_empty() {
            all.extend(self.text(v, ""));
        }
        all.extend(self.message_done(v));
        let mut done = keep.response(v, "completed", Some(&self.out));
        keep.save(v, &self.out, &mut done).await;
        let last = if done["status"] == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        all.push(self.event(last, json!({"response": done})));
        all
    }
}

/// A one-piece answer as the whole event sequence.
async fn one_piece_events(v: &ValidChat, keep: &Keep, out: &Output) -> Response {
    let mut seq = Seq::default();
    let mut all = seq.opening(v, keep);
    if out.has_message() {
        all.extend(seq.text(v, &out.text));
    }
    for c in &out.calls {
        all.extend(seq.call(v, &keep.shapes, c.clone()));
    }
    all.extend(seq.closing(v, keep, out.end, out.tokens).await);
    Sse::new(futures_util::stream::iter(
        all.into_iter().map(Ok::<_, Infallible>),
    ))
    .into_response()
}

/// A generation as Responses events, fed by a task that ends (cancelling the job) when the client goes; an
/// error after the start is a `response.failed` event.
fn events(v: &ValidChat, keep: Keep, mut g: Generation, quiet: std::time::Duration) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Event>(64);
    let v = v.clone();
    tokio::spawn(async move {
        let mut seq = Seq::default();
        for e in seq.opening(&v, &keep) {
            if tx.send(e).await.is_err() {
                return;
            }
        }
        while let Some(next) = g.next().await {
            let out: Vec<Event> = match next {
                Ok(Delta::Text(t)) => seq.text(&v, &t),
                Ok(Delta::ToolCall(c)) => seq.call(&v, &keep.shapes, c),
                Ok(Delta::End { finish, tokens, .. }) => {
                    seq.closing(&v, &keep, finish.as_str(), tokens).await
                }
                Ok(_) => continue,
                Err(e) => {
                    let e = ApiError::from(e);
                    let mut r = keep.response(&v, "failed", None);
                    r["error"] = json!({"code": e.parts().2, "message": e.to_string()});
                    vec![seq.event("response.failed", json!({"response": r}))]
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
    Sse::new(futures_util::StreamExt::map(stream, Ok::<_, Infallible>))
        .keep_alive(super::respond::keep_alive(quiet, None))
        .into_response()
}
