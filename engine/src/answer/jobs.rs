//! The one place the engine's request meets the queue's protocol on tools: a conversation's messages and its
//! tools as a job carries them, and a call the worker made as the engine's [`ToolCall`]. The queue's types
//! stay the shared-memory protocol's; no door sees them.

use crate::model::request::{Request, ToolCall, ToolChoice, Tools, ValidMessage};

/// `v`'s conversation as a job's messages.
pub(crate) fn messages(v: &Request) -> Vec<tiergate_queue::Message> {
    v.messages.iter().map(message).collect()
}

fn message(m: &ValidMessage) -> tiergate_queue::Message {
    tiergate_queue::Message {
        role: m.role.clone(),
        content: m.content.clone(),
        tool_calls: m.tool_calls.iter().map(call_out).collect(),
        tool_call_id: m.tool_call_id.clone(),
    }
}

fn call_out(c: &ToolCall) -> tiergate_queue::ToolCall {
    tiergate_queue::ToolCall {
        id: c.id.clone(),
        name: c.name.clone(),
        arguments: c.arguments.clone(),
    }
}

/// A call the worker made.
pub(crate) fn call_in(c: tiergate_queue::ToolCall) -> ToolCall {
    ToolCall {
        id: c.id,
        name: c.name,
        arguments: c.arguments,
    }
}

/// `v`'s tools as a job carries them.
pub(crate) fn tools(v: &Request) -> Option<tiergate_queue::Tools> {
    v.tools.as_ref().map(tools_out)
}

fn tools_out(t: &Tools) -> tiergate_queue::Tools {
    tiergate_queue::Tools {
        list: t
            .list
            .iter()
            .map(|f| tiergate_queue::Tool {
                name: f.name.clone(),
                description: f.description.clone(),
                parameters: f.parameters.clone(),
            })
            .collect(),
        choice: match &t.choice {
            ToolChoice::Auto => tiergate_queue::ToolChoice::Auto,
            ToolChoice::None => tiergate_queue::ToolChoice::None,
            ToolChoice::Required => tiergate_queue::ToolChoice::Required,
            ToolChoice::Function(f) => tiergate_queue::ToolChoice::Function(f.clone()),
        },
        parallel: t.parallel,
    }
}
