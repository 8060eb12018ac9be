//! The `[server]`, `[routing]`, `[reranker]` sections and the `[[routes]]` list used by `tiergate serve`.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{ConfigError, HeadConfig, PromptConfig};

/// HTTP front end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Largest request body, in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// Largest request head (start line and headers), in bytes; beyond, 431 in the OpenAI error shape (up to
    /// 1 MiB; past that the HTTP layer refuses with a bare 431).
    pub max_header_bytes: usize,
    /// Time allowed to receive a request's headers, in milliseconds (a slow client is cut off).
    pub header_timeout_ms: u64,
    /// Time allowed to receive a whole request body, in milliseconds (a total deadline, not per read).
    pub body_timeout_ms: u64,
    /// Requests handled at once by the whole server; beyond this, 429 with `Retry-After` (one admission point).
    pub max_in_flight: usize,
    /// Address of the admin listener (`/admin/*`, `/info`); loopback by default, never on the public
    /// listener, so a proxy in front of `listen` cannot reach it.
    pub admin_listen: SocketAddr,
    /// Bearer token for the admin listener (and for honouring `x-tiergate-threshold`). Without one, admin
    /// requests are accepted from loopback peers only, and the server warns at start.
    pub admin_token: Option<String>,
    /// Open connections at most on the public listener; beyond, new connections are closed at once.
    pub max_connections: usize,
    /// Open connections at most per client IP address.
    pub max_connections_per_peer: usize,
    /// After SIGTERM: how long the server keeps serving (with `Connection: close`, `/ready` already 503) so
    /// that load balancers stop sending, before it stops accepting, in milliseconds.
    pub lame_duck_ms: u64,
    /// When the LLM side is full, down or late: `degrade` answers with Tier-0 (flagged), `reject` returns 503.
    pub on_escalation_failure: FailureMode,
    /// Time given to in-flight requests at shutdown, in milliseconds.
    pub drain_ms: u64,
    /// Where traces are exported (OTLP), e.g. `http://127.0.0.1:4318` (HTTP: `/v1/traces` is appended) or
    /// `http://127.0.0.1:4317` (gRPC). Empty: the standard `OTEL_EXPORTER_OTLP_ENDPOINT` when set, else off.
    pub otlp_endpoint: String,
    /// `http/protobuf` or `grpc`. Empty: `OTEL_EXPORTER_OTLP_PROTOCOL` when set, else `http/protobuf`.
    pub otlp_protocol: OtlpProtocol,
    /// Share of new traces recorded, in [0, 1] (a request's own `traceparent` decides for its trace).
    pub trace_sample_ratio: f64,
    /// A JSON-lines file that receives every rerank the LLM answered (query text, Tier-0's and the fused
    /// distribution) for `tiergate distill`. Empty: off (users' text is written nowhere).
    #[serde(with = "empty_is_none")]
    pub record_escalations: Option<std::path::PathBuf>,
    /// Size of the record file before it rotates to `FILE.1`, bytes.
    pub record_max_bytes: u64,
    /// Keep the request's text in its decision record (`[feedback]`); off by default: records hold the
    /// decision, not what users wrote (audited requests keep theirs until labelled).
    pub record_text: bool,
    /// Also record each label Tier-0 answers alone and sure (not escalated, not degraded, not out of scope)
    /// in `record_escalations`, as `"source": "tier0"`: pseudo-labels for `tiergate distill` (off by default).
    pub record_tier0: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_body_bytes: 256 * 1024,
            max_header_bytes: 64 * 1024,
            header_timeout_ms: 10_000,
            body_timeout_ms: 30_000,
            max_in_flight: 512,
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 8081)),
            admin_token: None,
            max_connections: 4096,
            max_connections_per_peer: 256,
            lame_duck_ms: 2_000,
            on_escalation_failure: FailureMode::Degrade,
            drain_ms: 10_000,
            otlp_endpoint: String::new(),
            otlp_protocol: OtlpProtocol::Unset,
            trace_sample_ratio: 1.0,
            record_escalations: None,
            record_max_bytes: 64 << 20,
            record_text: false,
            record_tier0: false,
        }
    }
}

