//! The HTTP side: one pooled HTTP/1.1 client (hyper), the chat call (JSON or SSE) and small JSON helpers.

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

use crate::stats::intern;

/// The error kind of a stream that ended without its final event (`[DONE]`), whether the connection closed
/// or broke off.
pub const STREAM_TRUNCATED: &str = "stream_truncated";

/// The error kind of a request the bench gave up on (`--timeout`).
pub const TIMEOUT: &str = "timeout";

/// Most bytes read from one response.
const MAX_BODY: usize = 16 << 20;

/// The API dialect a run speaks (`--api`): the endpoint, the request body, where the answer and its tokens
/// are in the response, and its stream's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Api {
    /// OpenAI Chat Completions, `POST /v1/chat/completions`.
    #[default]
    Chat,
    /// OpenAI Responses, `POST /v1/responses`.
    Responses,
    /// Anthropic Messages, `POST /v1/messages` (the key as `x-api-key`).
    Messages,
}

impl Api {
    pub fn as_str(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Responses => "responses",
            Api::Messages => "messages",
        }
    }

    fn path(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Responses => "/v1/responses",
            Api::Messages => "/v1/messages",
        }
    }

    /// The answer's text and output tokens in a JSON response; `None` when it is not that dialect's shape.
    fn answer(self, v: &Value) -> Option<(String, u32)> {
        let (text, tokens) = match self {
            Api::Chat => (
                &v["choices"][0]["message"]["content"],
                &v["usage"]["completion_tokens"],
            ),
            Api::Responses => (
                &v["output"][0]["content"][0]["text"],
                &v["usage"]["output_tokens"],
            ),
            Api::Messages => (&v["content"][0]["text"], &v["usage"]["output_tokens"]),
        };
        let text = text.as_str()?.to_string();
        Some((text, tokens.as_u64().map_or(0, |n| n as u32)))
    }
}

/// What one stream event says.
enum Said<'a> {
    Text(&'a str),
    Tokens(u32),
    Done,
    Error(&'a str),
    Other,
}

impl Api {
    /// One event's `data`, read in this dialect (the event's name is in its `type` for the two that name
    /// events).
    fn said(self, v: &Value) -> Said<'_> {
        if !v["error"].is_null() && self != Api::Responses {
            return Said::Error(v["error"]["type"].as_str().unwrap_or("stream_error"));
        }
        match self {
            Api::Chat => match (
                v["choices"][0]["delta"]["content"].as_str(),
                v["usage"]["completion_tokens"].as_u64(),
            ) {
                (Some(c), _) => Said::Text(c),
                (None, Some(n)) => Said::Tokens(n as u32),
                _ => Said::Other,
            },
            Api::Responses => match v["type"].as_str().unwrap_or_default() {
                "response.output_text.delta" => Said::Text(v["delta"].as_str().unwrap_or_default()),
                "response.completed" | "response.incomplete" => Said::Tokens(
                    v["response"]["usage"]["output_tokens"]
                        .as_u64()
                        .unwrap_or(0) as u32,
                ),
                "response.failed" => Said::Error(
                    v["response"]["error"]["code"]
                        .as_str()
                        .unwrap_or("stream_error"),
                ),
                _ => Said::Other,
            },
            Api::Messages => match v["type"].as_str().unwrap_or_default() {
                "content_block_delta" => {
                    Said::Text(v["delta"]["text"].as_str().unwrap_or_default())
                }
                "message_delta" => {
                    Said::Tokens(v["usage"]["output_tokens"].as_u64().unwrap_or(0) as u32)
                }
                "message_stop" => Said::Done,
                _ => Said::Other,
            },
        }
    }

    /// The answer's id in a stream's first events.
    fn stream_id(self, v: &Value) -> Option<&str> {
        match self {
            Api::Chat => v["id"].as_str(),
            Api::Responses => v["response"]["id"].as_str(),
            Api::Messages => v["message"]["id"].as_str(),
        }
    }
}

