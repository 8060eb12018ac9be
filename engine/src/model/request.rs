//! A request as the engine takes it: validated once by the HTTP adapter ("parse, don't validate"), every
//! field set there (the tenant, a batch line's marker and the deadline included), read-only after.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tiergate_config::RouteKind;

/// A message after validation.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ValidMessage {
    /// `system`, `user`, `assistant` or `tool` (`developer` maps to `system`).
    pub role: String,
    /// The text (a `tool` message: the tool's result).
    pub content: String,
    /// An assistant turn's tool calls.
    pub tool_calls: Vec<ToolCall>,
    /// The call a `tool` message answers.
    pub tool_call_id: Option<String>,
}

/// What the request's `Cache-Control` lets the answer cache do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheControl {
    /// `no-cache`: do not answer from the cache (the LLM computes it).
    pub no_cache: bool,
    /// `no-store`: do not keep this request's verdict.
    pub no_store: bool,
}

/// A request as the engine takes it from any door, in no door's dialect: the conversation, how to sample it,
/// who asks and with what budget, what the cache may do, and what the door set aside. How the door renders
/// the answer (a stream, usage chunks, logprobs, a JSON label object) is the door's, not the engine's.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Route name.
    pub route: String,
    /// Route kind.
    pub kind: RouteKind,
    /// The conversation.
    pub messages: Vec<ValidMessage>,
    /// The text Tier-0 classifies: the last user turn.
    pub text: String,
    /// Tokens to generate at most.
    pub max_tokens: u32,
    /// Temperature.
    pub temperature: Option<f32>,
    /// Nucleus mass.
    pub top_p: Option<f32>,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Seed.
    pub seed: Option<u64>,
    /// End-user id, recorded in the request's log line.
    pub user: Option<String>,
    /// The session it belongs to (`x-session-id`, else a client's own session id, else a Responses chain's
    /// first id; `user` where the operator says so): its turns stay with the stage and backend of its last LLM
    /// turn ([`crate::routing::sessions`]).
    pub session: Option<String>,
    /// The switch budget the request asks for (`x-tiergate-max-switch-spend-pct`): lowers its route's.
    pub max_switch_spend_pct: Option<f64>,
    /// The model name as the client sent it (its route may be an alias's): a side call to another model
    /// under the same session (Claude Code's background `haiku` calls) has a pin of its own.
    pub asked_model: String,
    /// A line of a batch (from the caller, not the client): its LLM work waits for the interactive channel.
    pub batch: Option<BatchLine>,
    /// The tenant it runs as (from the caller).
    pub tenant: TenantId,
    /// When its budget ends (`x-tiergate-deadline-ms`, else the route's default, at most its maximum).
    pub deadline: Option<Instant>,
    /// The completion id its answer carries (what feedback names).
    pub id: String,
    /// What the answer cache may do for it (`Cache-Control`).
    pub cache: CacheControl,
    /// A θ the operator forced for it (`x-tiergate-threshold`, classified routes): no evidence about the
    /// traffic.
    pub forced: Option<f64>,
    /// The request presented the admin token with its forced θ (the door checked the credential); whether it
    /// may force θ at all is the engine's decision (the policy's `allow_header_override`).
    pub forced_by_admin: bool,
    /// When it arrived.
    pub started: Instant,
    /// The functions a generation may call, and how (generate routes; none: plain text).
    pub tools: Option<Tools>,
    /// The door it came through (`chat`, `responses`, `messages`, `batch`): a label of the request metrics.
    pub door: &'static str,
    /// The request fields set aside ([`crate::answer::fields`]), named in the answer's `x-tiergate-set-aside`.
    pub set_aside: Vec<String>,
    /// The client asked for more tokens than the route allows and was given the route's ceiling.
    pub max_tokens_clamped: bool,
    /// A JSON Schema the generation must follow (`response_format: json_schema` on a route whose every
    /// backend constrains decoding), as JSON text.
    pub json_schema: Option<String>,
    /// Only count the prompt's tokens (`count_tokens`): the backend reads nothing it need not.
    pub count_only: bool,
    /// The caller's `x-request-id`, when it sent one (a latency experiment's key without a `user`).
    pub request_id: Option<String>,
}

impl Request {
    /// A request to `route` of these turns (role, content), as a door validates it, for tests.
    #[cfg(test)]
    pub(crate) fn for_tests(route: &str, kind: RouteKind, turns: &[(&str, &str)]) -> Self {
        let messages: Vec<ValidMessage> = turns
            .iter()
            .map(|(role, content)| ValidMessage {
                role: role.to_string(),
                content: content.to_string(),
                ..ValidMessage::default()
            })
            .collect();
        let text = messages
            .last()
            .map(|m| m.content.clone())
            .unwrap_or_default();
        Request {
            route: route.into(),
            kind,
            messages,
            text,
            max_tokens: 16,
            temperature: None,
            top_p: None,
            stop: Vec::new(),
            seed: None,
            user: None,
            session: None,
            asked_model: route.into(),
            batch: None,
            tenant: TenantId::anonymous(),
            deadline: None,
            id: completion_id(),
            cache: CacheControl::default(),
            forced: None,
            forced_by_admin: false,
            started: Instant::now(),
            tools: None,
            door: "chat",
            set_aside: Vec::new(),
            max_tokens_clamped: false,
            json_schema: None,
            count_only: false,
            request_id: None,
            max_switch_spend_pct: None,
        }
    }