impl ServerConfig {
    /// Checks the section; errors name the field.
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        let positive = |name: &str, v: u64| {
            if v == 0 {
                Err(ConfigError::invalid(
                    format!("{at}.{name}"),
                    "must be at least 1",
                ))
            } else {
                Ok(())
            }
        };
        positive("max_body_bytes", self.max_body_bytes as u64)?;
        positive("header_timeout_ms", self.header_timeout_ms)?;
        if !(1024..=1 << 20).contains(&self.max_header_bytes) {
            return Err(ConfigError::invalid(
                format!("{at}.max_header_bytes"),
                "must be in 1024..=1048576",
            ));
        }
        positive("body_timeout_ms", self.body_timeout_ms)?;
        positive("max_in_flight", self.max_in_flight as u64)?;
        positive("max_connections", self.max_connections as u64)?;
        positive(
            "max_connections_per_peer",
            self.max_connections_per_peer as u64,
        )?;
        positive("drain_ms", self.drain_ms)?;
        positive("record_max_bytes", self.record_max_bytes)?;
        if self.max_connections_per_peer > self.max_connections {
            return Err(ConfigError::invalid(
                format!("{at}.max_connections_per_peer"),
                "must not exceed max_connections",
            ));
        }
        if let Some(t) = &self.admin_token {
            if t.trim().len() < 8 || t.chars().any(char::is_whitespace) {
                return Err(ConfigError::invalid(
                    format!("{at}.admin_token"),
                    "must be at least 8 characters without spaces (or unset: loopback-only admin)",
                ));
            }
        }
        if !(0.0..=1.0).contains(&self.trace_sample_ratio) {
            return Err(ConfigError::invalid(
                format!("{at}.trace_sample_ratio"),
                "must be in [0, 1]",
            ));
        }
        if self.admin_listen == self.listen && self.listen.port() != 0 {
            return Err(ConfigError::invalid(
                format!("{at}.admin_listen"),
                "must differ from listen: admin is never served on the public listener",
            ));
        }
        Ok(())
    }
}

/// What to do when escalation fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureMode {
    /// Answer with Tier-0 and `x-tiergate-degraded`.
    Degrade,
    /// Return 503.
    Reject,
}

/// How θ_eff is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoutingMode {
    /// θ_eff = θ_base.
    Static,
    /// θ_eff = clamp(θ_base + k·u, θ_min, θ_max).
    Load,
    /// θ tracks the (1 − target_share) quantile of recent ambiguity.
    Target,
    /// A bounded controller keeps the escalated channel's p95 under `slo_p95_ms`.
    Slo,
    /// θ is the largest one whose error bound on Tier-0's lone answers holds: error ≤ `max_error` with
    /// confidence `confidence`, chosen by Learn-then-Test on the head's labelled calibration rows.
    Risk,
}

/// What the server does when an answer must escalate to hold the error bound and the LLM cannot take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnBreach {
    /// Tier-0 answers, flagged `x-tiergate-degraded: risk_bound`.
    Degrade,
    /// 503 in the OpenAI error shape (`risk_bound`): the client may retry.
    Reject,
}

/// Where the utilisation u comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UtilizationSource {
    /// NVML when it initialises, else the workers' busy fraction.
    Auto,
    /// The GPU via NVML.
    Nvml,
    /// The reranker workers' measured busy fraction.
    Workers,
    /// `manual_utilization`, set by an operator.
    Manual,
    /// A PromQL query on the fleet's Prometheus (`[utilization]`), else the workers' busy fraction while the
    /// query fails or its value is stale.
    Prometheus,
}

/// Where the routing policy lives: in this process (`memory`, the default), or in Redis, shared by every
/// replica that names the same `url` and `key` (changes through any replica reach all of them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyStoreConfig {
    /// `memory` or `redis`.
    pub kind: StoreKind,
    /// `redis`: e.g. `redis://127.0.0.1:6379/0`.
    pub url: String,
    /// `redis`: the key prefix (`{key}` holds the policy and its version, `{key}:audit` the audit log,
    /// `{key}:changes` is the channel changes are published on).
    pub key: String,
    /// `redis`: how often a replica reads the shared policy, milliseconds.
    pub sync_ms: u64,
}

/// The LLM engine the workers run (`reranker.engine`; any other value is refused when the config is read).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// A deterministic word-overlap scorer and echo generator (tests, load tests of the plumbing).
    Stub,
    /// A local GGUF model in the worker process.
    Mistralrs,
    /// A remote OpenAI-compatible server.
    Openai,
}

impl EngineKind {
    /// The config value.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Stub => "stub",
            EngineKind::Mistralrs => "mistralrs",
            EngineKind::Openai => "openai",
        }
    }
}

/// The OTLP export protocol (`server.otlp_protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum OtlpProtocol {
    /// Not set: `OTEL_EXPORTER_OTLP_PROTOCOL` when set, else `http/protobuf`.
    #[default]
    #[serde(rename = "")]
    Unset,
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    #[serde(rename = "grpc")]
    Grpc,
}

impl OtlpProtocol {
    /// The config value (empty when unset).
    pub fn as_str(self) -> &'static str {
        match self {
            OtlpProtocol::Unset => "",
            OtlpProtocol::HttpProtobuf => "http/protobuf",
            OtlpProtocol::Grpc => "grpc",
        }
    }
}

