//! The `[prefilter]` section: which encoder, which head, how requests are batched.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::ConfigError;

/// Tier-0 encoder classifier settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PrefilterConfig {
    /// A local Hugging Face model folder (`config.json`, `model.safetensors`, `tokenizer.json`).
    pub encoder: PathBuf,
    /// How token states become one sentence vector; `auto` reads the sentence-transformers config.
    pub pooling: PoolingConfig,
    /// The classification head on top of the encoder.
    pub head: HeadConfig,
    /// Inputs are truncated to this many tokens (special tokens included).
    pub max_tokens: usize,
    /// Largest number of requests run in one forward pass.
    pub max_batch: usize,
    /// Longest time the batching thread waits for more requests once it has one, in microseconds.
    pub max_wait_us: u64,
    /// Upper bound on padded tokens (batch size x longest input) in one forward pass.
    pub token_budget: usize,
    /// Requests waiting for the batching thread; beyond this a request is refused as overloaded.
    pub queue_capacity: usize,
    /// Number of top candidates reported per request.
    pub top_k: usize,
    /// Threads running forward passes concurrently on the one shared model (each single-threaded inside);
    /// 0 picks the number of CPU cores. Whole batches in parallel use the cores better than splitting each
    /// matmul across them.
    pub workers: usize,
    /// A forward that starts while no other batch runs or waits lends a helper thread to its int8 layers
    /// (each layer splits its rows or outputs while no other forward has started): both cores on one request
    /// when the machine is otherwise idle. Off by default: it cuts the raw batch-1 forward from 1.69 to
    /// 1.42 ms here but gained nothing through HTTP with the clients on the same 2 cores (docs/forward.md).
    pub lend_idle_core: bool,
    /// Arithmetic of the encoder's dense layers at inference: `auto` (int8 where the CPU has AVX-512 VNNI and
    /// the encoder is BERT-family, else f32), `f32`, or `int8` (an error where it cannot run).
    pub precision: Precision,
}

/// Arithmetic of the encoder's dense layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// int8 where it runs, else f32.
    #[default]
    Auto,
    /// f32 throughout.
    F32,
    /// i8 weights (per output channel) and activations (per row) on AVX-512 VNNI.
    Int8,
}

impl std::str::FromStr for Precision {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "f32" => Ok(Self::F32),
            "int8" => Ok(Self::Int8),
            other => Err(format!("precision `{other}`: expected auto, f32 or int8")),
        }
    }
}

impl Default for PrefilterConfig {
    fn default() -> Self {
        Self {
            encoder: PathBuf::from("models/all-MiniLM-L6-v2"),
            pooling: PoolingConfig::Auto,
            head: HeadConfig::default(),
            max_tokens: 64,
            max_batch: 16,
            max_wait_us: 2_000,
            token_budget: 4_096,
            queue_capacity: 1_024,
            top_k: 5,
            workers: 0,
            lend_idle_core: false,
            precision: Precision::Auto,
        }
    }
}

/// Pooling of the encoder's token states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolingConfig {
    /// Read `modules.json` / `1_Pooling/config.json`; masked mean when absent.
    Auto,
    /// Masked mean over tokens, then L2 normalisation.
    MeanNormalized,
    /// Masked mean over tokens.
    Mean,
    /// The first (`[CLS]`) token.
    Cls,
}

/// Which classification head sits on the pooled sentence vector.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum HeadConfig {
    /// The encoder folder's own sequence-classification head and its `id2label`.
    Checkpoint,
    /// A head written by `tiergate train`.
    Trained(TrainedHeadConfig),
    /// A head built at load time from example utterances per label.
    FewShot {
        /// Labels with their example utterances (and the reply text used by answer routes).
        labels: Vec<FewShotLabel>,
        /// Softmax temperature on cosine similarities (smaller is sharper).
        #[serde(default = "default_few_shot_temperature")]
        temperature: f64,
    },
}

impl Default for HeadConfig {
    fn default() -> Self {
        HeadConfig::FewShot {
            labels: Vec::new(),
            temperature: default_few_shot_temperature(),
        }
    }
}