    /// It offers tools, or its conversation holds tool calls or results: only a backend that calls tools
    /// can take it.
    pub(crate) fn uses_tools(&self) -> bool {
        self.tools.is_some()
            || self
                .messages
                .iter()
                .any(|m| m.role == "tool" || !m.tool_calls.is_empty())
    }
}

/// What a route tells a door's validation: its kind and its budgets.
#[derive(Debug, Clone)]
pub struct RouteFacts {
    pub kind: RouteKind,
    /// The budget of a request that names none.
    pub deadline: Option<std::time::Duration>,
    /// The largest budget a request may name.
    pub max_deadline: std::time::Duration,
    /// The most tokens a request may generate (a larger `max_tokens` is lowered to it).
    pub max_tokens: u32,
    /// The most characters of conversation text a request may carry.
    pub max_text_chars: usize,
    /// The route's name (errors name its config keys).
    pub name: String,
    /// Its backends constrain decoding to a JSON Schema.
    pub schema_decoding: bool,
    /// `user` is a session key (`sessions.user_is_session`).
    pub user_is_session: bool,
}

/// A completion id unique across replicas: the time in ms (so feedback can tell how young an answer is) and
/// 64 bits no other client can predict.
pub fn completion_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static N: AtomicU64 = AtomicU64::new(0);
    // SipHash under the process's random keys: a keyed function of a counter, so one id tells nothing of
    // the next (a neighbour's id cannot be guessed from one's own).
    static KEYS: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    let mut h = KEYS.get_or_init(Default::default).build_hasher();
    h.write_u64(N.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    format!(
        "chatcmpl-{:012x}{:016x}",
        unix_ms() & 0xffff_ffff_ffff,
        h.finish()
    )
}

/// When the answer of a completion id from [`completion_id`] (or its Messages and Responses forms, `msg_…`, `resp_…`) was made (Unix
/// ms); none for other ids (batch lines, ids of another shape).
pub(crate) fn born_ms(id: &str) -> Option<u64> {
    let hex = id
        .strip_prefix("chatcmpl-")
        .or_else(|| id.strip_prefix("msg_"))
        .or_else(|| id.strip_prefix("resp_"))?;
    if hex.len() != 28 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(&hex[..12], 16).ok()
}

/// The tenant a request runs as (a request extension: set by the public API's gate
/// (`routes::authenticate`), or by an in-process caller
/// such as the batch runner — a client cannot set extensions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantId(pub Arc<str>);

impl TenantId {
    /// The tenant of requests on a server without tenants (and the owner of batches stored before them).
    pub fn anonymous() -> Self {
        Self(Arc::from("default"))
    }
}

/// Marks a request as a batch line.
#[derive(Debug, Clone, Default)]
pub struct BatchLine {
    /// Set while the line holds the batch turn at the LLM.
    pub(crate) holds_llm: Arc<AtomicBool>,
    /// An interactive escalation may cancel this line's LLM job (it is run again later); false after a few
    /// preemptions, so a batch always progresses.
    pub(crate) preemptible: bool,
    /// `batch_id/custom_id`: what feedback on the line may name instead of its completion id.
    pub alias: Option<Arc<str>>,
}

impl PartialEq for BatchLine {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.holds_llm, &other.holds_llm)
    }
}

impl BatchLine {
    /// A line; `preemptible`: its LLM job yields to interactive escalations.
    pub fn new(preemptible: bool) -> Self {
        Self {
            holds_llm: Arc::default(),
            preemptible,
            alias: None,
        }
    }

    /// The line `custom_id` of batch `batch`, for feedback that names it.
    pub fn with_alias(mut self, batch: &str, custom_id: &str) -> Self {
        self.alias = Some(Arc::from(format!("{batch}/{custom_id}").as_str()));
        self
    }

    /// Its LLM job is running and may be cancelled for an interactive one.
    pub fn preemptible_now(&self) -> bool {
        self.preemptible && self.holds_llm.load(Ordering::Acquire)
    }
}

/// Now as Unix milliseconds.
pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A function call the model made (or an earlier turn made).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The call's id (a tool message names it).
    pub id: String,
    /// The function's name.
    pub name: String,
    /// Its arguments, a JSON document as text.
    pub arguments: String,
}

/// A function the model may call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tool {
    /// The function's name.
    pub name: String,
    /// What it does.
    pub description: Option<String>,
    /// Its parameters' JSON Schema, as text.
    pub parameters: String,
}

/// Whether and which tool the model must call.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// No call.
    None,
    /// At least one call.
    Required,
    /// A call of this function.
    Function(String),
}

/// The tools of a generation: the functions offered, what the model must do with them, and whether it may
/// make several calls in one turn. The queue's protocol has its own (`tiergate_queue::Tools`); the engine
/// maps between the two in one place, when it writes a job and when a call comes back
/// ([`crate::answer::jobs`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Tools {
    pub list: Vec<Tool>,
    pub choice: ToolChoice,
    pub parallel: bool,
}
