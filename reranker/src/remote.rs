//! `reranker.engine = "openai"`: the worker talks to an OpenAI-compatible server (vLLM, TGI, SGLang, llama.cpp
//! server, Ollama, a hosted API) instead of loading a model. The shared-memory queue stays the server's only
//! path to the LLM side; this worker holds many upstream requests in flight on one pooled async client.
//!
//! - rerank: one multiple-choice question per candidate order (the route's `choice_prompt`, options as
//!   single-token letters, the same text the local engine puts in its chat template: `prompt::choice_question`),
//!   `max_tokens: 1`, `temperature: 0`, `logprobs` with `top_logprobs`; the letters' log-probabilities are
//!   renormalised over the letters (a letter missing from the top list is floored at the lowest one
//!   returned). The orders are the local engine's cyclic shifts (`prompt::choice_orders`; examples and order
//!   count from the route, or under `auto` from the profile matching the upstream's model name), asked at
//!   once and averaged per candidate, which cancels the letter-position bias of small models.
//! - generate: a streamed chat completion relayed token chunk by token chunk, usage at the end.
//! - failures: connection errors, timeouts, 429/503 and malformed answers fail that job with a message that
//!   says which (the server degrades it); the job's deadline bounds every request, and within it an upstream
//!   that accepts and never answers fails after `first_byte_timeout_ms`, one that stops mid-stream after
//!   `chunk_timeout_ms` without a chunk (each a failure the server's breaker counts).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};
use tiergate_config::{ModelProfile, PromptConfig};
use tiergate_queue::{Candidate, Message, Sampling, ToolCall, ToolChoice, Tools, Usage};

use crate::engine::{EngineError, Piece, Scored};
use crate::serve::GenerationSlots;

/// How to reach the upstream.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// Base URL up to and including `/v1`.
    pub url: String,
    /// The upstream's model name.
    pub model: String,
    /// Bearer key, if any.
    pub api_key: Option<String>,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// Timeout of one request.
    pub request_timeout: Duration,
    /// The upstream's response headers within this.
    pub first_byte_timeout: Duration,
    /// A streamed answer's next chunk within this.
    pub chunk_timeout: Duration,
    /// Requests in flight at most.
    pub max_in_flight: usize,
    /// `top_logprobs` asked for (TGI allows 5 by default, OpenAI and vLLM 20).
    pub top_logprobs: usize,
    /// What `method = "auto"` means for this upstream (examples per option, option orders).
    pub profile: ModelProfile,
}

/// The remote engine: a pooled client and the options.
#[derive(Clone)]
pub struct RemoteEngine {
    client: reqwest::Client,
    opts: Arc<RemoteOptions>,
}

use crate::prompt::{self, LETTERS};

