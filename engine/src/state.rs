//! The server's shared state, built once from the config: one prefilter per distinct head, the routes, the
//! policy, and (when configured) the LLM side: segment, supervisor and queue client.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusHandle;
use tiergate_config::{Config, HeadConfig, Resolved, RouteKind};
use tiergate_prefilter::{Classifier, PrefilterHandle};
use tiergate_queue::{Client, Geometry, Segment, Supervisor, SupervisorConfig};
use tokio::sync::Semaphore;

use crate::routing::policy::Policy;

pub(crate) use crate::routing::route::{Route, Stage};

pub(crate) use crate::backends::llm::Llm;

/// An LLM backend: its name, and its LLM side when it runs workers here.
pub(crate) struct Backend {
    pub name: String,
    pub llm: Option<Llm>,
}

/// Everything the engine serves with, in owned parts a reader can name: the routing, the backends, the
/// load, the tenancy, the evidence and the cache, beside the config and the server-wide limits.
pub(crate) struct AppState {
    /// The effective config (served at `/info`, secrets redacted).
    pub config: Config,
    /// Routes, their policy and shared store, head swaps, experiments.
    pub routing: crate::routing::Routing,
    /// The LLM backends in config order (the first is the default: `[reranker]`, or the first `[[llm]]`
    /// entry); a stage names its alternatives by index.
    pub backends: Vec<Backend>,
    /// Utilisation, the brownout ladder, the console's series and decisions.
    pub load: crate::load::Load,
    /// Who may use the API, and what each tenant got.
    pub tenancy: crate::tenancy::Tenancy,
    /// Decision records, audits, the LLM's second opinion, distillation records.
    pub evidence: crate::evidence::Evidence,
    /// Renders `/metrics`.
    pub metrics: Option<PrometheusHandle>,
    /// The one admission limit for the whole server.
    pub admission: Arc<Semaphore>,
    /// Set at SIGTERM: `/ready` answers 503 and every response says `Connection: close` (lame duck).
    pub draining: std::sync::atomic::AtomicBool,
    /// Tier −1, the answer cache (`[cache] enabled`).
    pub cache: Option<crate::cache::AnswerCache>,
    /// Start time.
    pub started: Instant,
    /// The dependencies' breakers (`/ready`, the console).
    pub deps: crate::deps::Registry,
}

impl AppState {
    /// Builds the state: loads the prefilters (blocking: call from a blocking context), creates the segment,
    /// starts the workers, and opens the decision ledger (on the durable store the binary hands it, if any).
    pub(crate) fn build_with(
        config: Config,
        metrics: Option<PrometheusHandle>,
        worker_program: Option<PathBuf>,
        ledger_store: Option<Arc<dyn crate::evidence::ledger::Store>>,
    ) -> anyhow::Result<Self> {
        let resolved = config.resolve()?;
        let (routes, order) = build_routes(&config, &resolved)?;
        let gate = Arc::new(crate::backends::priority::Gate::new(Duration::from_millis(
            config.batch.max_llm_wait_ms,
        )));
        let mut backends = Vec::new();
        for (i, b) in resolved.backends.iter().enumerate() {
            let llm = if b.config.workers > 0 {
                let warmup = if crate::backends::warmup::wanted(&b.config) {
                    crate::backends::warmup::jobs(i, &routes, &order)
                } else {
                    Vec::new()
                };
                Some(start_backend(
                    &b.name,
                    &b.config,
                    gate.clone(),
                    worker_program.clone(),
                    &warmup,
                )?)
            } else {
                None
            };
            backends.push(Backend {
                name: b.name.clone(),
                llm,
            });
        }
        let cache = crate::cache::AnswerCache::new(&config.cache)?;
        let store = match config.policy_store.kind {
            tiergate_config::StoreKind::Redis => Some(Arc::new(
                crate::routing::store::RedisStore::new(&config.policy_store)?,
            )),
            tiergate_config::StoreKind::Memory => None,
        };
        let deps = crate::deps::Registry::default();
        for d in store.iter().flat_map(|s| s.dependencies()) {
            deps.add(d);
        }
        let routing = crate::routing::Routing {
            policy: Arc::new(Policy::new(config.routing.clone())),
            experiments: crate::routing::experiments::Experiments::new(config.experiments.clone()),
            sessions: crate::routing::sessions::Sessions::new(&config.sessions, store.clone()),
            store,
            routes: crate::routing::route_table::RouteTable::new(routes),
            resolved,
            heads: crate::routing::heads::Heads::default(),
            route_order: order,
        };
        let evidence = crate::evidence::Evidence {
            recorder: match &config.server.record_escalations {
                None => None,
                Some(p) => Some(crate::evidence::record::Recorder::open(
                    p,
                    config.server.record_max_bytes,
                )?),
            },
            ledger: crate::evidence::ledger::open(&config, ledger_store)?,
            auditor: (config.feedback.enabled && config.feedback.audit_llm)
                .then(crate::evidence::auditor::Auditor::default),
        };
        if let Some(d) = evidence.ledger.as_ref().and_then(|l| l.dependency()) {
            deps.add(d);
        }
        Ok(Self {
            admission: Arc::new(Semaphore::new(config.server.max_in_flight)),
            draining: std::sync::atomic::AtomicBool::new(false),
            load: crate::load::Load::new(&config.brownout),
            tenancy: crate::tenancy::Tenancy::new(&config.all_tenants()?),
            routing,
            evidence,
            config,
            backends,
            metrics,
            cache,
            started: Instant::now(),
            deps,
        })
    }

