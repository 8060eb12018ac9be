//! The fields a door sets aside of a request, counted when the engine takes it: which fields the rules name
//! (their counts carry their name; any other is `other`), and a lowered `max_tokens`. The doors' side of the
//! rule — the names, the header, the session key, the ceiling — is `tiergate_server::fields`. Agents add request fields every month; a field this
//! server cannot honour is never a 400 for an otherwise valid request, and never dropped in silence.
//!
//! The rule (docs/api.md, "What each door does with each request field"): a field that asks a backend for something no tiergate backend
//! does — extended thinking or reasoning, a service tier, a server-side context editor, provider-run tools,
//! encrypted reasoning in the output — is set aside on every route and named; so is a field no rule names
//! (counted as `other`). What a backend can honour (sampling, stop sequences, tools the client runs) is
//! passed on, and what only the impossible would satisfy (`n` > 1, a tool choice naming no tool) is refused.

use crate::metrics as m;

/// The fields a rule names, with why each is set aside: their counts carry their own name, any other field's
/// count is `other` (a client's field names are not a label set to grow without bound).
pub(crate) const SET_ASIDE_RULES: &[(&str, &str)] = &[
    ("thinking", "no backend here thinks before it answers"),
    ("reasoning", "no backend here reasons before it answers"),
    (
        "reasoning_effort",
        "no backend here reasons before it answers",
    ),
    (
        "context_management",
        "the conversation is sent whole; no server-side edits",
    ),
    ("output_config", "no backend here has an effort setting"),
    ("service_tier", "one tier of service"),
    (
        "include",
        "no encrypted reasoning or provider-run tool output to include",
    ),
    (
        "truncation",
        "a conversation over the context is refused, not cut",
    ),
    (
        "metadata",
        "kept by the provider only; tiergate keeps no request text",
    ),
    ("client_metadata", "read for its session id only"),
    ("store", "the Chat Completions door stores nothing"),
    ("frequency_penalty", "the local engines take no penalties"),
    ("presence_penalty", "the local engines take no penalties"),
    ("logit_bias", "the local engines take no logit bias"),
    ("top_k", "the local engines take temperature and top_p only"),
    (
        "top_logprobs",
        "no token log-probabilities from generations",
    ),
    ("safety_identifier", "no provider-side abuse monitoring"),
    ("container", "no provider-run code execution"),
    ("mcp_servers", "no provider-run MCP connections"),
    (
        "tools.web_search",
        "a provider-run tool: no backend here searches the web",
    ),
    ("tools.file_search", "a provider-run tool"),
    ("tools.server", "a provider-run tool"),
    ("verbosity", "no backend here has a verbosity setting"),
    ("prompt", "no stored prompt templates"),
    ("max_tool_calls", "a turn ends at its first calls"),
    ("stream_options", "events are always sent in full"),
    ("background", "responses are answered in the foreground"),
    ("modalities", "text only"),
    ("audio", "text only"),
    (
        "prediction",
        "no speculative decoding from a client's prediction",
    ),
    ("web_search_options", "a provider-run tool"),
    ("image", "a text-only backend reads a placeholder"),
    (
        "cache_control",
        "prompt caching is the sessions' work here: a conversation stays on the backend whose cache is warm",
    ),
    ("tool_choice", "it names a provider-run tool: the model chooses"),
    ("text.verbosity", "no backend here has a verbosity setting"),
    (
        "response_format.json_schema",
        "a backend of the route cannot constrain decoding to a schema (the stub): text is answered",
    ),
];

/// Counts a request's set-aside fields, and a lowered `max_tokens`, under the door it came through (once,
/// when the engine takes it).
pub(crate) fn count(door: &'static str, names: &[String], clamped: bool) {
    if clamped {
        metrics::counter!(m::MAX_TOKENS_CLAMPED_TOTAL, "door" => door).increment(1);
    }
    for n in names {
        let label = if SET_ASIDE_RULES.iter().any(|(k, _)| k == n) {
            n.clone()
        } else {
            "other".to_string()
        };
        metrics::counter!(m::FIELDS_SET_ASIDE_TOTAL, "door" => door, "field" => label).increment(1);
    }
}
