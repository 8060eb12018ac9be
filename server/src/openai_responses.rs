//! OpenAI Responses wire types (`POST /v1/responses`, what `client.responses.create` and Codex CLI send) and
//! their mapping onto the chat door's request, so that one validation and one engine call serve both. A field
//! this door does not honour (`reasoning`, `include`, `truncation`, `service_tier`, provider-run tools, a
//! field no rule names) is set aside by the rule in [`crate::fields`] and named in
//! `x-tiergate-set-aside`; the tools the client runs are never set aside: function tools, Codex's `custom`
//! (freeform) and `local_shell` tools and a `namespace`'s functions are offered as functions and their calls
//! answered in the client's shape ([`Shapes`]). Errors keep OpenAI's shape.

use std::collections::HashSet;

use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::openai::ChatRequest;
use tiergate_engine::model::request::ToolCall;

/// `POST /v1/responses` body, as sent.
#[derive(Debug, Deserialize)]
pub struct ResponsesRequest {
    /// The route name.
    pub model: String,
    /// A string (one user turn) or input items.
    pub input: Input,
    #[serde(default)]
    pub instructions: Option<String>,
    #[serde(default)]
    pub max_output_tokens: Option<i64>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub text: Option<TextConfig>,
    /// OpenAI stores responses by default; tiergate keeps no request text unless `[responses] store` says so:
    /// then a response is kept unless this is `false`; without it every response says `"store": false`.
    #[serde(default)]
    pub store: Option<bool>,
    #[serde(default)]
    pub previous_response_id: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    /// A session key (Codex sends its session id here).
    #[serde(default)]
    pub prompt_cache_key: Option<String>,
    /// Codex's `session_id` in it is a session key; the rest is set aside.
    #[serde(default)]
    pub client_metadata: Option<Value>,
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    #[serde(default)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// Every other field (`reasoning`, `include`, `truncation`, `service_tier`, `metadata`, …): set aside.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// `input`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Input {
    Text(String),
    Items(Vec<Value>),
}

/// `text`: the output's format (`verbosity` and any other key are set aside).
#[derive(Debug, Deserialize)]
pub struct TextConfig {
    #[serde(default)]
    pub format: Option<Value>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// The name of the function a `local_shell` tool is offered as.
pub const LOCAL_SHELL: &str = "local_shell";

/// What shape each tool the client offered has, so that a call of it is answered as the client reads it: a
/// `custom_tool_call` with its freeform `input`, a `local_shell_call` with its `exec` action, else a
/// `function_call`.
#[derive(Debug, Clone, Default)]
pub struct Shapes {
    custom: HashSet<String>,
    local_shell: bool,
}

impl Shapes {
    /// The output item of call `c` (`status`: `in_progress` leaves the arguments empty).
    pub fn call_item(&self, c: &ToolCall, status: &str) -> Value {
        let done = status == "completed";
        if self.custom.contains(&c.name) {
            let input = if done {
                freeform_input(&c.arguments)
            } else {
                String::new()
            };
            return json!({"type": "custom_tool_call", "id": format!("ctc_{}", c.id), "call_id": c.id,
                          "name": c.name, "input": input, "status": status});
        }
        if self.local_shell && c.name == LOCAL_SHELL {
            let a: Value = serde_json::from_str(&c.arguments).unwrap_or(Value::Null);
            let command = match &a["command"] {
                Value::String(s) => json!(["bash", "-lc", s]),
                Value::Array(v) => Value::Array(v.clone()),
                _ => json!([]),
            };
            return json!({"type": "local_shell_call", "id": format!("lsh_{}", c.id), "call_id": c.id,
                          "status": status, "action": {"type": "exec", "command": command,
                          "working_directory": a["workdir"], "timeout_ms": a["timeout_ms"], "env": {}}});
        }
        let arguments = if done { c.arguments.as_str() } else { "" };
        json!({"type": "function_call", "id": format!("fc_{}", c.id), "call_id": c.id, "name": c.name,
               "arguments": arguments, "status": status})
    }

    /// Whether a call of `name` streams as a custom tool's input deltas.
    pub fn is_custom(&self, name: &str) -> bool {
        self.custom.contains(name)
    }

