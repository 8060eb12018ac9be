//! The mistralrs engine: the only module that uses mistralrs (its API changes between releases).
//!
//! mistralrs streams generated replies and tokenises text for the scorer; candidate scoring runs on our own
//! forward ([`crate::scoring`]), because mistralrs 0.8.1 gives raw logits only for a batch of one and no
//! prompt log-probabilities, so it would need one prefill per candidate.

mod chat;

use std::path::{Path, PathBuf};

use either::Either;
use mistralrs::{
    ChatCompletionChunkResponse, Constraint, GgufModelBuilder, IsqType, Model, RequestBuilder,
    Response, StopTokens, TextModelBuilder,
};
use tiergate_queue::{Candidate, Message, Sampling, ToolCall, Tools, Usage};

use tiergate_config::PromptConfig;

use crate::engine::{Engine, EngineError, Piece, Scored};
use crate::llama::WeightFormat;
use crate::scoring::{Scorer, Tokenize};

/// How to load the model.
#[derive(Debug, Clone)]
pub struct LlmOptions {
    /// A `.gguf` file, or a Hugging Face model folder.
    pub model: PathBuf,
    /// In-situ quantisation for a Hugging Face folder (e.g. `q8_0`, `q4_1`).
    pub isq: Option<String>,
    /// Sequences the engine batches together.
    pub max_seqs: usize,
    /// Arithmetic of the scoring forward.
    pub scoring_weights: WeightFormat,
    /// Bytes of cached label prefixes.
    pub prefix_cache_bytes: usize,
    /// The scoring profile (`config/models/profiles.toml`); empty: matched by the model's file name.
    pub profile: String,
}

/// A loaded mistralrs model with its own tokio runtime (the job loop is plain threads).
pub struct MistralEngine {
    rt: tokio::runtime::Runtime,
    model: Model,
    name: String,
    scorer: Option<Scorer>,
}

fn failed(e: impl std::fmt::Display) -> EngineError {
    EngineError::Failed(e.to_string())
}

fn isq_type(s: &str) -> Result<IsqType, EngineError> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "q4_0" => IsqType::Q4_0,
        "q4_1" => IsqType::Q4_1,
        "q5_0" => IsqType::Q5_0,
        "q5_1" => IsqType::Q5_1,
        "q8_0" => IsqType::Q8_0,
        other => {
            return Err(EngineError::Invalid(format!(
                "unknown --isq `{other}` (q4_0, q4_1, q5_0, q5_1, q8_0)"
            )))
        }
    })
}

impl MistralEngine {
    /// The scorer's batching (choice and channel jobs) so far: (forwards, jobs); (0, 0) without a scoring
    /// model.
    pub fn batching(&self) -> (u64, u64) {
        self.scorer.as_ref().map_or((0, 0), Scorer::batching)
    }

    /// Loads the model (CPU unless built with the `cuda` feature).
    pub fn load(opts: &LlmOptions) -> Result<Self, EngineError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(failed)?;
        let path = &opts.model;
        if !path.exists() {
            return Err(EngineError::Invalid(format!(
                "model {} not found",
                path.display()
            )));
        }
        let force_cpu = !cfg!(feature = "cuda");
        let model = rt.block_on(async {
            if path.is_file() {
                let dir = path.parent().unwrap_or(Path::new("."));
                let file = path
                    .file_name()
                    .and_then(|f| f.to_str())
                    .unwrap_or_default();
                // No prefix cache (scoring does not use it: it runs on our own forward). mistralrs 0.8.1 keeps
                // every finished sequence's KV cache on CPU and never evicts one (its eviction counts only caches
                // on an accelerator): with it on, a worker grew 11.3 MiB a generation (SmolLM2-135M, 60
                // requests, 898 → 1,588 MiB) while a 2-turn tool call took 27 s instead of 62 (Qwen 0.5B).
                let mut b = GgufModelBuilder::new(dir.to_string_lossy(), vec![file.to_string()])
                    .with_max_num_seqs(opts.max_seqs)
                    .with_prefix_cache_n(None);
                if force_cpu {
                    b = b.with_force_cpu();
                }
                b.build().await.map_err(failed)
            } else {
                let mut b = TextModelBuilder::new(path.to_string_lossy())
                    .with_max_num_seqs(opts.max_seqs)
                    .with_prefix_cache_n(None);
                if let Some(q) = &opts.isq {
                    b = b.with_isq(isq_type(q)?);
                }
                if force_cpu {
                    b = b.with_force_cpu();
                }
                b.build().await.map_err(failed)
            }
        })?;
        let name = path
            .file_name()
            .map_or_else(|| "llm".into(), |n| n.to_string_lossy().into_owned());
        let scorer = if path.is_file() {
            Some(crate::scoring::gguf_scorer(
                path,
                opts.scoring_weights,
                opts.prefix_cache_bytes,
                &opts.profile,
            )?)
        } else {
            None
        };
        Ok(Self {
            rt,
            model,
            name,
            scorer,
        })
    }
}