impl RemoteEngine {
    /// A client for `opts` (no request is made yet).
    pub fn new(opts: RemoteOptions) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder()
            .connect_timeout(opts.connect_timeout)
            .timeout(opts.request_timeout)
            .pool_max_idle_per_host(opts.max_in_flight)
            .build()?;
        Ok(Self {
            client,
            opts: Arc::new(opts),
        })
    }

    /// POST `body` to `{url}/chat/completions`; a non-2xx status is an error naming it.
    async fn post(&self, body: &Value) -> Result<reqwest::Response, EngineError> {
        let url = format!("{}/chat/completions", self.opts.url.trim_end_matches('/'));
        let mut req = self.client.post(&url).json(body);
        if let Some(k) = &self.opts.api_key {
            req = req.bearer_auth(k);
        }
        let first = self.opts.first_byte_timeout;
        let resp = tokio::time::timeout(first, req.send())
            .await
            .map_err(|_| {
                EngineError::Failed(format!(
                    "the upstream sent no answer within {} ms (first_byte_timeout_ms)",
                    first.as_millis()
                ))
            })?
            .map_err(|e| transport_error(&e))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let text = resp.text().await.unwrap_or_default();
        let text: String = text.chars().take(300).collect();
        Err(EngineError::Failed(match status.as_u16() {
            429 | 503 => format!("upstream busy ({status}): {text}"),
            _ => format!("upstream answered {status}: {text}"),
        }))
    }

    /// Scores `candidates` for `text`: the letters' log-probabilities in the cyclic orders, averaged.
    pub async fn score(
        &self,
        text: &str,
        candidates: &[Candidate],
        prompt: &PromptConfig,
    ) -> Result<Scored, EngineError> {
        let k = candidates.len();
        if k == 0 || k > LETTERS.len() {
            return Err(EngineError::Invalid(format!(
                "{k} candidates: the multiple-choice prompt takes 1 to {}",
                LETTERS.len()
            )));
        }
        // Under `auto` the upstream's profile gives examples and orders; the question is always a choice.
        let f = self.opts.profile.resolve(prompt);
        let (examples, orders) = (f.examples, f.orders);
        let orders = prompt::choice_orders(k, orders);
        let asked = futures_util::future::join_all(
            orders
                .iter()
                .map(|o| self.choice(text, candidates, prompt, o, examples)),
        )
        .await;
        let mut letter_lp = Vec::with_capacity(orders.len());
        let mut prompt_tokens = 0;
        for a in asked {
            let (lp, t) = a?;
            letter_lp.push(lp);
            prompt_tokens += t;
        }
        Ok(Scored {
            scores: prompt::average_over_orders(&orders, &letter_lp, &vec![0.0; k], k),
            prompt_tokens,
        })
    }

    /// One multiple-choice question with the candidates in `order`; returns the log-probability of each
    /// letter position (renormalised over the letters) and the prompt tokens.
    async fn choice(
        &self,
        text: &str,
        candidates: &[Candidate],
        prompt: &PromptConfig,
        order: &[usize],
        examples: usize,
    ) -> Result<(Vec<f32>, u32), EngineError> {
        let content = prompt::choice_question(text, candidates, order, prompt, examples);
        let body = json!({
            "model": self.opts.model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 1,
            "temperature": 0,
            "logprobs": true,
            "top_logprobs": self.opts.top_logprobs,
        });
        let v: Value = self
            .post(&body)
            .await?
            .json()
            .await
            .map_err(|e| EngineError::Failed(format!("malformed upstream answer: {e}")))?;
        let by_pos = letter_logprobs(&v, order.len())?;
        let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap_or(0) as u32;
        Ok((by_pos, prompt_tokens))
    }

    /// A streamed chat completion; `on_piece` gets each text chunk and each whole tool call (an upstream
    /// streams a call's arguments in fragments: they are joined, and the call handed on when the upstream
    /// ends the turn) and returns false to stop.
    pub async fn generate(
        &self,
        messages: &[Message],
        sampling: &Sampling,
        tools: Option<&Tools>,
        on_piece: &mut (dyn FnMut(Piece<'_>) -> bool + Send),
    ) -> Result<Usage, EngineError> {
        let mut body = json!({
            "model": self.opts.model,
            "messages": messages.iter().map(wire_message).collect::<Vec<_>>(),
            "max_tokens": sampling.max_tokens,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if let Some(t) = tools.filter(|t| !t.list.is_empty()) {
            wire_tools(&mut body, t)?;
        }
        if let Some(t) = sampling.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(p) = sampling.top_p {
            body["top_p"] = json!(p);
        }
        if !sampling.stop.is_empty() {
            body["stop"] = json!(sampling.stop);
        }
        if let Some(s) = sampling.seed {
            body["seed"] = json!(s);
        }
        if let Some(schema) = &sampling.json_schema {
            let schema: Value = serde_json::from_str(schema)
                .map_err(|e| EngineError::Invalid(format!("json_schema: {e}")))?;
            body["response_format"] = json!({"type": "json_schema",
                "json_schema": {"name": "response", "schema": schema, "strict": true}});
        }
        let resp = self.post(&body).await?;
        let mut usage = Usage {
            prompt_tokens: 0,
            completion_tokens: 0,
            cached_tokens: None,
            finish_reason: "stop".into(),
            stop_sequence: None,
        };
        let mut stream = resp.bytes_stream();
        let mut buf = Vec::new();
        let mut sent = 0u32;
        let mut calls = Calls::default();
        let idle = self.opts.chunk_timeout;
        while let Some(bytes) = tokio::time::timeout(idle, stream.next())
            .await
            .map_err(|_| {
                EngineError::Failed(format!(
                    "the upstream stopped mid-stream: no chunk within {} ms (chunk_timeout_ms)",
                    idle.as_millis()
                ))
            })?
        {
            buf.extend_from_slice(&bytes.map_err(|e| transport_error(&e))?);
            while let Some(end) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=end).collect();
                let line = String::from_utf8_lossy(&line);
                let Some(data) = line.trim().strip_prefix("data:") else {
                    continue;
                };
                let data = data.trim();
                if data == "[DONE]" {
                    return Ok(calls.hand_on(usage, sent, on_piece));
                }
                let v: Value = serde_json::from_str(data).map_err(|e| {
                    EngineError::Failed(format!("malformed upstream stream event: {e}"))
                })?;
                calls.add(&v["choices"][0]["delta"]["tool_calls"]);
                if let Some(text) = v["choices"][0]["delta"]["content"].as_str() {
                    if !text.is_empty() {
                        sent += 1;
                        if !on_piece(Piece::Text(text)) {
                            usage.finish_reason = "cancelled".into();
                            return Ok(finish(usage, sent));
                        }
                    }
                }
                if let Some(r) = v["choices"][0]["finish_reason"].as_str() {
                    usage.finish_reason = r.to_string();
                }
                if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                    usage.prompt_tokens = u["prompt_tokens"].as_u64().unwrap_or(0) as u32;
                    usage.completion_tokens = u["completion_tokens"].as_u64().unwrap_or(0) as u32;
                    // What the upstream's prompt cache held (vLLM, llama.cpp's server, OpenAI say it).
                    usage.cached_tokens = u["prompt_tokens_details"]["cached_tokens"]
                        .as_u64()
                        .map(|c| c as u32);
                }
            }
        }
        Err(EngineError::Failed(
            "upstream stream ended without [DONE]".into(),
        ))
    }
}

