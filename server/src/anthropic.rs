//! Anthropic Messages wire types (`POST /v1/messages`, what the `anthropic` SDKs send and read) and their
//! mapping onto the chat door's request, so that one validation and one engine call serve both dialects.
//! A field this door does not honour (`thinking`, `context_management`, `output_config`, `top_k`, provider-run
//! tools, a field no rule names) is set aside by the rule in [`crate::fields`] and named in
//! `x-tiergate-set-aside` — never a 400 for a request Anthropic's API would take, never dropped in silence.
//! An image or document block becomes a named placeholder for a text-only backend. Errors take Anthropic's shape (`{"type": "error", "error": {"type", "message"}}`), reshaped
//! from the door's own errors in one place ([`reshape`]).

use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::fields;
use crate::openai::ChatRequest;

/// `POST /v1/messages` body, as sent.
#[derive(Debug, Deserialize)]
pub struct MessagesRequest {
    /// The route name.
    pub model: String,
    /// Required by the API; checked with a clear error when missing.
    #[serde(default)]
    pub max_tokens: Option<i64>,
    pub messages: Vec<Message>,
    #[serde(default)]
    pub system: Option<System>,
    #[serde(default)]
    pub stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub top_k: Option<i64>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub metadata: Option<Metadata>,
    /// Client tools (`name`, `description`, `input_schema`); server tools are refused by name.
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    /// `{"type": "auto" | "any" | "tool" | "none", "name"?, "disable_parallel_tool_use"?}`.
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// Every other field (`thinking`, `context_management`, `output_config`, `service_tier`, …): set aside.
    #[serde(flatten)]
    pub other: serde_json::Map<String, Value>,
}

/// `metadata`.
#[derive(Debug, Deserialize)]
pub struct Metadata {
    /// An end user's id; Claude Code sends a JSON string holding its session id.
    #[serde(default)]
    pub user_id: Option<String>,
}

/// `system`: a string or text blocks.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum System {
    Text(String),
    Blocks(Vec<Block>),
}

/// One message.
#[derive(Debug, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: MessageContent,
}

/// A message's content: a string or blocks.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Blocks(Vec<Block>),
}

/// A content block: `text`, an assistant's `tool_use`, a user's `tool_result`; others are named in the error
/// that refuses them.
#[derive(Debug, Deserialize)]
pub struct Block {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
    /// `tool_use`: the call's id, function and input.
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub input: Option<Value>,
    /// `tool_result`: the call it answers, its content (a string or text blocks), whether it failed.
    #[serde(default)]
    pub tool_use_id: Option<String>,
    #[serde(default)]
    pub content: Option<MessageContent>,
    #[serde(default)]
    pub is_error: Option<bool>,
    /// A prompt-caching breakpoint: prompt caching is the sessions' work here (a conversation stays on the
    /// backend whose cache is warm), so it is set aside by name.
    #[serde(default)]
    pub cache_control: Option<Value>,
}

/// What a text-only backend reads in place of an image or document block (the model is told something was
/// there; the turn and the ones after it still answer).
fn placeholder(kind: &str, b: &Block) -> String {
    let name = b.name.as_deref().or(b.id.as_deref()).unwrap_or(kind);
    format!("[{kind} `{name}` omitted: this model reads text only]")
}

/// What the mapping set aside, by field name.
#[derive(Default)]
struct Aside(Vec<String>);

impl Aside {
    fn note(&mut self, name: &str) {
        self.0.push(name.to_string());
    }

    /// Notes what a block carries that is set aside (its `cache_control`).
    fn block(&mut self, b: &Block) {
        if b.cache_control.is_some() {
            self.note("cache_control");
        }
    }
}

/// The text of `blocks` (an image or document as its placeholder), or a 400 naming `at` for a block that
/// has no text form.
fn text_of(blocks: &[Block], at: &str, aside: &mut Aside) -> Result<String, ApiError> {
    let mut out = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        aside.block(b);
        match (b.kind.as_str(), &b.text) {
            ("text", Some(t)) => out.push(t.clone()),
            ("text", None) => {
                return Err(ApiError::invalid(
                    format!("{at}.{i}.text"),
                    "a text block needs `text`",
                ))
            }
            (kind @ ("image" | "document"), _) => {
                aside.note("image");
                out.push(placeholder(kind, b));
            }
            (kind, _) => {
                return Err(ApiError::invalid(
                    format!("{at}.{i}.type"),
                    format!("content blocks of type `{kind}` are not supported here"),
                ))
            }
        }
    }
    Ok(out.join("\n"))
}

