//! The mistralrs engine: the only module that uses mistralrs (its API changes between releases).
//!
//! Scoring is candidate log-likelihood after a fixed prompt (prefill only, one pass per candidate, sent
//! one after the other). Generation streams the chat reply.

use std::path::{Path, PathBuf};

use either::Either;
use mistralrs::core::{RequestMessage, ResponseOk};
use mistralrs::{
    ChatCompletionChunkResponse, Constraint, GgufModelBuilder, IsqType, Model, NormalRequest,
    Request, RequestBuilder, Response, SamplingParams, StopTokens, TextMessageRole, TextMessages,
    TextModelBuilder,
};
use tiergate_queue::{Candidate, Message, Sampling, Usage};

use crate::engine::{Engine, EngineError, Scored};
use crate::fusion::normalise;

/// Most candidates per rerank job.
const MAX_CANDIDATES: usize = 10;

/// Longest wait for mistralrs to retire a scored sequence before the next one is sent.
const RETIRE_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// How to load the model.
#[derive(Debug, Clone)]
pub struct LlmOptions {
    /// A `.gguf` file, or a Hugging Face model folder.
    pub model: PathBuf,
    /// In-situ quantisation for a Hugging Face folder (e.g. `q8_0`, `q4_1`).
    pub isq: Option<String>,
    /// Sequences the engine batches together.
    pub max_seqs: usize,
}

/// A loaded mistralrs model with its own tokio runtime (the job loop is plain threads).
pub struct MistralEngine {
    rt: tokio::runtime::Runtime,
    model: Model,
    name: String,
    raw_lock: tokio::sync::Mutex<()>,
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
                // No prefix cache: a cached prefix would drop the logits scoring needs.
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
        Ok(Self {
            rt,
            model,
            name,
            raw_lock: tokio::sync::Mutex::new(()),
        })
    }
}

fn role(r: &str) -> TextMessageRole {
    match r {
        "system" => TextMessageRole::System,
        "assistant" => TextMessageRole::Assistant,
        _ => TextMessageRole::User,
    }
}

/// The prompt a candidate label is scored after.
pub fn rerank_prompt(text: &str) -> String {
    format!(
        "Customer message: \"{}\"\nIn a few words, what does the customer want?",
        text.trim()
    )
}

/// Mean log-probability of the last `n` tokens of `tokens` under the logits of the positions before them.
fn label_mean_logprob(
    chunks: &[mistralrs::Tensor],
    tokens: &[u32],
    n: usize,
) -> Result<f32, EngineError> {
    let logits = mistralrs::Tensor::cat(chunks, 0)
        .and_then(|t| t.to_dtype(mistralrs::DType::F32))
        .and_then(|t| t.to_device(&mistralrs::Device::Cpu))
        .map_err(failed)?;
    // The rows are the logits of the last `rows` positions (all of them unless a cached prefix was skipped).
    let rows = logits.dims().first().copied().unwrap_or(0);
    let len = tokens.len();
    if n == 0 || n >= len || rows < n + 1 || rows > len {
        return Err(failed(format!(
            "raw logits have {rows} rows for {len} tokens ({n} scored)"
        )));
    }
    let offset = len - rows;
    let mut total = 0f32;
    for (j, &token) in tokens.iter().enumerate().skip(len - n) {
        let row: Vec<f32> = logits
            .get(j - 1 - offset)
            .and_then(|r| r.to_vec1::<f32>())
            .map_err(failed)?;
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let lse = row.iter().map(|v| (v - max).exp()).sum::<f32>().ln() + max;
        total += row
            .get(token as usize)
            .copied()
            .ok_or_else(|| failed("token id outside the vocabulary"))?
            - lse;
    }
    Ok(total / n as f32)
}

impl Engine for MistralEngine {
    fn name(&self) -> &str {
        &self.name
    }