/// What one chat call came back with.
#[derive(Debug, Clone)]
pub struct ChatResult {
    /// HTTP status; 0 when no response arrived.
    pub status: u16,
    /// Error type: the OpenAI `error.type`, or `http_<status>`, `connection_error`, `transport_error` (no
    /// response), `stream_truncated` (a stream that ended without its final event), `bad_response`,
    /// `timeout`, `client_backlog`.
    pub error: Option<&'static str>,
    pub tier: Option<&'static str>,
    pub degraded: Option<&'static str>,
    /// `x-tiergate-out-of-scope: 1`: the answer is the route's out-of-scope outcome.
    pub out_of_scope: bool,
    /// First content token (streaming) — for a JSON answer, the whole answer is the first token.
    pub first_token: Option<Instant>,
    /// The last content event (streaming).
    pub last_token: Option<Instant>,
    /// Content events received (a label answer is one; a generation one per token or a few).
    pub events: u32,
    pub content: String,
    pub tokens_out: u32,
    /// `Server-Timing: model;dur=` (ms).
    pub model_ms: Option<f64>,
    /// `x-tiergate-variant`.
    pub variant: Option<&'static str>,
    /// `x-tiergate-stage`: the cascade stage (LLM backend) that answered.
    pub stage: Option<&'static str>,
    /// `x-tiergate-head-version`: the head that classified it.
    pub head: Option<&'static str>,
    /// The completion id (`chatcmpl-…`), for feedback.
    pub id: Option<String>,
}

impl ChatResult {
    pub fn failed(error: &'static str) -> Self {
        Self {
            status: 0,
            error: Some(error),
            tier: None,
            degraded: None,
            out_of_scope: false,
            first_token: None,
            last_token: None,
            events: 0,
            content: String::new(),
            tokens_out: 0,
            model_ms: None,
            variant: None,
            stage: None,
            head: None,
            id: None,
        }
    }
}

/// The `dur` of metric `name` in a `Server-Timing` header value.
pub fn server_timing(value: &str, name: &str) -> Option<f64> {
    value.split(',').find_map(|metric| {
        let mut parts = metric.split(';').map(str::trim);
        if parts.next()? != name {
            return None;
        }
        parts.find_map(|p| p.strip_prefix("dur=")?.parse::<f64>().ok())
    })
}

/// A pooled client bound to one base URL.
#[derive(Clone)]
pub struct HttpClient {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
    api_key: Option<String>,
}