/// A message as an OpenAI-compatible upstream reads it.
fn wire_message(m: &Message) -> Value {
    let mut out = json!({"role": m.role, "content": m.content});
    if !m.tool_calls.is_empty() {
        out["tool_calls"] = m
            .tool_calls
            .iter()
            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
    }
    if let Some(id) = &m.tool_call_id {
        out["tool_call_id"] = json!(id);
    }
    out
}

/// The functions and the choice, as an OpenAI-compatible upstream reads them.
fn wire_tools(body: &mut Value, t: &Tools) -> Result<(), EngineError> {
    let mut list = Vec::with_capacity(t.list.len());
    for tool in &t.list {
        let parameters: Value = serde_json::from_str(&tool.parameters).map_err(|e| {
            EngineError::Invalid(format!("the parameters of tool `{}`: {e}", tool.name))
        })?;
        list.push(json!({"type": "function", "function": {
            "name": tool.name, "description": tool.description, "parameters": parameters}}));
    }
    body["tools"] = Value::Array(list);
    body["tool_choice"] = match &t.choice {
        ToolChoice::Auto => json!("auto"),
        ToolChoice::None => json!("none"),
        ToolChoice::Required => json!("required"),
        ToolChoice::Function(name) => json!({"type": "function", "function": {"name": name}}),
    };
    body["parallel_tool_calls"] = json!(t.parallel);
    Ok(())
}