/// `""` in the TOML for "none": an optional path that reads and writes as a plain string.
mod empty_is_none {
    use std::path::PathBuf;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(p: &Option<PathBuf>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(
            &p.as_deref()
                .map(|p| p.to_string_lossy())
                .unwrap_or_default(),
        )
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PathBuf>, D::Error> {
        let s = String::deserialize(d)?;
        Ok((!s.is_empty()).then(|| PathBuf::from(s)))
    }
}

/// The policy store's kind (`policy_store.kind`; any other value is refused when the config is read).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    Memory,
    Redis,
}

impl Default for PolicyStoreConfig {
    fn default() -> Self {
        Self {
            kind: StoreKind::Memory,
            url: String::new(),
            key: "tiergate:policy".into(),
            sync_ms: 500,
        }
    }
}

impl PolicyStoreConfig {
    /// Checks the section.
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        match self.kind {
            StoreKind::Memory => Ok(()),
            StoreKind::Redis
                if self.url.starts_with("redis://") || self.url.starts_with("rediss://") =>
            {
                if self.key.trim().is_empty() || !(50..=2_000).contains(&self.sync_ms) {
                    return Err(ConfigError::invalid(
                        format!("{at}.key"),
                        "a non-empty key and sync_ms in 50..=2000 (changes must reach every replica within 2 s)",
                    ));
                }
                Ok(())
            }
            StoreKind::Redis => Err(ConfigError::invalid(
                format!("{at}.url"),
                "must be a redis:// URL",
            )),
        }
    }
}

/// The Prometheus utilisation source: a PromQL query returning one number in [0, 1], e.g.
/// `avg(DCGM_FI_DEV_GPU_UTIL)/100` (DCGM exporter), `sum(vllm:num_requests_running)/64` (vLLM, 64 = the
/// fleet's capacity), `avg(llamacpp:requests_processing)` (llama.cpp server with one slot).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UtilizationConfig {
    /// Prometheus base URL (e.g. `http://prometheus:9090`); empty: no Prometheus source.
    pub prometheus_url: String,
    /// The PromQL query (one series or a scalar; values are clamped to [0, 1]).
    pub prometheus_query: String,
    /// How often the query is run, milliseconds.
    pub poll_ms: u64,
    /// Timeout of one query, milliseconds.
    pub timeout_ms: u64,
    /// A value older than this (the query failing since) no longer counts: the next source is used.
    pub stale_ms: u64,
}

impl Default for UtilizationConfig {
    fn default() -> Self {
        Self {
            prometheus_url: String::new(),
            prometheus_query: String::new(),
            poll_ms: 2_000,
            timeout_ms: 1_000,
            stale_ms: 10_000,
        }
    }
}

impl UtilizationConfig {
    /// Checks the section.
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        if !self.prometheus_url.is_empty() {
            if !self.prometheus_url.starts_with("http://")
                && !self.prometheus_url.starts_with("https://")
            {
                return Err(ConfigError::invalid(
                    format!("{at}.prometheus_url"),
                    "must be an http:// or https:// URL",
                ));
            }
            if self.prometheus_query.trim().is_empty() {
                return Err(ConfigError::invalid(
                    format!("{at}.prometheus_query"),
                    "must be a PromQL query when prometheus_url is set",
                ));
            }
        }
        if self.poll_ms < 100 || self.timeout_ms == 0 || self.stale_ms < self.poll_ms {
            return Err(ConfigError::invalid(
                format!("{at}.poll_ms"),
                "poll_ms >= 100, timeout_ms >= 1 and stale_ms >= poll_ms",
            ));
        }
        Ok(())
    }
}

