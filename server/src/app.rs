//! The server's shared state, built once from the config: one prefilter per distinct head, the routes, the
//! policy, and (when configured) the LLM side: segment, supervisor and queue client.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusHandle;
use tiergate_config::{Config, HeadConfig, PromptConfig, RouteKind, ScoringMethod};
use tiergate_prefilter::{Classifier, PrefilterHandle};
use tiergate_queue::{Client, Geometry, Segment, Supervisor, SupervisorConfig};
use tokio::sync::Semaphore;

use crate::policy::Policy;

/// One route.
pub struct Route {
    /// The `model` name.
    pub name: String,
    /// What it does.
    pub kind: RouteKind,
    /// Its classifier (classify and answer routes).
    pub prefilter: Option<PrefilterHandle>,
    /// Its prompt templates (its own, else `[reranker.prompts]`).
    pub prompts: PromptConfig,
    /// How its escalations are fused.
    pub fusion: Fusion,
    /// The judge is shown examples per candidate in a formulation where they may differ per query
    /// (`choice`): each candidate's examples go nearest the query first.
    pub grounded: bool,
}

/// The fusion in force for a route, and where it comes from.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Fusion {
    /// Weight of the LLM's distribution.
    pub llm_weight: f32,
    /// Temperature of the LLM's scores.
    pub llm_temperature: f32,
    /// `fitted` (the head's `fusion.json`) or `config` (`reranker.llm_weight` / `llm_temperature`).
    pub source: &'static str,
    /// The fit, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fit: Option<tiergate_prefilter::heads::FittedFusion>,
}

/// The formulation the worker will use for these templates and the examples per candidate it shows
/// (under `method = "auto"`, what the model's profile says; the remote engine always asks its choice question).
pub fn formulation(config: &Config, prompts: &PromptConfig) -> (ScoringMethod, usize) {
    let r = &config.reranker;
    let Ok(profile) = tiergate_config::profile_for(&r.model.to_string_lossy(), &r.profile) else {
        return (prompts.method, prompts.choice_examples);
    };
    let f = profile.resolve(prompts);
    if r.engine == "openai" && prompts.method == ScoringMethod::Auto {
        (ScoringMethod::Choice, f.examples)
    } else {
        (f.method, f.examples)
    }
}

/// Whether candidates' examples should be ranked by nearness to the query: the choice formulation shows
/// a few per candidate, and they may differ per query (the channel form's fixed examples are its cache key).
pub fn grounded(config: &Config, prompts: &PromptConfig) -> bool {
    matches!(formulation(config, prompts), (ScoringMethod::Choice, k) if k > 0)
}

/// The LLM's name for reports and `fusion.json`: the model file and the formulation it scores with (under
/// `method = "auto"`, the one its profile picks), e.g. `qwen2.5-coder-0.5b-instruct-q4_k_m.gguf (choice)`.
pub fn llm_name(config: &Config, prompts: &PromptConfig) -> String {
    let r = &config.reranker;
    let model = if r.engine == "stub" {
        "stub".to_string()
    } else {
        r.model
            .file_name()
            .map_or_else(|| "llm".into(), |f| f.to_string_lossy().into_owned())
    };
    let (method, examples) = formulation(config, prompts);
    let grounding = if method == ScoringMethod::Choice && examples > 0 {
        format!(", {examples} nearest examples")
    } else {
        String::new()
    };
    format!("{model} ({}{grounding})", method.name()).to_lowercase()
}

/// A head's fit, if it was made with the LLM named `running`; a fit made with another LLM is refused, and
/// the refusal logged.
pub fn fit_for<'a>(
    fit: Option<&'a tiergate_prefilter::heads::FittedFusion>,
    running: &str,
) -> Option<&'a tiergate_prefilter::heads::FittedFusion> {
    let f = fit?;
    if f.llm == running {
        return Some(f);
    }
    tracing::warn!(
        fitted_with = %f.llm,
        running = %running,
        "the head's fusion.json was fitted with another LLM: not used (run tiergate fit-fusion with this one)"
    );
    None
}

