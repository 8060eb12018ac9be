//! What one LLM worker process runs, as one typed value: the server builds it from `[reranker]`
//! ([`WorkerSpec::of`]) and hands it to each worker as a single serialised argument (`--spec JSON`), so the
//! worker's engine options have one schema — this one — and their defaults live in `[reranker]`'s.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{EngineKind, RerankerConfig};

/// One worker's configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSpec {
    pub engine: EngineSpec,
    /// Jobs run at once.
    #[serde(default = "default_max_concurrent")]
    pub max_concurrent: usize,
    /// Heartbeat period, milliseconds.
    #[serde(default = "default_heartbeat_ms")]
    pub heartbeat_ms: u64,
    /// Where the worker exports its job spans (the server's own OTLP endpoint); `None`: not exported.
    #[serde(default)]
    pub telemetry: Option<WorkerTelemetry>,
    /// A JSON file of rerank jobs (`tiergate_queue::Job`s) the server built from its routes' labels: the
    /// worker scores them before it says it is ready. `None`: no warm-up.
    #[serde(default)]
    pub warmup: Option<PathBuf>,
    /// The most time the warm-up may take, milliseconds (`[reranker] warmup_ms`).
    #[serde(default)]
    pub warmup_ms: u64,
}

fn default_max_concurrent() -> usize {
    4
}

fn default_heartbeat_ms() -> u64 {
    100
}

/// The engine a worker runs, with its options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum EngineSpec {
    /// The deterministic stub (no model; its fault knobs are the worker's `--stub-*` flags).
    Stub,
    /// mistralrs (generation) and the scoring forward on a local model.
    Mistralrs {
        /// A .gguf file or a Hugging Face folder.
        model: PathBuf,
        /// In-situ quantisation for a Hugging Face folder (q4_0, q4_1, q5_0, q5_1, q8_0).
        #[serde(default)]
        isq: Option<String>,
        /// Dequantise GGUF weights to f32 for generation.
        #[serde(default)]
        f32_weights: bool,
        /// The scoring forward's arithmetic: int8, f32 or quantized.
        scoring_weights: crate::ScoringWeights,
        /// The scoring profile (empty: by the model's file name).
        #[serde(default)]
        profile: String,
        /// Memory for cached label prefixes, MiB.
        prefix_cache_mib: usize,
    },
    /// llama.cpp (generation) and the scoring forward on a local GGUF file.
    Llamacpp {
        model: PathBuf,
        /// Chosen by `engine = "auto"`: a worker without llama.cpp, or built for CUDA, runs mistralrs instead.
        #[serde(default)]
        auto: bool,
        /// mistralrs's option, for that fallback.
        #[serde(default)]
        f32_weights: bool,
        scoring_weights: crate::ScoringWeights,
        #[serde(default)]
        profile: String,
        prefix_cache_mib: usize,
        /// Decode threads (0: the machine's cores).
        threads: usize,
        /// Prompt-chunk threads (0: as `threads`).
        batch_threads: usize,
        /// KV cells shared by the sequences.
        context_tokens: u32,
        /// Cached finished sequences besides the running ones.
        cached_sequences: usize,
        /// Most tokens in one forward pass.
        chunk_tokens: usize,
    },
    /// A remote OpenAI-compatible server.
    Openai {
        /// The base URL, up to and including `/v1`.
        url: String,
        /// The upstream's model name.
        model: String,
        /// The environment variable holding the API key (empty: none).
        #[serde(default)]
        api_key_env: String,
        connect_timeout_ms: u64,
        request_timeout_ms: u64,
        /// The upstream's headers within this (none: the request timeout only).
        #[serde(default)]
        first_byte_timeout_ms: Option<u64>,
        /// A streamed answer's next chunk within this (none: the request timeout only).
        #[serde(default)]
        chunk_timeout_ms: Option<u64>,
        /// Upstream requests in flight at most.
        max_in_flight: usize,
        /// `top_logprobs` asked for when scoring (TGI: 5; OpenAI, vLLM: up to 20).
        #[serde(default = "default_top_logprobs")]
        top_logprobs: usize,
        /// The scoring profile (empty: by the model name).
        #[serde(default)]
        profile: String,
    },
}

fn default_top_logprobs() -> usize {
    20
}

/// Where a worker exports its spans.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerTelemetry {
    pub endpoint: String,
    /// `http/protobuf` or `grpc`.
    pub protocol: String,
    pub service_name: String,
}

