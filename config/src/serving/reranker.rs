//! `[reranker]`: the LLM worker processes and the shared-memory queue (and each `[[llm]]` backend).

use super::*;

/// The LLM engine the workers run (`reranker.engine`; any other value is refused when the config is read).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// A deterministic word-overlap scorer and echo generator (tests, load tests of the plumbing).
    Stub,
    /// A local GGUF model in the worker process, on mistralrs (the engine for CUDA hosts).
    Mistralrs,
    /// A local GGUF model in the worker process, on llama.cpp (the fast engine on a CPU).
    Llamacpp,
    /// A local model on the engine the worker was built for: llama.cpp, or mistralrs where the worker is built
    /// for CUDA (the `cuda` feature) or without llama.cpp.
    Auto,
    /// A remote OpenAI-compatible server.
    Openai,
}

impl EngineKind {
    /// The config value.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Stub => "stub",
            EngineKind::Mistralrs => "mistralrs",
            EngineKind::Llamacpp => "llamacpp",
            EngineKind::Auto => "auto",
            EngineKind::Openai => "openai",
        }
    }

    /// A model in the worker process (mistralrs, llama.cpp or `auto`).
    pub fn is_local(self) -> bool {
        matches!(
            self,
            EngineKind::Mistralrs | EngineKind::Llamacpp | EngineKind::Auto
        )
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
    /// `auto` (llama.cpp; mistralrs in a worker built for CUDA), `llamacpp`, `mistralrs`, `stub`, or `openai` (a
    /// remote OpenAI-compatible server: vLLM, TGI, llama.cpp's server, …).
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
    /// `openai`: how long the upstream may take to answer a request's headers, milliseconds (an upstream
    /// that accepts and never answers fails the job after this, not after `request_timeout_ms`).
    pub first_byte_timeout_ms: u64,
    /// `openai`: how long a streamed answer may go without a chunk, milliseconds (an upstream that stops
    /// mid-stream fails the job after this).
    pub chunk_timeout_ms: u64,
    /// `openai`: requests in flight to the upstream at most, per worker (generations may take all but one).
    pub remote_max_in_flight: usize,
    /// Dequantise GGUF weights to f32 (mistralrs: faster prefill on CPU).
    pub f32_weights: bool,
    /// llama.cpp: threads of a single-token decode step (0: the machine's cores).
    pub threads: usize,
    /// llama.cpp: threads of every step of more than one token — prompt chunks, several streams decoding (0: as
    /// `threads`).
    pub batch_threads: usize,
    /// llama.cpp: KV cache cells shared by a worker's sequences, running and cached (a sequence's window is
    /// the smaller of this and the model's training context).
    pub context_tokens: u32,
    /// llama.cpp: finished conversations kept as cached prefixes besides the running ones (their KV cells are
    /// reused by a request that continues them, and given up least recently used first when space is needed).
    pub cached_sequences: usize,
    /// How many conversations the backend keeps warm in its prompt cache, for the placement of new sessions
    /// (past it, a new session there pushes a held one's conversation out). The `llamacpp` engine keeps
    /// `workers × cached_sequences` whatever this says; a remote upstream keeps what it is set to (a llama.cpp
    /// server's slots, a vLLM prefix cache's room): 0, not modelled.
    pub prompt_cache_sessions: usize,
    /// llama.cpp: most tokens in one forward pass; a longer prompt is read in chunks of this size between the
    /// decode steps of the streams already running.
    pub chunk_tokens: usize,
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
    /// Its generations may carry tools (function calling): requests with `tools` go only to backends that
    /// say so, and a route with none answers 400. The model's chat template must render tools (Qwen2.5's
    /// does, SmolLM2's does not); the `openai` engine hands them to its upstream.
    pub tools: bool,
    /// How long a starting local worker (`mistralrs`) may spend scoring the server's warm-up jobs before it
    /// says it is ready, milliseconds: one rerank per chunk of each escalating route's labels, so the label
    /// prefixes and first passes are built before the first real escalation (and again after a restart).
    /// 0: no warm-up. Counts in `load_timeout_ms`.
    pub warmup_ms: u64,
}

impl Default for RerankerConfig {
    fn default() -> Self {
        Self {
            workers: 1,
            program: PathBuf::new(),
            engine: EngineKind::Auto,
            model: PathBuf::from("models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"),
            url: String::new(),
            api_key_env: String::new(),
            connect_timeout_ms: 2_000,
            request_timeout_ms: 60_000,
            first_byte_timeout_ms: 30_000,
            chunk_timeout_ms: 15_000,
            remote_max_in_flight: 32,
            f32_weights: false,
            threads: 0,
            batch_threads: 0,
            context_tokens: 16_384,
            cached_sequences: 4,
            prompt_cache_sessions: 0,
            chunk_tokens: 512,
            max_concurrent: 4,
            extra_args: Vec::new(),
            slots: 64,
            request_bytes: 4 * 1024 * 1024,
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
            tools: false,
            warmup_ms: 120_000,
        }
    }
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

impl RerankerConfig {
    /// Jobs the workers run at once (`workers × max_concurrent`, within the in-flight limit): jobs beyond wait
    /// in their tenant's lane before the shared-memory queue.
    pub fn capacity(&self) -> usize {
        (self.workers * self.max_concurrent)
            .min(self.in_flight_limit())
            .max(1)
    }

    /// How many conversations the backend keeps warm ([`RerankerConfig::prompt_cache_sessions`]; 0: not
    /// modelled).
    pub fn warm_sessions(&self) -> usize {
        match self.engine {
            EngineKind::Llamacpp | EngineKind::Auto => self.workers * self.cached_sequences,
            EngineKind::Openai => self.prompt_cache_sessions,
            EngineKind::Stub | EngineKind::Mistralrs => 0,
        }
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
                || self.first_byte_timeout_ms == 0
                || self.chunk_timeout_ms == 0
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
        if !(1..=4096).contains(&self.chunk_tokens) {
            return Err(ConfigError::invalid(
                format!("{at}.chunk_tokens"),
                "must be in 1..=4096",
            ));
        }
        if self.context_tokens < 256 {
            return Err(ConfigError::invalid(
                format!("{at}.context_tokens"),
                "at least 256",
            ));
        }
        if self.threads > 256 || self.batch_threads > 256 {
            return Err(ConfigError::invalid(
                format!("{at}.threads"),
                "threads and batch_threads: at most 256 (0: the machine's cores)",
            ));
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
        if self.warmup_ms >= self.load_timeout_ms {
            return Err(ConfigError::invalid(
                format!("{at}.warmup_ms"),
                "must be below load_timeout_ms (the warm-up is part of a worker's start)",
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
