//! The one generation path, for a generate route and for an answer route's escalation: the answer cache
//! first (a written answer it holds, served under brownout too), then — unless the brownout step pauses
//! generation on a stage that is pressed itself — the stage's alternatives until one produces its first event. From there the answer is a
//! [`Generation`]: its deltas as they come, kept whole in the cache when it ends well.
//!
//! The two callers differ on purpose in what a refusal means: a generate route has nothing else to answer
//! with (an error), an answer route falls back to its label's configured reply.

use std::sync::Arc;
use std::time::Duration;

use tiergate_cache::HitKind;
use tiergate_config::RouteKind;
use tiergate_queue::{Event, Job, JobHandle, QueueError, Reply};

use super::Body;
use crate::answer::attempt::{attempt, first_event, Started};
use crate::answer::cached::{generation_probe, written, KeepWritten};
use crate::backends::llm::Refused;
use crate::error::EngineError;
use crate::metrics as m;
use crate::model::outcome::{CacheHit, Outcome, Tier};
use crate::model::request::Request;
use crate::state::{AppState, Route, Stage};

/// Why a generation did not start.
pub(super) enum Declined {
    /// The brownout step pauses generation.
    Paused,
    /// No alternative of the stage took it.
    Refused(Refused),
}

/// A generate route's request: its conversation, written by the stage steering and the session's pin
/// choose (the first stage of a route not steered).
pub(super) async fn generate_route(
    state: &Arc<AppState>,
    route: &Route,
    v: &Request,
    out: &mut Outcome,
) -> Result<Body, EngineError> {
    let steer = super::steer::steered(route, v, out).await?;
    let mut turn = super::session::Turn::open(state, route, v).await;
    let (k, stage) = turn.stage(state, route, steer)?;
    if v.uses_tools() {
        calls_tools(state, &v.route, &stage)?;
    }
    let job = super::steer::job(route, &steer, v);
    let body = generate(state, route, &stage, v, job, 0, out).await;
    if body.is_ok() {
        turn.close(state, route, k, out);
    }
    match body {
        Ok(body) => Ok(body),
        Err(Declined::Paused) => Err(crate::load::brownout::refusal(
            out.brownout,
            RouteKind::Generate,
        )
        .unwrap_or_else(EngineError::busy)),
        Err(Declined::Refused(r)) => Err(r.into_error(&v.tenant.0)),
    }
}

/// A request with tools (or a conversation with tool calls and results) goes to a stage whose every
/// alternative calls tools (a fallback that did not would
/// drop them in silence): else a 400 naming the route and the backends that do not.
fn calls_tools(state: &AppState, route: &str, stage: &Stage) -> Result<(), EngineError> {
    let without: Vec<&str> = stage
        .alternatives
        .iter()
        .filter(|(i, _)| state.backend(*i).is_none_or(|b| !b.tools))
        .map(|(_, name)| name.as_str())
        .collect();
    if without.is_empty() {
        return Ok(());
    }
    Err(EngineError::Invalid {
        param: "tools".into(),
        message: format!(
            "route `{route}` cannot call tools: its backend(s) {} do not (set `tools = true` on an [[llm]] entry whose model's chat template renders tools)",
            without.join(", ")
        ),
    })
}

/// Runs `job` on `stage`: a written answer from the cache, or a started generation. `prompt_tokens`: tokens
/// the worker does not see (Tier-0's, for an answer route's escalation).
pub(super) async fn generate(
    state: &Arc<AppState>,
    route: &Route,
    stage: &Stage,
    v: &Request,
    job: Job,
    prompt_tokens: u32,
    out: &mut Outcome,
) -> Result<Body, Declined> {
    let probe = generation_probe(state, route, stage, v, &job);
    if let Some(hit) = written(state, route, stage, v, probe.as_ref()).await {
        out.tier = Tier::Cache;
        out.stage = Some(stage.name.clone());
        out.cache = Some(CacheHit {
            kind: HitKind::Exact,
            similarity: 1.0,
        });
        out.backend = Some(hit.backend.clone());
        let tokens = Tokens {
            prompt: prompt_tokens,
            completion: hit.completion_tokens,
            cached: 0,
        };
        let text = hit.text.clone().unwrap_or_default();
        return Ok(Body::Text { text, tokens });
    }
    if !generates(state, stage, out.brownout) {
        return Err(Declined::Paused);
    }
    let (started, by) = attempt(state, stage, v, &job, first_event)
        .await
        .map_err(Declined::Refused)?;
    let keep = KeepWritten::new(state, route, v, probe, &by);
    out.tier = Tier::Llm;
    out.stage = Some(stage.name.clone());
    out.backend = Some(by);
    out.timings.queue_ms = started.waited.as_secs_f64() * 1e3;
    metrics::histogram!(m::QUEUE_WAIT_SECONDS).record(started.waited.as_secs_f64());
    if matches!(started.first, Event::Chunk(_) | Event::ToolCall(_)) {
        metrics::histogram!(m::TTFT_SECONDS).record(v.started.elapsed().as_secs_f64());
    }
    let estimated = super::switch::tokens_of(v.messages.iter().map(|m| m.content.len()).sum());
    Ok(Body::Stream(Box::new(Generation::new(
        started,
        keep,
        prompt_tokens,
        estimated,
    ))))
}