/// Tool calls streamed by an upstream: by index, the id and name from their first fragment, the arguments
/// joined.
#[derive(Default)]
struct Calls {
    by_index: std::collections::BTreeMap<u64, ToolCall>,
}

impl Calls {
    fn add(&mut self, deltas: &Value) {
        for (i, d) in deltas.as_array().into_iter().flatten().enumerate() {
            let index = d["index"].as_u64().unwrap_or(i as u64);
            let c = self.by_index.entry(index).or_insert_with(|| ToolCall {
                id: String::new(),
                name: String::new(),
                arguments: String::new(),
            });
            if let Some(id) = d["id"].as_str().filter(|s| !s.is_empty()) {
                c.id = id.to_string();
            }
            if let Some(name) = d["function"]["name"].as_str().filter(|s| !s.is_empty()) {
                c.name = name.to_string();
            }
            if let Some(a) = d["function"]["arguments"].as_str() {
                c.arguments.push_str(a);
            }
        }
    }

    /// Hands the whole calls on at the end of the turn; the usage says `tool_calls` when there were any.
    fn hand_on(
        self,
        mut usage: Usage,
        sent: u32,
        on_piece: &mut (dyn FnMut(Piece<'_>) -> bool + Send),
    ) -> Usage {
        let any = !self.by_index.is_empty();
        for (i, mut c) in self.by_index {
            if c.id.is_empty() {
                c.id = format!("call_{i}");
            }
            if !on_piece(Piece::Call(c)) {
                usage.finish_reason = "cancelled".into();
                return finish(usage, sent);
            }
        }
        if any {
            usage.finish_reason = "tool_calls".into();
        }
        finish(usage, sent)
    }
}

/// Usage with the completion count filled from the chunks when the upstream sent none.
fn finish(mut usage: Usage, sent: u32) -> Usage {
    if usage.completion_tokens == 0 {
        usage.completion_tokens = sent;
    }
    usage
}

/// What a transport error means to an operator.
fn transport_error(e: &reqwest::Error) -> EngineError {
    EngineError::Failed(if e.is_timeout() {
        format!("upstream timed out: {e}")
    } else if e.is_connect() {
        format!("upstream unreachable: {e}")
    } else {
        format!("upstream connection failed: {e}")
    })
}

/// Log-probabilities of the first `k` option letters at the first generated position, renormalised over the
/// letters. A letter not among the returned tokens gets the lowest returned log-probability.
pub fn letter_logprobs(v: &Value, k: usize) -> Result<Vec<f32>, EngineError> {
    let top = v["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        .as_array()
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            EngineError::Failed(
                "upstream answer has no top_logprobs (does it support logprobs?)".into(),
            )
        })?;
    let mut best: HashMap<u8, f32> = HashMap::new();
    let mut floor = f32::INFINITY;
    for t in top {
        let (Some(tok), Some(lp)) = (t["token"].as_str(), t["logprob"].as_f64()) else {
            return Err(EngineError::Failed(format!(
                "malformed top_logprobs entry: {t}"
            )));
        };
        let lp = lp as f32;
        if !lp.is_finite() {
            continue;
        }
        floor = floor.min(lp);
        let tok = tok.trim().trim_end_matches(')');
        if let [c] = tok.as_bytes() {
            let c = c.to_ascii_uppercase();
            let e = best.entry(c).or_insert(f32::NEG_INFINITY);
            *e = e.max(lp);
        }
    }
    if !floor.is_finite() {
        return Err(EngineError::Failed(
            "no finite log-probability in the answer".into(),
        ));
    }
    let raw: Vec<f32> = LETTERS[..k]
        .iter()
        .map(|l| best.get(l).copied().unwrap_or(floor))
        .collect();
    let lse = crate::scoring::log_sum_exp(&raw);
    Ok(raw.iter().map(|x| x - lse).collect())
}

/// The remote engine runs a job against its upstream; the job's deadline bounds the whole exchange.
impl crate::serve::Runner for RemoteEngine {
    async fn score(
        &self,
        text: &str,
        candidates: &[Candidate],
        prompt: &PromptConfig,
        _cancelled: &(dyn Fn() -> bool + Sync),
        left: Option<Duration>,
    ) -> Result<Scored, EngineError> {
        let left = left.unwrap_or(Duration::from_secs(3600));
        tokio::time::timeout(left, RemoteEngine::score(self, text, candidates, prompt))
            .await
            .unwrap_or_else(|_| {
                Err(EngineError::Failed(
                    "deadline passed while waiting for the upstream".into(),
                ))
            })
    }

