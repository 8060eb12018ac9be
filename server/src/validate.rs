//! Validation: the wire request becomes a [`ValidChat`] — the engine's [`Request`] and how this door renders
//! the answer — or a 400 that names the field and the limit. Only a validated request reaches the engine
//! ("parse, don't validate").

use std::time::Instant;

use axum::http::HeaderMap;
use tiergate_config::RouteKind;

use crate::error::ApiError;
use crate::fields;
use crate::openai::{ChatRequest, Content, Stop, WireMessage};
use crate::openai_tools as tools;
pub use crate::openai_tools::{valid_name, MAX_TOOLS};
pub use tiergate_engine::model::request::{Request, ValidMessage};

/// A request as a door validated it: the engine's [`Request`] (what a reader of `v.route`, `v.id`, … reads,
/// through `Deref`) and how the door renders its answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidChat {
    /// What the engine answers.
    pub request: Request,
    /// Stream as SSE.
    pub stream: bool,
    /// Send a usage chunk at the end of a stream.
    pub include_usage: bool,
    /// Label probabilities wanted (classify routes).
    pub logprobs: bool,
    /// Alternatives per position.
    pub top_logprobs: usize,
    /// Reply as a JSON object (classify routes).
    pub json_object: bool,
}

impl std::ops::Deref for ValidChat {
    type Target = Request;
    fn deref(&self) -> &Request {
        &self.request
    }
}

impl std::ops::DerefMut for ValidChat {
    fn deref_mut(&mut self) -> &mut Request {
        &mut self.request
    }
}

/// Default generation length.
pub const DEFAULT_MAX_TOKENS: u32 = 256;

pub use tiergate_engine::model::request::RouteFacts;

/// What the handler knows of a request besides its body: who asks, a batch line's marker, its headers
/// (the budget) and when it arrived. Everything a [`ValidChat`] holds is set in [`validate`], once.
pub struct Caller<'a> {
    pub tenant: tiergate_engine::model::request::TenantId,
    pub batch: Option<tiergate_engine::model::request::BatchLine>,
    pub headers: &'a HeaderMap,
    pub started: Instant,
    /// The θ its `x-tiergate-threshold` forces and whether it presents the admin token, or why the value is
    /// not one (read by the routes that classify).
    pub forced: Result<Option<(f64, bool)>, ApiError>,
}

