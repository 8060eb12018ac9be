//! [`Engine`]: the engine as one object — a cheap handle over the state every door shares, whose methods are
//! the use cases a door performs. A door (the HTTP adapter, the batch runner, the CLI) holds an `Engine` and
//! nothing else of the engine's: the state behind it is private to this crate.

mod admin;
mod evidence;
mod policy;
mod views;

pub use evidence::Verdict;
pub use policy::{PolicyChange, PolicyTarget};

use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tiergate_config::Config;

use crate::answer::{Admitted, Answer, Declined};
use crate::error::EngineError;
use crate::model::outcome::Outcome;
use crate::model::request::Request;
use crate::state::AppState;
use crate::tenancy::tenants::TenantId;

/// The engine: clone it freely (an `Arc` inside); the last clone dropped stops the workers and unlinks the
/// shared-memory segment.
#[derive(Clone)]
pub struct Engine {
    state: Arc<AppState>,
}

/// An [`Engine`] that does not keep it alive (a background task's, the batch runner's).
#[derive(Clone)]
pub struct WeakEngine {
    state: Weak<AppState>,
}

impl WeakEngine {
    /// The engine, while it runs.
    pub fn upgrade(&self) -> Option<Engine> {
        self.state.upgrade().map(|state| Engine { state })
    }
}

impl Engine {
    /// Builds the engine from `config`: loads the prefilters (blocking: call from a blocking context), creates
    /// the shared-memory segment and starts the workers (`worker_program`: the reranker binary), with the
    /// durable store of decision records the binary hands it.
    pub fn build(
        config: Config,
        metrics: Option<PrometheusHandle>,
        worker_program: Option<PathBuf>,
        ledger_store: Option<Arc<dyn crate::evidence::ledger::Store>>,
    ) -> anyhow::Result<Self> {
        let state = AppState::build_with(config, metrics, worker_program, ledger_store)?;
        Ok(Self {
            state: Arc::new(state),
        })
    }

    /// Starts the background tasks (utilisation sampling, audits, the shared store's syncs, …); each ends when
    /// the engine is gone.
    pub fn start(&self) {
        zero_breach_counters(&self.state.routing.routes);
        crate::tasks::start(&self.state);
    }

    /// The Responses API's store (`[responses] store`; none when off): in Redis with the Redis policy store
    /// (its calls behind the `responses_store` dependency, in `/ready`), else `local` (the binary's SQLite
    /// file), else in memory.
    pub fn responses_store(
        &self,
        local: Option<Arc<dyn crate::answer::stored::ResponseStore>>,
    ) -> anyhow::Result<Option<Arc<dyn crate::answer::stored::ResponseStore>>> {
        crate::answer::stored::open(&self.state.config, local, &self.state.deps)
    }

    /// A handle that does not keep the engine alive.
    pub fn downgrade(&self) -> WeakEngine {
        WeakEngine {
            state: Arc::downgrade(&self.state),
        }
    }

    /// Answers `v`: the engine's one call for every door ([`crate::answer::answer`]).
    pub async fn answer(&self, v: &Request) -> Result<Answer, Declined> {
        crate::answer::answer(&self.state, v, None).await
    }

    /// An admission permit taken before the request is whole ([`crate::answer::admit_early`]): a door that
    /// reads a store to build the request (a continued conversation) takes it first, then answers with
    /// [`Engine::answer_admitted`].
    pub fn admit_early(&self) -> Result<Admitted, Declined> {
        crate::answer::admit_early(&self.state)
    }

    /// [`Engine::answer`] holding the permit [`Engine::admit_early`] gave (the rest of admission follows).
    pub async fn answer_admitted(&self, v: &Request, early: Admitted) -> Result<Answer, Declined> {
        crate::answer::answer(&self.state, v, Some(early)).await
    }

    /// `v`'s prompt tokens, counted by what would answer it ([`crate::answer::count_tokens`]).
    pub async fn count_tokens(&self, v: &Request) -> Result<(u32, Outcome, Admitted), Declined> {
        crate::answer::count_tokens(&self.state, v).await
    }

    /// The effective config.
    pub fn config(&self) -> &Config {
        &self.state.config
    }