/// Whether `stage` may generate at `step`: the ladder pauses generation where the stage is pressed too
/// ([`crate::load::brownout::stage_generates`]).
fn generates(state: &AppState, stage: &Stage, step: crate::load::brownout::Step) -> bool {
    let pressures = stage
        .alternatives
        .iter()
        .filter_map(|(b, _)| state.backend(*b))
        .map(|l| l.pressure());
    let calm = state.config.brownout.leave[0];
    crate::load::brownout::stage_generates(step, pressures, calm)
}

/// Tokens in and out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    pub prompt: u32,
    pub completion: u32,
    /// Prompt tokens the backend found in its prompt cache (0 where it does not say).
    pub cached: u32,
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// The model stopped (its end of turn, or a stop string).
    Stop,
    /// It reached its token limit (`max_tokens`, or the response area).
    Length,
    /// It called tools: the client runs them and sends their results.
    ToolCalls,
}

impl Finish {
    /// OpenAI's `finish_reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::ToolCalls => "tool_calls",
        }
    }
}

/// One event of a generation.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Delta {
    /// More text.
    Text(String),
    /// A whole tool call (its arguments complete: engines hand a call on whole).
    ToolCall(crate::model::request::ToolCall),
    /// The end: why, the tokens counted, and the stop sequence that ended it when the engine says which.
    End {
        finish: Finish,
        tokens: Tokens,
        stop_sequence: Option<String>,
    },
}

/// A generation that has produced its first event; from here on it is this backend's answer. Dropping it
/// cancels the job; its slot at the workers (and a batch line's turn) is held until then.
pub struct Generation {
    handle: JobHandle,
    _slot: crate::backends::fair::Slot,
    _held: crate::backends::llm::Held,
    first: Option<Event>,
    keep: Option<KeepWritten>,
    /// The text so far, when it is to be kept.
    text: String,
    prompt_tokens: u32,
    waited: Duration,
    ended: bool,
    /// The span it started in (a generate route's `generation`, an answer route's `escalation`): a door that
    /// streams it opens its stream's span under this one.
    span: tracing::Span,
    /// When its first event came.
    first_at: std::time::Instant,
    /// Its backend's per-token times, which its end adds to.
    rates: std::sync::Arc<crate::backends::llm::Rates>,
    /// Its prompt's tokens as estimated from its text: the prefill rate's divisor when the backend counts
    /// none (an upstream whose stream carries no usage, as llama-cpp-python's server).
    estimated_prompt: f64,
    /// The request's records, settled at its end, its error or its drop ([`super::settle`]).
    settle: Option<super::settle::Settle>,
    /// What became of the request, its generation time filled in at the end.
    outcome: Outcome,
}

impl Generation {
    fn new(
        s: Started,
        keep: Option<KeepWritten>,
        prompt_tokens: u32,
        estimated_prompt: f64,
    ) -> Self {
        Self {
            handle: s.handle,
            _slot: s.slot,
            _held: s.held,
            first: Some(s.first),
            keep,
            text: String::new(),
            prompt_tokens,
            waited: s.waited,
            ended: false,
            span: tracing::Span::current(),
            first_at: std::time::Instant::now(),
            rates: s.rates,
            estimated_prompt,
            settle: None,
            outcome: Outcome::default(),
        }
    }

    /// Hands it the request's records to settle when it ends, with the outcome so far.
    pub(super) fn settle_at_end(&mut self, settle: super::settle::Settle, outcome: Outcome) {
        self.settle = Some(settle);
        self.outcome = outcome;
    }