fn default_few_shot_temperature() -> f64 {
    0.05
}

/// A folder written by `tiergate train`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainedHeadConfig {
    /// The folder holding `head.json` and `head.safetensors`.
    pub dir: PathBuf,
}

/// One label of a few-shot head.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FewShotLabel {
    /// The label name returned to clients.
    pub label: String,
    /// Example utterances; their mean embedding is the label's prototype.
    pub examples: Vec<String>,
    /// Reply text for answer routes.
    #[serde(default)]
    pub reply: Option<String>,
    /// One sentence saying what the label means, shown to the judge (`{description}` in the prompts).
    #[serde(default)]
    pub description: Option<String>,
}

impl PrefilterConfig {
    pub(crate) fn validate(&self, at: &str) -> Result<(), ConfigError> {
        let field = |name: &str| format!("{at}.{name}");
        if self.encoder.as_os_str().is_empty() {
            return Err(ConfigError::invalid(
                field("encoder"),
                "must name a model folder",
            ));
        }
        if !(2..=8192).contains(&self.max_tokens) {
            return Err(ConfigError::invalid(
                field("max_tokens"),
                format!("{} is outside 2..=8192", self.max_tokens),
            ));
        }
        if !(1..=1024).contains(&self.max_batch) {
            return Err(ConfigError::invalid(
                field("max_batch"),
                format!("{} is outside 1..=1024", self.max_batch),
            ));
        }
        if self.max_wait_us > 1_000_000 {
            return Err(ConfigError::invalid(
                field("max_wait_us"),
                format!("{} us is more than one second", self.max_wait_us),
            ));
        }
        if self.token_budget < self.max_tokens {
            return Err(ConfigError::invalid(
                field("token_budget"),
                format!(
                    "{} is smaller than max_tokens ({}): a single long input could never run",
                    self.token_budget, self.max_tokens
                ),
            ));
        }
        if self.queue_capacity == 0 {
            return Err(ConfigError::invalid(
                field("queue_capacity"),
                "must be at least 1",
            ));
        }
        if self.workers > 256 {
            return Err(ConfigError::invalid(
                field("workers"),
                format!("{} is more than 256", self.workers),
            ));
        }
        if self.top_k == 0 {
            return Err(ConfigError::invalid(field("top_k"), "must be at least 1"));
        }
        self.head.validate(&field("head"))
    }
}

impl HeadConfig {
    fn validate(&self, at: &str) -> Result<(), ConfigError> {
        match self {
            HeadConfig::Checkpoint => Ok(()),
            HeadConfig::Trained(t) if t.dir.as_os_str().is_empty() => Err(ConfigError::invalid(
                format!("{at}.dir"),
                "must name a folder",
            )),
            HeadConfig::Trained(_) => Ok(()),
            HeadConfig::FewShot {
                labels,
                temperature,
            } => {
                if !(temperature.is_finite() && *temperature > 0.0) {
                    return Err(ConfigError::invalid(
                        format!("{at}.temperature"),
                        format!("{temperature} must be a positive number"),
                    ));
                }
                if labels.len() < 2 {
                    return Err(ConfigError::invalid(
                        format!("{at}.labels"),
                        format!(
                            "a few-shot head needs at least 2 labels, got {}",
                            labels.len()
                        ),
                    ));
                }
                let mut seen = std::collections::HashSet::new();
                for (i, l) in labels.iter().enumerate() {
                    if l.label.trim().is_empty() {
                        return Err(ConfigError::invalid(
                            format!("{at}.labels[{i}].label"),
                            "must not be empty",
                        ));
                    }
                    if !seen.insert(l.label.as_str()) {
                        return Err(ConfigError::invalid(
                            format!("{at}.labels[{i}].label"),
                            format!("duplicate label `{}`", l.label),
                        ));
                    }
                    if l.examples.iter().all(|e| e.trim().is_empty()) {
                        return Err(ConfigError::invalid(
                            format!("{at}.labels[{i}].examples"),
                            format!("label `{}` needs at least one non-empty example", l.label),
                        ));
                    }
                }
                Ok(())
            }
        }
    }
}