/// Validates `req` from `caller` against the route table (`route_of` maps a route name to its facts).
pub fn validate(
    req: ChatRequest,
    route_of: impl Fn(&str) -> Option<RouteFacts>,
    caller: Caller<'_>,
) -> Result<ValidChat, ApiError> {
    let facts = route_of(&req.model).ok_or_else(|| {
        ApiError::UnknownModel(format!(
            "the model `{}` does not exist; see GET /v1/models",
            req.model
        ))
    })?;
    let kind = facts.kind;
    if let Some(n) = req.n {
        if n != 1 {
            return Err(ApiError::invalid(
                "n",
                format!("n = {n} is not supported: only 1 choice per request"),
            ));
        }
    }
    let tools = tools::valid_tools(&req, kind)?;
    let (json_schema, schema_set_aside) = json_schema(&req, &facts)?;
    let set_aside = fields::set_aside(
        req.set_aside
            .iter()
            .cloned()
            .chain(req.other.keys().cloned())
            .chain(schema_set_aside),
    );
    let (messages, text) = valid_messages(req.messages, facts.max_text_chars, &facts.name)?;
    let s = valid_sampling(
        req.max_completion_tokens,
        req.max_tokens,
        req.temperature,
        req.top_p,
        req.stop,
        req.seed,
    )?;
    let (max_tokens, max_tokens_clamped) = fields::clamp_max_tokens(s.max_tokens, facts.max_tokens);
    let (logprobs, top_logprobs, json_object) = valid_outputs(
        kind,
        req.logprobs,
        req.top_logprobs,
        req.response_format.as_ref().map(|f| f.kind.as_str()),
    )?;
    let user = req.user.map(|u| u.chars().take(256).collect::<String>());
    let mut client_sessions = req.client_sessions;
    client_sessions.extend(req.prompt_cache_key);
    let session = fields::session_key(
        session_header(caller.headers)?,
        &client_sessions,
        user.as_deref().filter(|_| facts.user_is_session),
    );
    let stream = req.stream.unwrap_or(false);
    let include_usage = req
        .stream_options
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    let deadline = crate::adapt::budget(caller.headers, facts.deadline, facts.max_deadline)?
        .map(|b| caller.started + b);
    let forced = match kind {
        RouteKind::Generate => None,
        RouteKind::Classify | RouteKind::Answer => caller.forced?,
    };
    let (forced, forced_by_admin) = (forced.map(|f| f.0), forced.is_some_and(|f| f.1));
    let door = if caller.batch.is_some() {
        "batch"
    } else {
        "chat"
    };
    let request = Request {
        door,
        route: req.model,
        kind,
        messages,
        text,
        max_tokens,
        max_tokens_clamped,
        set_aside,
        json_schema,
        count_only: false,
        request_id: caller
            .headers
            .get("x-request-id")
            .and_then(|h| h.to_str().ok())
            .filter(|r| !r.is_empty())
            .map(str::to_string),
        temperature: s.temperature,
        top_p: s.top_p,
        stop: s.stop,
        seed: s.seed,
        user,
        session,
        asked_model: String::new(),
        max_switch_spend_pct: switch_budget(caller.headers)?,
        batch: caller.batch,
        tenant: caller.tenant,
        deadline,
        id: completion_id(),
        cache: cache_control(caller.headers),
        forced,
        forced_by_admin,
        started: caller.started,
        tools,
    };
    Ok(ValidChat {
        request,
        stream,
        include_usage,
        logprobs,
        top_logprobs,
        json_object,
    })
}

/// A generate route's `response_format: json_schema`: the schema (as JSON text) passed on when every backend
/// of the route constrains decoding, else set aside by name (the text is answered unconstrained).
fn json_schema(
    req: &ChatRequest,
    facts: &RouteFacts,
) -> Result<(Option<String>, Option<String>), ApiError> {
    let Some(f) = req
        .response_format
        .as_ref()
        .filter(|f| f.kind == "json_schema" && facts.kind == RouteKind::Generate)
    else {
        return Ok((None, None));
    };
    if !facts.schema_decoding {
        return Ok((None, Some("response_format.json_schema".into())));
    }
    let schema = f.json_schema.as_ref().map(|j| &j["schema"]);
    match schema {
        Some(s) if s.is_object() => Ok((Some(s.to_string()), None)),
        _ => Err(ApiError::invalid(
            "response_format.json_schema.schema",
            "a JSON Schema object is required",
        )),
    }
}

/// The session key `x-session-id` names: 1 to 256 visible ASCII characters, else a 400 naming the header.
fn session_header(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let name = tiergate_core::outcome::header::SESSION_ID;
    let Some(raw) = headers.get(name) else {
        return Ok(None);
    };
    let text = raw.to_str().unwrap_or("").trim();
    if text.is_empty() || text.len() > 256 || !text.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ApiError::invalid(
            name,
            "a session key is 1 to 256 visible ASCII characters (no spaces)",
        ));
    }
    Ok(Some(text.to_string()))
}

/// The switch budget `x-tiergate-max-switch-spend-pct` asks for: a percentage at least 0, else a 400 naming
/// the header.
fn switch_budget(headers: &HeaderMap) -> Result<Option<f64>, ApiError> {
    let name = tiergate_core::outcome::header::MAX_SWITCH_SPEND_PCT;
    let Some(raw) = headers.get(name) else {
        return Ok(None);
    };
    let text = raw.to_str().unwrap_or("").trim();
    match text.parse::<f64>() {
        Ok(p) if p.is_finite() && p >= 0.0 => Ok(Some(p)),
        _ => Err(ApiError::invalid(
            name,
            format!("`{text}` is not a percentage (a number at least 0)"),
        )),
    }
}