/// The escalation policy (live-tunable through `/admin/routing`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RoutingConfig {
    /// How θ_eff is computed.
    pub mode: RoutingMode,
    /// Base threshold on the ambiguity 1 − max p.
    pub theta_base: f64,
    /// Load sensitivity: θ rises by k at full utilisation.
    pub k: f64,
    /// Lowest θ_eff.
    pub theta_min: f64,
    /// Highest θ_eff.
    pub theta_max: f64,
    /// `target` mode: share of traffic to escalate.
    pub target_share: f64,
    /// `slo` mode: p95 target of the escalated channel, milliseconds.
    pub slo_p95_ms: f64,
    /// Where u comes from.
    pub utilization_source: UtilizationSource,
    /// u used when the source is `manual`.
    pub manual_utilization: f64,
    /// Honour the request header `x-tiergate-threshold` (in [0, 1]) from clients that present the admin
    /// token; such requests are left out of the policy's statistics. Off by default.
    pub allow_header_override: bool,
    /// The out-of-scope threshold of every route that has an out-of-scope outcome (`null`: each route's
    /// own, fitted or configured).
    pub oos_threshold: Option<f64>,
    /// Out-of-scope scores within this of the threshold are uncertain calls, escalated to the LLM (which
    /// may answer "none of these"); 0: Tier-0's call stands.
    pub oos_margin: f64,
    /// The largest error allowed among the answers Tier-0 gives alone (ε, in (0, 1)); required by `risk`
    /// mode. Set in another mode, it caps that mode's θ: under load θ_eff never rises above the risk θ.
    pub max_error: Option<f64>,
    /// The confidence 1 − δ with which the error stays ≤ `max_error`.
    pub confidence: f64,
    /// When a request must escalate to hold the bound and the LLM cannot take it: `degrade` or `reject`.
    pub on_breach: OnBreach,
    /// Share of the answers Tier-0 gives alone (degraded ones included) kept with their text in the audit
    /// queue for labelling (`/admin/audits`), drawn at random: an unbiased sample of Tier-0's silent error.
    pub audit_rate: f64,
    /// Use a head's calibration rows for `max_error` even when they are flawed (in-sample halves of a dev
    /// split too small to halve, or labels with no calibration row): off, such a head's bound allows θ = 0
    /// (every request escalates) and says why. On, the bound is used and shown flagged — its proof does not
    /// hold on such rows.
    pub allow_flawed_calibration: bool,
}

impl Default for RoutingConfig {
    fn default() -> Self {
        Self {
            mode: RoutingMode::Load,
            theta_base: 0.65,
            k: 0.15,
            theta_min: 0.0,
            theta_max: 1.0,
            target_share: 0.1,
            slo_p95_ms: 4_500.0,
            utilization_source: UtilizationSource::Auto,
            manual_utilization: 0.0,
            allow_header_override: false,
            oos_threshold: None,
            oos_margin: 0.0,
            max_error: None,
            confidence: 0.95,
            on_breach: OnBreach::Degrade,
            audit_rate: 0.0,
            allow_flawed_calibration: false,
        }
    }
}

/// A change to the routing policy (`/admin/routing`): some of its fields (PATCH) or all (PUT), as JSON. It is
/// applied by deserialising the policy it yields, so an unknown field is refused by the policy's own
/// `deny_unknown_fields` and a wrong type by its field's type: no list of fields is kept by hand.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutingPatch(serde_json::Map<String, serde_json::Value>);

impl RoutingPatch {
    /// A patch from a JSON body: an object whose every key is a policy field.
    pub fn parse(body: serde_json::Value) -> Result<Self, ConfigError> {
        let serde_json::Value::Object(m) = body else {
            return Err(ConfigError::invalid("routing", "expected a JSON object"));
        };
        let patch = Self(m);
        match patch.apply(&RoutingConfig::default()) {
            // A value out of range is checked again on the policy in force, where it is applied.
            Ok(_) | Err(ConfigError::Invalid { .. }) => Ok(patch),
            Err(e) => Err(e),
        }
    }

    /// The first policy field it does not set (a PUT must set them all).
    pub fn missing(&self) -> Option<String> {
        RoutingConfig::fields()
            .into_iter()
            .find(|f| !self.0.contains_key(f))
    }

    /// `base` with its fields, validated.
    pub fn apply(&self, base: &RoutingConfig) -> Result<RoutingConfig, ConfigError> {
        let mut merged = serde_json::to_value(base).map_err(|e| ConfigError::Parse {
            origin: "routing".into(),
            message: e.to_string(),
        })?;
        if let Some(m) = merged.as_object_mut() {
            m.extend(self.0.clone());
        }
        let cfg: RoutingConfig =
            serde_json::from_value(merged).map_err(|e| ConfigError::Parse {
                origin: "routing".into(),
                message: e.to_string(),
            })?;
        cfg.validate("routing")?;
        Ok(cfg)
    }

    /// The patch as sent (for the audit log).
    pub fn as_json(&self) -> serde_json::Value {
        serde_json::Value::Object(self.0.clone())
    }
}

impl RoutingConfig {
    /// The policy's field names, read off the type (its serialised form): what `/admin/routing` accepts
    /// (PATCH: any subset, PUT: all) and what a client saves to put a policy back.
    pub fn fields() -> Vec<String> {
        match serde_json::to_value(Self::default()) {
            Ok(serde_json::Value::Object(m)) => m.keys().cloned().collect(),
            _ => Vec::new(),
        }
    }