impl Fusion {
    /// The head's fitted fusion when it was fitted with the LLM this server runs, else the config's values
    /// (a fit made with another judge says nothing about this one).
    pub fn resolve(
        config: &Config,
        prompts: &PromptConfig,
        prefilter: Option<&PrefilterHandle>,
    ) -> Self {
        let running = llm_name(config, prompts);
        match fit_for(prefilter.and_then(|p| p.fitted_fusion()), &running) {
            Some(f) => Self {
                llm_weight: f.llm_weight,
                llm_temperature: f.llm_temperature,
                source: "fitted",
                fit: Some(f.clone()),
            },
            None => Self {
                llm_weight: config.reranker.llm_weight,
                llm_temperature: config.reranker.llm_temperature,
                source: "config",
                fit: None,
            },
        }
    }
}

pub use crate::llm::Llm;

/// Everything a handler needs.
pub struct AppState {
    /// The effective config (served at `/info`, secrets redacted).
    pub config: Config,
    /// Routes by name.
    pub routes: HashMap<String, Route>,
    /// Route names in config order.
    pub route_order: Vec<String>,
    /// The routing policy.
    pub policy: Arc<Policy>,
    /// The LLM side, when `reranker.workers > 0`.
    pub llm: Option<Llm>,
    /// Renders `/metrics`.
    pub metrics: Option<PrometheusHandle>,
    /// The one admission limit for the whole server.
    pub admission: Arc<Semaphore>,
    /// The last decisions, for `/console`.
    pub decisions: std::sync::Mutex<std::collections::VecDeque<crate::console::Decision>>,
    /// The shared policy store, when `[policy_store] kind = "redis"`.
    pub store: Option<crate::store::RedisStore>,
    /// The fleet's utilisation from the Prometheus source, with the time it was read.
    pub fleet_utilization: std::sync::Mutex<Option<(Instant, f64)>>,
    /// Set at SIGTERM: `/ready` answers 503 and every response says `Connection: close` (lame duck).
    pub draining: std::sync::atomic::AtomicBool,
    /// The Batch API (`None`: off, or its store could not be opened: `batch_unavailable` says why).
    pub batches: Option<Arc<crate::batch::Batches>>,
    /// Why the Batch API is unavailable although enabled.
    pub batch_unavailable: Option<String>,
    /// Where escalations are recorded for distillation (`server.record_escalations`).
    pub recorder: Option<crate::record::Recorder>,
    /// Latency-injection experiments in force.
    pub experiments: crate::experiments::Experiments,
    /// Start time.
    pub started: Instant,
}

