//! The mistralrs engine: the only module that uses mistralrs (its API changes between releases).
//!
//! Scoring is one-token multiple choice: the candidates are listed as lettered options and the model's
//! log-probabilities for the option letters at the first generated position give the distribution (one
//! prefill plus one decode step). Generation streams the chat reply.

use std::path::{Path, PathBuf};

use mistralrs::{
    ChatCompletionChunkResponse, GgufModelBuilder, IsqType, Model, RequestBuilder, Response, StopTokens,
    TextMessageRole, TextModelBuilder,
};
use tiergate_queue::{Candidate, Message, Sampling, Usage};

use crate::engine::{Engine, EngineError, Scored};

/// Option letters; a rerank job may carry at most this many candidates.
const LETTERS: &[&str] = &["A", "B", "C", "D", "E", "F", "G", "H", "I", "J"];

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
        other => return Err(EngineError::Invalid(format!("unknown --isq `{other}` (q4_0, q4_1, q5_0, q5_1, q8_0)"))),
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
            return Err(EngineError::Invalid(format!("model {} not found", path.display())));
        }
        let force_cpu = !cfg!(feature = "cuda");
        let model = rt.block_on(async {
            if path.is_file() {
                let dir = path.parent().unwrap_or(Path::new("."));
                let file = path.file_name().and_then(|f| f.to_str()).unwrap_or_default();
                let mut b = GgufModelBuilder::new(dir.to_string_lossy(), vec![file.to_string()])
                    .with_max_num_seqs(opts.max_seqs);
                if force_cpu {
                    b = b.with_force_cpu();
                }
                b.build().await.map_err(failed)
            } else {
                let mut b = TextModelBuilder::new(path.to_string_lossy()).with_max_num_seqs(opts.max_seqs);
                if let Some(q) = &opts.isq {
                    b = b.with_isq(isq_type(q)?);
                }
                if force_cpu {
                    b = b.with_force_cpu();
                }
                b.build().await.map_err(failed)
            }
        })?;
        let name = path.file_name().map_or_else(|| "llm".into(), |n| n.to_string_lossy().into_owned());
        Ok(Self { rt, model, name })
    }
}

fn role(r: &str) -> TextMessageRole {
    match r {
        "system" => TextMessageRole::System,
        "assistant" => TextMessageRole::Assistant,
        _ => TextMessageRole::User,
    }
}

/// The multiple-choice prompt for a rerank job.
pub fn rerank_prompt(text: &str, candidates: &[Candidate]) -> String {
    let mut p = format!("Customer message: \"{}\"\n\nWhich intent does the message express?\n", text.trim());
    for (letter, c) in LETTERS.iter().zip(candidates) {
        let name = c.label.replace(['_', '-'], " ");
        match &c.description {
            Some(d) if !d.trim().is_empty() => p.push_str(&format!("{letter}) {name}: {}\n", d.trim())),
            _ => p.push_str(&format!("{letter}) {name}\n")),
        }
    }
    p.push_str("\nAnswer with the letter only.");
    p
}

impl Engine for MistralEngine {
    fn name(&self) -> &str {
        &self.name
    }

    fn score(&self, text: &str, candidates: &[Candidate]) -> Result<Scored, EngineError> {
        if candidates.is_empty() || candidates.len() > LETTERS.len() {
            return Err(EngineError::Invalid(format!(
                "a rerank job needs 1..={} candidates, got {}",
                LETTERS.len(),
                candidates.len()
            )));
        }
        let request = RequestBuilder::new()
            .add_message(TextMessageRole::System, "You classify customer messages. Reply with one letter.")
            .add_message(TextMessageRole::User, rerank_prompt(text, candidates))
            .return_logprobs(true)
            .set_sampler_topn_logprobs(20)
            .set_sampler_max_len(1)
            .set_deterministic_sampler();
        let response = self.rt.block_on(self.model.send_chat_request(request)).map_err(failed)?;
        let choice = response.choices.first().ok_or_else(|| failed("no choice in the response"))?;
        let top = choice
            .logprobs
            .as_ref()
            .and_then(|l| l.content.as_ref())
            .and_then(|c| c.first())
            .map(|first| first.top_logprobs.clone())
            .unwrap_or_default();
        let mut logits = vec![f32::NEG_INFINITY; candidates.len()];
        for t in &top {
            let token = t.bytes.as_deref().unwrap_or("").trim().trim_end_matches(')');
            if let Some(i) = LETTERS.iter().take(candidates.len()).position(|l| *l == token) {
                logits[i] = logits[i].max(t.logprob);
            }
        }
        // Letters outside the top-20 get a floor below the smallest one seen.
        let floor = logits.iter().copied().filter(|v| v.is_finite()).fold(0.0f32, f32::min) - 5.0;
        let max = logits.iter().map(|v| if v.is_finite() { *v } else { floor }).fold(f32::MIN, f32::max);
        let exps: Vec<f32> = logits.iter().map(|v| ((if v.is_finite() { *v } else { floor }) - max).exp()).collect();
        let sum: f32 = exps.iter().sum();
        Ok(Scored {
            probs: exps.iter().map(|e| e / sum).collect(),
            prompt_tokens: response.usage.prompt_tokens as u32,
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
        let mut request = RequestBuilder::new().set_sampler_max_len(sampling.max_tokens.max(1) as usize);
        for m in messages {
            request = request.add_message(role(&m.role), &m.content);
        }
        match sampling.temperature {
            Some(t) if t <= 0.0 => request = request.set_deterministic_sampler(),
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
            let mut stream = self.model.stream_chat_request(request).await.map_err(failed)?;
            let mut usage = Usage { prompt_tokens: 0, completion_tokens: 0, finish_reason: "stop".into() };
            let mut sent = 0u32;
            while let Some(event) = stream.next().await {
                match event {
                    Response::Chunk(ChatCompletionChunkResponse { choices, usage: u, .. }) => {
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
                    Response::InternalError(e) | Response::ValidationError(e) => return Err(failed(e)),
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