    /// What became of the request: final once [`Generation::next`] has returned the end (its generation
    /// time — from the job's submission to its end — filled in then).
    pub fn outcome(&self) -> &Outcome {
        &self.outcome
    }

    /// The end, or an error: the generation time, and the records settled.
    fn ended(&mut self, error: Option<&EngineError>) {
        self.ended = true;
        self.outcome.timings.generation_ms =
            (self.waited + self.first_at.elapsed()).as_secs_f64() * 1e3;
        if let Some(s) = self.settle.take() {
            match error {
                None => s.ok(&self.outcome),
                Some(e) => s.failed(e),
            }
        }
    }

    /// Adds its figures to its backend's: the wait for its first token over `prompt` tokens (its estimate
    /// when the backend counted none), and as a cold rate over the tokens it read (the backend says how many
    /// it found cached; one that does not: over them all when its session found no warm conversation there);
    /// the rest over the `completion` tokens after the first, and the answer's tokens.
    fn measure(&self, prompt: u32, cached: Option<u32>, completion: u32) {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let all = match prompt {
            0 => self.estimated_prompt,
            n => f64::from(n),
        };
        let wait = ms(self.waited);
        let prefill = (all >= 1.0).then(|| wait / all);
        let cold = match cached {
            // Enough tokens read that a fixed cost per request does not make the rate.
            Some(c) => Some(f64::from(prompt.saturating_sub(c))).filter(|r| *r >= 32.0),
            None => super::session::cold(self.outcome.session).then_some(all),
        };
        let cold = cold.filter(|r| *r >= 1.0).map(|read| wait / read);
        let decode =
            (completion > 1).then(|| ms(self.first_at.elapsed()) / f64::from(completion - 1));
        self.rates.observe(crate::backends::llm::RateView {
            prompt: (all >= 1.0).then_some(all),
            prefill,
            cold_prefill: cold,
            decode,
            completion: Some(f64::from(completion)),
        });
    }

    /// The span it started in.
    pub fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// The next event; `None` after the end or an error.
    pub async fn next(&mut self) -> Option<Result<Delta, EngineError>> {
        if self.ended {
            return None;
        }
        let ev = match self.first.take() {
            Some(ev) => ev,
            None => self
                .handle
                .events
                .recv_async()
                .await
                .unwrap_or(Event::Error(QueueError::Cancelled)),
        };
        Some(match ev {
            Event::Chunk(c) => {
                if self.keep.is_some() {
                    self.text.push_str(&c);
                }
                Ok(Delta::Text(c))
            }
            Event::ToolCall(c) => {
                // A turn that called tools is not an answer to keep: its calls are the client's to run.
                self.keep = None;
                Ok(Delta::ToolCall(super::jobs::call_in(c)))
            }
            Event::Reply(Reply::Generated(u)) => {
                self.ended(None);
                self.measure(u.prompt_tokens, u.cached_tokens, u.completion_tokens);
                let finish = match u.finish_reason.as_str() {
                    "length" => Finish::Length,
                    "tool_calls" => Finish::ToolCalls,
                    _ => Finish::Stop,
                };
                if let Some(k) = self.keep.take() {
                    let text = std::mem::take(&mut self.text);
                    k.keep(text, finish.as_str(), u.completion_tokens);
                }
                let tokens = Tokens {
                    prompt: u.prompt_tokens + self.prompt_tokens,
                    completion: u.completion_tokens,
                    cached: u.cached_tokens.unwrap_or(0),
                };
                Ok(Delta::End {
                    finish,
                    tokens,
                    stop_sequence: u.stop_sequence,
                })
            }
            Event::Reply(_) => {
                let e = EngineError::Internal("unexpected reply kind".into());
                self.ended(Some(&e));
                Err(e)
            }
            Event::Error(e) => {
                let e = EngineError::from(e);
                self.ended(Some(&e));
                Err(e)
            }
        })
    }
}

impl Drop for Generation {
    /// A generation dropped before its end (its client went away): the request settles as `cancelled`.
    fn drop(&mut self) {
        if let Some(s) = self.settle.take() {
            self.outcome.timings.generation_ms =
                (self.waited + self.first_at.elapsed()).as_secs_f64() * 1e3;
            s.settled(&self.outcome, "cancelled");
        }
    }
}