impl Tokenize for MistralEngine {
    fn encode(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        self.rt.block_on(async {
            self.model
                .tokenize(Either::Right(text.to_string()), None, false, false, None)
                .await
                .map_err(failed)
        })
    }
}

impl Engine for MistralEngine {
    fn name(&self) -> &str {
        &self.name
    }

    /// One-pass scoring on our own forward over the same GGUF ([`crate::scoring`]), tokenised by mistralrs.
    fn score(
        &self,
        text: &str,
        candidates: &[Candidate],
        prompt: &PromptConfig,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Scored, EngineError> {
        crate::scoring::score_checked(
            self.scorer.as_ref(),
            self,
            text,
            candidates,
            prompt,
            cancelled,
        )
    }

    fn generate(
        &self,
        messages: &[Message],
        sampling: &Sampling,
        tools: Option<&Tools>,
        on_piece: &mut dyn FnMut(Piece<'_>) -> bool,
    ) -> Result<Usage, EngineError> {
        if messages.is_empty() {
            return Err(EngineError::Invalid("no messages".into()));
        }
        let request = chat::Chat::new(messages, sampled(sampling), tools)?;
        let parallel = tools.is_some_and(|t| t.parallel);
        self.rt.block_on(async {
            let mut stream = self
                .model
                .stream_chat_request(request)
                .await
                .map_err(failed)?;
            let mut usage = Usage {
                prompt_tokens: 0,
                completion_tokens: 0,
                cached_tokens: None,
                finish_reason: "stop".into(),
                stop_sequence: None,
            };
            let (mut sent, mut calls) = (0u32, 0usize);
            while let Some(event) = stream.next().await {
                match event {
                    Response::Chunk(ChatCompletionChunkResponse {
                        choices, usage: u, ..
                    }) => {
                        if let Some(c) = choices.first() {
                            let text = c.delta.content.as_deref().filter(|t| !t.is_empty());
                            let called = c.delta.tool_calls.iter().flatten().map(|t| ToolCall {
                                id: t.id.clone(),
                                name: t.function.name.clone(),
                                arguments: t.function.arguments.clone(),
                            });
                            // Without parallel calls, the first call is the turn's one call.
                            let room = if parallel {
                                usize::MAX
                            } else {
                                usize::from(calls == 0)
                            };
                            let called = called.take(room);
                            let pieces: Vec<Piece<'_>> = text
                                .map(Piece::Text)
                                .into_iter()
                                .chain(called.map(Piece::Call))
                                .collect();
                            for p in pieces {
                                calls += usize::from(matches!(p, Piece::Call(_)));
                                sent += 1;
                                if !on_piece(p) {
                                    usage.finish_reason = "cancelled".into();
                                    return Ok(usage);
                                }
                            }
                            if let Some(r) = &c.finish_reason {
                                usage.finish_reason = r.clone();
                            }
                        }
                        if let Some(u) = u {
                            usage.prompt_tokens = u.prompt_tokens as u32;
                            usage.completion_tokens = u.completion_tokens as u32;
                        }
                    }
                    Response::Done(done) => {
                        usage.prompt_tokens = done.usage.prompt_tokens as u32;
                        usage.completion_tokens = done.usage.completion_tokens as u32;
                        break;
                    }
                    Response::InternalError(e) | Response::ValidationError(e) => {
                        return Err(failed(e))
                    }
                    Response::ModelError(m, _) => return Err(failed(m)),
                    _ => {}
                }
            }
            if usage.completion_tokens == 0 {
                usage.completion_tokens = sent;
            }
            if calls > 0 {
                usage.finish_reason = "tool_calls".into();
            }
            Ok(usage)
        })
    }
}

/// The sampling of a generation as mistralrs takes it.
fn sampled(sampling: &Sampling) -> RequestBuilder {
    let max_len = sampling.max_tokens.max(1) as usize;
    let mut request = RequestBuilder::new().set_sampler_max_len(max_len);
    match sampling.temperature {
        // The deterministic sampler resets all sampling parameters: restore the length after it.
        Some(t) if t <= 0.0 => {
            request = request
                .set_deterministic_sampler()
                .set_sampler_max_len(max_len)
        }
        Some(t) => request = request.set_sampler_temperature(f64::from(t)),
        None => {}
    }
    if let Some(p) = sampling.top_p {
        request = request.set_sampler_topp(f64::from(p));
    }
    if !sampling.stop.is_empty() {
        request = request.set_sampler_stop_toks(StopTokens::Seqs(sampling.stop.clone()));
    }
    // A schema the server validated as a JSON object; text that does not parse is left unconstrained.
    if let Some(schema) = sampling
        .json_schema
        .as_deref()
        .and_then(|s| serde_json::from_str(s).ok())
    {
        request = request.set_constraint(Constraint::JsonSchema(schema));
    }
    request
}
