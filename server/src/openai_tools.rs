//! OpenAI's tool fields (the Chat Completions wire format, validated): tool use on the chat door: `tools`, `tool_choice` and `parallel_tool_calls` become the engine's
//! [`Tools`]; an assistant turn's `tool_calls` and a `tool` turn's `tool_call_id` are read into its
//! messages. Every malformed field is a 400 that names it; the legacy `functions` / `function_call` are
//! refused with the fields to send instead.

use serde_json::Value;
use tiergate_config::RouteKind;
use tiergate_engine::model::request::{Tool, ToolCall, ToolChoice, Tools};

use crate::error::ApiError;
use crate::openai::ChatRequest;

/// Most tools a request may offer (OpenAI's limit).
pub const MAX_TOOLS: usize = 128;

/// The request's tools, or none when it offers none (`tools` absent or empty). A classify or answer route
/// answers with a label: tools sent to it are refused, not ignored.
pub fn valid_tools(req: &ChatRequest, kind: RouteKind) -> Result<Option<Tools>, ApiError> {
    for (field, v) in [
        ("functions", &req.functions),
        ("function_call", &req.function_call),
    ] {
        if v.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(ApiError::invalid(
                field,
                format!(
                    "`{field}` is deprecated and not supported: send `tools` and `tool_choice`"
                ),
            ));
        }
    }
    let list = match &req.tools {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, t)| tool(t, i))
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err(ApiError::invalid("tools", "must be an array of tools")),
    };
    if list.is_empty() {
        return match req
            .tool_choice
            .as_ref()
            .filter(|c| !c.is_null() && *c != "none" && *c != "auto")
        {
            Some(_) => Err(ApiError::invalid(
                "tool_choice",
                "names a tool but `tools` offers none",
            )),
            None => Ok(None),
        };
    }
    if list.len() > MAX_TOOLS {
        return Err(ApiError::invalid(
            "tools",
            format!("{} tools; at most {MAX_TOOLS}", list.len()),
        ));
    }
    if kind != RouteKind::Generate {
        return Err(ApiError::invalid(
            "tools",
            format!(
                "route `{}` answers with a label and calls no tools; send tools to a generate route",
                req.model
            ),
        ));
    }
    let choice = choice(req.tool_choice.as_ref(), &list)?;
    let parallel = match &req.parallel_tool_calls {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ApiError::invalid(
                "parallel_tool_calls",
                "must be a boolean",
            ))
        }
    };
    Ok(Some(Tools {
        list,
        choice,
        parallel,
    }))
}

/// One function tool: `{"type": "function", "function": {"name", "description"?, "parameters"?}}`.
fn tool(t: &Value, i: usize) -> Result<Tool, ApiError> {
    let at = |f: &str| format!("tools[{i}]{f}");
    match t["type"].as_str() {
        Some("function") => {}
        Some(other) => {
            return Err(ApiError::invalid(
                at(".type"),
                format!("tool type `{other}` is not supported (function)"),
            ))
        }
        None => return Err(ApiError::invalid(at(".type"), "must be \"function\"")),
    }
    let f = &t["function"];
    let name = f["name"]
        .as_str()
        .ok_or_else(|| ApiError::invalid(at(".function.name"), "a function needs a name"))?;
    valid_name(name).map_err(|m| ApiError::invalid(at(".function.name"), m))?;
    let parameters = match &f["parameters"] {
        Value::Null => serde_json::json!({"type": "object", "properties": {}}),
        p @ Value::Object(_) => p.clone(),
        _ => {
            return Err(ApiError::invalid(
                at(".function.parameters"),
                "must be a JSON Schema object",
            ))
        }
    };
    let description = match &f["description"] {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        _ => {
            return Err(ApiError::invalid(
                at(".function.description"),
                "must be a string",
            ))
        }
    };
    Ok(Tool {
        name: name.to_string(),
        description,
        parameters: parameters.to_string(),
    })
}