impl AppState {
    /// Builds the state: loads the prefilters (blocking: call from a blocking context), creates the segment and
    /// starts the workers.
    pub fn build(
        config: Config,
        metrics: Option<PrometheusHandle>,
        worker_program: Option<PathBuf>,
    ) -> anyhow::Result<Self> {
        let mut handles: Vec<(HeadConfig, PrefilterHandle)> = Vec::new();
        let mut routes = HashMap::new();
        let mut order = Vec::new();
        let route_cfgs = if config.routes.is_empty() {
            vec![tiergate_config::RouteConfig {
                prompts: None,
                name: "classify".into(),
                kind: RouteKind::Classify,
                head: None,
            }]
        } else {
            config.routes.clone()
        };
        for r in &route_cfgs {
            let prompts = r
                .prompts
                .clone()
                .unwrap_or_else(|| config.reranker.prompts.clone());
            let grounded = grounded(&config, &prompts);
            let prefilter = if r.kind == RouteKind::Generate {
                None
            } else {
                let head = r
                    .head
                    .clone()
                    .unwrap_or_else(|| config.prefilter.head.clone());
                match handles.iter().find(|(h, _)| *h == head) {
                    Some((_, h)) => Some(h.clone()),
                    None => {
                        let mut pcfg = config.prefilter.clone();
                        pcfg.head = head.clone();
                        let mut classifier = Classifier::from_config(&pcfg)?;
                        if grounded {
                            classifier.ground()?;
                        }
                        tracing::info!(
                            route = %r.name,
                            precision = ?classifier.encoder.precision(),
                            labels = classifier.labels().len(),
                            "prefilter loaded"
                        );
                        let handle = PrefilterHandle::start(classifier, &pcfg)?;
                        handles.push((head, handle.clone()));
                        Some(handle)
                    }
                }
            };
            order.push(r.name.clone());
            let fusion = Fusion::resolve(&config, &prompts, prefilter.as_ref());
            warn_if_llm_adds_nothing(&r.name, &fusion);
            routes.insert(
                r.name.clone(),
                Route {
                    name: r.name.clone(),
                    kind: r.kind,
                    prefilter,
                    prompts,
                    fusion,
                    grounded,
                },
            );
        }
        let (batches, batch_unavailable) = if config.batch.enabled {
            match crate::batch::Batches::open(&config.batch) {
                Ok(b) => (Some(Arc::new(b)), None),
                Err(e) => {
                    tracing::warn!(error = %e, "the Batch API is unavailable");
                    (None, Some(e.to_string()))
                }
            }
        } else {
            (None, None)
        };
        let llm = if config.reranker.workers > 0 {
            Some(start_llm(&config, worker_program)?)
        } else {
            None
        };
        Ok(Self {
            policy: Arc::new(Policy::new(config.routing.clone())),
            admission: Arc::new(Semaphore::new(config.server.max_in_flight)),
            draining: std::sync::atomic::AtomicBool::new(false),
            experiments: crate::experiments::Experiments::new(config.experiments.clone()),
            batches,
            batch_unavailable,
            recorder: match config.server.record_escalations.as_str() {
                "" => None,
                p => Some(crate::record::Recorder::open(
                    std::path::Path::new(p),
                    config.server.record_max_bytes,
                )?),
            },
            fleet_utilization: std::sync::Mutex::new(None),
            decisions: std::sync::Mutex::new(std::collections::VecDeque::new()),
            store: match config.policy_store.kind {
                tiergate_config::StoreKind::Redis => {
                    Some(crate::store::RedisStore::new(&config.policy_store)?)
                }
                tiergate_config::StoreKind::Memory => None,
            },
            config,
            routes,
            route_order: order,
            llm,
            metrics,
            started: Instant::now(),
        })
    }

    /// Live, ready workers (0 without an LLM side).
    pub fn live_workers(&self) -> usize {
        self.llm.as_ref().map_or(0, |l| l.client.live_workers())
    }
}

/// Says so at start when the head's fit found that the LLM adds no accuracy.
fn warn_if_llm_adds_nothing(route: &str, fusion: &Fusion) {
    let Some(fit) = &fusion.fit else { return };
    if fit.llm_weight == 0.0 || fit.fused_accuracy <= fit.tier0_accuracy {
        tracing::warn!(
            route,
            llm = %fit.llm,
            rows = fit.rows,
            tier0_accuracy = fit.tier0_accuracy,
            "escalation adds no accuracy with this LLM on the dev split; θ = 1 recommended"
        );
    } else {
        tracing::info!(
            route,
            llm_weight = fit.llm_weight,
            llm_temperature = fit.llm_temperature,
            tier0_accuracy = fit.tier0_accuracy,
            fused_accuracy = fit.fused_accuracy,
            "fitted fusion in force"
        );
    }
}

/// Creates the segment and starts the workers the config asks for (also used by `eval --hybrid`).
pub fn start_llm(config: &Config, worker_program: Option<PathBuf>) -> anyhow::Result<Llm> {
    let r = &config.reranker;
    if r.engine == "mistralrs" && r.workers > 0 {
        crate::preflight::check_local_model(&r.model)?;
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
        client,
        supervisor,
        segment: name_for_info,
        rerank_ewma_ns: std::sync::atomic::AtomicU64::new(0),
    })
}
