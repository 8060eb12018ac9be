//! A chat request for mistralrs with the turns an agent sends: assistant turns that called tools (their
//! `tool_calls`, which the model's chat template renders) and tool results (`tool` turns with their
//! `tool_call_id`), and the functions the model may call. mistralrs 0.8.1's `RequestBuilder` keeps an
//! assistant turn's calls under a key the chat templates do not read, so the turns are built here and the
//! rest (sampling, tools) is the builder's.

use std::collections::HashMap;

use either::Either;
use indexmap::IndexMap;
use mistralrs::{
    Constraint, CustomLogitsProcessor, Function, MessageContent, RequestBuilder, RequestLike,
    RequestMessage, SamplingParams, Tool as MistralTool, ToolChoice as MistralChoice, ToolType,
    WebSearchOptions,
};
use serde_json::Value;
use tiergate_queue::{Message, ToolChoice, Tools};

use crate::engine::EngineError;

/// The turns, and a builder holding everything else.
pub(super) struct Chat {
    base: RequestBuilder,
    turns: Vec<IndexMap<String, MessageContent>>,
}

impl Chat {
    /// `messages` with `sampling`'s builder and `tools` (a choice mistralrs cannot force, `required`, is
    /// refused).
    pub(super) fn new(
        messages: &[Message],
        sampling: RequestBuilder,
        tools: Option<&Tools>,
    ) -> Result<Self, EngineError> {
        let mut base = sampling;
        if let Some(t) = tools.filter(|t| !t.list.is_empty()) {
            let list = t.list.iter().map(tool).collect::<Result<Vec<_>, _>>()?;
            let choice = match &t.choice {
                ToolChoice::Auto => MistralChoice::Auto,
                ToolChoice::None => MistralChoice::None,
                ToolChoice::Function(name) => MistralChoice::Tool(
                    list.iter()
                        .find(|l| &l.function.name == name)
                        .cloned()
                        .ok_or_else(|| {
                            EngineError::Invalid(format!("tool_choice names `{name}`, not a tool"))
                        })?,
                ),
                ToolChoice::Required => {
                    return Err(EngineError::Invalid(
                        "tool_choice `required` is not supported by the mistralrs engine (auto, none or a named function)"
                            .into(),
                    ))
                }
            };
            base = base.set_tools(list).set_tool_choice(choice);
        }
        Ok(Self {
            base,
            turns: messages.iter().map(turn).collect(),
        })
    }
}

/// One turn as the chat template reads it.
fn turn(m: &Message) -> IndexMap<String, MessageContent> {
    let text = |s: &str| Either::Left(s.to_string());
    let mut t = IndexMap::from([
        ("role".to_string(), text(&m.role)),
        ("content".to_string(), text(&m.content)),
    ]);
    if !m.tool_calls.is_empty() {
        let calls = m
            .tool_calls
            .iter()
            .map(|c| {
                // Templates read the arguments as an object (Qwen's `tojson`), as OpenAI's clients send text.
                let arguments = serde_json::from_str::<Value>(&c.arguments)
                    .unwrap_or_else(|_| Value::String(c.arguments.clone()));
                IndexMap::from([
                    ("id".to_string(), Value::String(c.id.clone())),
                    ("type".to_string(), Value::String("function".into())),
                    (
                        "function".to_string(),
                        serde_json::json!({"name": c.name, "arguments": arguments}),
                    ),
                ])
            })
            .collect();
        t.insert("tool_calls".to_string(), Either::Right(calls));
    }
    if let Some(id) = &m.tool_call_id {
        t.insert("tool_call_id".to_string(), text(id));
    }
    t
}

/// A function as mistralrs takes it; its parameters must be a JSON object.
fn tool(t: &tiergate_queue::Tool) -> Result<MistralTool, EngineError> {
    let parameters: HashMap<String, Value> = serde_json::from_str(&t.parameters).map_err(|e| {
        EngineError::Invalid(format!(
            "the parameters of tool `{}` are not a JSON object: {e}",
            t.name
        ))
    })?;
    Ok(MistralTool {
        tp: ToolType::Function,
        function: Function {
            description: t.description.clone(),
            name: t.name.clone(),
            parameters: Some(parameters),
        },
    })
}

impl RequestLike for Chat {
    fn messages_ref(&self) -> &[IndexMap<String, MessageContent>] {
        &self.turns
    }

    fn images_ref(&self) -> &[image::DynamicImage] {
        RequestLike::images_ref(&self.base)
    }

    fn take_messages(&mut self) -> RequestMessage {
        match RequestLike::take_messages(&mut self.base) {
            RequestMessage::Chat {
                enable_thinking,
                reasoning_effort,
                ..
            } => RequestMessage::Chat {
                messages: std::mem::take(&mut self.turns),
                enable_thinking,
                reasoning_effort,
            },
            other => other,
        }
    }

    fn take_logits_processors(&mut self) -> Option<Vec<std::sync::Arc<dyn CustomLogitsProcessor>>> {
        RequestLike::take_logits_processors(&mut self.base)
    }

    fn take_adapters(&mut self) -> Option<Vec<String>> {
        RequestLike::take_adapters(&mut self.base)
    }

    fn return_logprobs(&self) -> bool {
        RequestLike::return_logprobs(&self.base)
    }

    fn enable_search(&self) -> Option<bool> {
        RequestLike::enable_search(&self.base)
    }

    fn take_constraint(&mut self) -> Constraint {
        RequestLike::take_constraint(&mut self.base)
    }

    fn take_tools(&mut self) -> Option<(Vec<MistralTool>, MistralChoice)> {
        RequestLike::take_tools(&mut self.base)
    }

    fn take_sampling_params(&mut self) -> SamplingParams {
        RequestLike::take_sampling_params(&mut self.base)
    }

    fn take_web_search_options(&mut self) -> Option<WebSearchOptions> {
        RequestLike::take_web_search_options(&mut self.base)
    }
}
