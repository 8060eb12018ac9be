//! The engine's one call: [`answer`] takes a validated request from any door and returns an [`Answer`] — a
//! label with its candidates, a text in one piece, or a started [`Generation`] — with its [`Outcome`], or
//! why it was [`Declined`]. Inside: admission and the one brownout gate (the step read once, carried in the
//! outcome), Tier-0 and the decision ([`label`]), the cascade ([`crate::answer::cascade`]), one generation path
//! ([`generation`]) for generate routes and answer-route escalations, and the request's records.
//!
//! A door validates its dialect into a [`Request`], calls [`answer`], and renders the value: no door runs
//! a step of the pipeline itself. Here too: the request as validated ([`request`]), what became of it
//! ([`outcome`]), the decision and the cascade ([`cascade`], [`out_of_scope`], [`judge`]), a stage's
//! alternatives ([`attempt`], [`select`]), the records of an answer ([`answered`]) and its trace steps
//! ([`trace`]), Tier-0 on a request ([`tier0`]) and the context it reads ([`context`]), a steered
//! generate route's choice of stage ([`steer`]), a session's pin ([`session`]), what a door sets aside of a request and its session key ([`fields`]), and the conversations a Responses door keeps when told to
//! ([`stored`]).

pub(crate) mod answered;
pub(crate) mod attempt;
pub(crate) mod cached;
#[cfg(test)]
mod cached_tests;
pub(crate) mod cascade;
mod context;
pub(crate) mod fields;
mod generation;
mod jobs;
mod label;
pub(crate) mod select;
mod session;
mod settle;
mod steer;
pub mod stored;
pub mod switch;
mod tier0;

use std::sync::Arc;

use tiergate_config::RouteKind;
use tiergate_telemetry::TARGET;
use tracing::Instrument;

use crate::error::EngineError;
use crate::load::brownout::Step;
use crate::metrics as m;
use crate::model::outcome::Outcome;
use crate::model::request::Request;
use crate::state::AppState;

pub use generation::{Delta, Finish, Generation, Tokens};

/// What the engine answered, with what became of the request.
pub struct Answer {
    pub body: Body,
    pub outcome: Outcome,
    /// The request's share of the server's admission limit: a door holds it until the last byte of its
    /// response (a stream's end, or its client's disconnect).
    pub admitted: Admitted,
}

/// The answer itself.
pub enum Body {
    /// A classify route's label, or an answer route's configured reply for it (Tier-0's, reranked, or
    /// degraded).
    Label(Labelled),
    /// A text in one piece: a written answer the cache held.
    Text { text: String, tokens: Tokens },
    /// A generation that has produced its first event: its deltas follow ([`Generation::next`]).
    Stream(Box<Generation>),
}

/// A label answer.
pub struct Labelled {
    /// The label answered (the route's out-of-scope label when it is "none of these").
    pub label: String,
    /// Its probability.
    pub p: f32,
    /// The final distribution by label name, most likely first.
    pub candidates: Vec<(String, f32)>,
    /// Tier-0's own top labels (what alternatives a client gets when the final distribution is shorter).
    pub tier0_top: Vec<(String, f32)>,
    /// An answer route's configured reply for the label (its out-of-scope reply for "none of these").
    pub reply: Option<String>,
    /// The encoder's tokens.
    pub prompt_tokens: u32,
}

/// A request the engine did not answer, and the brownout step it came in under (a door says it).
#[derive(Debug)]
pub struct Declined {
    pub error: EngineError,
    pub brownout: Step,
    /// It was admitted and ran (the engine counted it among the requests, by its error's status); a refusal
    /// at admission is not counted.
    pub ran: bool,
}