/// What `Cache-Control` lets the answer cache do: `no-cache` skips the lookup, `no-store` the write
/// (directives are case-insensitive; others are ignored, as an HTTP cache would).
pub fn cache_control(headers: &HeaderMap) -> tiergate_engine::model::request::CacheControl {
    let mut c = tiergate_engine::model::request::CacheControl::default();
    for v in headers.get_all(axum::http::header::CACHE_CONTROL) {
        for d in v.to_str().unwrap_or("").split(',') {
            match d.trim().to_ascii_lowercase().as_str() {
                "no-cache" => c.no_cache = true,
                "no-store" => c.no_store = true,
                _ => {}
            }
        }
    }
    c
}

pub use tiergate_engine::model::request::completion_id;

/// Now as Unix seconds (a response's `created`).
pub fn unix_now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The messages with roles mapped and content parts joined, and the text Tier-0 classifies (the last
/// non-empty user message).
fn valid_messages(
    wire: Vec<WireMessage>,
    limit: usize,
    route: &str,
) -> Result<(Vec<ValidMessage>, String), ApiError> {
    if wire.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "must contain at least one message",
        ));
    }
    let mut messages = Vec::with_capacity(wire.len());
    let mut total = 0usize;
    let mut called = std::collections::HashSet::new();
    for (i, m) in wire.into_iter().enumerate() {
        let role = match m.role.as_str() {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            "tool" => "tool",
            "function" => {
                return Err(ApiError::invalid(
                    format!("messages[{i}].role"),
                    "`function` messages are deprecated and not supported: send `tool` messages",
                ))
            }
            other => {
                return Err(ApiError::invalid(
                    format!("messages[{i}].role"),
                    format!("unknown role `{other}` (system, developer, user, assistant, tool)"),
                ))
            }
        };
        let (tool_calls, tool_call_id) =
            tools::message_tools(role, m.tool_calls.as_ref(), m.tool_call_id, i, &mut called)?;
        let content = match m.content {
            None => String::new(),
            Some(Content::Text(t)) => t,
            Some(Content::Parts(parts)) => {
                let mut out = Vec::new();
                for (j, p) in parts.into_iter().enumerate() {
                    if p.kind != "text" {
                        return Err(ApiError::invalid(
                            format!("messages[{i}].content[{j}].type"),
                            format!("content part `{}` is not supported (text only)", p.kind),
                        ));
                    }
                    out.push(p.text.unwrap_or_default());
                }
                out.join("\n")
            }
        };
        total += content.chars().count()
            + tool_calls
                .iter()
                .map(|c| c.arguments.chars().count())
                .sum::<usize>();
        messages.push(ValidMessage {
            role: role.into(),
            content,
            tool_calls,
            tool_call_id,
        });
    }
    if total > limit {
        return Err(ApiError::invalid(
            "messages",
            format!(
                "{total} characters of text; the limit is {limit} (routes.{route}.max_text_chars)"
            ),
        ));
    }
    let text = messages
        .iter()
        .rev()
        .find(|m| m.role == "user" && !m.content.trim().is_empty())
        .map(|m| m.content.clone())
        .ok_or_else(|| ApiError::invalid("messages", "needs a non-empty user message"))?;
    Ok((messages, text))
}

/// The sampling fields, checked.
struct Sampling {
    max_tokens: u32,
    temperature: Option<f32>,
    top_p: Option<f32>,
    stop: Vec<String>,
    seed: Option<u64>,
}