    /// Checks the policy; errors name the field.
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        let unit = |name: &str, v: f64| {
            if v.is_finite() && (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(ConfigError::invalid(
                    format!("{at}.{name}"),
                    format!("{v} is outside [0, 1]"),
                ))
            }
        };
        unit("theta_base", self.theta_base)?;
        unit("theta_min", self.theta_min)?;
        unit("theta_max", self.theta_max)?;
        unit("target_share", self.target_share)?;
        unit("manual_utilization", self.manual_utilization)?;
        unit("audit_rate", self.audit_rate)?;
        if !(self.k.is_finite() && (-1.0..=1.0).contains(&self.k)) {
            return Err(ConfigError::invalid(
                format!("{at}.k"),
                format!("{} is outside [-1, 1]", self.k),
            ));
        }
        if self.theta_min > self.theta_max {
            return Err(ConfigError::invalid(
                format!("{at}.theta_min"),
                format!("{} is above theta_max {}", self.theta_min, self.theta_max),
            ));
        }
        if self.oos_threshold.is_some_and(|t| !t.is_finite()) {
            return Err(ConfigError::invalid(
                format!("{at}.oos_threshold"),
                "must be a number or null",
            ));
        }
        if !(self.oos_margin.is_finite() && (0.0..=1.0).contains(&self.oos_margin)) {
            return Err(ConfigError::invalid(
                format!("{at}.oos_margin"),
                format!("{} is outside [0, 1]", self.oos_margin),
            ));
        }
        if !(self.slo_p95_ms.is_finite() && self.slo_p95_ms > 0.0) {
            return Err(ConfigError::invalid(
                format!("{at}.slo_p95_ms"),
                "must be a positive number",
            ));
        }
        self.validate_risk(at)
    }

    /// Checks a cascade stage's policy: the error bound and the audits are about the answers Tier-0 gives
    /// alone, decided by the routing policy, not by a later stage's.
    pub fn validate_stage(&self, at: &str) -> Result<(), ConfigError> {
        self.validate(at)?;
        if self.mode == RoutingMode::Risk || self.max_error.is_some() || self.audit_rate > 0.0 {
            return Err(ConfigError::invalid(
                format!("{at}.max_error"),
                "mode \"risk\", max_error and audit_rate belong to the routing policy (Tier-0's lone answers), \
                 not to a later stage's",
            ));
        }
        Ok(())
    }

    fn validate_risk(&self, at: &str) -> Result<(), ConfigError> {
        let open = |v: f64| v.is_finite() && v > 0.0 && v < 1.0;
        match self.max_error {
            Some(e) if !open(e) => {
                return Err(ConfigError::invalid(
                    format!("{at}.max_error"),
                    format!("{e} is outside (0, 1)"),
                ))
            }
            None if self.mode == RoutingMode::Risk => {
                return Err(ConfigError::invalid(
                    format!("{at}.max_error"),
                    "mode \"risk\" needs max_error (the error allowed among Tier-0's lone answers)",
                ))
            }
            _ => {}
        }
        if !open(self.confidence) {
            return Err(ConfigError::invalid(
                format!("{at}.confidence"),
                format!("{} is outside (0, 1)", self.confidence),
            ));
        }
        Ok(())
    }
}

/// `[brownout]`: the ladder the server steps down under overload (off by default).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BrownoutConfig {
    /// Step down under overload (`normal` → `rerank_only` → `tier0_only` → `shed`).
    pub enabled: bool,
    /// Pressure at which each step is entered from the one below (`rerank_only`, `tier0_only`, `shed`).
    pub enter: [f64; 3],
    /// Pressure below which each step is left for the one below (each below its `enter`).
    pub leave: [f64; 3],
    /// How long the pressure must stay at or above `enter` before the step goes up, ms.
    pub hold_ms: u64,
    /// How long it must stay below `leave` before the step comes down, ms.
    pub cool_ms: u64,
    /// The LLM's P95 service time that counts as pressure 1, ms.
    pub p95_limit_ms: u64,
}

impl Default for BrownoutConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            enter: [0.9, 1.2, 1.6],
            leave: [0.6, 0.9, 1.2],
            hold_ms: 2_000,
            cool_ms: 10_000,
            p95_limit_ms: 2_000,
        }
    }
}

impl BrownoutConfig {
    /// Checks the section.
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        let ok = (0..3).all(|k| {
            self.leave[k] > 0.0
                && self.leave[k] < self.enter[k]
                && (k == 0
                    || (self.enter[k] > self.enter[k - 1] && self.leave[k] > self.leave[k - 1]))
        });
        if !ok || self.enter.iter().chain(&self.leave).any(|v| !v.is_finite()) {
            return Err(ConfigError::invalid(
                format!("{at}.enter"),
                "enter and leave must rise step by step, each leave positive and below its enter",
            ));
        }
        if self.hold_ms > 600_000 || self.cool_ms > 600_000 || self.p95_limit_ms == 0 {
            return Err(ConfigError::invalid(
                format!("{at}.hold_ms"),
                "hold_ms and cool_ms at most 600000, p95_limit_ms positive",
            ));
        }
        Ok(())
    }
}

