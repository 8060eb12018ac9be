//! `tiergate-reranker`: one reranker worker process. Started by the server's supervisor with
//! `--segment NAME --worker-index I`; attaches to the shared-memory queue and serves jobs.

use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use tiergate_queue::{QueueWorker, Segment};
use tiergate_reranker::engine::Engine;
use tiergate_reranker::serve::{serve, ServeConfig};
use tiergate_reranker::stub::{StubEngine, StubKnobs};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum EngineKind {
    /// The deterministic stub (no model).
    Stub,
    /// mistralrs with the model given by --model.
    Mistralrs,
    /// A remote OpenAI-compatible server at --url (--model: its model name).
    Openai,
}

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
    /// Which engine to run.
    #[arg(long, value_enum, default_value_t = EngineKind::Stub)]
    engine: EngineKind,
    /// The model: a .gguf file or a Hugging Face folder.
    #[arg(
        long,
        default_value = "models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
    )]
    model: std::path::PathBuf,
    /// In-situ quantisation for a Hugging Face folder (q4_0, q4_1, q5_0, q5_1, q8_0).
    #[arg(long)]
    isq: Option<String>,
    /// Dequantise GGUF weights to f32 (faster prefill on CPU, slower decode; see the README).
    #[arg(long)]
    f32_weights: bool,
    /// Arithmetic of the scoring forward: int8 (AVX-512 VNNI, else f32), f32 (weights dequantised at load)
    /// or quantized (as stored).
    #[arg(long, default_value = "int8")]
    scoring_weights: String,
    /// The scoring profile `method = auto` follows (config/models/profiles.toml); empty: by the model's file name.
    #[arg(long, default_value = "")]
    profile: String,
    /// Memory for cached label prefixes, MiB.
    #[arg(long, default_value_t = 512)]
    prefix_cache_mib: usize,
    /// Jobs run at once.
    #[arg(long, default_value_t = 4)]
    max_concurrent: usize,
    /// Heartbeat period in milliseconds.
    #[arg(long, default_value_t = 100)]
    heartbeat_ms: u64,
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
    /// openai: the base URL, up to and including /v1.
    #[arg(long, default_value = "")]
    url: String,
    /// openai: the environment variable holding the API key (empty: none).
    #[arg(long, default_value = "")]
    api_key_env: String,
    /// openai: connect timeout, ms.
    #[arg(long, default_value_t = 2_000)]
    connect_timeout_ms: u64,
    /// openai: timeout of one upstream request, ms.
    #[arg(long, default_value_t = 60_000)]
    request_timeout_ms: u64,
    /// openai: upstream requests in flight at most.
    #[arg(long, default_value_t = 32)]
    max_in_flight: usize,
    /// openai: `top_logprobs` asked for when scoring (TGI: 5; OpenAI, vLLM: up to 20).
    #[arg(long, default_value_t = 20)]
    top_logprobs: usize,
    /// Stub: job N never returns from the engine (the process and its heartbeat stay alive).
    #[arg(long)]
    stub_stuck_after: Option<u64>,
    /// Stub: milliseconds the "model load" takes before the worker is ready.
    #[arg(long, default_value_t = 0)]
    stub_load_ms: u64,
    /// Where this worker exports its spans (the server passes its own OTLP endpoint; empty: not exported).
    #[arg(long, default_value = "")]
    otlp_endpoint: String,
    /// The OTLP transport: http/protobuf or grpc.
    #[arg(long, default_value = "http/protobuf")]
    otlp_protocol: String,
    /// `service.name` of this worker's spans.
    #[arg(long, default_value = "tiergate-worker")]
    service_name: String,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let telemetry = match init_telemetry(&args) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("tiergate-reranker: error: {e:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = run(args);
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
fn init_telemetry(args: &Args) -> anyhow::Result<tiergate_telemetry::Telemetry> {
    let export = if args.otlp_endpoint.is_empty() {
        None
    } else {
        Some(tiergate_telemetry::Export {
            url: args.otlp_endpoint.clone(),
            protocol: tiergate_telemetry::Protocol::parse(&args.otlp_protocol)?,
            service_name: args.service_name.clone(),
            sample_ratio: 1.0,
            roots: false,
        })
    };
    tiergate_telemetry::init(export)
}

fn run(args: Args) -> anyhow::Result<i32> {
    let seg = Arc::new(Segment::open(&args.segment)?);
    let worker = QueueWorker::attach(seg, args.worker_index)?;
    // Heartbeats start before the model loads (loading can take a while); readiness comes after.
    worker.heartbeat();
    let engine: Arc<dyn Engine> = match args.engine {
        EngineKind::Stub => {
            std::thread::sleep(Duration::from_millis(args.stub_load_ms));
            Arc::new(StubEngine::new(StubKnobs {
                delay: Duration::from_millis(args.stub_delay_ms),
                crash_after: args.stub_crash_after,
                hang_after: args.stub_hang_after,
                garbage_every: args.stub_garbage_every,
                stuck_after: args.stub_stuck_after,
            }))
        }
        EngineKind::Mistralrs => load_llm(&args)?,
        EngineKind::Openai => {
            let api_key = (!args.api_key_env.is_empty())
                .then(|| std::env::var(&args.api_key_env))
                .transpose()
                .map_err(|_| anyhow::anyhow!("--api-key-env {}: not set", args.api_key_env))?;
            let engine = tiergate_reranker::remote::RemoteEngine::new(
                tiergate_reranker::remote::RemoteOptions {
                    url: args.url.clone(),
                    model: args.model.to_string_lossy().into_owned(),
                    api_key,
                    connect_timeout: Duration::from_millis(args.connect_timeout_ms),
                    request_timeout: Duration::from_millis(args.request_timeout_ms),
                    max_in_flight: args.max_in_flight,
                    top_logprobs: args.top_logprobs,
                    profile: tiergate_config::profile_for(
                        &args.model.to_string_lossy(),
                        &args.profile,
                    )?,
                },
            )?;
            let heartbeat = Duration::from_millis(args.heartbeat_ms.max(1));
            return tiergate_reranker::remote::serve_remote(worker, engine, heartbeat);
        }
    };
    let cfg = ServeConfig {
        max_concurrent: args.max_concurrent,
        heartbeat: Duration::from_millis(args.heartbeat_ms.max(1)),
    };
    Ok(serve(worker, engine, cfg))
}

#[cfg(feature = "llm")]
fn load_llm(args: &Args) -> anyhow::Result<Arc<dyn Engine>> {
    if args.f32_weights {
        // candle reads this switch from the environment; only this binary's main sets it.
        std::env::set_var("CANDLE_DEQUANTIZE_ALL", "1");
    }
    let opts = tiergate_reranker::llm::LlmOptions {
        model: args.model.clone(),
        isq: args.isq.clone(),
        max_seqs: args.max_concurrent.max(1),
        scoring_weights: tiergate_reranker::llama::WeightFormat::parse(&args.scoring_weights)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "--scoring-weights `{}`: use int8, f32 or quantized",
                    args.scoring_weights
                )
            })?,
        prefix_cache_bytes: args.prefix_cache_mib << 20,
        profile: args.profile.clone(),
    };
    Ok(Arc::new(tiergate_reranker::llm::MistralEngine::load(
        &opts,
    )?))
}

#[cfg(not(feature = "llm"))]
fn load_llm(_: &Args) -> anyhow::Result<Arc<dyn Engine>> {
    anyhow::bail!("this build has no mistralrs engine (built without the `llm` feature)")
}