fn valid_sampling(
    max_completion_tokens: Option<i64>,
    max_tokens: Option<i64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    stop: Option<Stop>,
    seed: Option<i64>,
) -> Result<Sampling, ApiError> {
    // A ceiling, not a request: anything from 1 up is accepted and lowered to the route's ceiling after.
    let max_tokens = match max_completion_tokens.or(max_tokens) {
        None => DEFAULT_MAX_TOKENS,
        Some(v) if v >= 1 => u32::try_from(v).unwrap_or(u32::MAX),
        Some(v) => {
            let field = if max_completion_tokens.is_some() {
                "max_completion_tokens"
            } else {
                "max_tokens"
            };
            return Err(ApiError::invalid(field, format!("{v} must be at least 1")));
        }
    };
    let temperature = match temperature {
        None => None,
        Some(t) if t.is_finite() && (0.0..=2.0).contains(&t) => Some(t as f32),
        Some(t) => {
            return Err(ApiError::invalid(
                "temperature",
                format!("{t} is outside 0..=2"),
            ))
        }
    };
    let top_p = match top_p {
        None => None,
        Some(p) if p.is_finite() && p > 0.0 && p <= 1.0 => Some(p as f32),
        Some(p) => return Err(ApiError::invalid("top_p", format!("{p} is outside (0, 1]"))),
    };
    let stop = match stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) if v.len() <= 4 => v,
        Some(Stop::Many(v)) => {
            return Err(ApiError::invalid(
                "stop",
                format!("{} stop strings; at most 4", v.len()),
            ))
        }
    };
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "stop strings must not be empty"));
    }
    let seed = match seed {
        None => None,
        Some(s) if s >= 0 => Some(s as u64),
        Some(s) => {
            return Err(ApiError::invalid(
                "seed",
                format!("{s} must not be negative"),
            ))
        }
    };
    Ok(Sampling {
        max_tokens,
        temperature,
        top_p,
        stop,
        seed,
    })
}

