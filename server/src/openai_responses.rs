//! OpenAI Responses wire types (`POST /v1/responses`, what `client.responses.create` sends) and their mapping
//! onto the chat door's request, so that one validation and one engine call serve both. Unknown fields are
//! refused by name; what this door does not do yet (function tools and their items, built-in tools, stored
//! conversations) is a 400 that says so, never dropped in silence. Errors keep OpenAI's shape.

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

/// One input item's text: a message with string content or `input_text` / `output_text` parts.
fn item_text(item: &Value, at: &str) -> Result<(String, String), ApiError> {
    let kind = item["type"].as_str().unwrap_or("message");
    if kind != "message" {
        return Err(ApiError::invalid(
            format!("{at}.type"),
            format!("input items of type `{kind}` are not supported by this server yet"),
        ));
    }
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

impl ResponsesRequest {
    /// Whether the answer streams.
    pub fn streams(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// The same request in the chat door's terms — `instructions` as the system turn, then `previous` (the
    /// stored conversation a `previous_response_id` continues), the input items in order, `max_output_tokens`,
    /// sampling, `text.format` (`json_object` as `response_format`) — and the conversation to keep (without
    /// the instructions, which a continuation does not inherit).
    pub fn into_chat(
        self,
        previous: Vec<(String, String)>,
    ) -> Result<(ChatRequest, Vec<(String, String)>), ApiError> {
        if self.tools.as_ref().is_some_and(|t| !t.is_empty()) || self.tool_choice.is_some() {
            return Err(ApiError::invalid(
                "tools",
                "tools (function and built-in) are not supported by this server's Responses API yet",
            ));
        }
        let mut turns = previous;
        match self.input {
            Input::Text(t) => turns.push(("user".into(), t)),
            Input::Items(items) => {
                for (i, item) in items.iter().enumerate() {
                    turns.push(item_text(item, &format!("input.{i}"))?);
                }
            }
        }
        let mut messages = Vec::new();
        if let Some(i) = self.instructions {
            messages.push(json!({"role": "system", "content": i}));
        }
        messages.extend(
            turns
                .iter()
                .map(|(role, text)| json!({"role": role, "content": text})),
        );
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
            "user": self.user, "response_format": format,
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
            ("user".into(), "hi".into()),
            ("assistant".into(), "yo".into()),
        ])
        .unwrap();
        assert_eq!(c.messages.len(), 4);
        assert_eq!(turns.len(), 3);
        assert_eq!(turns[2], ("user".to_string(), "and then?".to_string()));
    }

    #[test]
    fn what_it_does_not_do_is_refused_by_name() {
        assert_eq!(
            param(json!({"model": "a", "input": "x", "tools": [{"type": "web_search_preview"}]})),
            "tools"
        );
        assert_eq!(
            param(
                json!({"model": "a", "input": [{"type": "function_call_output", "call_id": "c", "output": "o"}]})
            ),
            "input.0.type"
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
