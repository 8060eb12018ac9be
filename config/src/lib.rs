//! Typed tiergate configuration: the schema, its defaults (written once, here), loading from TOML with
//! environment and command-line overrides, and validation with messages that name the field.
//!
//! This crate owns no behaviour and must not depend on any other tiergate crate. It never reads the process
//! environment itself: `main` passes the variables in.

mod backends;
mod batch;
mod cache;
mod error;
mod experiments;
mod feedback;
mod heads;
mod load;
mod models;
pub mod origins;
mod prefilter;
mod prompts;
pub mod redact;
mod resolve;
mod responses;
mod serving;
mod sessions;
mod tenants;
mod worker;

pub use backends::{LlmEntry, DEFAULT_BACKEND};
pub use batch::BatchConfig;
pub use cache::{CacheConfig, CacheKind};
pub use error::ConfigError;
pub use experiments::{validate_experiments, DelayConfig, ExperimentConfig, MAX_DELAY_MS};
pub use feedback::{FeedbackConfig, FeedbackTrust};
pub use heads::HeadsConfig;
pub use load::{explain, load, DEFAULT_CONFIG, ENV_PREFIX};
pub use models::{profile_for, profiles, template, ChatTemplate, Formulation, ModelProfile};
pub use prefilter::{
    FewShotLabel, HeadConfig, PoolingConfig, Precision, PrefilterConfig, TrainedHeadConfig,
};
pub use prompts::{display_label, render, PromptConfig, ScoringMethod, NEUTRAL_PROMPTS};
pub use resolve::{Backend, Resolved, Route, Stage, Steer};
pub use responses::ResponsesConfig;
pub use serving::{
    BrownoutConfig, EngineKind, FailureMode, Grade, OnBreach, OtlpProtocol, OutOfScopeConfig,
    PolicyStoreConfig, Prefer, RerankerConfig, RouteConfig, RouteKind, RoutingConfig, RoutingMode,
    RoutingPatch, ScoringWeights, ServerConfig, StageConfig, StageTable, SteerConfig,
    SteerOverride, StoreKind, UtilizationConfig, UtilizationSource,
};
pub use sessions::{SessionsConfig, SwitchMode};
pub use tenants::{load_tenants_file, validate_tenants, TenantConfig};
pub use worker::{EngineSpec, WorkerSpec, WorkerTelemetry};

use serde::{Deserialize, Serialize};

/// The whole tiergate configuration. Later sections (server, routing, reranker) are added by their issues.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The Tier-0 encoder classifier.
    pub prefilter: PrefilterConfig,
    /// HTTP front end.
    pub server: ServerConfig,
    /// Escalation policy.
    pub routing: RoutingConfig,
    /// LLM worker processes and the queue.
    pub reranker: RerankerConfig,
    /// Routes (`model` names).
    pub routes: Vec<RouteConfig>,
    /// Where a fleet's utilisation comes from (the Prometheus source).
    pub utilization: UtilizationConfig,
    /// Where the routing policy lives (this process, or Redis shared by replicas).
    pub policy_store: PolicyStoreConfig,
    /// Latency-injection A/B tests (none by default; live-editable through `/admin/experiments`).
    pub experiments: Vec<ExperimentConfig>,
    /// The Batch API.
    pub batch: BatchConfig,
    /// The brownout ladder.
    #[serde(default)]
    pub brownout: BrownoutConfig,
    /// Several LLM backends (`[[llm]]`, each over `[reranker]`); none: `[reranker]` is the one backend.
    #[serde(default)]
    pub llm: Vec<LlmEntry>,
    /// Who may use the public API (`[[tenants]]`); none: the API is open (no key asked for).
    pub tenants: Vec<TenantConfig>,
    /// A keys file with more `[[tenants]]`, read at start and again on SIGHUP or `POST /admin/tenants/reload`
    /// (a file that fails to load keeps the keys in force).
    pub tenants_file: Option<std::path::PathBuf>,
    /// Decision records, feedback and audits.
    pub feedback: FeedbackConfig,
    /// Live head swaps: the shadow and its checks.
    pub heads: HeadsConfig,
    /// Tier −1: the answer cache in front of the LLM tier.
    pub cache: CacheConfig,
    /// The Responses API's store (`previous_response_id`, `GET /v1/responses/{id}`).
    pub responses: ResponsesConfig,
    /// Session pins: a conversation stays with the stage and backend of its last turn.
    pub sessions: SessionsConfig,
}

