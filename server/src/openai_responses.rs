//! OpenAI Responses wire types (`POST /v1/responses`, what `client.responses.create` sends) and their mapping
//! onto the chat door's request, so that one validation and one engine call serve both. Unknown fields are
//! refused by name; what this door does not do (built-in tools, item types other than messages and function
//! calls and their outputs) is a 400 that says so, never dropped in silence. Errors keep OpenAI's shape.

use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::openai::ChatRequest;

/// `POST /v1/responses` body, as sent.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
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
    #[serde(default)]
    pub metadata: Option<Value>,
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    #[serde(default)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
}

/// `input`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Input {
    Text(String),
    Items(Vec<Value>),
}

/// `text`: the output's format.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextConfig {
    #[serde(default)]
    pub format: Option<Value>,
}

/// One input item in the chat door's terms, appended to `turns`: a message (string content or
/// `input_text` / `output_text` parts), a `function_call` (joined to the assistant turn before it, or an
/// assistant turn of its own), a `function_call_output` (a `tool` message).
fn push_item(item: &Value, at: &str, turns: &mut Vec<Value>) -> Result<(), ApiError> {
    let kind = item["type"].as_str().unwrap_or("message");
    let field = |f: &str| format!("{at}.{f}");
    let text_of = |f: &str| {
        item[f]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| ApiError::invalid(field(f), format!("{f}: a string is required")))
    };
    match kind {
        "message" => {
            let (role, text) = item_text(item, at)?;
            turns.push(json!({"role": role, "content": text}));
        }
        "function_call" => {
            let call = json!({"id": text_of("call_id")?, "type": "function",
                              "function": {"name": text_of("name")?, "arguments": text_of("arguments")?}});
            match turns.last_mut() {
                Some(last) if last["role"] == "assistant" => match last["tool_calls"].as_array_mut() {
                    Some(calls) => calls.push(call),
                    None => last["tool_calls"] = json!([call]),
                },
                _ => turns.push(json!({"role": "assistant", "content": "", "tool_calls": [call]})),
            }
        }
        "function_call_output" => {
            let output = match &item["output"] {
                Value::String(s) => s.clone(),
                Value::Null => return Err(ApiError::invalid(field("output"), "output: required")),
                other => other.to_string(),
            };
            turns.push(json!({"role": "tool", "tool_call_id": text_of("call_id")?, "content": output}));
        }
        other => {
            return Err(ApiError::invalid(
                field("type"),
                format!("input items of type `{other}` are not supported by this server (message, function_call, function_call_output)"),
            ))
        }
    }
    Ok(())
}

/// One message item's role and text: string content or `input_text` / `output_text` parts.
fn item_text(item: &Value, at: &str) -> Result<(String, String), ApiError> {
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
        Value::Array(parts) => {
            let mut out = Vec::new();
            for (i, p) in parts.iter().enumerate() {
                match (p["type"].as_str(), p["text"].as_str()) {
                    (Some("input_text" | "output_text"), Some(t)) => out.push(t),
                    (kind, _) => {
                        return Err(ApiError::invalid(
                            format!("{at}.content.{i}"),
                            format!(
                                "content parts of type `{}` are not supported by this server",
                                kind.unwrap_or("?")
                            ),
                        ))
                    }
                }
            }
            out.join("\n")
        }
        _ => {
            return Err(ApiError::invalid(
                format!("{at}.content"),
                "a string or a list of input_text parts",
            ))
        }
    };
    Ok((role.to_string(), text))
}

/// Function tools in the chat door's terms; a built-in tool (web search, file search, …) is refused.
fn chat_tools(tools: &[Value]) -> Result<Vec<Value>, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| match t["type"].as_str() {
            Some("function") => Ok(json!({"type": "function", "function": {
                "name": t["name"], "description": t["description"], "parameters": t["parameters"]}})),
            other => Err(ApiError::invalid(
                format!("tools.{i}.type"),
                format!(
                    "built-in tool `{}` is not supported by this server (function tools only)",
                    other.unwrap_or("?")
                ),
            )),
        })
        .collect()
}