/// The LLM worker processes and the shared-memory queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RerankerConfig {
    /// Worker processes (0: no LLM; escalations degrade).
    pub workers: usize,
    /// The worker program; empty: `tiergate-reranker` next to the `tiergate` binary.
    pub program: PathBuf,
    /// `stub`, `mistralrs`, or `openai` (a remote OpenAI-compatible server: vLLM, TGI, llama.cpp, …).
    pub engine: EngineKind,
    /// The model: for `mistralrs` a .gguf file or a Hugging Face folder; for `openai` the upstream's model name.
    pub model: PathBuf,
    /// `openai`: the base URL, up to and including `/v1`.
    pub url: String,
    /// `openai`: the name of the environment variable that holds the API key (empty: no key sent).
    pub api_key_env: String,
    /// `openai`: connect timeout, milliseconds.
    pub connect_timeout_ms: u64,
    /// `openai`: timeout of one upstream request, milliseconds (the job's deadline also applies).
    pub request_timeout_ms: u64,
    /// `openai`: requests in flight to the upstream at most, per worker (generations may take all but one).
    pub remote_max_in_flight: usize,
    /// Dequantise GGUF weights to f32 (faster prefill on CPU).
    pub f32_weights: bool,
    /// Jobs each worker runs at once.
    pub max_concurrent: usize,
    /// Extra arguments for the worker (e.g. stub knobs).
    pub extra_args: Vec<String>,
    /// Slots in the shared-memory queue (the most escalations in flight).
    pub slots: usize,
    /// Request bytes per slot.
    pub request_bytes: usize,
    /// Response bytes per slot.
    pub response_bytes: usize,
    /// A worker silent for this long is killed as hung, milliseconds; also the grace after a job's deadline
    /// before a worker still holding the job is killed as stuck.
    pub heartbeat_timeout_ms: u64,
    /// A worker not ready this long after its start (model load) is killed and restarted, milliseconds.
    pub load_timeout_ms: u64,
    /// Deadline of a rerank job, milliseconds.
    pub rerank_deadline_ms: u64,
    /// Deadline of a generation, milliseconds.
    pub generate_deadline_ms: u64,
    /// A rerank's service time assumed until a few have been measured, milliseconds (predicts whether an
    /// escalation can finish within its deadline).
    pub rerank_prior_ms: u64,
    /// A generation's service time assumed likewise, milliseconds.
    pub generate_prior_ms: u64,
    /// Jobs in a row ending in a backend failure before the circuit breaker opens.
    pub breaker_failures: u32,
    /// How long an open breaker refuses jobs before it lets a probe through, milliseconds.
    pub breaker_cooldown_ms: u64,
    /// Weight of the LLM's distribution when fusing with Tier-0, for heads without a fitted `fusion.json`
    /// (`tiergate fit-fusion` writes one next to a trained head; it wins over this value).
    pub llm_weight: f32,
    /// Temperature of the LLM's candidate scores before fusion (same precedence as `llm_weight`).
    pub llm_temperature: f32,
    /// Arithmetic of the scoring model: `int8` (8-bit weights and activations on AVX-512 VNNI, f32 without
    /// it), `f32` (weights dequantised at load, ~4x the memory of the file) or `quantized` (as stored).
    pub scoring_weights: ScoringWeights,
    /// Memory for cached label prefixes (channel scoring) per worker, in MiB.
    pub prefix_cache_mib: usize,
    /// Prompt templates (a route's own `prompts` win).
    pub prompts: PromptConfig,
    /// The model profile `method = "auto"` follows (`config/models/profiles.toml`); empty: the profile whose
    /// `match` is part of the model's file name.
    pub profile: String,
    /// Candidates sent to the LLM.
    pub candidates: usize,
    /// Escalations allowed in flight before new ones degrade at once ("deadline out of reach": a longer
    /// queue only makes every escalated request wait longer). 0: workers × max_concurrent × 2.
    pub max_in_flight: usize,
}

impl Default for RerankerConfig {
    fn default() -> Self {
        Self {
            workers: 1,
            program: PathBuf::new(),
            engine: EngineKind::Mistralrs,
            model: PathBuf::from("models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"),
            url: String::new(),
            api_key_env: String::new(),
            connect_timeout_ms: 2_000,
            request_timeout_ms: 60_000,
            remote_max_in_flight: 32,
            f32_weights: false,
            max_concurrent: 4,
            extra_args: Vec::new(),
            slots: 64,
            request_bytes: 16 * 1024,
            response_bytes: 64 * 1024,
            heartbeat_timeout_ms: 5_000,
            load_timeout_ms: 600_000,
            rerank_deadline_ms: 10_000,
            generate_deadline_ms: 60_000,
            rerank_prior_ms: 1_000,
            generate_prior_ms: 5_000,
            breaker_failures: 5,
            breaker_cooldown_ms: 5_000,
            llm_weight: 0.5,
            llm_temperature: 1.0,
            scoring_weights: ScoringWeights::Int8,
            prefix_cache_mib: 512,
            prompts: PromptConfig::default(),
            profile: String::new(),
            candidates: 5,
            max_in_flight: 0,
        }
    }
}

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