impl Config {
    /// The LLM backends in force, in order (the first is the default); readers take them resolved
    /// ([`Config::resolve`]).
    fn backends(&self) -> Result<Vec<(String, RerankerConfig)>, ConfigError> {
        backends::backends(&self.reranker, &self.llm)
    }

    /// The `[reranker]` fields that have no effect because every `[[llm]]` entry sets its own.
    pub fn shadowed_reranker_fields(&self) -> Vec<String> {
        backends::shadowed(&self.reranker, &self.llm)
    }

    /// The configured route names (the implicit `classify` route when none is configured).
    pub fn route_names(&self) -> Vec<&str> {
        if self.routes.is_empty() {
            vec!["classify"]
        } else {
            self.routes.iter().map(|r| r.name.as_str()).collect()
        }
    }

    /// The tenants in force: `[[tenants]]`, then those of `tenants_file`.
    pub fn all_tenants(&self) -> Result<Vec<TenantConfig>, ConfigError> {
        let mut all = self.tenants.clone();
        if let Some(path) = &self.tenants_file {
            all.extend(load_tenants_file(path)?);
        }
        Ok(all)
    }

    /// Checks every field; the first problem found is returned with the field's dotted path.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.checked_backends()?;
        validate_experiments(&self.experiments, &self.route_names(), "experiments")?;
        validate_tenants(&self.all_tenants()?, &self.route_names(), "tenants")?;
        Ok(())
    }

    /// Checks every section but the experiments and the tenants (which read no backend and, with a keys
    /// file, a file), and returns the backends it merged: what [`Config::resolve`] builds on.
    fn checked_backends(&self) -> Result<Vec<(String, RerankerConfig)>, ConfigError> {
        self.prefilter.validate("prefilter")?;
        self.server.validate("server")?;
        self.utilization.validate("utilization")?;
        self.policy_store.validate("policy_store")?;
        self.batch.validate("batch")?;
        self.feedback.validate("feedback")?;
        self.heads.validate("heads")?;
        self.cache.validate("cache")?;
        self.responses.validate("responses")?;
        self.sessions.validate("sessions")?;
        self.brownout.validate("brownout")?;
        if self.routing.utilization_source == UtilizationSource::Prometheus
            && self.utilization.prometheus_url.is_empty()
        {
            return Err(ConfigError::invalid(
                "routing.utilization_source",
                "`prometheus` needs utilization.prometheus_url and utilization.prometheus_query",
            ));
        }
        self.routing.validate("routing")?;
        self.reranker.validate("reranker")?;
        let backends = self.backends()?;
        let names: Vec<String> = backends.iter().map(|(n, _)| n.clone()).collect();
        if let Some((name, r)) = backends
            .iter()
            .find(|(_, r)| r.workers > 0 && self.prefilter.top_k < r.candidates)
        {
            return Err(ConfigError::invalid(
                "prefilter.top_k",
                format!(
                    "{} is below backend `{name}`'s candidates {}: Tier-0 must offer every candidate the LLM \
                     is sent",
                    self.prefilter.top_k, r.candidates
                ),
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for (i, r) in self.routes.iter().enumerate() {
            if r.name.trim().is_empty() || !seen.insert(r.name.as_str()) {
                return Err(ConfigError::invalid(
                    format!("routes[{i}].name"),
                    "must be non-empty and unique",
                ));
            }
            if let Some(h) = &r.head {
                let mut p = self.prefilter.clone();
                p.head = h.clone();
                p.validate(&format!("routes[{i}]"))?;
            }
            if let Some(pr) = &r.prompts {
                pr.validate(&format!("routes[{i}].prompts"))?;
            }
            let mut stage_names = std::collections::HashSet::new();
            for (k, st) in r.stages.iter().flatten().enumerate() {
                let listed = st.backends();
                if listed.is_empty()
                    || matches!(st, StageConfig::Table(t) if t.llm.is_some() && t.any.is_some())
                {
                    return Err(ConfigError::invalid(
                        format!("routes[{i}].stages[{k}]"),
                        "name one backend (`llm`) or alternatives (`any`)",
                    ));
                }
                if let Some(unknown) = listed.iter().find(|b| !names.iter().any(|n| n == *b)) {
                    return Err(ConfigError::invalid(
                        format!("routes[{i}].stages[{k}]"),
                        format!(
                            "`{unknown}` is no [[llm]] backend (backends: {})",
                            names.join(", ")
                        ),
                    ));
                }
                if st.name().trim().is_empty() || !stage_names.insert(st.name()) {
                    return Err(ConfigError::invalid(
                        format!("routes[{i}].stages[{k}].name"),
                        format!(
                            "route `{}` has two stages named `{}` (a stage is named after its first backend \
                             unless it has a `name`; each stage's policy is kept under its name): name them apart",
                            r.name,
                            st.name()
                        ),
                    ));
                }
                if let StageConfig::Table(StageTable {
                    policy: Some(p), ..
                }) = st
                {
                    p.validate_stage(&format!("routes[{i}].stages[{k}].policy"))?;
                }
                if st.theta().is_some_and(|t| !(0.0..=1.0).contains(&t))
                    || (k == 0 && st.theta().is_some())
                {
                    return Err(ConfigError::invalid(
                        format!("routes[{i}].stages[{k}].theta"),
                        "in [0, 1], and only on stages after the first (the first follows the routing policy)",
                    ));
                }
            }
            if r.stages.as_ref().is_some_and(Vec::is_empty) {
                return Err(ConfigError::invalid(
                    format!("routes[{i}].stages"),
                    "name at least one backend (or leave it out: the first backend)",
                ));
            }
            if r.deadline_ms == Some(0)
                || r.max_deadline_ms == Some(0)
                || r.deadline_ms.unwrap_or(0) > r.max_deadline_ms_in_force()
            {
                return Err(ConfigError::invalid(
                    format!("routes[{i}].deadline_ms"),
                    "deadline_ms and max_deadline_ms must be positive, deadline_ms at most max_deadline_ms",
                ));
            }
            if r.max_tokens == Some(0) {
                return Err(ConfigError::invalid(
                    format!("routes[{i}].max_tokens"),
                    "must be at least 1",
                ));
            }
            if let Some(a) = r.aliases.iter().find(|a| {
                a.trim().is_empty()
                    || a.as_str() == "auto"
                    || self.routes.iter().any(|o| &o.name == *a)
            }) {
                return Err(ConfigError::invalid(
                    format!("routes[{i}].aliases"),
                    format!("`{a}` is empty, `auto` (which names the steered route) or another route's name"),
                ));
            }
            if let Some(a) = r
                .aliases
                .iter()
                .filter(|a| !a.contains('*'))
                .find(|a| self.routes[..i].iter().any(|o| o.aliases.contains(a)))
            {
                return Err(ConfigError::invalid(
                    format!("routes[{i}].aliases"),
                    format!("`{a}` is an alias of an earlier route too"),
                ));
            }
            if r.default && self.routes[..i].iter().any(|o| o.default) {
                return Err(ConfigError::invalid(
                    format!("routes[{i}].default"),
                    "only one route may answer unknown model names",
                ));
            }
            if let Some(o) = &r.out_of_scope {
                if r.kind == RouteKind::Generate {
                    return Err(ConfigError::invalid(
                        format!("routes[{i}].out_of_scope"),
                        "a generate route has no labels to be out of scope of",
                    ));
                }
                o.validate(&format!("routes[{i}].out_of_scope"))?;
            }
        }
        Ok(backends)
    }
}