impl MessagesRequest {
    /// Whether the answer streams.
    pub fn streams(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// The same request in the chat door's terms: `system` first, the messages in order (an assistant's
    /// `tool_use` blocks as its tool calls, a user's `tool_result` blocks as `tool` messages before its text),
    /// the tools and the choice, the sampling and stop sequences, `metadata.user_id` as the user (and Claude
    /// Code's session in it as a session key). `max_tokens` is required (≥ 1; the route's ceiling applies);
    /// what is set aside is named in the request's `set_aside`.
    pub fn into_chat(self) -> Result<ChatRequest, ApiError> {
        let max_tokens = self
            .max_tokens
            .ok_or_else(|| ApiError::invalid("max_tokens", "max_tokens: Field required"))?;
        if max_tokens < 1 {
            return Err(ApiError::invalid("max_tokens", "must be at least 1"));
        }
        let mut aside = Aside(self.other.keys().cloned().collect());
        if self.top_k.is_some() {
            aside.note("top_k");
        }
        let tools = self
            .tools
            .as_deref()
            .map(|t| chat_tools(t, &mut aside))
            .transpose()?
            .filter(|t| !t.is_empty());
        let (tool_choice, parallel) = match &self.tool_choice {
            Some(c) if tools.is_some() => chat_choice(c)?,
            _ => (None, None),
        };
        let messages = chat_messages(self.system, self.messages, &mut aside)?;
        let user = self.metadata.and_then(|m| m.user_id);
        let chat = json!({
            "model": self.model,
            "messages": messages,
            "tools": tools,
            "tool_choice": tool_choice,
            "parallel_tool_calls": parallel,
            "max_tokens": max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stop": self.stop_sequences,
            "stream": self.stream,
            "user": user,
        });
        let mut chat: ChatRequest =
            serde_json::from_value(chat).map_err(|e| ApiError::Invalid {
                message: format!("invalid request body: {e}"),
                param: None,
            })?;
        chat.set_aside = aside.0;
        chat.client_sessions
            .extend(user.as_deref().and_then(fields::claude_session));
        Ok(chat)
    }
}

/// `system` and the messages in the chat door's terms.
fn chat_messages(
    system: Option<System>,
    wire: Vec<Message>,
    aside: &mut Aside,
) -> Result<Vec<Value>, ApiError> {
    let mut messages = Vec::new();
    match system {
        Some(System::Text(t)) => messages.push(json!({"role": "system", "content": t})),
        Some(System::Blocks(b)) => {
            messages.push(json!({"role": "system", "content": text_of(&b, "system", aside)?}))
        }
        None => {}
    }
    for (i, m) in wire.into_iter().enumerate() {
        // Claude Code puts `system` turns among the messages (its environment, mid-conversation notes).
        if !matches!(m.role.as_str(), "user" | "assistant" | "system") {
            return Err(ApiError::invalid(
                format!("messages.{i}.role"),
                format!("role `{}`: must be `user`, `assistant` or `system`", m.role),
            ));
        }
        match m.content {
            MessageContent::Text(t) => messages.push(json!({"role": m.role, "content": t})),
            MessageContent::Blocks(b) => chat_turns(
                &m.role,
                &b,
                &format!("messages.{i}.content"),
                &mut messages,
                aside,
            )?,
        }
    }
    Ok(messages)
}

/// The turns of one message's blocks in the chat door's terms: a user's `tool_result` blocks become `tool`
/// messages (first: they answer the previous turn's calls), its text one user message; an assistant's text
/// and `tool_use` blocks one assistant message with its tool calls. An image or document is its placeholder;
/// an assistant's `thinking` blocks and a provider-run tool's blocks are set aside.
fn chat_turns(
    role: &str,
    blocks: &[Block],
    at: &str,
    out: &mut Vec<Value>,
    aside: &mut Aside,
) -> Result<(), ApiError> {
    let mut text = Vec::new();
    let mut calls = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        let here = |f: &str| format!("{at}.{i}{f}");
        aside.block(b);
        match (role, b.kind.as_str()) {
            (_, "text") => text.push(
                b.text
                    .clone()
                    .ok_or_else(|| ApiError::invalid(here(".text"), "a text block needs `text`"))?,
            ),
            (_, kind @ ("image" | "document")) => {
                aside.note("image");
                text.push(placeholder(kind, b));
            }
            ("assistant", "thinking" | "redacted_thinking") => aside.note("thinking"),
            ("assistant", "server_tool_use") | (_, "web_search_tool_result") => {
                aside.note("tools.server")
            }
            ("assistant", "tool_use") => {
                let (Some(id), Some(name)) = (&b.id, &b.name) else {
                    return Err(ApiError::invalid(
                        here(""),
                        "a tool_use block needs `id` and `name`",
                    ));
                };
                let input = b.input.clone().unwrap_or_else(|| json!({}));
                calls.push(json!({"id": id, "type": "function",
                                  "function": {"name": name, "arguments": input.to_string()}}));
            }
            ("user", "tool_result") => {
                let id = b.tool_use_id.as_ref().ok_or_else(|| {
                    ApiError::invalid(
                        here(".tool_use_id"),
                        "a tool_result block needs `tool_use_id`",
                    )
                })?;
                let mut content = match &b.content {
                    None => String::new(),
                    Some(MessageContent::Text(t)) => t.clone(),
                    Some(MessageContent::Blocks(inner)) => {
                        text_of(inner, &here(".content"), aside)?
                    }
                };
                if b.is_error == Some(true) {
                    content = format!("Error: {content}");
                }
                out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            (_, kind) => {
                return Err(ApiError::invalid(
                    here(".type"),
                    format!(
                    "content blocks of type `{kind}` are not supported in a {role} message here"
                ),
                ))
            }
        }
    }
    if !calls.is_empty() {
        out.push(json!({"role": "assistant", "content": text.join("\n"), "tool_calls": calls}));
    } else if !text.is_empty() || out.last().is_none_or(|m| m["role"] != "tool") {
        out.push(json!({"role": role, "content": text.join("\n")}));
    }
    Ok(())
}

/// Client tools in the chat door's terms; a provider-run tool (a `type` other than `custom`, such as
/// `web_search_20250305`) is set aside — no backend here runs it — and named.
fn chat_tools(tools: &[Value], aside: &mut Aside) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        if t["type"].as_str().is_some_and(|k| k != "custom") {
            aside.note("tools.server");
            continue;
        }
        if t.get("cache_control").is_some() {
            aside.note("cache_control");
        }
        let schema = t.get("input_schema").cloned().ok_or_else(|| {
            ApiError::invalid(
                format!("tools.{i}.input_schema"),
                "input_schema: Field required",
            )
        })?;
        out.push(json!({"type": "function", "function": {
            "name": t["name"], "description": t["description"], "parameters": schema}}));
    }
    Ok(out)
}