impl EngineSpec {
    /// `auto`'s llama.cpp spec as mistralrs runs it (a worker without llama.cpp, or built for CUDA); any other
    /// spec as it is.
    pub fn as_mistralrs(&self) -> Option<Self> {
        match self {
            EngineSpec::Llamacpp {
                model,
                auto: true,
                f32_weights,
                scoring_weights,
                profile,
                prefix_cache_mib,
                ..
            } => Some(EngineSpec::Mistralrs {
                model: model.clone(),
                isq: None,
                f32_weights: *f32_weights,
                scoring_weights: *scoring_weights,
                profile: profile.clone(),
                prefix_cache_mib: *prefix_cache_mib,
            }),
            _ => None,
        }
    }
}

impl WorkerSpec {
    /// The spec `[reranker]` describes (without telemetry, which the server adds when it exports).
    pub fn of(r: &RerankerConfig) -> Self {
        let engine = match r.engine {
            EngineKind::Mistralrs => EngineSpec::Mistralrs {
                model: r.model.clone(),
                isq: None,
                f32_weights: r.f32_weights,
                scoring_weights: r.scoring_weights,
                profile: r.profile.clone(),
                prefix_cache_mib: r.prefix_cache_mib,
            },
            EngineKind::Llamacpp | EngineKind::Auto => EngineSpec::Llamacpp {
                model: r.model.clone(),
                auto: r.engine == EngineKind::Auto,
                f32_weights: r.f32_weights,
                scoring_weights: r.scoring_weights,
                profile: r.profile.clone(),
                prefix_cache_mib: r.prefix_cache_mib,
                threads: r.threads,
                batch_threads: r.batch_threads,
                context_tokens: r.context_tokens,
                cached_sequences: r.cached_sequences,
                chunk_tokens: r.chunk_tokens,
            },
            EngineKind::Openai => EngineSpec::Openai {
                url: r.url.clone(),
                model: r.model.to_string_lossy().into_owned(),
                api_key_env: r.api_key_env.clone(),
                connect_timeout_ms: r.connect_timeout_ms,
                request_timeout_ms: r.request_timeout_ms,
                first_byte_timeout_ms: Some(r.first_byte_timeout_ms),
                chunk_timeout_ms: Some(r.chunk_timeout_ms),
                max_in_flight: r.remote_max_in_flight,
                top_logprobs: default_top_logprobs(),
                profile: r.profile.clone(),
            },
            EngineKind::Stub => EngineSpec::Stub,
        };
        Self {
            engine,
            max_concurrent: r.max_concurrent,
            heartbeat_ms: default_heartbeat_ms(),
            telemetry: None,
            warmup: None,
            warmup_ms: r.warmup_ms,
        }
    }

    /// The spec as the one command-line argument that carries it.
    pub fn to_arg(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads [`Self::to_arg`]'s form back.
    pub fn parse(arg: &str) -> Result<Self, String> {
        serde_json::from_str(arg).map_err(|e| format!("--spec: {e}"))
    }

    /// The stub with defaults (a worker started without `--spec`).
    pub fn stub() -> Self {
        Self {
            engine: EngineSpec::Stub,
            max_concurrent: default_max_concurrent(),
            heartbeat_ms: default_heartbeat_ms(),
            telemetry: None,
            warmup: None,
            warmup_ms: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reranker_section_round_trips_through_one_argument() {
        for engine in [
            EngineKind::Stub,
            EngineKind::Mistralrs,
            EngineKind::Llamacpp,
            EngineKind::Auto,
            EngineKind::Openai,
        ] {
            let mut r = crate::Config::default().reranker;
            r.engine = engine;
            r.url = "http://127.0.0.1:9/v1".into();
            let spec = WorkerSpec::of(&r);
            assert_eq!(
                WorkerSpec::parse(&spec.to_arg()).unwrap(),
                spec,
                "{engine:?}"
            );
            assert_eq!(spec.max_concurrent, r.max_concurrent);
        }
        let mut r = crate::Config::default().reranker;
        r.engine = EngineKind::Mistralrs;
        r.scoring_weights = crate::ScoringWeights::F32;
        assert!(matches!(
            WorkerSpec::of(&r).engine,
            EngineSpec::Mistralrs { scoring_weights, .. } if scoring_weights == crate::ScoringWeights::F32
        ));
    }

    #[test]
    fn a_bad_spec_is_a_clear_error() {
        let e = WorkerSpec::parse(r#"{"engine":{"kind":"tpu"}}"#).unwrap_err();
        assert!(e.contains("--spec") && e.contains("tpu"), "{e}");
        let e = WorkerSpec::parse(r#"{"engine":{"kind":"stub"},"workerz":1}"#).unwrap_err();
        assert!(e.contains("workerz"), "{e}");
        let s = WorkerSpec::parse(r#"{"engine":{"kind":"stub"}}"#).unwrap();
        assert_eq!(s, WorkerSpec::stub());
    }
}