    /// Candidate log-likelihood: for each candidate, one prefill of `prompt ++ label` with raw logits, scoring
    /// the label's tokens (mean log-probability per token, so long labels are not penalised). The requests
    /// run one after the other (mistralrs gives raw logits for a batch of one only); the shared prompt prefix is
    /// the same token sequence for all of them. Probabilities: softmax of the means.
    fn score(
        &self,
        text: &str,
        candidates: &[Candidate],
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Scored, EngineError> {
        if candidates.is_empty() || candidates.len() > MAX_CANDIDATES {
            return Err(EngineError::Invalid(format!(
                "a rerank job needs 1..={MAX_CANDIDATES} candidates, got {}",
                candidates.len()
            )));
        }
        self.rt.block_on(async {
            let prompt = TextMessages::new()
                .add_message(
                    TextMessageRole::System,
                    "You name the intent of customer messages to a bank.",
                )
                .add_message(TextMessageRole::User, rerank_prompt(text));
            let prefix = self
                .model
                .tokenize(Either::Left(prompt), None, true, true, None)
                .await
                .map_err(failed)?;
            let runner = self.model.inner();
            let mut pending = Vec::with_capacity(candidates.len());
            for c in candidates {
                let label = format!("{}.", c.label.replace(['_', '-'], " "));
                let cand = self
                    .model
                    .tokenize(Either::Right(label), None, false, false, None)
                    .await
                    .map_err(failed)?;
                if cand.is_empty() {
                    return Err(EngineError::Invalid(format!(
                        "label `{}` has no tokens",
                        c.label
                    )));
                }
                let tokens: Vec<u32> = prefix.iter().chain(cand.iter()).copied().collect();
                let (tx, rx) = tokio::sync::mpsc::channel(1);
                let request = Request::Normal(Box::new(NormalRequest {
                    messages: RequestMessage::CompletionTokens(tokens),
                    sampling_params: SamplingParams {
                        max_len: Some(0),
                        ..SamplingParams::deterministic()
                    },
                    response: tx,
                    return_logprobs: false,
                    is_streaming: false,
                    id: 0,
                    constraint: Constraint::None,
                    suffix: None,
                    tools: None,
                    tool_choice: None,
                    logits_processors: None,
                    return_raw_logits: true,
                    web_search_options: None,
                    model_id: None,
                    truncate_sequence: false,
                }));
                pending.push((request, rx, cand.len()));
            }
            // mistralrs returns raw logits only for a batch of one: score one sequence at a time, and one job
            // at a time (the lock), so two concurrent rerank jobs are never batched together.
            let _one_at_a_time = self.raw_lock.lock().await;
            let mut means = Vec::with_capacity(pending.len());
            for (request, mut rx, n) in pending {
                if cancelled() {
                    return Err(EngineError::Cancelled);
                }
                runner
                    .get_sender(None)
                    .map_err(failed)?
                    .send(request)
                    .await
                    .map_err(failed)?;
                let response = rx
                    .recv()
                    .await
                    .ok_or_else(|| failed("engine closed the response channel"))?;
                let ResponseOk::Raw {
                    logits_chunks,
                    tokens,
                } = response.as_result().map_err(|e| failed(format!("{e:?}")))?
                else {
                    return Err(failed("expected raw logits"));
                };
                means.push(label_mean_logprob(&logits_chunks, &tokens, n)?);
                // mistralrs answers before it retires the sequence; a request sent in between can be
                // scheduled with it, and a raw-logits step with two sequences fails ("Raw response only
                // supports batch size of 1"), killing the engine. Its responder is dropped when the sequence
                // is freed: wait for that (bounded) before the next candidate.
                let _ =
                    tokio::time::timeout(RETIRE_WAIT, async { while rx.recv().await.is_some() {} })
                        .await;
            }
            let max = means.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let exps: Vec<f32> = means.iter().map(|m| (m - max).exp()).collect();
            Ok(Scored {
                probs: normalise(&exps),
                prompt_tokens: prefix.len() as u32,
            })
        })
    }

    fn generate(
        &self,
        messages: &[Message],
        sampling: &Sampling,
        on_token: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Usage, EngineError> {
        if messages.is_empty() {
            return Err(EngineError::Invalid("no messages".into()));
        }
        let mut request =
            RequestBuilder::new().set_sampler_max_len(sampling.max_tokens.max(1) as usize);
        for m in messages {
            request = request.add_message(role(&m.role), &m.content);
        }
        match sampling.temperature {
            // The deterministic sampler resets all sampling parameters: restore the length after it.
            Some(t) if t <= 0.0 => {
                request = request
                    .set_deterministic_sampler()
                    .set_sampler_max_len(sampling.max_tokens.max(1) as usize)
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
        self.rt.block_on(async {
            let mut stream = self
                .model
                .stream_chat_request(request)
                .await
                .map_err(failed)?;
            let mut usage = Usage {
                prompt_tokens: 0,
                completion_tokens: 0,
                finish_reason: "stop".into(),
            };
            let mut sent = 0u32;
            while let Some(event) = stream.next().await {
                match event {
                    Response::Chunk(ChatCompletionChunkResponse {
                        choices, usage: u, ..
                    }) => {
                        if let Some(c) = choices.first() {
                            if let Some(text) = c.delta.content.as_deref() {
                                if !text.is_empty() {
                                    sent += 1;
                                    if !on_token(text) {
                                        usage.finish_reason = "cancelled".into();
                                        break;
                                    }
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
            Ok(usage)
        })
    }
}
