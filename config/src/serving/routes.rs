//! `[[routes]]`: what a client names in `model`, its kind, head and cascade of stages.

use super::*;

/// What a route does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteKind {
    /// Reply with the label.
    Classify,
    /// Reply with the label's configured text (FAQ bot); escalations get an LLM-written reply.
    Answer,
    /// Straight to the LLM.
    Generate,
}

/// A route: what a client names in `model`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// The `model` name.
    pub name: String,
    /// What it does.
    pub kind: RouteKind,
    /// A head of its own (e.g. a trained one); by default the `[prefilter]` head.
    #[serde(default)]
    pub head: Option<HeadConfig>,
    /// Prompt templates of its own; by default `[reranker.prompts]`.
    #[serde(default)]
    pub prompts: Option<PromptConfig>,
    /// What the route answers for a query none of its labels covers (off: every query gets a label).
    #[serde(default)]
    pub out_of_scope: Option<OutOfScopeConfig>,
    /// The budget of a request that sends no `x-tiergate-deadline-ms`, milliseconds (unset: none; the LLM's
    /// deadlines by job kind apply).
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    /// The largest budget a request may ask for, milliseconds (600 000 when unset).
    #[serde(default)]
    pub max_deadline_ms: Option<u64>,
    /// Its cascade of LLM backends (`[[llm]]` names, or `{ llm, theta }`): an escalation goes to the first; after
    /// each stage's fused answer, if its ambiguity is still above the next stage's `theta`, on to the next.
    /// Unset: the first backend alone.
    #[serde(default)]
    pub stages: Option<Vec<StageConfig>>,
    /// With `[cache] enabled`: its LLM-written answers (answer routes) and generations (generate routes) at
    /// temperature 0 may be answered from the cache, keyed by the whole conversation, the sampling and the
    /// tenant (off: only rerank verdicts are cached).
    #[serde(default)]
    pub cache_generations: bool,
    /// A generate route steered by Tier-0: its head classifies the conversation's last user turn, a sure label
    /// (ambiguity 1 − p ≤ `theta`) sends it to the stage `by_label` maps it to, an unsure one — or a label the
    /// map does not name — to the `"*"` stage (by default the route's last, strongest stage).
    #[serde(default)]
    pub steer: Option<SteerConfig>,
    /// Earlier user turns Tier-0 reads with the last one (classify, answer and steered routes; 0: the last
    /// turn alone). A follow-up such as "and cancel it" is then classified with what it follows; the
    /// context is part of the answer cache's key, and an answer classified with it is outside the error
    /// bound's calibration (single utterances): escalated while a bound is set, never drawn for audit.
    #[serde(default)]
    pub context_turns: usize,
    /// The most characters of earlier turns read (the latest kept; the last turn is always whole).
    #[serde(default = "default_context_chars")]
    pub context_chars: usize,
    /// Other model names this route answers to: exact names, or globs with `*` (`claude-*`, `gpt-5*`) — an
    /// agent names its provider's models (Claude Code's background calls name a `claude-haiku-*`). A route's
    /// own name wins over an alias, an exact alias over a glob; two routes may not claim one exact name.
    #[serde(default)]
    pub aliases: Vec<String>,
    /// This route answers a model name no route or alias names (at most one route; off: 404).
    #[serde(default)]
    pub default: bool,
    /// The most tokens one request may generate here (4096 when unset): a client that asks for more is given
    /// this many — `max_tokens` is a ceiling, not a request (Anthropic's clients send 32,000 and more).
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// The most characters of conversation text one request may carry (message contents, tool calls'
    /// arguments, tool results; 4,194,304 when unset, with `server.max_body_bytes` and
    /// `reranker.request_bytes` the other two limits an agent's conversation meets).
    #[serde(default)]
    pub max_text_chars: Option<usize>,
}

fn default_context_chars() -> usize {
    400
}