    /// The admin token, when one is set.
    pub fn admin_token(&self) -> Option<&str> {
        self.state.admin_token()
    }

    /// Enters the lame-duck period: `/ready` says 503 and every response closes its connection.
    pub fn drain(&self) {
        self.state
            .draining
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether the engine is draining ([`Engine::drain`]).
    pub fn draining(&self) -> bool {
        self.state
            .draining
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Reloads the tenants from their file (SIGHUP, the admin API); a file that fails to load keeps the keys
    /// in force.
    pub fn reload_tenants(&self) -> Result<usize, String> {
        self.state.reload_tenants()
    }

    /// Writes the records still waiting for the ledger's writer (up to `within`), then lets this handle go:
    /// the last one dropped stops the workers.
    pub async fn shutdown(self, within: Duration) {
        if let Some(ledger) = self.state.evidence.ledger.clone() {
            let _ = tokio::task::spawn_blocking(move || ledger.drain(within)).await;
        }
        let _ = tokio::task::spawn_blocking(move || drop(self)).await;
    }

    /// Who asks with the API key `key` (the anonymous tenant on a server without tenants), admitted at its
    /// request rate.
    pub fn identify(
        &self,
        key: Option<&str>,
        now: std::time::Instant,
    ) -> Result<TenantId, EngineError> {
        let tenant = crate::tenancy::identify(&self.state.tenants(), key, now)?;
        Ok(tenant.map_or_else(TenantId::anonymous, |t| t.id.clone()))
    }

    /// `tenant`'s quotas (none for an identity that is no configured tenant).
    pub fn quotas(&self, tenant: &TenantId) -> crate::tenancy::tenants::Quotas {
        self.state
            .tenants()
            .named(&tenant.0)
            .map(|t| t.quotas)
            .unwrap_or_default()
    }

    /// The gate between batch work and interactive work on the default LLM (none without an LLM side: no
    /// batch line then holds an LLM turn).
    pub fn batch_gate(&self) -> Option<Arc<crate::backends::priority::Gate>> {
        self.state.default_llm().map(|l| l.gate.clone())
    }

    /// The route a request's `model` names: a route's name, one of its aliases, `auto` (the steered route), or
    /// none.
    pub fn resolve_model(&self, model: &str) -> Option<String> {
        self.state.routing.routes.resolve(model)
    }

    /// What validation needs to know of the route `name`.
    pub fn route_facts(&self, name: &str) -> Option<crate::model::request::RouteFacts> {
        self.state
            .routing
            .routes
            .get(name)
            .map(|r| crate::model::request::RouteFacts {
                kind: r.kind,
                deadline: r.deadline,
                max_deadline: r.max_deadline,
                max_tokens: r.max_tokens,
                max_text_chars: r.max_text_chars,
                name: r.name.clone(),
                schema_decoding: r.schema_decoding,
                user_is_session: self.state.config.sessions.user_is_session,
            })
    }

    /// The brownout step in force.
    pub fn brownout(&self) -> crate::load::brownout::Step {
        self.state.brownout()
    }

    /// Test hook: one observation of the utilisation `u` for the brownout ladder, as the sampler makes.
    #[doc(hidden)]
    pub fn observe_utilization(&self, u: f64) {
        crate::tasks::utilization::observe_brownout(&self.state, u);
    }

    /// Test hook: the decision ledger, to read its store as a replica's writer left it.
    #[doc(hidden)]
    pub fn ledger(&self) -> Option<Arc<crate::evidence::ledger::Ledger>> {
        self.state.evidence.ledger.clone()
    }
}

/// Starts each classified route's breach counter at 0 for both actions, so that a rate over it (the alert in
/// deploy/prometheus/rules.yml) has data before the first breach.
fn zero_breach_counters(routes: &crate::routing::route_table::RouteTable) {
    for (name, _) in routes.iter().filter(|(_, r)| r.prefilter.is_some()) {
        for action in ["degrade", "reject"] {
            metrics::counter!(crate::metrics::RISK_BREACHES_TOTAL, "route" => name.clone(), "action" => action)
                .increment(0);
        }
    }
}