/// `logprobs`, `top_logprobs` and `response_format`, checked against the route's kind.
fn valid_outputs(
    kind: RouteKind,
    logprobs: Option<bool>,
    top_logprobs: Option<i64>,
    format: Option<&str>,
) -> Result<(bool, usize, bool), ApiError> {
    let top_logprobs = match top_logprobs {
        None => 0,
        Some(k) if (0..=20).contains(&k) => k as usize,
        Some(k) => {
            return Err(ApiError::invalid(
                "top_logprobs",
                format!("{k} is outside 0..=20"),
            ))
        }
    };
    let logprobs = logprobs.unwrap_or(false);
    if top_logprobs > 0 && !logprobs {
        return Err(ApiError::invalid("top_logprobs", "requires logprobs: true"));
    }
    if logprobs && kind == RouteKind::Generate {
        return Err(ApiError::invalid(
            "logprobs",
            "log-probabilities are available on classify routes only",
        ));
    }
    let json_object = match format {
        None | Some("text") => false,
        Some("json_object") if kind == RouteKind::Classify => true,
        Some("json_object") => {
            return Err(ApiError::invalid(
                "response_format",
                "json_object is available on classify routes only",
            ))
        }
        // No engine here constrains a generation to a schema yet: the text is answered and the format named
        // in `x-tiergate-set-aside` (see fields::SET_ASIDE_RULES).
        Some("json_schema") if kind == RouteKind::Generate => false,
        Some(other) => {
            return Err(ApiError::invalid(
                "response_format",
                format!("type `{other}` is not supported on a {kind:?} route"),
            ))
        }
    };
    Ok((logprobs, top_logprobs, json_object))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tiergate_engine::model::request::ToolChoice;

    fn req(v: serde_json::Value) -> ChatRequest {
        serde_json::from_value(v).unwrap()
    }
    fn kinds(name: &str) -> Option<RouteFacts> {
        let kind = match name {
            "classify" => RouteKind::Classify,
            "generate" => RouteKind::Generate,
            _ => return None,
        };
        Some(RouteFacts {
            kind,
            deadline: None,
            max_deadline: Duration::from_secs(60),
            max_tokens: 4096,
            max_text_chars: 131_072,
            name: name.to_string(),
            schema_decoding: false,
            user_is_session: false,
        })
    }

    static NO_HEADERS: std::sync::LazyLock<HeaderMap> = std::sync::LazyLock::new(HeaderMap::new);

    fn anyone() -> Caller<'static> {
        Caller {
            tenant: tiergate_engine::model::request::TenantId::anonymous(),
            batch: None,
            headers: &NO_HEADERS,
            started: Instant::now(),
            forced: Ok(None),
        }
    }
    fn param(e: ApiError) -> String {
        e.body()["error"]["param"]
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    #[test]
    fn cache_control_reads_no_cache_and_no_store_in_any_case_and_order() {
        use axum::http::header::CACHE_CONTROL;
        let mut h = HeaderMap::new();
        assert_eq!(cache_control(&h), Default::default());
        h.insert(CACHE_CONTROL, "max-age=0, No-Store".parse().unwrap());
        let c = cache_control(&h);
        assert!(c.no_store && !c.no_cache);
        h.append(CACHE_CONTROL, "no-cache".parse().unwrap());
        let c = cache_control(&h);
        assert!(c.no_store && c.no_cache);
    }

    #[test]
    fn accepts_a_full_request_and_picks_the_last_user_turn() {
        let v = validate(
            req(serde_json::json!({"model":"classify","messages":[
                {"role":"system","content":"be brief"},{"role":"user","content":"first"},
                {"role":"assistant","content":"ok"},{"role":"user","content":[{"type":"text","text":"second"}]}],
                "max_completion_tokens": 10, "temperature": 0.5, "stop": "x", "logprobs": true, "top_logprobs": 3,
                "response_format": {"type":"json_object"}, "stream": true, "stream_options": {"include_usage": true},
                "some_future_field": 1})),
            kinds,
            anyone(),
        )
        .unwrap();
        assert_eq!(v.text, "second");
        assert_eq!((v.max_tokens, v.top_logprobs, v.stop.len()), (10, 3, 1));
        assert!(v.stream && v.include_usage && v.json_object && v.logprobs);
    }

    #[test]
    fn the_caller_and_the_budget_are_set_in_validation() {
        let mut headers = HeaderMap::new();
        headers.insert(
            tiergate_core::outcome::header::DEADLINE,
            "500".parse().unwrap(),
        );
        let started = Instant::now();
        let caller = Caller {
            tenant: tiergate_engine::model::request::TenantId(std::sync::Arc::from("acme")),
            batch: Some(tiergate_engine::model::request::BatchLine::new(false)),
            headers: &headers,
            started,
            forced: Ok(None),
        };
        let body =
            serde_json::json!({"model":"classify","messages":[{"role":"user","content":"hi"}]});
        let v = validate(req(body.clone()), kinds, caller).unwrap();
        assert_eq!(&*v.tenant.0, "acme");
        assert!(v.batch.is_some());
        assert_eq!(v.deadline, Some(started + Duration::from_millis(500)));
        // A budget above the route's maximum is a 400 naming the header, before anything runs.
        headers.insert(
            tiergate_core::outcome::header::DEADLINE,
            "600000".parse().unwrap(),
        );
        let caller = Caller {
            tenant: tiergate_engine::model::request::TenantId::anonymous(),
            batch: None,
            headers: &headers,
            started,
            forced: Ok(None),
        };
        let e = validate(req(body), kinds, caller).unwrap_err();
        assert_eq!(param(e), tiergate_core::outcome::header::DEADLINE);
    }

    #[test]
    fn errors_name_the_field() {
        let bad = |j: serde_json::Value| validate(req(j), kinds, anyone()).unwrap_err();
        // Tools are read, never dropped: a generate route takes them; a classify route, a malformed tool, a
        // choice naming no tool, a tool message without its call id, the legacy fields are refused by name.
        let param = |e: ApiError| match e {
            ApiError::Invalid { param, .. } => param.unwrap_or_default(),
            other => panic!("{other:?}"),
        };
        let user = serde_json::json!({"role":"user","content":"x"});
        let f = serde_json::json!({"type":"function","function":{"name":"f"}});
        let ok = |j: serde_json::Value| validate(req(j), kinds, anyone()).unwrap();
        let v = ok(serde_json::json!({"model":"generate","messages":[user,
            {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",
             "function":{"name":"f","arguments":"{\"a\":1}"}}]},
            {"role":"tool","tool_call_id":"c1","content":"42"}],
            "tools":[f],"tool_choice":{"type":"function","function":{"name":"f"}},
            "parallel_tool_calls":false}));
        let tools = v.tools.clone().unwrap();
        assert_eq!(
            (tools.list[0].name.as_str(), &tools.choice, tools.parallel),
            ("f", &ToolChoice::Function("f".into()), false)
        );
        assert_eq!(v.messages[1].tool_calls[0].arguments, r#"{"a":1}"#);
        assert_eq!(
            (
                v.messages[2].role.as_str(),
                v.messages[2].tool_call_id.as_deref()
            ),
            ("tool", Some("c1"))
        );
        assert_eq!(v.text, "x", "Tier-0 reads the last user turn");
        for (body, field) in [
            (
                serde_json::json!({"model":"classify","messages":[user],"tools":[f]}),
                "tools",
            ),
            (
                serde_json::json!({"model":"generate","messages":[user],"tools":[{"type":"web_search"}]}),
                "tools[0].type",
            ),
            (
                serde_json::json!({"model":"generate","messages":[user],
              "tools":[{"type":"function","function":{"name":"no spaces"}}]}),
                "tools[0].function.name",
            ),
            (
                serde_json::json!({"model":"generate","messages":[user],"tools":[f],
              "tool_choice":{"type":"function","function":{"name":"g"}}}),
                "tool_choice",
            ),
            (
                serde_json::json!({"model":"generate","messages":[user],"tools":[f],"tool_choice":"sometimes"}),
                "tool_choice",
            ),
            (
                serde_json::json!({"model":"generate","messages":[user],"tools":[f],"parallel_tool_calls":"yes"}),
                "parallel_tool_calls",
            ),
            (
                serde_json::json!({"model":"generate","messages":[user,{"role":"tool","content":"42"}]}),
                "messages[1].tool_call_id",
            ),
            (
                serde_json::json!({"model":"generate","messages":[user,{"role":"tool","tool_call_id":"c9","content":"42"}]}),
                "messages[1].tool_call_id",
            ),
            (
                serde_json::json!({"model":"generate","messages":[user,
              {"role":"assistant","content":null,"tool_calls":[{"type":"function"}]}]}),
                "messages[1].tool_calls[0].id",
            ),
            (
                serde_json::json!({"model":"generate","messages":[user,
              {"role":"user","content":"x","tool_calls":[]}]}),
                "messages[1].tool_calls",
            ),
            (
                serde_json::json!({"model":"generate","messages":[user],"functions":[{"name":"f"}]}),
                "functions",
            ),
            (
                serde_json::json!({"model":"generate","messages":[user,{"role":"function","name":"f","content":"1"}]}),
                "messages[1].role",
            ),
        ] {
            assert_eq!(param(bad(body.clone())), field, "{body}");
        }
        assert!(ok(serde_json::json!({"model":"generate","messages":[user],"tools":[],"tool_choice":"none"}))
            .tools
            .is_none());
        assert!(matches!(
            bad(serde_json::json!({"model":"nope","messages":[{"role":"user","content":"x"}]})),
            ApiError::UnknownModel(_)
        ));
        assert_eq!(
            param(bad(
                serde_json::json!({"model":"classify","n":2,"messages":[{"role":"user","content":"x"}]})
            )),
            "n"
        );
        assert_eq!(
            param(bad(serde_json::json!({"model":"classify","messages":[]}))),
            "messages"
        );
        assert_eq!(
            param(bad(
                serde_json::json!({"model":"classify","temperature":3,"messages":[{"role":"user","content":"x"}]})
            )),
            "temperature"
        );
        assert_eq!(
            param(bad(
                serde_json::json!({"model":"classify","max_tokens":0,"messages":[{"role":"user","content":"x"}]})
            )),
            "max_tokens"
        );
        assert_eq!(
            param(bad(
                serde_json::json!({"model":"classify","messages":[{"role":"robot","content":"x"}]})
            )),
            "messages[0].role"
        );
        assert_eq!(
            param(bad(
                serde_json::json!({"model":"generate","logprobs":true,"messages":[{"role":"user","content":"x"}]})
            )),
            "logprobs"
        );
        assert_eq!(
            param(bad(
                serde_json::json!({"model":"classify","messages":[{"role":"system","content":"x"}]})
            )),
            "messages"
        );
    }
}
