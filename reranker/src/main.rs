//! `tiergate-reranker`: one reranker worker process. Started by the server's supervisor with
//! `--segment NAME --worker-index I --spec JSON` (the `WorkerSpec` the server builds from `[reranker]`, one
//! schema for the engine's options); attaches to the shared-memory queue and serves jobs. The `--stub-*` flags
//! are the stub engine's fault knobs (tests set them through `reranker.extra_args`).

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use tiergate_config::{EngineSpec, WorkerSpec};
use tiergate_queue::{QueueWorker, Segment};
use tiergate_reranker::engine::Engine;
use tiergate_reranker::serve::{serve, ServeConfig};
use tiergate_reranker::stub::{StubEngine, StubKnobs};

/// A tiergate reranker worker.
#[derive(Debug, Parser)]
#[command(name = "tiergate-reranker", version, about)]
struct Args {
    /// Name of the server's shared-memory segment.
    #[arg(long)]
    segment: String,
    /// This worker's index (0-based).
    #[arg(long)]
    worker_index: usize,
    /// What to run: a `tiergate_config::WorkerSpec` as JSON, which the server builds from `[reranker]`
    /// (default: the stub).
    #[arg(long)]
    spec: Option<String>,
    /// mistralrs: in-situ quantisation for a Hugging Face folder (q4_0, q4_1, q5_0, q5_1, q8_0); overrides the
    /// spec's (`[reranker]` has no key for it: set through `reranker.extra_args`).
    #[arg(long)]
    isq: Option<String>,
    /// openai: `top_logprobs` asked for when scoring (TGI: 5); overrides the spec's 20 (set through
    /// `reranker.extra_args`).
    #[arg(long)]
    top_logprobs: Option<usize>,
    /// Stub: milliseconds each job takes.
    #[arg(long, default_value_t = 0)]
    stub_delay_ms: u64,
    /// Stub: abort the process at job N.
    #[arg(long)]
    stub_crash_after: Option<u64>,
    /// Stub: freeze the process at job N.
    #[arg(long)]
    stub_hang_after: Option<u64>,
    /// Stub: answer every N-th job with garbage.
    #[arg(long)]
    stub_garbage_every: Option<u64>,
    /// Stub: job N never returns from the engine (the process and its heartbeat stay alive).
    #[arg(long)]
    stub_stuck_after: Option<u64>,
    /// Stub: every generation fails after its first token (a stream broken mid-way).
    #[arg(long)]
    stub_fail_mid_stream: bool,
    /// Stub: a job's delay runs uninterrupted and counts progress, as a model's forward passes would.
    #[arg(long)]
    stub_progress: bool,
    /// Stub: milliseconds the "model load" takes before the worker is ready.
    #[arg(long, default_value_t = 0)]
    stub_load_ms: u64,
    /// Stub: an agent's script, a JSON file `{"calls": [["Read", {"file_path": "…"}], …]}` (the agent CLIs'
    /// tests): the stub calls the first scripted tool a conversation offers, then answers from its result.
    #[arg(long)]
    stub_script: Option<std::path::PathBuf>,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let mut spec = match args
        .spec
        .as_deref()
        .map_or(Ok(WorkerSpec::stub()), WorkerSpec::parse)
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tiergate-reranker: error: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match &mut spec.engine {
        EngineSpec::Mistralrs { isq, .. } if args.isq.is_some() => isq.clone_from(&args.isq),
        EngineSpec::Openai { top_logprobs, .. } => {
            *top_logprobs = args.top_logprobs.unwrap_or(*top_logprobs)
        }
        _ => {}
    }
    let telemetry = match init_telemetry(&spec) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("tiergate-reranker: error: {e:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = run(&args, &spec);
    drop(telemetry);
    match result {
        Ok(code) => std::process::ExitCode::from(code as u8),
        Err(e) => {
            eprintln!("tiergate-reranker: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Logs, and the job spans exported where the server says (as children of the server's spans only: the worker
/// starts no trace of its own).
fn init_telemetry(spec: &WorkerSpec) -> anyhow::Result<tiergate_telemetry::Telemetry> {
    let export = match &spec.telemetry {
        None => None,
        Some(t) => Some(tiergate_telemetry::Export {
            url: t.endpoint.clone(),
            protocol: tiergate_telemetry::Protocol::parse(&t.protocol)?,
            service_name: t.service_name.clone(),
            sample_ratio: 1.0,
            roots: false,
        }),
    };
    tiergate_telemetry::init(export)
}

fn run(args: &Args, spec: &WorkerSpec) -> anyhow::Result<i32> {
    let seg = Arc::new(Segment::open(&args.segment)?);
    let worker = QueueWorker::attach(seg, args.worker_index)?;
    // Heartbeats start before the model loads (loading can take a while); readiness comes after.
    worker.heartbeat();
    let heartbeat = Duration::from_millis(spec.heartbeat_ms.max(1));
    let engine: Arc<dyn Engine> = match &spec.engine {
        EngineSpec::Stub => {
            std::thread::sleep(Duration::from_millis(args.stub_load_ms));
            let script = match &args.stub_script {
                Some(path) => Some(serde_json::from_slice(&std::fs::read(path)?)?),
                None => None,
            };
            Arc::new(StubEngine::new(StubKnobs {
                delay: Duration::from_millis(args.stub_delay_ms),
                crash_after: args.stub_crash_after,
                hang_after: args.stub_hang_after,
                garbage_every: args.stub_garbage_every,
                stuck_after: args.stub_stuck_after,
                fail_mid_stream: args.stub_fail_mid_stream,
                progress: args.stub_progress,
                script,
            }))
        }
        EngineSpec::Mistralrs { .. } => load_llm(spec)?,
        EngineSpec::Llamacpp { .. } => load_local(spec)?,
        EngineSpec::Openai {
            url,
            model,
            api_key_env,
            connect_timeout_ms,
            request_timeout_ms,
            first_byte_timeout_ms,
            chunk_timeout_ms,
            max_in_flight,
            top_logprobs,
            profile,
        } => {
            let api_key = (!api_key_env.is_empty())
                .then(|| std::env::var(api_key_env))
                .transpose()
                .map_err(|_| anyhow::anyhow!("api_key_env {api_key_env}: not set"))?;
            let engine = tiergate_reranker::remote::RemoteEngine::new(
                tiergate_reranker::remote::RemoteOptions {
                    url: url.clone(),
                    model: model.clone(),
                    api_key,
                    connect_timeout: Duration::from_millis(*connect_timeout_ms),
                    request_timeout: Duration::from_millis(*request_timeout_ms),
                    first_byte_timeout: Duration::from_millis(
                        first_byte_timeout_ms.unwrap_or(*request_timeout_ms),
                    ),
                    chunk_timeout: Duration::from_millis(
                        chunk_timeout_ms.unwrap_or(*request_timeout_ms),
                    ),
                    max_in_flight: *max_in_flight,
                    top_logprobs: *top_logprobs,
                    profile: tiergate_config::profile_for(model, profile)?,
                },
            )?;
            return tiergate_reranker::remote::serve_remote(worker, engine, heartbeat);
        }
    };
    let cfg = ServeConfig {
        max_concurrent: spec.max_concurrent,
        heartbeat,
        warmup: warmup_jobs(spec),
        warmup_budget: Duration::from_millis(spec.warmup_ms),
    };
    Ok(serve(worker, engine, cfg))
}

/// The server's warm-up jobs (`spec.warmup`); an unreadable file is logged and means no warm-up.
fn warmup_jobs(spec: &WorkerSpec) -> Vec<tiergate_queue::Job> {
    let Some(path) = &spec.warmup else {
        return Vec::new();
    };
    let read = std::fs::read(path)
        .map_err(anyhow::Error::from)
        .and_then(|b| Ok(serde_json::from_slice(&b)?));
    read.unwrap_or_else(|e: anyhow::Error| {
        tracing::warn!(path = %path.display(), error = %e, "cannot read the warm-up jobs: none run");
        Vec::new()
    })
}

/// `auto` runs mistralrs in a worker built for CUDA (its `cuda` feature) or without llama.cpp; otherwise the
/// spec's llama.cpp.
fn load_local(spec: &WorkerSpec) -> anyhow::Result<Arc<dyn Engine>> {
    let mistralrs = cfg!(feature = "cuda") || !cfg!(feature = "llamacpp");
    match spec.engine.as_mistralrs().filter(|_| mistralrs) {
        Some(engine) => {
            tracing::info!(
                reason = if cfg!(feature = "cuda") {
                    "built for CUDA"
                } else {
                    "built without llama.cpp"
                },
                "engine auto: mistralrs"
            );
            load_llm(&WorkerSpec {
                engine,
                ..spec.clone()
            })
        }
        None => load_llamacpp(spec),
    }
}

#[cfg(feature = "llamacpp")]
fn load_llamacpp(spec: &WorkerSpec) -> anyhow::Result<Arc<dyn Engine>> {
    let EngineSpec::Llamacpp {
        model,
        scoring_weights,
        profile,
        prefix_cache_mib,
        threads,
        batch_threads,
        context_tokens,
        cached_sequences,
        chunk_tokens,
        ..
    } = &spec.engine
    else {
        anyhow::bail!("not a llama.cpp spec")
    };
    let opts = tiergate_reranker::llamacpp::LlamaCppOptions {
        model: model.clone(),
        threads: *threads,
        batch_threads: *batch_threads,
        context_tokens: *context_tokens,
        running: spec.max_concurrent.max(1),
        cached: *cached_sequences,
        chunk_tokens: *chunk_tokens,
        scoring_weights: weights(*scoring_weights),
        prefix_cache_bytes: prefix_cache_mib << 20,
        profile: profile.clone(),
    };
    Ok(Arc::new(tiergate_reranker::llamacpp::LlamaCppEngine::load(
        &opts,
    )?))
}

#[cfg(not(feature = "llamacpp"))]
fn load_llamacpp(_: &WorkerSpec) -> anyhow::Result<Arc<dyn Engine>> {
    anyhow::bail!("this build has no llama.cpp engine (built without the `llamacpp` feature)")
}

#[cfg(any(feature = "llm", feature = "llamacpp"))]
fn weights(w: tiergate_config::ScoringWeights) -> tiergate_reranker::llama::WeightFormat {
    match w {
        tiergate_config::ScoringWeights::Int8 => tiergate_reranker::llama::WeightFormat::Int8,
        tiergate_config::ScoringWeights::F32 => tiergate_reranker::llama::WeightFormat::F32,
        tiergate_config::ScoringWeights::Quantized => {
            tiergate_reranker::llama::WeightFormat::Quantized
        }
    }
}

#[cfg(feature = "llm")]
fn load_llm(spec: &WorkerSpec) -> anyhow::Result<Arc<dyn Engine>> {
    let EngineSpec::Mistralrs {
        model,
        isq,
        f32_weights,
        scoring_weights,
        profile,
        prefix_cache_mib,
    } = &spec.engine
    else {
        anyhow::bail!("not a mistralrs spec")
    };
    if *f32_weights {
        // candle reads this switch from the environment; only this binary's main sets it.
        std::env::set_var("CANDLE_DEQUANTIZE_ALL", "1");
    }
    let opts = tiergate_reranker::llm::LlmOptions {
        model: model.clone(),
        isq: isq.clone(),
        max_seqs: spec.max_concurrent.max(1),
        scoring_weights: weights(*scoring_weights),
        prefix_cache_bytes: prefix_cache_mib << 20,
        profile: profile.clone(),
    };
    Ok(Arc::new(tiergate_reranker::llm::MistralEngine::load(
        &opts,
    )?))
}

#[cfg(not(feature = "llm"))]
fn load_llm(_: &WorkerSpec) -> anyhow::Result<Arc<dyn Engine>> {
    anyhow::bail!("this build has no mistralrs engine (built without the `llm` feature)")
}