    /// The id of a call's output item (what its delta events name).
    pub fn item_id(&self, c: &ToolCall) -> String {
        match self.call_item(c, "in_progress")["id"].as_str() {
            Some(id) => id.to_string(),
            None => format!("fc_{}", c.id),
        }
    }
}

/// A freeform tool's input from the arguments of the function it was offered as (`{"input": "…"}`); text
/// that is not that object is the input as it is.
fn freeform_input(arguments: &str) -> String {
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(o)) => match o.get("input") {
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => arguments.to_string(),
        },
        _ => arguments.to_string(),
    }
}

/// What the mapping set aside, by field name.
type Aside = Vec<String>;

/// One input item in the chat door's terms, appended to `turns`: a message (string content or text parts;
/// an image or file part as a placeholder), a call — `function_call`, `custom_tool_call`, `local_shell_call`
/// (joined to the assistant turn before it, or an assistant turn of its own) — and its output (a `tool`
/// message). `reasoning` and provider-run tools' items are set aside.
fn push_item(
    item: &Value,
    at: &str,
    turns: &mut Vec<Value>,
    aside: &mut Aside,
) -> Result<(), ApiError> {
    let kind = item["type"].as_str().unwrap_or("message");
    let field = |f: &str| format!("{at}.{f}");
    let text_of = |f: &str| {
        item[f]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| ApiError::invalid(field(f), format!("{f}: a string is required")))
    };
    let call = match kind {
        "message" => {
            let (role, text) = item_text(item, at, aside)?;
            turns.push(json!({"role": role, "content": text}));
            return Ok(());
        }
        "function_call" => (text_of("call_id")?, text_of("name")?, text_of("arguments")?),
        "custom_tool_call" => {
            let input = json!({"input": text_of("input")?}).to_string();
            (text_of("call_id")?, text_of("name")?, input)
        }
        "local_shell_call" => {
            let id = text_of("call_id")
                .or_else(|e| item["id"].as_str().map(str::to_string).ok_or(e))?;
            let a = &item["action"];
            let args = json!({"command": a["command"], "workdir": a["working_directory"],
                              "timeout_ms": a["timeout_ms"]});
            (id, LOCAL_SHELL.to_string(), args.to_string())
        }
        "function_call_output" | "custom_tool_call_output" | "local_shell_call_output" => {
            let output = match &item["output"] {
                Value::String(s) => s.clone(),
                Value::Null => return Err(ApiError::invalid(field("output"), "output: required")),
                Value::Array(parts) => parts_text(parts, &field("output"), aside)?,
                other => other.to_string(),
            };
            let id = text_of("call_id")
                .or_else(|e| item["id"].as_str().map(str::to_string).ok_or(e))?;
            turns.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
            return Ok(());
        }
        "reasoning" => {
            aside.push("reasoning".into());
            return Ok(());
        }
        "web_search_call" | "file_search_call" => {
            aside.push("tools.web_search".into());
            return Ok(());
        }
        other => {
            return Err(ApiError::invalid(
                field("type"),
                format!("input items of type `{other}` are not supported here (messages, function, custom and local shell calls and their outputs)"),
            ))
        }
    };
    push_call(turns, call);
    Ok(())
}

/// A call, joined to the assistant turn before it or as an assistant turn of its own.
fn push_call(turns: &mut Vec<Value>, (id, name, arguments): (String, String, String)) {
    let call =
        json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}});
    match turns.last_mut() {
        Some(last) if last["role"] == "assistant" => match last["tool_calls"].as_array_mut() {
            Some(calls) => calls.push(call),
            None => last["tool_calls"] = json!([call]),
        },
        _ => turns.push(json!({"role": "assistant", "content": "", "tool_calls": [call]})),
    }
}

/// One message item's role and text: string content or text parts.
fn item_text(item: &Value, at: &str, aside: &mut Aside) -> Result<(String, String), ApiError> {
    let role = item["role"].as_str().unwrap_or_default();
    let role = match role {
        "user" | "assistant" | "system" => role,
        "developer" => "system",
        other => {
            return Err(ApiError::invalid(
                format!("{at}.role"),
                format!("role `{other}`: must be user, assistant, system or developer"),
            ))
        }
    };
    let text = match &item["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts_text(parts, &format!("{at}.content"), aside)?,
        _ => {
            return Err(ApiError::invalid(
                format!("{at}.content"),
                "a string or a list of input_text parts",
            ))
        }
    };
    Ok((role.to_string(), text))
}