/// `steer = { by_label = { billing = "small", "*" = "big" }, theta = 0.4 }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SteerConfig {
    /// Label → stage name; `"*"`: the stage of unsure requests and unmapped labels.
    pub by_label: std::collections::BTreeMap<String, String>,
    /// The most ambiguity a label may have to count as sure (0.5 when unset): the `theta_base` of a static
    /// policy when `policy` is unset.
    #[serde(default = "default_steer_theta")]
    pub theta: f64,
    /// The route's own θ policy (`mode`, `theta_base`, `k`, …; not `risk`): changed live with
    /// `/admin/routing?route=…`. In `load` mode u is the busiest of the default stage's backends: as they get
    /// busy θ rises, more labels count as sure and go to their (cheaper) stages.
    #[serde(default)]
    pub policy: Option<RoutingConfig>,
    /// Per label, what its generation is written with: a system prompt put before the conversation's own and
    /// sampling that replaces the client's (`max_tokens` caps it).
    #[serde(default)]
    pub overrides: std::collections::BTreeMap<String, SteerOverride>,
    /// A session's switch budget: moving a pinned session to another stage costs reading its conversation
    /// again on the target, and all its moves together may cost at most this share of its spend (percent of
    /// its turns' backend time, moves included); a request's `x-tiergate-max-switch-spend-pct` lowers it.
    #[serde(default = "default_max_switch_spend_pct")]
    pub max_switch_spend_pct: f64,
}

fn default_max_switch_spend_pct() -> f64 {
    100.0
}

/// `[routes.steer.overrides.billing] system = "…", temperature = 0.2, top_p = 0.9, max_tokens = 200`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SteerOverride {
    /// A system prompt put first (before the client's own system turn, joined with a blank line).
    #[serde(default)]
    pub system: Option<String>,
    /// Temperature, replacing the client's.
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Nucleus mass, replacing the client's.
    #[serde(default)]
    pub top_p: Option<f32>,
    /// The most tokens the label's generations may write (the client's `max_tokens` when smaller).
    #[serde(default)]
    pub max_tokens: Option<u32>,
}

impl SteerConfig {
    /// Its θ policy: its own, else a static θ of `theta` over `global`'s other fields.
    pub fn policy(&self, global: &RoutingConfig) -> RoutingConfig {
        self.policy
            .clone()
            .unwrap_or_else(|| global.fixed_at(self.theta))
    }
}

fn default_steer_theta() -> f64 {
    0.5
}

/// One stage of a route's cascade: a backend's name, or a table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StageConfig {
    /// A backend's name.
    Name(String),
    /// A backend (`llm`) or alternatives (`any`), and how to choose and retry.
    Table(StageTable),
}

/// A stage as a table: `{ llm = "a" }` or `{ any = ["a", "b"], prefer = "latency", retries = 1 }`, or a
/// `grade` preset; `theta` on stages after the first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageTable {
    /// The stage's name within its route (its policy's key in `/admin/routing?stage=`, the shared store and
    /// metrics); by default its first backend's. Two stages of one route may not share a name.
    #[serde(default)]
    pub name: Option<String>,
    /// The one backend.
    #[serde(default)]
    pub llm: Option<String>,
    /// Alternatives: the request goes to the best one predicted to finish within its budget.
    #[serde(default)]
    pub any: Option<Vec<String>>,
    /// `quality` (the first listed that fits) or `latency` (the fastest predicted); the grade's, else quality.
    #[serde(default)]
    pub prefer: Option<Prefer>,
    /// Runs again on the same backend after an engine or upstream error; the grade's, else 0.
    #[serde(default)]
    pub retries: Option<u32>,
    /// A preset of the latency-graded gateway: `gold` (fastest, no retry), `silver` (fastest, 1 retry),
    /// `bronze` (as listed — the last is the fallback —, 2 retries).
    #[serde(default)]
    pub grade: Option<Grade>,
    /// The ambiguity above which a request goes on to this stage (stages after the first): its policy's
    /// `theta_base` when `policy` is unset.
    #[serde(default)]
    pub theta: Option<f64>,
    /// This stage's own routing policy (stages after the first; a static θ = `theta` when unset), changed live
    /// with `/admin/routing?route=…&stage=…`.
    #[serde(default)]
    pub policy: Option<RoutingConfig>,
}