/// A function name as OpenAI allows it: 1–64 of `a-z A-Z 0-9 _ -`.
pub fn valid_name(name: &str) -> Result<(), String> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{name}` is not a valid function name (1 to 64 of a-z, A-Z, 0-9, _ and -)"
        ))
    }
}

/// `tool_choice`: `auto` (the default), `none`, `required`, or `{"type": "function", "function": {"name"}}`
/// naming one of the tools.
fn choice(c: Option<&Value>, list: &[Tool]) -> Result<ToolChoice, ApiError> {
    let named = |name: &str| {
        if list.iter().any(|t| t.name == name) {
            Ok(ToolChoice::Function(name.to_string()))
        } else {
            Err(ApiError::invalid(
                "tool_choice",
                format!("names `{name}`, which is not among the tools"),
            ))
        }
    };
    match c {
        None | Some(Value::Null) => Ok(ToolChoice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => Ok(ToolChoice::Auto),
            "none" => Ok(ToolChoice::None),
            "required" => Ok(ToolChoice::Required),
            other => Err(ApiError::invalid(
                "tool_choice",
                format!("`{other}` is not a choice (auto, none, required, or a function)"),
            )),
        },
        Some(v) if v["type"] == "function" => match v["function"]["name"].as_str() {
            Some(name) => named(name),
            None => Err(ApiError::invalid("tool_choice", "a function choice needs function.name")),
        },
        Some(_) => Err(ApiError::invalid(
            "tool_choice",
            "must be auto, none, required, or {\"type\": \"function\", \"function\": {\"name\": …}}",
        )),
    }
}

/// Message `i`'s tool calls (an assistant's) and the call it answers (a `tool` message's), checked: only an
/// assistant carries calls, a tool message names a call an earlier assistant turn made (`called` collects
/// their ids) — a result without its call is a 400, not a turn the model reads out of context.
pub fn message_tools(
    role: &str,
    tool_calls: Option<&Value>,
    tool_call_id: Option<String>,
    i: usize,
    called: &mut std::collections::HashSet<String>,
) -> Result<(Vec<ToolCall>, Option<String>), ApiError> {
    let calls = match tool_calls.filter(|v| !v.is_null()) {
        Some(_) if role != "assistant" => {
            return Err(ApiError::invalid(
                format!("messages[{i}].tool_calls"),
                "only assistant messages carry tool calls",
            ))
        }
        Some(v) => calls(v, i)?,
        None => Vec::new(),
    };
    called.extend(calls.iter().map(|c| c.id.clone()));
    let answers = match (role, tool_call_id) {
        ("tool", Some(id)) if called.contains(&id) => Some(id),
        ("tool", Some(id)) if !id.is_empty() => {
            return Err(ApiError::invalid(
                format!("messages[{i}].tool_call_id"),
                format!("`{id}` names no tool call of an earlier assistant message"),
            ))
        }
        ("tool", _) => {
            return Err(ApiError::invalid(
                format!("messages[{i}].tool_call_id"),
                "a tool message needs the tool_call_id it answers",
            ))
        }
        (_, _) => None,
    };
    Ok((calls, answers))
}

/// A call as Chat Completions writes it in an assistant message's `tool_calls` (a stored conversation keeps
/// it so too).
pub fn call_json(c: &ToolCall) -> Value {
    serde_json::json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})
}

/// An assistant turn's `tool_calls` (`messages[i].tool_calls`).
fn calls(v: &Value, i: usize) -> Result<Vec<ToolCall>, ApiError> {
    let at = |j: usize, f: &str| format!("messages[{i}].tool_calls[{j}]{f}");
    let list = v.as_array().ok_or_else(|| {
        ApiError::invalid(format!("messages[{i}].tool_calls"), "must be an array")
    })?;
    list.iter()
        .enumerate()
        .map(|(j, c)| {
            if c["type"].as_str().is_some_and(|t| t != "function") {
                return Err(ApiError::invalid(at(j, ".type"), "must be \"function\""));
            }
            let id = c["id"]
                .as_str()
                .filter(|s| !s.is_empty())
                .ok_or_else(|| ApiError::invalid(at(j, ".id"), "a tool call needs an id"))?;
            let name = c["function"]["name"].as_str().ok_or_else(|| {
                ApiError::invalid(at(j, ".function.name"), "a tool call needs a name")
            })?;
            let arguments = match &c["function"]["arguments"] {
                Value::String(s) => s.clone(),
                Value::Null => "{}".to_string(),
                _ => {
                    return Err(ApiError::invalid(
                        at(j, ".function.arguments"),
                        "must be a string (JSON text)",
                    ))
                }
            };
            Ok(ToolCall {
                id: id.to_string(),
                name: name.to_string(),
                arguments,
            })
        })
        .collect()
}