/// The text of content parts: `input_text`, `output_text`, `refusal`; an image or a file is a named
/// placeholder for a text-only backend.
fn parts_text(parts: &[Value], at: &str, aside: &mut Aside) -> Result<String, ApiError> {
    let mut out = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        match (p["type"].as_str(), p["text"].as_str()) {
            (Some("input_text" | "output_text" | "text"), Some(t)) => out.push(t.to_string()),
            (Some("refusal"), _) => out.push(p["refusal"].as_str().unwrap_or_default().to_string()),
            (Some(kind @ ("input_image" | "input_file")), _) => {
                aside.push("image".into());
                let name = p["filename"].as_str().unwrap_or(kind);
                out.push(format!(
                    "[{kind} `{name}` omitted: this model reads text only]"
                ));
            }
            (kind, _) => {
                return Err(ApiError::invalid(
                    format!("{at}.{i}"),
                    format!(
                        "content parts of type `{}` are not supported here",
                        kind.unwrap_or("?")
                    ),
                ))
            }
        }
    }
    Ok(out.join("\n"))
}

/// The tools the client runs, as functions in the chat door's terms, and their shapes: function tools,
/// `custom` (freeform: one string `input`), `local_shell` (a command), a `namespace`'s functions; a
/// provider-run tool (web search, file search, …) is set aside.
fn chat_tools(tools: &[Value], shapes: &mut Shapes, aside: &mut Aside) -> Vec<Value> {
    let mut out = Vec::new();
    for t in tools {
        match t["type"].as_str() {
            Some("function") => out.push(json!({"type": "function", "function": {
                "name": t["name"], "description": t["description"], "parameters": t["parameters"]}})),
            Some("custom") => {
                if let Some(name) = t["name"].as_str() {
                    shapes.custom.insert(name.to_string());
                }
                let parameters = json!({"type": "object", "required": ["input"],
                    "properties": {"input": {"type": "string", "description": "The tool's input, as free text."}}});
                out.push(json!({"type": "function", "function": {
                    "name": t["name"], "description": t["description"], "parameters": parameters}}));
            }
            Some("local_shell") => {
                shapes.local_shell = true;
                let parameters = json!({"type": "object", "required": ["command"], "properties": {
                    "command": {"type": "array", "items": {"type": "string"}},
                    "workdir": {"type": "string"}, "timeout_ms": {"type": "integer"}}});
                out.push(json!({"type": "function", "function": {"name": LOCAL_SHELL,
                    "description": "Runs a command on the user's machine.", "parameters": parameters}}));
            }
            Some("namespace") => {
                let inner = t["tools"].as_array().map(Vec::as_slice).unwrap_or_default();
                out.extend(chat_tools(inner, shapes, aside));
            }
            Some("web_search" | "web_search_preview") => aside.push("tools.web_search".into()),
            Some("file_search") => aside.push("tools.file_search".into()),
            _ => aside.push("tools.server".into()),
        }
    }
    out
}

/// `tool_choice` in the chat door's terms: a string, or a function or custom tool by name; a choice of a
/// provider-run tool (or of `allowed_tools`) is set aside and the model chooses.
fn chat_choice(c: &Value, aside: &mut Aside) -> Result<Option<Value>, ApiError> {
    match c {
        Value::String(_) => Ok(Some(c.clone())),
        _ if c["type"] == "function" || c["type"] == "custom" => Ok(Some(
            json!({"type": "function", "function": {"name": c["name"]}}),
        )),
        _ if c["type"].is_string() => {
            aside.push("tool_choice".into());
            Ok(None)
        }
        _ => Err(ApiError::invalid(
            "tool_choice",
            "auto, none, required, or {\"type\": \"function\", \"name\": …}",
        )),
    }
}

/// `text.format` in the chat door's terms (`json_schema` is passed on for the route to honour or set aside).
fn chat_format(text: Option<TextConfig>, aside: &mut Aside) -> Result<Option<Value>, ApiError> {
    let Some(text) = text else {
        return Ok(None);
    };
    aside.extend(text.other.keys().map(|k| format!("text.{k}")));
    let Some(f) = text.format else {
        return Ok(None);
    };
    match f["type"].as_str() {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => Ok(Some(json!({"type": "json_schema", "json_schema": {
            "name": f["name"], "schema": f["schema"], "strict": f["strict"]}}))),
        other => Err(ApiError::invalid(
            "text.format",
            format!(
                "text.format `{}`: text, json_object or json_schema",
                other.unwrap_or("?")
            ),
        )),
    }
}

