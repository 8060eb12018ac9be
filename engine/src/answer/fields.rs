//! What every door does with what a client sends beyond the request itself, decided here once: which fields
//! are set aside (accepted, not honoured, and named in `x-tiergate-set-aside`), which session key a request
//! carries, and how far its `max_tokens` is lowered. Agents add request fields every month; a field this
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
pub const SET_ASIDE_RULES: &[(&str, &str)] = &[
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

/// The fields set aside for one request, sorted and without repeats.
pub fn set_aside(names: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut names: Vec<String> = names.into_iter().collect();
    names.sort();
    names.dedup();
    names
}

/// Counts a request's set-aside fields, and a lowered `max_tokens`, under the door it came through (once,
/// when the engine takes it).
pub fn count(door: &'static str, names: &[String], clamped: bool) {
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

/// The `x-tiergate-set-aside` value: the names joined with `, `, at most `MAX_HEADER` bytes (a client can
/// send many unknown fields; the rest is `…`).
pub fn header_value(names: &[String]) -> Option<String> {
    const MAX_HEADER: usize = 1024;
    if names.is_empty() {
        return None;
    }
    let mut out = String::new();
    for n in names {
        let piece: String = n
            .chars()
            .filter(|c| c.is_ascii_graphic())
            .take(64)
            .collect();
        if out.len() + piece.len() + 2 > MAX_HEADER {
            out.push_str(", …");
            break;
        }
        if !out.is_empty() {
            out.push_str(", ");
        }
        out.push_str(&piece);
    }
    Some(out)
}

/// The session a request belongs to: `x-session-id` when sent, else the first session id the client's own
/// wire carries (Claude Code's `X-Claude-Code-Session-Id` or `metadata.user_id`'s session, Codex's
/// `client_metadata.session_id`, `prompt_cache_key`), else `user` (one end user, one session — issue-level
/// refinement of that is tracked separately). Each key is at most 256 characters.
pub fn session_key(
    header: Option<String>,
    client: &[String],
    user: Option<&str>,
) -> Option<String> {
    header
        .or_else(|| client.iter().find(|s| !s.trim().is_empty()).cloned())
        .or_else(|| user.filter(|u| !u.is_empty()).map(str::to_string))
        .map(|s| s.chars().take(256).collect())
}

/// The session id inside Claude Code's `metadata.user_id`: a JSON string holding `session_id` (newer
/// versions), or the `_session_<uuid>` tail of the older `user_<hash>_account_<id>_session_<uuid>` form.
pub fn claude_session(user_id: &str) -> Option<String> {
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(user_id) {
        return v["session_id"].as_str().map(str::to_string);
    }
    user_id
        .rsplit_once("_session_")
        .map(|(_, s)| s.to_string())
        .filter(|s| !s.is_empty())
}

/// `asked` tokens lowered to the route's `ceiling` (a ceiling, not a request: Anthropic's clients ask for
/// 32,000 to 64,000 as a matter of course), and whether it was lowered ([`count`] counts it).
pub fn clamp_max_tokens(asked: u32, ceiling: u32) -> (u32, bool) {
    (asked.min(ceiling), asked > ceiling)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_aside_names_are_sorted_once_and_the_header_is_bounded() {
        let n =
            set_aside(["thinking", "zz_new", "thinking", "context_management"].map(String::from));
        assert_eq!(n, ["context_management", "thinking", "zz_new"]);
        assert_eq!(
            header_value(&n).as_deref(),
            Some("context_management, thinking, zz_new")
        );
        assert_eq!(header_value(&[]), None);
        let many: Vec<String> = (0..500).map(|i| format!("field_{i}")).collect();
        let h = header_value(&many).unwrap();
        assert!(h.len() <= 1030 && h.ends_with('…'), "{}", h.len());
        // A name with bytes a header cannot carry keeps its visible ASCII only.
        assert_eq!(
            header_value(&["bad\nname é".to_string()]).as_deref(),
            Some("badname")
        );
    }

    #[test]
    fn the_session_key_prefers_the_header_then_the_clients_ids_then_user() {
        let ids = vec!["".to_string(), "claude-1".to_string()];
        assert_eq!(
            session_key(Some("h".into()), &ids, Some("u")).as_deref(),
            Some("h")
        );
        assert_eq!(
            session_key(None, &ids, Some("u")).as_deref(),
            Some("claude-1")
        );
        assert_eq!(session_key(None, &[], Some("u")).as_deref(), Some("u"));
        assert_eq!(session_key(None, &[], Some("")), None);
        assert_eq!(
            session_key(Some("x".repeat(300)), &[], None).map(|s| s.len()),
            Some(256)
        );
    }

    #[test]
    fn claude_codes_user_id_yields_its_session() {
        assert_eq!(
            claude_session(r#"{"device_id":"d","account_uuid":"","session_id":"abc-1"}"#)
                .as_deref(),
            Some("abc-1")
        );
        assert_eq!(
            claude_session("user_ff_account__session_9f2c").as_deref(),
            Some("9f2c")
        );
        assert_eq!(claude_session("plain-user"), None);
    }

    #[test]
    fn max_tokens_is_a_ceiling() {
        assert_eq!(clamp_max_tokens(100, 4096), (100, false));
        assert_eq!(clamp_max_tokens(64_000, 4096), (4096, true));
    }
}