/// `tool_choice` in the chat door's terms, and whether parallel calls are allowed.
fn chat_choice(c: &Value) -> Result<(Option<Value>, Option<bool>), ApiError> {
    let parallel = c["disable_parallel_tool_use"].as_bool().map(|d| !d);
    let choice = match c["type"].as_str() {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => match c["name"].as_str() {
            Some(name) => json!({"type": "function", "function": {"name": name}}),
            None => {
                return Err(ApiError::invalid(
                    "tool_choice.name",
                    "name: Field required",
                ))
            }
        },
        _ => {
            return Err(ApiError::invalid(
                "tool_choice.type",
                "must be auto, any, tool or none",
            ))
        }
    };
    Ok((Some(choice), parallel))
}

/// Anthropic's `stop_reason` for the chat door's finish reason and the stop sequence that ended it, if any.
pub fn stop_reason(finish: &str, stop: Option<&str>) -> &'static str {
    match (finish, stop) {
        ("length", _) => "max_tokens",
        ("tool_calls", _) => "tool_use",
        (_, Some(_)) => "stop_sequence",
        _ => "end_turn",
    }
}

/// Anthropic's error type for an HTTP status.
pub fn error_type(status: u16) -> &'static str {
    match status {
        400 | 405 | 408 | 409 | 412 | 422 | 431 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// An error body in Anthropic's shape.
pub fn error_body(status: u16, message: &str) -> Value {
    json!({"type": "error", "error": {"type": error_type(status), "message": message}})
}

/// An error response of the chat door (OpenAI's shape, or a plain body from a layer) in Anthropic's shape,
/// keeping its status and headers (`retry-after`, the request id).
pub async fn reshape(resp: axum::response::Response) -> axum::response::Response {
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let bytes = axum::body::to_bytes(body, 64 << 10)
        .await
        .unwrap_or_default();
    let message = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(&bytes).trim().to_string());
    let body = error_body(status.as_u16(), &message).to_string();
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    parts.headers.insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    axum::response::Response::from_parts(parts, axum::body::Body::from(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<ChatRequest, ApiError> {
        serde_json::from_value::<MessagesRequest>(v)
            .map_err(|e| ApiError::invalid("body", e.to_string()))?
            .into_chat()
    }

    #[test]
    fn a_messages_request_maps_onto_the_chat_door() {
        let c = parse(json!({"model": "generate", "max_tokens": 8,
            "system": [{"type": "text", "text": "be brief"}],
            "messages": [{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
                         {"role": "user", "content": "again"}],
            "stop_sequences": ["\n"], "temperature": 0.0, "metadata": {"user_id": "u1"}}))
        .unwrap();
        assert_eq!(c.model, "generate");
        assert_eq!(c.messages.len(), 4);
        assert_eq!(c.messages[0].role, "system");
        assert_eq!(c.max_tokens, Some(8));
        assert_eq!(c.user.as_deref(), Some("u1"));
    }

    #[test]
    fn tool_use_and_tool_results_map_onto_tool_calls_and_tool_messages() {
        let c = parse(json!({"model": "generate", "max_tokens": 8,
            "tools": [{"name": "weather", "description": "the weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "messages": [{"role": "user", "content": "weather in Oslo?"},
                         {"role": "assistant", "content": [{"type": "text", "text": "checking"},
                             {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}}]},
                         {"role": "user", "content": [
                             {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "rain"}]},
                             {"type": "text", "text": "and tomorrow?"}]}]}))
        .unwrap();
        let roles: Vec<&str> = c.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["user", "assistant", "tool", "user"]);
        let calls = c.messages[1].tool_calls.as_ref().unwrap();
        assert_eq!(calls[0]["function"]["arguments"], r#"{"city":"Oslo"}"#);
        assert_eq!(c.messages[2].tool_call_id.as_deref(), Some("toolu_1"));
        assert_eq!(
            c.tools.as_ref().unwrap()[0]["function"]["parameters"]["type"],
            "object"
        );
        assert_eq!(c.tool_choice, Some(json!("required")));
        assert_eq!(c.parallel_tool_calls, Some(json!(false)));
    }

    #[test]
    fn what_this_door_cannot_take_is_refused_by_name() {
        let param = |v: Value| match parse(v) {
            Err(ApiError::Invalid { param, .. }) => param.unwrap_or_default(),
            other => panic!("{other:?}"),
        };
        let m = json!([{"role": "user", "content": "hi"}]);
        assert_eq!(param(json!({"model": "a", "messages": m})), "max_tokens");
        assert_eq!(
            param(json!({"model": "a", "max_tokens": 1, "messages": m,
                         "tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "maybe"}})),
            "tool_choice.type"
        );
        let tool_role = json!([{"role": "tool", "content": "x"}]);
        assert_eq!(
            param(json!({"model": "a", "max_tokens": 1, "messages": tool_role})),
            "messages.0.role"
        );
        let unknown_block = json!([{"role": "user", "content": [{"type": "hologram"}]}]);
        assert_eq!(
            param(json!({"model": "a", "max_tokens": 1, "messages": unknown_block})),
            "messages.0.content.0.type"
        );
        assert_eq!(error_type(529), "overloaded_error");
        assert_eq!(error_type(404), "not_found_error");
    }

    /// What Claude Code sends on its first request: every field is taken, what is not honoured is named.
    #[test]
    fn claude_codes_fields_are_set_aside_by_name_not_refused() {
        let c = parse(json!({"model": "claude-sonnet-4-5", "max_tokens": 32000, "stream": true,
            "thinking": {"type": "enabled", "budget_tokens": 31999},
            "context_management": {"edits": []}, "output_config": {"effort": "high"}, "top_k": 5,
            "metadata": {"user_id": "{\"device_id\":\"d\",\"session_id\":\"sess-1\"}"},
            "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
            "tools": [{"name": "Read", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}},
                      {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}],
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}},
                {"type": "text", "text": "read notes.txt", "cache_control": {"type": "ephemeral"}}]},
                {"role": "system", "content": [{"type": "text", "text": "# Environment"}]},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                    {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "/x"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "the word"}, {"type": "image", "source": {}}]}]}]}))
        .unwrap();
        let mut aside = fields::set_aside(c.set_aside.clone());
        aside.dedup();
        assert_eq!(
            aside,
            [
                "cache_control",
                "context_management",
                "image",
                "output_config",
                "thinking",
                "tools.server",
                "top_k"
            ]
        );
        assert_eq!(c.client_sessions, ["sess-1"]);
        assert_eq!(
            c.max_tokens,
            Some(32000),
            "the route's ceiling applies in validation"
        );
        let tools = c.tools.as_ref().unwrap().as_array().unwrap();
        assert_eq!(
            tools.len(),
            1,
            "the provider-run tool is not offered to the model"
        );
        let roles: Vec<&str> = c.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "system", "assistant", "tool"]);
        let Some(crate::openai::Content::Text(t)) = &c.messages[1].content else {
            panic!("{:?}", c.messages[1].content)
        };
        assert!(t.contains("[image `image` omitted"), "{t}");
        let Some(crate::openai::Content::Text(t)) = &c.messages[4].content else {
            panic!()
        };
        assert!(t.starts_with("the word\n[image"), "{t}");
    }
}