impl ResponsesRequest {
    /// Whether the answer streams.
    pub fn streams(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// The same request in the chat door's terms — `instructions` as the system turn, then `previous` (the
    /// stored conversation a `previous_response_id` continues), the input items in order, the client's tools
    /// and the choice, `max_output_tokens`, sampling, `text.format`, the session keys Codex sends — with the
    /// conversation to keep (without the instructions, which a continuation does not inherit) and the tools'
    /// shapes.
    pub fn into_chat(
        self,
        previous: Vec<Value>,
    ) -> Result<(ChatRequest, Vec<Value>, Shapes), ApiError> {
        let mut aside: Aside = self.other.keys().cloned().collect();
        let mut shapes = Shapes::default();
        let tools = self
            .tools
            .as_deref()
            .map(|t| chat_tools(t, &mut shapes, &mut aside))
            .filter(|t| !t.is_empty());
        let tool_choice = match &self.tool_choice {
            Some(c) if tools.is_some() => chat_choice(c, &mut aside)?,
            _ => None,
        };
        let mut turns = previous;
        match self.input {
            Input::Text(t) => turns.push(json!({"role": "user", "content": t})),
            Input::Items(items) => {
                for (i, item) in items.iter().enumerate() {
                    push_item(item, &format!("input.{i}"), &mut turns, &mut aside)?;
                }
            }
        }
        let mut messages = Vec::new();
        if let Some(i) = self.instructions {
            messages.push(json!({"role": "system", "content": i}));
        }
        messages.extend(turns.iter().cloned());
        let format = chat_format(self.text, &mut aside)?;
        let parallel = tools.as_ref().and(self.parallel_tool_calls);
        let chat = json!({
            "model": self.model, "messages": messages, "max_tokens": self.max_output_tokens,
            "temperature": self.temperature, "top_p": self.top_p, "stream": self.stream,
            "user": self.user, "response_format": format, "tools": tools, "tool_choice": tool_choice,
            "parallel_tool_calls": parallel, "prompt_cache_key": self.prompt_cache_key,
        });
        let mut chat: ChatRequest =
            serde_json::from_value(chat).map_err(|e| ApiError::Invalid {
                message: format!("invalid request body: {e}"),
                param: None,
            })?;
        if let Some(m) = &self.client_metadata {
            chat.client_sessions
                .extend(m["session_id"].as_str().map(str::to_string));
            aside.push("client_metadata".into());
        }
        chat.set_aside = aside;
        Ok((chat, turns, shapes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<ChatRequest, ApiError> {
        serde_json::from_value::<ResponsesRequest>(v)
            .map_err(|e| ApiError::invalid("body", e.to_string()))?
            .into_chat(Vec::new())
            .map(|(c, _, _)| c)
    }

    fn param(v: Value) -> String {
        match parse(v) {
            Err(ApiError::Invalid { param, .. }) => param.unwrap_or_default(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn input_items_and_instructions_map_onto_the_chat_door() {
        let c = parse(json!({"model": "generate", "instructions": "be brief", "max_output_tokens": 9,
            "input": [{"role": "user", "content": "hi"},
                      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "yo"}]},
                      {"role": "developer", "content": [{"type": "input_text", "text": "again"}]}]}))
        .unwrap();
        assert_eq!(c.messages.len(), 4);
        assert_eq!(c.messages[3].role, "system");
        assert_eq!(c.max_tokens, Some(9));
        let c = parse(json!({"model": "classify", "input": "card lost", "text": {"format": {"type": "json_object"}}}))
            .unwrap();
        assert!(c.response_format.is_some());
        // A continuation: the stored turns first, then the new input; the instructions are not kept.
        let (c, turns, _) = serde_json::from_value::<ResponsesRequest>(
            json!({"model": "generate", "instructions": "brief", "input": "and then?"}),
        )
        .unwrap()
        .into_chat(vec![
            json!({"role": "user", "content": "hi"}),
            json!({"role": "assistant", "content": "yo"}),
        ])
        .unwrap();
        assert_eq!(c.messages.len(), 4);
        assert_eq!(turns.len(), 3);
        assert_eq!(turns[2], json!({"role": "user", "content": "and then?"}));
    }

    #[test]
    fn function_tools_and_their_items_map_onto_tool_calls_and_tool_messages() {
        let c = parse(json!({"model": "generate",
            "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "weather"}, "parallel_tool_calls": false,
            "input": [{"role": "user", "content": "weather in Oslo?"},
                      {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": "{}"},
                      {"type": "function_call", "call_id": "call_2", "name": "weather", "arguments": "{}"},
                      {"type": "function_call_output", "call_id": "call_1", "output": "rain"},
                      {"type": "function_call_output", "call_id": "call_2", "output": {"t": 3}}]}))
        .unwrap();
        let roles: Vec<&str> = c.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["user", "assistant", "tool", "tool"]);
        assert_eq!(
            c.messages[1]
                .tool_calls
                .as_ref()
                .unwrap()
                .as_array()
                .unwrap()
                .len(),
            2
        );
        assert_eq!(c.messages[3].tool_call_id.as_deref(), Some("call_2"));
        assert_eq!(c.tools.as_ref().unwrap()[0]["function"]["name"], "weather");
        assert_eq!(
            c.tool_choice.as_ref().unwrap()["function"]["name"],
            "weather"
        );
        assert_eq!(c.parallel_tool_calls, Some(json!(false)));
    }

    #[test]
    fn what_it_cannot_take_is_refused_by_name() {
        assert_eq!(
            param(json!({"model": "a", "input": [{"type": "item_reference", "id": "x"}]})),
            "input.0.type"
        );
        assert_eq!(
            param(
                json!({"model": "a", "input": [{"type": "function_call_output", "output": "o"}]})
            ),
            "input.0.call_id"
        );
        assert_eq!(
            param(json!({"model": "a", "input": "x", "text": {"format": {"type": "grammar"}}})),
            "text.format"
        );
    }

    /// What Codex CLI sends: every field is taken, the tools it runs are offered in function terms, and
    /// their calls come back in its shape.
    #[test]
    fn codexs_fields_are_set_aside_and_its_tools_kept() {
        let (c, _, shapes) = serde_json::from_value::<ResponsesRequest>(json!({
            "model": "gpt-5", "stream": true, "store": false, "tool_choice": "auto", "parallel_tool_calls": true,
            "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "sess-9", "client_metadata": {"session_id": "sess-9", "turn_id": "t"},
            "text": {"verbosity": "low"}, "service_tier": "auto",
            "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
                      {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}},
                      {"type": "local_shell"},
                      {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "close_agent", "parameters": {}}]},
                      {"type": "web_search", "external_web_access": false}],
            "input": [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "be good"}]},
                      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"},
                          {"type": "input_image", "image_url": "data:"}]},
                      {"type": "reasoning", "summary": [], "encrypted_content": "x"},
                      {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "*** Begin Patch"},
                      {"type": "custom_tool_call_output", "call_id": "c1", "output": "done"},
                      {"type": "local_shell_call", "call_id": "c2", "status": "completed",
                       "action": {"type": "exec", "command": ["ls"]}},
                      {"type": "function_call_output", "call_id": "c2", "output": "a.txt"}]}))
        .unwrap()
        .into_chat(Vec::new())
        .unwrap();
        let names: Vec<&str> = c
            .tools
            .as_ref()
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            ["exec_command", "apply_patch", "local_shell", "close_agent"]
        );
        let mut aside = crate::fields::set_aside(c.set_aside.clone());
        aside.dedup();
        assert_eq!(
            aside,
            [
                "client_metadata",
                "image",
                "include",
                "reasoning",
                "service_tier",
                "text.verbosity",
                "tools.web_search"
            ]
        );
        assert_eq!(c.prompt_cache_key.as_deref(), Some("sess-9"));
        assert_eq!(c.client_sessions, ["sess-9"]);
        let roles: Vec<&str> = c.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(
            roles,
            ["system", "user", "assistant", "tool", "assistant", "tool"]
        );
        // Calls go back in the client's shapes.
        let call = |name: &str, args: &str| ToolCall {
            id: "k".into(),
            name: name.into(),
            arguments: args.into(),
        };
        let custom = shapes.call_item(
            &call("apply_patch", r#"{"input":"*** Begin Patch"}"#),
            "completed",
        );
        assert_eq!(
            (custom["type"].as_str(), custom["input"].as_str()),
            (Some("custom_tool_call"), Some("*** Begin Patch"))
        );
        let shell = shapes.call_item(
            &call("local_shell", r#"{"command":["cat","notes.txt"]}"#),
            "completed",
        );
        assert_eq!(shell["type"], "local_shell_call");
        assert_eq!(shell["action"]["command"], json!(["cat", "notes.txt"]));
        let f = shapes.call_item(&call("exec_command", r#"{"cmd":"ls"}"#), "completed");
        assert_eq!(
            (f["type"].as_str(), f["arguments"].as_str()),
            (Some("function_call"), Some(r#"{"cmd":"ls"}"#))
        );
    }
}