/// The arithmetic of the scoring forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScoringWeights {
    /// 8-bit weights and activations on AVX-512 VNNI (f32 without it).
    #[default]
    Int8,
    /// Weights dequantised at load (~4x the memory of the file).
    F32,
    /// The weights as stored in the GGUF.
    Quantized,
}

impl ScoringWeights {
    /// Its config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Int8 => "int8",
            Self::F32 => "f32",
            Self::Quantized => "quantized",
        }
    }

    /// From its config spelling.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Int8, Self::F32, Self::Quantized]
            .into_iter()
            .find(|w| w.as_str() == s)
    }
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
            _ => RoutingConfig {
                mode: RoutingMode::Static,
                theta_base: self.theta().unwrap_or(0.0),
                max_error: None,
                audit_rate: 0.0,
                ..global.clone()
            },
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

impl RerankerConfig {
    /// Jobs the workers run at once (`workers × max_concurrent`, within the in-flight limit): jobs beyond wait
    /// in their tenant's lane before the shared-memory queue.
    pub fn capacity(&self) -> usize {
        (self.workers * self.max_concurrent)
            .min(self.in_flight_limit())
            .max(1)
    }

    /// The escalation in-flight bound in force: jobs dispatched to the workers or waiting for them.
    pub fn in_flight_limit(&self) -> usize {
        match self.max_in_flight {
            0 => (self.workers * self.max_concurrent * 2).max(1),
            n => n,
        }
    }