    async fn generate(
        &self,
        messages: &[Message],
        sampling: &Sampling,
        tools: Option<&Tools>,
        on_piece: &mut (dyn FnMut(Piece<'_>) -> bool + Send),
        left: Option<Duration>,
    ) -> Result<Usage, EngineError> {
        let left = left.unwrap_or(Duration::from_secs(3600));
        tokio::time::timeout(
            left,
            RemoteEngine::generate(self, messages, sampling, tools, on_piece),
        )
        .await
        .unwrap_or_else(|_| {
            Err(EngineError::Failed(
                "deadline passed while the upstream was generating".into(),
            ))
        })
    }
}

/// Serves jobs from the queue against the upstream until the server goes away: one thread takes jobs while
/// fewer than `max_in_flight` run; each runs as a task on a small runtime (generations may take all places but
/// one, so a rerank always finds one).
pub fn serve_remote(
    worker: tiergate_queue::QueueWorker,
    engine: RemoteEngine,
    heartbeat: Duration,
) -> anyhow::Result<i32> {
    let worker = Arc::new(worker);
    crate::serve::start_heartbeat(&worker, heartbeat)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let cap = engine.opts.max_in_flight.max(2);
    let places = Arc::new(tokio::sync::Semaphore::new(cap));
    let generations = Arc::new(GenerationSlots::new(cap - 1));
    worker.set_ready(true);
    tracing::info!(upstream = %engine.opts.url, model = %engine.opts.model, cap, "worker ready (openai engine)");
    while !worker.shutdown_requested() {
        let place = rt.block_on(places.clone().acquire_owned())?;
        let Some((taken, generating)) = generations.take(&worker) else {
            continue;
        };
        let (engine, generations) = (engine.clone(), generations.clone());
        rt.spawn(async move {
            crate::serve::dispatch(&engine, taken).await;
            generations.release(generating);
            drop(place);
        });
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn letters_are_renormalised_and_missing_ones_floored() {
        let v = json!({"choices": [{"logprobs": {"content": [{"token": "A", "logprob": -0.5, "top_logprobs": [
            {"token": "A", "logprob": -0.5},
            {"token": " B", "logprob": -1.5},
            {"token": "The", "logprob": -2.0},
            {"token": "b", "logprob": -3.0},
        ]}]}}]});
        let lp = letter_logprobs(&v, 3).unwrap();
        let p: Vec<f32> = lp.iter().map(|x| x.exp()).collect();
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        // A: -0.5, B: -1.5 (the better of " B" and "b"), C: missing → the floor, -3.0.
        assert!(p[0] > p[1] && p[1] > p[2]);
        assert!(((lp[0] - lp[1]) - 1.0).abs() < 1e-5);
        assert!(((lp[1] - lp[2]) - 1.5).abs() < 1e-5);
    }

    #[test]
    fn an_answer_without_logprobs_is_an_error() {
        let v = json!({"choices": [{"message": {"content": "A"}}]});
        assert!(letter_logprobs(&v, 2).is_err());
        let v = json!({"choices": [{"logprobs": {"content": [{"top_logprobs": [{"token": 3}]}]}}]});
        assert!(letter_logprobs(&v, 2).is_err());
    }
}
