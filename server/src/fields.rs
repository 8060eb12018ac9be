//! What every door does with what a client sends beyond the request itself, decided here once: which fields
//! are set aside (accepted, not honoured, and named in `x-tiergate-set-aside`), which session key a request
//! carries, and how far its `max_tokens` is lowered. Agents add request fields every month; a field this
//! server cannot honour is never a 400 for an otherwise valid request, and never dropped in silence. (The
//! engine counts them: `tiergate_engine::answer::fields`, where the rules' names are.)

/// The fields set aside for one request, sorted and without repeats.
pub fn set_aside(names: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut names: Vec<String> = names.into_iter().collect();
    names.sort();
    names.dedup();
    names
}

/// The `x-tiergate-set-aside` header's value: the names joined with `, `, at most `MAX_HEADER` bytes (a client
/// can send many unknown fields; the rest is `…`).
pub fn header_value(names: &[String]) -> Option<axum::http::HeaderValue> {
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
    axum::http::HeaderValue::from_str(&out).ok()
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
/// 32,000 to 64,000 as a matter of course), and whether it was lowered (the engine counts it).
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
        let text = |h: Option<axum::http::HeaderValue>| {
            h.map(|v| String::from_utf8_lossy(v.as_bytes()).to_string())
        };
        assert_eq!(
            text(header_value(&n)).as_deref(),
            Some("context_management, thinking, zz_new")
        );
        assert_eq!(header_value(&[]), None);
        let many: Vec<String> = (0..500).map(|i| format!("field_{i}")).collect();
        let h = text(header_value(&many)).unwrap();
        assert!(h.len() <= 1030 && h.ends_with('…'), "{}", h.len());
        // A name with bytes a header cannot carry keeps its visible ASCII only.
        assert_eq!(
            text(header_value(&["bad\nname é".to_string()])).as_deref(),
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