    /// Checks the section.
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        if self.engine == EngineKind::Openai {
            if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
                return Err(ConfigError::invalid(
                    format!("{at}.url"),
                    "the openai engine needs an http:// or https:// base URL (up to and including /v1)",
                ));
            }
            if self.remote_max_in_flight < 2
                || self.connect_timeout_ms == 0
                || self.request_timeout_ms == 0
            {
                return Err(ConfigError::invalid(
                    format!("{at}.remote_max_in_flight"),
                    "remote_max_in_flight >= 2 and positive timeouts",
                ));
            }
        }
        if self.workers > 16 {
            return Err(ConfigError::invalid(format!("{at}.workers"), "at most 16"));
        }
        if !(1..=65_536).contains(&self.slots) {
            return Err(ConfigError::invalid(
                format!("{at}.slots"),
                "must be in 1..=65536",
            ));
        }
        if self.request_bytes < 1024 || self.response_bytes < 8192 {
            return Err(ConfigError::invalid(
                format!("{at}.request_bytes"),
                "request >= 1024 and response >= 8192 bytes",
            ));
        }
        if !(0.0..=1.0).contains(&self.llm_weight) {
            return Err(ConfigError::invalid(
                format!("{at}.llm_weight"),
                "must be in [0, 1]",
            ));
        }
        if !(self.llm_temperature.is_finite() && self.llm_temperature > 0.0) {
            return Err(ConfigError::invalid(
                format!("{at}.llm_temperature"),
                "must be a positive number",
            ));
        }
        self.prompts.validate(&format!("{at}.prompts"))?;
        if !self.profile.is_empty() {
            crate::profile_for("", &self.profile)?;
        }
        if !(1..=10).contains(&self.candidates) {
            return Err(ConfigError::invalid(
                format!("{at}.candidates"),
                "must be in 1..=10",
            ));
        }
        if self.heartbeat_timeout_ms < 100 {
            return Err(ConfigError::invalid(
                format!("{at}.heartbeat_timeout_ms"),
                "must be at least 100 (workers heartbeat every 100 ms)",
            ));
        }
        for (name, v) in [
            ("rerank_deadline_ms", self.rerank_deadline_ms),
            ("generate_deadline_ms", self.generate_deadline_ms),
            ("max_concurrent", self.max_concurrent as u64),
            ("load_timeout_ms", self.load_timeout_ms),
        ] {
            if v == 0 {
                return Err(ConfigError::invalid(
                    format!("{at}.{name}"),
                    "must be at least 1",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{RerankerConfig, RoutingConfig, RoutingMode, ServerConfig};

    #[test]
    fn the_error_bound_is_checked_and_kept_to_the_routing_policy() {
        let with = |f: &dyn Fn(&mut RoutingConfig)| {
            let mut c = RoutingConfig::default();
            f(&mut c);
            c
        };
        let err = |c: RoutingConfig| c.validate("routing").unwrap_err().to_string();
        assert!(err(with(&|c| c.mode = RoutingMode::Risk)).contains("routing.max_error"));
        assert!(err(with(&|c| c.max_error = Some(0.0))).contains("routing.max_error"));
        assert!(err(with(&|c| c.max_error = Some(1.0))).contains("routing.max_error"));
        assert!(err(with(&|c| c.confidence = 1.0)).contains("routing.confidence"));
        assert!(err(with(&|c| c.audit_rate = 1.5)).contains("routing.audit_rate"));
        let risk = with(&|c| {
            c.mode = RoutingMode::Risk;
            c.max_error = Some(0.05);
        });
        assert!(risk.validate("routing").is_ok());
        // A later stage's policy may not carry them.
        assert!(risk.validate_stage("stage").is_err());
        assert!(with(&|c| c.audit_rate = 0.1)
            .validate_stage("stage")
            .is_err());
        assert!(RoutingConfig::default().validate_stage("stage").is_ok());
    }

    #[test]
    fn server_and_reranker_sections_refuse_zero_and_unsafe_values() {
        assert!(ServerConfig::default().validate("server").is_ok());
        let bad = |f: &dyn Fn(&mut ServerConfig)| {
            let mut c = ServerConfig::default();
            f(&mut c);
            c.validate("server").unwrap_err().to_string()
        };
        assert!(bad(&|c| c.max_in_flight = 0).contains("server.max_in_flight"));
        assert!(bad(&|c| c.header_timeout_ms = 0).contains("server.header_timeout_ms"));
        assert!(bad(&|c| c.body_timeout_ms = 0).contains("server.body_timeout_ms"));
        assert!(bad(&|c| c.max_connections = 0).contains("server.max_connections"));
        assert!(bad(&|c| c.admin_token = Some(String::new())).contains("server.admin_token"));
        assert!(bad(&|c| c.admin_token = Some("   x   ".into())).contains("server.admin_token"));
        assert!(bad(&|c| c.admin_listen = c.listen).contains("server.admin_listen"));
        assert!(bad(&|c| c.max_connections_per_peer = c.max_connections + 1)
            .contains("max_connections_per_peer"));
        let mut r = RerankerConfig {
            heartbeat_timeout_ms: 0,
            ..RerankerConfig::default()
        };
        assert!(r
            .validate("reranker")
            .unwrap_err()
            .to_string()
            .contains("heartbeat_timeout_ms"));
        r.heartbeat_timeout_ms = 5_000;
        r.rerank_deadline_ms = 0;
        assert!(r
            .validate("reranker")
            .unwrap_err()
            .to_string()
            .contains("rerank_deadline_ms"));
    }

    #[test]
    fn header_override_is_off_by_default() {
        assert!(!RoutingConfig::default().allow_header_override);
    }

    #[test]
    fn a_routing_patch_refuses_unknown_fields_and_wrong_types_and_a_put_needs_them_all() {
        use crate::RoutingPatch;
        use serde_json::json;
        let fields = RoutingConfig::fields();
        assert!(
            fields.len() >= 16 && fields.iter().any(|f| f == "max_error"),
            "{fields:?}"
        );
        let e = RoutingPatch::parse(json!({"theta_bsae": 0.3})).unwrap_err();
        assert!(e.to_string().contains("unknown field `theta_bsae`"), "{e}");
        let e = RoutingPatch::parse(json!({"theta_base": "high"})).unwrap_err();
        assert!(e.to_string().contains("invalid type"), "{e}");
        assert!(RoutingPatch::parse(json!([1])).is_err());
        let p = RoutingPatch::parse(json!({"theta_base": 0.3, "mode": "static"})).unwrap();
        assert!(p
            .missing()
            .is_some_and(|f| f != "mode" && f != "theta_base"));
        let base = RoutingConfig::default();
        let c = p.apply(&base).unwrap();
        assert_eq!(
            (c.theta_base, c.mode, c.k),
            (0.3, RoutingMode::Static, base.k)
        );
        // Out of range: refused when applied.
        let p = RoutingPatch::parse(json!({"theta_base": 7.0})).unwrap();
        assert!(p
            .apply(&base)
            .unwrap_err()
            .to_string()
            .contains("theta_base"));
        // Every field set: nothing missing, and the policy comes back as it was.
        let all = RoutingPatch::parse(serde_json::to_value(&base).unwrap()).unwrap();
        assert_eq!(all.missing(), None);
        assert_eq!(
            all.apply(&RoutingConfig {
                theta_base: 0.1,
                ..base.clone()
            })
            .unwrap(),
            base
        );
    }
}