/// An admission permit of `server.max_in_flight`, given back when dropped.
pub struct Admitted {
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Admitted {
    /// A permit of `state`'s admission limit, when one is free.
    pub(crate) fn try_take(state: &AppState) -> Option<Self> {
        let permit = state.admission.clone().try_acquire_owned().ok()?;
        Some(Admitted { _permit: permit })
    }
}

/// Answers `v`: admission, the tenant's permission and the brownout gate, then the route's kind of answer,
/// then the latency experiment's delay; its records (metrics, decision record, audit draw) are settled when
/// the answer ends — at once for a label or a text, at a generation's end (or drop) for a stream — and a
/// request that ran and failed is counted here, by its error's status.
pub(crate) async fn answer(
    state: &Arc<AppState>,
    v: &Request,
    early: Option<Admitted>,
) -> Result<Answer, Declined> {
    let step = state.brownout();
    let decline = |error, ran| Declined {
        error,
        brownout: step,
        ran,
    };
    let admitted = admit(state, v, step, early).map_err(|e| decline(e, false))?;
    // The route as it is now, kept to the end (a head promoted meanwhile is not half seen). What Tier-0 reads
    // (and the cache keys, the LLM reranks): the last turn, with its context if the route reads one.
    let route = route_of(state, v).map_err(|e| decline(e, false))?;
    fields::count(v.door, &v.set_aside, v.max_tokens_clamped);
    let (v, context) = context::with_context(&route, v);
    let v = &*v;
    let mut settle = settle::Settle::of(state, v);
    let mut out = Outcome {
        brownout: step,
        context,
        policy_version: state.routing.policy.current().version,
        ..Outcome::default()
    };
    let body = match v.kind {
        RouteKind::Generate => {
            let span = tracing::info_span!(target: TARGET, "generation");
            generation::generate_route(state, &route, v, &mut out)
                .instrument(span)
                .await
        }
        RouteKind::Classify | RouteKind::Answer => {
            label::classified(state, &route, v, &mut out).await
        }
    };
    match body {
        Ok(mut body) => {
            settle.delayed(experiment(state, v, &mut out).await);
            match &mut body {
                Body::Stream(g) => g.settle_at_end(settle, out.clone()),
                _ => settle.ok(&out),
            }
            Ok(Answer {
                body,
                outcome: out,
                admitted,
            })
        }
        Err(e) => {
            settle.failed(&e);
            Err(decline(e, true))
        }
    }
}

/// The latency experiment's variant of `v` (on a route one names), its delay slept here — after the answer
/// is ready, before the door has it, so the client sees it in its time to first token — and its metrics.
/// Returns the delay.
async fn experiment(state: &AppState, v: &Request, out: &mut Outcome) -> std::time::Duration {
    let Some(a) =
        state
            .routing
            .experiments
            .assign(&v.route, v.user.as_deref(), v.request_id.as_deref())
    else {
        return std::time::Duration::ZERO;
    };
    if !a.delay.is_zero() {
        tokio::time::sleep(a.delay).await;
    }
    let labels = [("variant", a.variant.clone()), ("route", v.route.clone())];
    metrics::counter!(m::EXPERIMENT_REQUESTS_TOTAL, &labels).increment(1);
    metrics::histogram!(m::EXPERIMENT_DELAY_SECONDS, &labels).record(a.delay.as_secs_f64());
    metrics::histogram!(m::EXPERIMENT_REQUEST_SECONDS, &labels)
        .record(v.started.elapsed().as_secs_f64());
    out.variant = Some(a.variant);
    a.delay
}

/// The route `v` names, as it is now.
fn route_of(
    state: &AppState,
    v: &Request,
) -> Result<Arc<crate::routing::route::Route>, EngineError> {
    state
        .routing
        .routes
        .get(&v.route)
        .ok_or_else(|| EngineError::UnknownRoute(v.route.clone()))
}

/// The one admission point: the permission to force θ, a permit of `server.max_in_flight` (or the one
/// [`admit_early`] took), the tenant's permission for the route, and the brownout step's refusal (every
/// request at `shed`; a generation is refused later, after its cache lookup, when the step pauses
/// generation).
fn admit(
    state: &AppState,
    v: &Request,
    step: Step,
    early: Option<Admitted>,
) -> Result<Admitted, EngineError> {
    may_force(state, v)?;
    let admitted = match early {
        Some(a) => a,
        None => Admitted::try_take(state).ok_or_else(EngineError::busy)?,
    };
    state.tenants().permit(&v.tenant, &v.route)?;
    if step == Step::Shed {
        return Err(crate::load::brownout::refusal(step, v.kind).unwrap_or_else(EngineError::busy));
    }
    Ok(admitted)
}

/// A permit of `server.max_in_flight` taken before the request is whole — for a door that must read a store
/// to build it (a continued conversation), so that a request the server would refuse costs no store read and
/// the read counts among the requests in flight; refused at once when none is free or the brownout step
/// sheds every request. The rest of admission follows in [`answer`].
pub(crate) fn admit_early(state: &AppState) -> Result<Admitted, Declined> {
    let step = state.brownout();
    let refused = |error| Declined {
        error,
        brownout: step,
        ran: false,
    };
    if step == Step::Shed {
        let kind = tiergate_config::RouteKind::Classify;
        let e = crate::load::brownout::refusal(step, kind).unwrap_or_else(EngineError::busy);
        return Err(refused(e));
    }
    Admitted::try_take(state).ok_or_else(|| refused(EngineError::busy()))
}

/// A θ forced per request (`x-tiergate-threshold`) is honoured only where the policy allows overrides and the
/// request presented the admin token: else refused, never silently ignored (a client would mistake the
/// server's θ for its own).
fn may_force(state: &AppState, v: &Request) -> Result<(), EngineError> {
    if v.forced.is_none()
        || (v.forced_by_admin && state.routing.policy.current().cfg.allow_header_override)
    {
        return Ok(());
    }
    Err(EngineError::Forbidden(
        "x-tiergate-threshold needs routing.allow_header_override and the admin token in \
         x-tiergate-admin-token"
            .into(),
    ))
}

/// A request's prompt tokens, counted by the tokenizer of what would answer it — Tier-0's encoder on a
/// classify or answer route, the chosen stage's backend on a generate route (a steered route's stage as
/// steering picks it; the outcome names it) — exact, never estimated: the backend reads the prompt as it
/// would for the answer (the answer cache is skipped). The llama.cpp engine only tokenises the rendered prompt;
/// the others generate one token (not sent), which costs the prompt's prefill. The permit is the caller's to
/// hold until it has answered.
pub(crate) async fn count_tokens(
    state: &Arc<AppState>,
    v: &Request,
) -> Result<(u32, Outcome, Admitted), Declined> {
    let mut v = v.clone();
    // An engine that cannot only count generates this one token.
    v.max_tokens = 1;
    v.count_only = true;
    v.temperature = Some(0.0);
    v.cache.no_cache = true;
    v.cache.no_store = true;
    let Answer {
        body,
        outcome,
        admitted,
    } = answer(state, &v, None).await?;
    let prompt = match body {
        Body::Label(l) => l.prompt_tokens,
        Body::Text { tokens, .. } => tokens.prompt,
        Body::Stream(mut g) => loop {
            match g.next().await {
                Some(Ok(Delta::End { tokens, .. })) => break tokens.prompt,
                Some(Ok(_)) => continue,
                Some(Err(error)) => {
                    return Err(Declined {
                        error,
                        brownout: outcome.brownout,
                        ran: true,
                    })
                }
                None => break 0,
            }
        },
    };
    Ok((prompt, outcome, admitted))
}