/// `tool_choice` in the chat door's terms.
fn chat_choice(c: &Value) -> Result<Value, ApiError> {
    match c {
        Value::String(_) => Ok(c.clone()),
        _ if c["type"] == "function" => Ok(json!({"type": "function", "function": {"name": c["name"]}})),
        _ => Err(ApiError::invalid(
            "tool_choice",
            "auto, none, required, or {\"type\": \"function\", \"name\": …} (built-in tools are not supported)",
        )),
    }
}

impl ResponsesRequest {
    /// Whether the answer streams.
    pub fn streams(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// The same request in the chat door's terms — `instructions` as the system turn, then `previous` (the
    /// stored conversation a `previous_response_id` continues), the input items in order, function tools and
    /// the choice, `max_output_tokens`, sampling, `text.format` (`json_object` as `response_format`) — and the
    /// conversation to keep (without the instructions, which a continuation does not inherit).
    pub fn into_chat(self, previous: Vec<Value>) -> Result<(ChatRequest, Vec<Value>), ApiError> {
        let tools = self.tools.as_deref().map(chat_tools).transpose()?;
        let tool_choice = self.tool_choice.as_ref().map(chat_choice).transpose()?;
        let mut turns = previous;
        match self.input {
            Input::Text(t) => turns.push(json!({"role": "user", "content": t})),
            Input::Items(items) => {
                for (i, item) in items.iter().enumerate() {
                    push_item(item, &format!("input.{i}"), &mut turns)?;
                }
            }
        }
        let mut messages = Vec::new();
        if let Some(i) = self.instructions {
            messages.push(json!({"role": "system", "content": i}));
        }
        messages.extend(turns.iter().cloned());
        let format = match self.text.and_then(|t| t.format) {
            None => None,
            Some(f) => match f["type"].as_str() {
                Some("text") => None,
                Some("json_object") => Some(json!({"type": "json_object"})),
                other => {
                    return Err(ApiError::invalid(
                        "text.format",
                        format!(
                            "text.format `{}`: only `text` and `json_object` are supported",
                            other.unwrap_or("?")
                        ),
                    ))
                }
            },
        };
        let chat = json!({
            "model": self.model, "messages": messages, "max_tokens": self.max_output_tokens,
            "temperature": self.temperature, "top_p": self.top_p, "stream": self.stream,
            "user": self.user, "response_format": format, "tools": tools, "tool_choice": tool_choice,
            "parallel_tool_calls": self.parallel_tool_calls,
        });
        let chat = serde_json::from_value(chat).map_err(|e| ApiError::Invalid {
            message: format!("invalid request body: {e}"),
            param: None,
        })?;
        Ok((chat, turns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<ChatRequest, ApiError> {
        serde_json::from_value::<ResponsesRequest>(v)
            .map_err(|e| ApiError::invalid("body", e.to_string()))?
            .into_chat(Vec::new())
            .map(|(c, _)| c)
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
        let (c, turns) = serde_json::from_value::<ResponsesRequest>(
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
    fn what_it_does_not_do_is_refused_by_name() {
        assert_eq!(
            param(json!({"model": "a", "input": "x", "tools": [{"type": "web_search_preview"}]})),
            "tools.0.type"
        );
        assert_eq!(
            param(json!({"model": "a", "input": [{"type": "reasoning", "summary": []}]})),
            "input.0.type"
        );
        assert_eq!(
            param(
                json!({"model": "a", "input": [{"type": "function_call_output", "output": "o"}]})
            ),
            "input.0.call_id"
        );
        assert_eq!(
            param(json!({"model": "a", "input": "x", "text": {"format": {"type": "json_schema"}}})),
            "text.format"
        );
        assert!(serde_json::from_value::<ResponsesRequest>(
            json!({"model": "a", "input": "x", "nonsense": 1})
        )
        .is_err());
    }
}