/// How a stage chooses among its alternatives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Prefer {
    Quality,
    Latency,
}

/// The latency-graded gateway's presets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Grade {
    Gold,
    Silver,
    Bronze,
}

impl StageConfig {
    /// Its name: its own, else its first backend's.
    pub fn name(&self) -> &str {
        match self {
            StageConfig::Table(StageTable { name: Some(n), .. }) => n,
            _ => self.backends().first().copied().unwrap_or(""),
        }
    }

    /// Its backends' names, in the order listed.
    pub fn backends(&self) -> Vec<&str> {
        match self {
            StageConfig::Name(n) => vec![n.as_str()],
            StageConfig::Table(t) => t
                .llm
                .iter()
                .chain(t.any.iter().flatten())
                .map(String::as_str)
                .collect(),
        }
    }

    /// Its θ, when set.
    pub fn theta(&self) -> Option<f64> {
        match self {
            StageConfig::Name(_) => None,
            StageConfig::Table(t) => t.theta,
        }
    }

    /// Its routing policy: its own, else `global` as a static θ of `theta` (0 unset).
    pub fn policy(&self, global: &RoutingConfig) -> RoutingConfig {
        match self {
            StageConfig::Table(StageTable {
                policy: Some(p), ..
            }) => p.clone(),
            _ => global.fixed_at(self.theta().unwrap_or(0.0)),
        }
    }

    /// Its preference among alternatives.
    pub fn prefer(&self) -> Prefer {
        match self {
            StageConfig::Name(_) => Prefer::Quality,
            StageConfig::Table(t) => t.prefer.unwrap_or(match t.grade {
                Some(Grade::Gold | Grade::Silver) => Prefer::Latency,
                _ => Prefer::Quality,
            }),
        }
    }

    /// Its retries on the same backend.
    pub fn retries(&self) -> u32 {
        match self {
            StageConfig::Name(_) => 0,
            StageConfig::Table(t) => t.retries.unwrap_or(match t.grade {
                Some(Grade::Silver) => 1,
                Some(Grade::Bronze) => 2,
                _ => 0,
            }),
        }
    }
}

impl RouteConfig {
    /// The largest budget in force.
    /// Its text limit in force.
    pub fn max_text_chars_in_force(&self) -> usize {
        self.max_text_chars.unwrap_or(4 * 1024 * 1024)
    }

    /// Its generation ceiling in force.
    pub fn max_tokens_in_force(&self) -> u32 {
        self.max_tokens.unwrap_or(4096)
    }

    pub fn max_deadline_ms_in_force(&self) -> u64 {
        self.max_deadline_ms.unwrap_or(600_000)
    }
}

/// A route's out-of-scope outcome (`out_of_scope = { label = "…", reply = "…" }`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutOfScopeConfig {
    /// The label answered (classify routes, and `json_object` replies).
    pub label: String,
    /// The reply text (answer routes).
    #[serde(default)]
    pub reply: Option<String>,
    /// Scores above it are out of scope; by default the threshold `tiergate train` fitted (the head's
    /// `oos.json`). Required for a head without one, which is scored by 1 − max p.
    #[serde(default)]
    pub threshold: Option<f64>,
    /// What the LLM is shown as the extra candidate when an escalated route may answer out of scope.
    #[serde(default = "default_none_candidate")]
    pub none_candidate: String,
}

fn default_none_candidate() -> String {
    "none of these".into()
}

impl OutOfScopeConfig {
    /// Checks the section.
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        if self.label.trim().is_empty() || self.none_candidate.trim().is_empty() {
            return Err(ConfigError::invalid(
                format!("{at}.label"),
                "label and none_candidate must be non-empty",
            ));
        }
        if let Some(t) = self.threshold {
            if !t.is_finite() {
                return Err(ConfigError::invalid(
                    format!("{at}.threshold"),
                    "must be a number",
                ));
            }
        }
        Ok(())
    }
}