impl HttpClient {
    pub fn new(base: &str, api_key: Option<String>) -> Self {
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(std::time::Duration::from_secs(30))
            .build(conn);
        Self {
            client,
            base: base.trim_end_matches('/').to_string(),
            api_key,
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// The bearer token of the chat endpoint.
    pub fn api_key(&self) -> Option<&str> {
        self.api_key.as_deref()
    }

    fn request(
        &self,
        method: Method,
        path: &str,
        bearer: Option<&str>,
        body: Bytes,
        extra: &[(String, String)],
    ) -> Result<Request<Full<Bytes>>, String> {
        let mut b = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if !body.is_empty() {
            b = b.header("content-type", "application/json");
        }
        if let Some(t) = bearer {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        for (k, v) in extra {
            b = b.header(k.as_str(), v.as_str());
        }
        b.body(Full::new(body))
            .map_err(|e| format!("cannot build a request to {}{path}: {e}", self.base))
    }

    /// A JSON request (admin, models); returns status and parsed body (`null` when not JSON).
    pub async fn json(
        &self,
        method: Method,
        path: &str,
        bearer: Option<&str>,
        body: Option<&Value>,
    ) -> Result<(u16, Value), String> {
        let bytes = match body {
            Some(v) => Bytes::from(serde_json::to_vec(v).map_err(|e| e.to_string())?),
            None => Bytes::new(),
        };
        let req = self.request(method, path, bearer, bytes, &[])?;
        let resp =
            tokio::time::timeout(std::time::Duration::from_secs(10), self.client.request(req))
                .await
                .map_err(|_| format!("{}{path}: no answer in 10 s", self.base))?
                .map_err(|e| format!("{}{path}: {}", self.base, describe(&e)))?;
        let status = resp.status().as_u16();
        let body = read_limited(resp.into_body()).await?;
        Ok((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
    }

    /// One answer from the `api` endpoint. `body` is the serialised request ([`chat_body`]). Past `deadline`
    /// it gives up with the error `timeout`, keeping what the server had sent by then.
    pub async fn chat(
        &self,
        api: Api,
        body: Bytes,
        stream: bool,
        extra: &[(String, String)],
        deadline: Instant,
    ) -> ChatResult {
        let deadline = tokio::time::Instant::from_std(deadline);
        // Anthropic's clients send the key as `x-api-key`, with the API version.
        let mut headers = extra.to_vec();
        let mut bearer = self.api_key.as_deref();
        if api == Api::Messages {
            headers.push(("anthropic-version".into(), "2023-06-01".into()));
            if let Some(k) = bearer.take() {
                headers.push(("x-api-key".into(), k.to_string()));
            }
        }
        let req = match self.request(Method::POST, api.path(), bearer, body, &headers) {
            Ok(r) => r,
            Err(_) => return ChatResult::failed("client_error"),
        };
        let resp = match tokio::time::timeout_at(deadline, self.client.request(req)).await {
            Err(_) => return ChatResult::failed(TIMEOUT),
            Ok(Ok(r)) => r,
            Ok(Err(e)) if e.is_connect() => return ChatResult::failed("connection_error"),
            Ok(Err(_)) => return ChatResult::failed("transport_error"),
        };
        let status = resp.status().as_u16();
        let header = |k: &str| {
            resp.headers()
                .get(k)
                .and_then(|v| v.to_str().ok())
                .map(intern)
        };
        let mut out = ChatResult {
            status,
            error: None,
            tier: header(tiergate_core::outcome::header::TIER),
            degraded: header(tiergate_core::outcome::header::DEGRADED),
            out_of_scope: header(tiergate_core::outcome::header::OUT_OF_SCOPE) == Some("1"),
            first_token: None,
            last_token: None,
            events: 0,
            content: String::new(),
            tokens_out: 0,
            model_ms: resp
                .headers()
                .get("server-timing")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| server_timing(v, "model")),
            variant: header("x-tiergate-variant"),
            stage: header(tiergate_core::outcome::header::STAGE),
            head: header(tiergate_core::outcome::header::HEAD_VERSION),
            id: None,
        };
        let body = resp.into_body();
        if !(200..300).contains(&status) {
            let raw = match tokio::time::timeout_at(deadline, read_limited(body)).await {
                Ok(raw) => raw.unwrap_or_default(),
                Err(_) => {
                    out.error = Some(TIMEOUT);
                    return out;
                }
            };
            let v: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
            out.error = Some(
                v["error"]["type"]
                    .as_str()
                    .or_else(|| v["error"]["code"].as_str())
                    .map_or_else(|| intern(&format!("http_{status}")), intern),
            );
            return out;
        }
        if stream {
            read_sse(api, body, &mut out, deadline).await;
        } else {
            match tokio::time::timeout_at(deadline, read_limited(body)).await {
                Err(_) => out.error = Some(TIMEOUT),
                Ok(Ok(raw)) => {
                    out.first_token = Some(Instant::now());
                    let v = serde_json::from_slice::<Value>(&raw).unwrap_or(Value::Null);
                    match api.answer(&v) {
                        Some((text, tokens)) => {
                            out.id = v["id"].as_str().map(str::to_string);
                            out.content = text;
                            out.tokens_out = tokens;
                        }
                        None => out.error = Some("bad_response"),
                    }
                }
                Ok(Err(_)) => out.error = Some("transport_error"),
            }
        }
        out
    }
}

fn describe(e: &hyper_util::client::legacy::Error) -> String {
    use std::error::Error;
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

async fn read_limited(mut body: hyper::body::Incoming) -> Result<Bytes, String> {
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| e.to_string())?;
        if let Some(d) = frame.data_ref() {
            if buf.len() + d.len() > MAX_BODY {
                return Err("response over 16 MiB".into());
            }
            buf.extend_from_slice(d);
        }
    }
    Ok(buf.freeze())
}

/// Read server-sent events in `api`'s dialect: content deltas (first one = first token), the output tokens,
/// errors, and the final event (`[DONE]`, `message_stop`, `response.completed`).
async fn read_sse(
    api: Api,
    mut body: hyper::body::Incoming,
    out: &mut ChatResult,
    deadline: tokio::time::Instant,
) {
    let mut buf: Vec<u8> = Vec::new();
    let mut done = false;
    let mut usage: Option<u32> = None;
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => {
                // Given up on: what came so far stays (content, events, first token) for the report.
                out.tokens_out = usage.unwrap_or(out.events);
                out.error = Some(TIMEOUT);
                return;
            }
            Ok(None) => break,
            Ok(Some(f)) => f,
        };
        let Ok(frame) = frame else {
            // The response started and its body broke off (llama.cpp's server does this to a stream when a
            // newer request interrupts it, `interrupt_requests`): a stream that ended without its final
            // event, not a failure to reach the server.
            out.error = Some(STREAM_TRUNCATED);
            return;
        };
        let Some(d) = frame.data_ref() else { continue };
        buf.extend_from_slice(d);
        if buf.len() > MAX_BODY {
            out.error = Some("bad_response");
            return;
        }
        while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            let line = String::from_utf8_lossy(&line);
            let Some(data) = line.trim().strip_prefix("data:") else {
                continue;
            };
            let data = data.trim();
            if data == "[DONE]" {
                done = true;
                continue;
            }
            let Ok(v) = serde_json::from_str::<Value>(data) else {
                out.error = Some("bad_response");
                continue;
            };
            if out.id.is_none() {
                out.id = api.stream_id(&v).map(str::to_string);
            }
            match api.said(&v) {
                Said::Error(e) => out.error = Some(intern(e)),
                Said::Text(c) if !c.is_empty() => {
                    let now = Instant::now();
                    out.first_token.get_or_insert(now);
                    out.last_token = Some(now);
                    out.events += 1;
                    out.content.push_str(c);
                }
                Said::Tokens(n) => {
                    usage = Some(n);
                    // Responses ends with its completed event (no `[DONE]`).
                    done |= api == Api::Responses;
                }
                Said::Done => done = true,
                Said::Text(_) | Said::Other => {}
            }
        }
    }
    out.tokens_out = usage.unwrap_or(out.events);
    if !done && out.error.is_none() {
        out.error = Some(STREAM_TRUNCATED);
    }
}

/// Messages needs `max_tokens`: this when `--max-tokens` is not given.
const MESSAGES_MAX_TOKENS: u32 = 1024;

/// The request body for one workload item in `api`'s dialect.
pub fn chat_body(
    api: Api,
    route: &str,
    text: &str,
    stream: bool,
    max_tokens: Option<u32>,
) -> Bytes {
    let mut v = match api {
        Api::Chat | Api::Messages => json!({
            "model": route,
            "messages": [{"role": "user", "content": text}],
        }),
        Api::Responses => json!({"model": route, "input": text}),
    };
    if stream {
        v["stream"] = json!(true);
        if api == Api::Chat {
            v["stream_options"] = json!({"include_usage": true});
        }
    }
    match (api, max_tokens) {
        (Api::Chat, Some(m)) => v["max_tokens"] = json!(m),
        (Api::Responses, Some(m)) => v["max_output_tokens"] = json!(m),
        (Api::Messages, m) => v["max_tokens"] = json!(m.unwrap_or(MESSAGES_MAX_TOKENS)),
        (_, None) => {}
    }
    Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
}