    /// The tenants in force.
    pub(crate) fn tenants(&self) -> Arc<crate::tenancy::tenants::Tenants> {
        self.tenancy.in_force()
    }

    /// Reads `[[tenants]]` and `tenants_file` again and swaps them in; on any error (the file unreadable,
    /// malformed or invalid) the tenants in force stay, and the error says why. Returns how many are in force.
    pub(crate) fn reload_tenants(&self) -> Result<usize, String> {
        let loaded = self.config.all_tenants().and_then(|all| {
            tiergate_config::validate_tenants(&all, &self.config.route_names(), "tenants")?;
            Ok(all)
        });
        match loaded {
            Ok(all) => {
                let next = Arc::new(self.tenants().reloaded(&all));
                let n = all.len();
                self.tenancy.swap(next);
                metrics::gauge!(crate::metrics::TENANTS).set(n as f64);
                tracing::info!(tenants = n, "tenants reloaded");
                Ok(n)
            }
            Err(e) => {
                metrics::counter!(crate::metrics::TENANTS_RELOAD_FAILURES_TOTAL).increment(1);
                tracing::error!(error = %e, "tenants not reloaded: the keys in force stay");
                Err(e.to_string())
            }
        }
    }

    /// The brownout ladder's step in force.
    pub(crate) fn brownout(&self) -> crate::load::brownout::Step {
        crate::load::brownout::Step::of(
            self.load
                .brownout_step
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// Every LLM backend that runs workers, with its index ([`AppState::backend`]).
    pub(crate) fn llms(&self) -> impl Iterator<Item = (usize, &Llm)> {
        self.backends
            .iter()
            .enumerate()
            .filter_map(|(i, b)| Some((i, b.llm.as_ref()?)))
    }

    /// The default backend (the first), when it runs workers.
    pub(crate) fn default_llm(&self) -> Option<&Llm> {
        self.backend(0)
    }

    /// A route's own policy: a steered route's (`stage` none) or its stage `stage`'s (after the first).
    pub(crate) fn route_policy(&self, route: &str, stage: Option<&str>) -> Option<Arc<Policy>> {
        let r = self.routing.routes.get(route)?;
        match stage {
            None => r.steer.as_ref().map(|s| s.policy.clone()),
            Some(st) => r
                .stages
                .iter()
                .filter(|s| s.name == st)
                .find_map(|s| s.policy.clone()),
        }
    }

    /// Every route's own policy (steered routes', cascade stages' after the first), in config order, with
    /// the backends whose load it reads: a steered route's default stage's, a stage's own.
    pub(crate) fn route_policies(&self) -> Vec<RoutePolicy> {
        let backends = |s: &Stage| s.alternatives.iter().map(|(b, _)| *b).collect();
        let mut all = Vec::new();
        for r in self.routing.in_order() {
            if let Some(s) = &r.steer {
                all.push(RoutePolicy {
                    route: r.name.clone(),
                    stage: None,
                    policy: s.policy.clone(),
                    backends: r.stages.get(s.default).map(backends).unwrap_or_default(),
                });
            }
            for st in &r.stages {
                if let Some(p) = &st.policy {
                    all.push(RoutePolicy {
                        route: r.name.clone(),
                        stage: Some(st.name.clone()),
                        policy: p.clone(),
                        backends: backends(st),
                    });
                }
            }
        }
        all
    }

    /// `server.admin_token`.
    pub(crate) fn admin_token(&self) -> Option<&str> {
        self.config.server.admin_token.as_deref()
    }

    /// Submits `job` to backend `backend` ([`Llm::submit`]) for `tenant` (its weight and budget as configured now);
    /// `Refused::NoLlm` when this server runs none, `Refused::Budget` when the tenant has spent its budget.
    pub(crate) async fn submit(
        &self,
        job: &tiergate_queue::Job,
        backend: usize,
        tenant: &crate::tenancy::tenants::TenantId,
        batch: Option<&crate::backends::priority::BatchLine>,
        deadline: Option<std::time::Instant>,
    ) -> Result<crate::backends::llm::Submitted<'_>, crate::backends::llm::Refused> {
        use crate::backends::llm::Refused;
        let llm = self.backend(backend).ok_or(Refused::NoLlm)?;
        let configured = self.tenants().named(&tenant.0).cloned();
        let budget = configured.as_ref().and_then(|t| t.budget().cloned());
        if let Some(b) = &budget {
            let spent = b
                .lock()
                .map_or(Ok(()), |mut b| b.check(std::time::Instant::now()));
            spent.map_err(Refused::Budget)?;
        }
        let ask = crate::backends::llm::Ask {
            tenant: Some(tenant.0.clone()),
            weight: configured.map_or(1.0, |t| t.weight),
            budget,
            figures: Some(self.tenancy.figures.clone()),
            deadline,
            batch,
        };
        llm.submit(job, ask).await
    }

    /// Backend `i` (0: the first), when it runs workers.
    pub(crate) fn backend(&self, i: usize) -> Option<&Llm> {
        self.backends.get(i)?.llm.as_ref()
    }

    /// Live, ready workers of every backend together (0 without an LLM side).
    pub(crate) fn live_workers(&self) -> usize {
        self.llms().map(|(_, l)| l.client.live_workers()).sum()
    }

    /// LLM jobs in flight on every backend together.
    pub(crate) fn in_flight(&self) -> usize {
        self.llms().map(|(_, l)| l.client.in_flight()).sum()
    }

    /// Jobs of `tenant` waiting for a slot on any backend.
    pub(crate) fn waiting(&self, tenant: &str) -> usize {
        self.llms().map(|(_, l)| l.share.waiting(tenant)).sum()
    }

    /// Per route, the LLM's agreement with Tier-0 on audited answers (empty without `audit_llm`).
    pub(crate) fn agreement(
        &self,
    ) -> std::collections::BTreeMap<String, crate::evidence::auditor::Agreement> {
        self.evidence
            .auditor
            .as_ref()
            .map(crate::evidence::auditor::Auditor::counts)
            .unwrap_or_default()
    }

    /// Whether every backend's breaker is closed.
    pub(crate) fn breakers_closed(&self) -> bool {
        self.llms().all(|(_, l)| l.breaker_closed())
    }

    /// The generate routes whose first stage has backends with workers, none of them live: they cannot
    /// answer now.
    pub(crate) fn unserved(&self) -> Vec<String> {
        self.routing
            .in_order()
            .filter(|r| r.kind == RouteKind::Generate)
            .filter(|r| {
                let mut run = r
                    .stages
                    .iter()
                    .take(1)
                    .flat_map(|s| s.alternatives.iter())
                    .filter_map(|(b, _)| self.backend(*b))
                    .peekable();
                run.peek().is_some() && run.all(|l| l.client.live_workers() == 0)
            })
            .map(|r| r.name.clone())
            .collect()
    }
}

/// A route's own policy ([`AppState::route_policies`]).
pub(crate) struct RoutePolicy {
    pub route: String,
    /// The stage it belongs to; none: a steered route's.
    pub stage: Option<String>,
    pub policy: Arc<Policy>,
    /// The backends whose load its `load` mode reads.
    pub backends: Vec<usize>,
}

impl RoutePolicy {
    /// Its name in the console's series and metrics: `route` or `route/stage`.
    pub(crate) fn key(&self) -> String {
        match &self.stage {
            Some(st) => format!("{}/{st}", self.route),
            None => self.route.clone(),
        }
    }
}

/// The routes of the resolved config, in config order; routes with the same head share one prefilter.
fn build_routes(
    config: &Config,
    resolved: &Resolved,
) -> anyhow::Result<(HashMap<String, Route>, Vec<String>)> {
    let mut handles: Vec<(HeadConfig, PrefilterHandle)> = Vec::new();
    let mut routes = HashMap::new();
    let mut order = Vec::new();
    for r in &resolved.routes {
        order.push(r.name.clone());
        routes.insert(r.name.clone(), route_of(config, resolved, r, &mut handles)?);
    }
    Ok((routes, order))
}

/// Route `r` on its head: the prefilter (one of `handles` already started for the same head, else a new
/// one), its cascade's fusions, out-of-scope outcome, error bound and head version.
fn route_of(
    config: &Config,
    resolved: &Resolved,
    r: &tiergate_config::Route,
    handles: &mut Vec<(HeadConfig, PrefilterHandle)>,
) -> anyhow::Result<Route> {
    // The first stage's judge decides how candidates are shown (grounded or not).
    let grounded = crate::model::judge::grounded(resolved.judge(r), &r.prompts);
    let prefilter = if r.kind == RouteKind::Generate && r.steer.is_none() {
        None
    } else {
        Some(prefilter_for(config, resolved, r, grounded, handles)?)
    };
    let mut stages = stages_of(r, resolved, prefilter.as_ref());
    let fusion = stages[0].fusions[0].clone();
    fusion.log_for(&r.name);
    let out_of_scope = match (&r.out_of_scope, &prefilter) {
        (Some(o), Some(p)) => Some(crate::model::out_of_scope::OutOfScopeRoute::resolve(
            &r.name,
            o,
            p.out_of_scope(),
        )?),
        _ => None,
    };
    if let Some(o) = &out_of_scope {
        tracing::info!(route = %r.name, method = o.method.name(), threshold = o.threshold, "out-of-scope outcome");
    }
    let risk = Arc::new(crate::routing::risk::RouteRisk::of_head(prefilter.as_ref()));
    // A trained head by its weights' fingerprint; a few-shot or checkpoint head by its labels and temperature.
    let head_version = prefilter.as_ref().map_or_else(String::new, |p| {
        if let Some(t) = p.trained() {
            return t.fingerprint.clone();
        }
        let t = p.calibration().map_or(0.0, |c| c.temperature);
        crate::evidence::ledger::head_version(p.labels(), t)
    });
    for (k, s) in stages.iter_mut().enumerate() {
        s.cache_scope = crate::cache::scope(
            r,
            &resolved.backends,
            prefilter.as_ref(),
            &head_version,
            k,
            s,
        );
    }
    let steer = match (&r.steer, &prefilter) {
        (Some(s), Some(p)) => Some(crate::routing::route::Steering::of(&r.name, s, p.labels())?),
        _ => None,
    };
    Ok(Route {
        steer,
        name: r.name.clone(),
        kind: r.kind,
        prefilter,
        prompts: r.prompts.clone(),
        fusion,
        grounded,
        out_of_scope,
        deadline: r.deadline_ms.map(Duration::from_millis),
        max_deadline: Duration::from_millis(r.max_deadline_ms),
        stage_fingerprint: crate::routing::route::stage_fingerprint(&stages),
        stages,
        risk,
        head_version,
        cache_generations: r.cache_generations,
        context_turns: r.context_turns,
        context_chars: r.context_chars,
        aliases: r.aliases.clone(),
        default: r.default,
        max_tokens: r.max_tokens,
        max_text_chars: r.max_text_chars,
        schema_decoding: r
            .stages
            .iter()
            .flat_map(|s| &s.alternatives)
            .all(|&b| resolved.backends[b].config.engine != tiergate_config::EngineKind::Stub),
    })
}

impl AppState {
    /// Route `name` as it would be on the trained head in `dir` (its own prefilter, fusion and out-of-scope
    /// files): a candidate for [`crate::routing::heads`]. Blocking (loads the encoder).
    pub(crate) fn candidate_route(
        &self,
        name: &str,
        dir: &std::path::Path,
    ) -> anyhow::Result<Route> {
        let mut resolved = self.routing.resolved.clone();
        let r = resolved
            .routes
            .iter_mut()
            .find(|r| r.name == name)
            .ok_or_else(|| anyhow::anyhow!("no route `{name}`"))?;
        anyhow::ensure!(
            r.kind != RouteKind::Generate,
            "route `{name}` generates: it has no head"
        );
        r.head = HeadConfig::Trained(tiergate_config::TrainedHeadConfig {
            dir: dir.to_path_buf(),
        });
        let r = r.clone();
        route_of(&self.config, &resolved, &r, &mut Vec::new())
    }
}

/// Route `r`'s cascade with each alternative's fusion: the head's fit (`fusion.json` for the first stage,
/// `fusion.BACKEND.json` after), valid only for its LLM after the same stages before it (each stage's first
/// backend), else the backend's configured values.
fn stages_of(
    r: &tiergate_config::Route,
    resolved: &Resolved,
    prefilter: Option<&PrefilterHandle>,
) -> Vec<Stage> {
    let mut after: Vec<String> = Vec::new();
    r.stages
        .iter()
        .enumerate()
        .map(|(k, st)| {
            let backend = st.first();
            let alternatives: Vec<(usize, String)> = st
                .alternatives
                .iter()
                .map(|&b| (b, resolved.backends[b].name.clone()))
                .collect();
            let fusions = alternatives
                .iter()
                .map(|(b, name)| {
                    let fit = prefilter.and_then(|p| {
                        if k == 0 {
                            p.fitted_fusion()
                        } else {
                            p.stage_fusion(name)
                        }
                    });
                    crate::routing::fusion::Fusion::resolve(
                        &resolved.backends[*b].config,
                        &r.prompts,
                        fit,
                        &after,
                    )
                })
                .collect();
            let judge = &resolved.backends[backend].config;
            after.push(crate::model::judge::llm_name(judge, &r.prompts));
            Stage {
                name: st.name.clone(),
                candidates: judge.candidates,
                alternatives,
                prefer: st.prefer,
                retries: st.retries,
                theta: st.theta,
                policy: st.policy.clone().map(|p| Arc::new(Policy::new(p))),
                fusions,
                cache_scope: 0,
                pinned: None,
            }
        })
        .collect()
}

/// The prefilter of route `r`'s head: one already started for the same head, else a new one.
fn prefilter_for(
    config: &Config,
    resolved: &Resolved,
    r: &tiergate_config::Route,
    grounded: bool,
    handles: &mut Vec<(HeadConfig, PrefilterHandle)>,
) -> anyhow::Result<PrefilterHandle> {
    let head = r.head.clone();
    if let Some((_, h)) = handles.iter().find(|(h, _)| *h == head) {
        return Ok(h.clone());
    }
    let mut pcfg = config.prefilter.clone();
    pcfg.head = head.clone();
    let mut classifier = Classifier::from_config(&pcfg)?;
    if grounded {
        classifier.ground()?;
    }
    // The semantic cache looks escalations up by the query's Tier-0 embedding.
    classifier.keep_embeddings = config.cache.enabled && config.cache.semantic;
    // The out-of-scope score costs a product with the reference rows per query: only heads a route with an
    // out-of-scope outcome reads compute it.
    let wanted = resolved
        .routes
        .iter()
        .any(|o| o.out_of_scope.is_some() && o.head == head);
    if !wanted {
        classifier.out_of_scope = None;
    }
    tracing::info!(
        route = %r.name,
        precision = ?classifier.encoder.precision(),
        labels = classifier.labels().len(),
        "prefilter loaded"
    );
    let handle = PrefilterHandle::start(classifier, &pcfg)?;
    handles.push((head, handle.clone()));
    Ok(handle)
}

/// Creates the segment and starts the workers of `backend` alone (`eval --hybrid` uses it).
pub fn start_llm(
    backend: &tiergate_config::Backend,
    max_llm_wait: Duration,
    worker_program: Option<PathBuf>,
) -> anyhow::Result<Llm> {
    let gate = Arc::new(crate::backends::priority::Gate::new(max_llm_wait));
    start_backend(&backend.name, &backend.config, gate, worker_program, &[])
}

/// Creates backend `backend`'s segment and starts its workers; batch lines wait at `gate` (shared by all).
/// Its workers score `warmup` ([`crate::backends::warmup`]; empty: none) before they are ready.
pub(crate) fn start_backend(
    backend: &str,
    r: &tiergate_config::RerankerConfig,
    gate: Arc<crate::backends::priority::Gate>,
    worker_program: Option<PathBuf>,
    warmup: &[tiergate_queue::Job],
) -> anyhow::Result<Llm> {
    if r.engine.is_local() && r.workers > 0 {
        crate::backends::preflight::check_local_model(&r.model)?;
    }
    // Unique per server instance in this process (tests run several).
    static INSTANCE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = INSTANCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("tiergate-{}-{n}", std::process::id());
    let swept = tiergate_queue::layout::sweep_stale("tiergate-");
    if swept > 0 {
        tracing::info!(swept, "removed segments left by killed tiergate processes");
    }
    let seg = Arc::new(Segment::create(
        &name,
        Geometry {
            slots: r.slots,
            req_cap: r.request_bytes,
            resp_cap: r.response_bytes,
        },
    )?);
    let program = if r.program.as_os_str().is_empty() {
        worker_program.ok_or_else(|| {
            anyhow::anyhow!("cannot locate tiergate-reranker; set reranker.program")
        })?
    } else {
        r.program.clone()
    };
    let mut spec = tiergate_config::WorkerSpec::of(r);
    let warmup = crate::backends::warmup::write(warmup)?;
    spec.warmup = warmup.as_ref().map(|p| p.to_path_buf());
    // The worker exports its job spans where this server exports its own.
    spec.telemetry = tiergate_telemetry::export().map(|e| tiergate_config::WorkerTelemetry {
        endpoint: e.url.clone(),
        protocol: e.protocol.as_str().into(),
        service_name: format!("{}-worker", e.service_name),
    });
    let mut args = vec!["--spec".to_string(), spec.to_arg()];
    args.extend(r.extra_args.iter().cloned());
    let heartbeat = Duration::from_millis(r.heartbeat_timeout_ms);
    let name_for_info = name.clone();
    let supervisor = Supervisor::start(
        seg.clone(),
        SupervisorConfig {
            workers: r.workers,
            program,
            args,
            segment: name,
            heartbeat_timeout: heartbeat,
            load_timeout: Duration::from_millis(r.load_timeout_ms),
            backoff_initial: Duration::from_millis(200),
            backoff_max: Duration::from_secs(10),
            retry: true,
        },
    )?;
    let client = Client::new(seg, heartbeat)?;
    Ok(Llm {
        name: backend.to_string(),
        client,
        supervisor,
        segment: name_for_info,
        rerank_times: Arc::new(crate::backends::deadline::ServiceTimes::new(
            Duration::from_millis(r.rerank_prior_ms),
        )),
        generate_times: Arc::new(crate::backends::deadline::ServiceTimes::new(
            Duration::from_millis(r.generate_prior_ms),
        )),
        rates: Arc::default(),
        gate,
        limits: crate::backends::llm::Limits::of(r),
        breaker: std::sync::Mutex::new(crate::deps::breaker::Breaker::new(
            r.breaker_failures,
            Duration::from_millis(r.breaker_cooldown_ms),
        )),
        // A worker keeps one job thread for reranks (`reranker/src/serve.rs`); the share keeps its slot too.
        share: crate::backends::fair::Share::with_generations(
            r.capacity(),
            r.workers * r.max_concurrent.saturating_sub(1).max(1),
            r.in_flight_limit().saturating_sub(r.capacity()),
        ),
        tools: r.tools,
        pressure: std::sync::atomic::AtomicU64::new(0),
        _warmup: warmup,
    })
}
