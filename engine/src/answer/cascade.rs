//! The steps of a classify or answer request, as values: decide (θ against ambiguity, the out-of-scope
//! verdict, the error bound), then escalate through the route's cascade (each stage's LLM reranks, fused with
//! the distribution so far), degrading to Tier-0 when the LLM side is full, down, broken or late. What became
//! of the request is its [`Outcome`]; one mapping turns a refused submission into a degrade reason
//! ([`reason_of`]) or, where the route rejects, an [`EngineError`].

use std::sync::Arc;
use std::time::Instant;

use tiergate_config::FailureMode;
use tiergate_prefilter::Prediction;
use tiergate_queue::{Job, QueueError, Sampling};

use crate::answer::attempt::{attempt, scores as rerank_scores};
use crate::backends::llm::Refused;
use crate::error::EngineError;
use crate::metrics as m;
use crate::model::out_of_scope::{verdict, Call, Verdict, NONE};
use crate::model::outcome::{CacheHit, DegradeReason, Outcome, Tier};
use crate::model::request::Request;
use crate::state::{AppState, Route};

pub(crate) fn queue_error_reason(e: &QueueError) -> DegradeReason {
    match e {
        QueueError::Full { .. } => DegradeReason::QueueFull,
        QueueError::WorkerDown(_) => DegradeReason::WorkerDown,
        QueueError::DeadlineExceeded => DegradeReason::Deadline,
        _ => DegradeReason::LlmError,
    }
}

pub(crate) fn degrade(
    state: &AppState,
    out: &mut Outcome,
    e: &QueueError,
) -> Result<(), EngineError> {
    tracing::warn!(error = %e, "escalation failed: answering with Tier-0");
    if state.config.server.on_escalation_failure == FailureMode::Reject {
        return Err(EngineError::from(e.clone()));
    }
    fall_back(out, queue_error_reason(e));
    Ok(())
}

/// Tier-0 answers instead, for `reason`.
pub(crate) fn fall_back(out: &mut Outcome, reason: DegradeReason) {
    out.tier = Tier::Tier0;
    out.degraded = Some(reason);
    crate::model::trace::degraded(reason.as_str());
}

pub(crate) fn sampling(v: &Request) -> Sampling {
    Sampling {
        max_tokens: v.max_tokens,
        count_only: v.count_only,
        temperature: v.temperature,
        top_p: v.top_p,
        stop: v.stop.clone(),
        seed: v.seed,
        json_schema: v.json_schema.clone(),
    }
}

/// Tier-0's view of one request and the decision taken on it.
pub(crate) struct Decided {
    pub pred: Prediction,
    /// Tier-0's top candidates (label index, probability), most likely first.
    pub top: Vec<(usize, f32)>,
    /// Tier-0's out-of-scope call (routes with an out-of-scope outcome).
    pub call: Option<Call>,
    pub verdict: Verdict,
    /// The θ the error bound allows, when one is set (`routing.max_error`) and θ was not forced.
    pub bound: Option<f64>,
}

impl Decided {
    pub(crate) fn escalate(&self) -> bool {
        self.verdict == Verdict::Escalate
    }

    /// Tier-0's own answer, also the fallback of a degraded escalation: its candidates, led by "none of these"
    /// ([`NONE`]) when its out-of-scope call says so.
    pub(crate) fn tier0_answer(&self) -> Vec<(usize, f32)> {
        match self.call {
            Some(c) if c.out_of_scope() => std::iter::once((NONE, c.none_mass()))
                .chain(self.top.iter().copied())
                .collect(),
            _ => self.top.clone(),
        }
    }
}

/// Decides: ambiguity against θ_eff (or a permitted per-request θ), and on a route with an out-of-scope outcome
/// Tier-0's out-of-scope score against its threshold ([`verdict`]). `override_theta`: a θ the request sets (the
/// adapter checks that it may: `allow_header_override` and the admin token).
pub(crate) fn decide(
    state: &AppState,
    route: &Route,
    pred: Prediction,
    override_theta: Option<f64>,
    out: &mut Outcome,
) -> Decided {
    let span = tracing::info_span!(target: tiergate_telemetry::TARGET, "decision");
    let ambiguity = 1.0 - f64::from(pred.confidence);
    let policy = state.routing.policy.current();
    let now = Instant::now();
    // The error bound caps the policy's θ (a forced θ is the operator's own and is not capped).
    let bound = override_theta
        .is_none()
        .then(|| route.risk.theta(&policy.cfg))
        .flatten();
    let theta = override_theta
        .unwrap_or_else(|| crate::routing::risk::cap(state.routing.policy.theta_eff(now), bound));
    let call = route.out_of_scope.as_ref().map(|o| Call {
        score: pred.oos_score.unwrap_or(1.0 - pred.confidence),
        threshold: policy.cfg.oos_threshold.unwrap_or(o.threshold),
        margin: policy.cfg.oos_margin,
    });
    out.oos_score = call.map(|c| c.score);
    if let Some(c) = &call {
        metrics::histogram!(m::OOS_SCORE, "route" => route.name.clone()).record(f64::from(c.score));
    }
    let verdict = verdict(ambiguity, theta, call.as_ref());
    let escalate = verdict == Verdict::Escalate;
    crate::model::trace::decision(
        &span,
        &crate::model::trace::Decision {
            ambiguity,
            theta,
            mode: crate::model::trace::mode_name(policy.cfg.mode),
            version: policy.version,
            escalated: escalate,
            forced: override_theta.is_some(),
            oos_score: out.oos_score,
            verdict: verdict.as_str(),
        },
    );
    // A forced θ says nothing about the traffic: it stays out of the policy's statistics.
    out.forced = override_theta.is_some();
    if !out.forced {
        state
            .routing
            .policy
            .record_decision(now, ambiguity, escalate);
    }
    out.threshold = Some(theta);
    let k = route
        .stages
        .first()
        .map_or(1, |s| s.candidates)
        .min(pred.top.len())
        .max(1);
    let top = pred.top.iter().take(k).copied().collect();
    Decided {
        pred,
        top,
        call,
        verdict,
        bound,
    }
}

/// After an escalation: when Tier-0 answers one whose ambiguity is above the bound's θ (the LLM was full,
/// shed, broken or late), the bound is breached; `routing.on_breach` degrades (`risk_bound`) or rejects.
pub(crate) fn hold_bound(
    state: &AppState,
    route: &Route,
    d: &Decided,
    out: &mut Outcome,
) -> Result<(), EngineError> {
    let (Some(bound), Some(cause)) = (d.bound, out.degraded) else {
        return Ok(());
    };
    if out.tier != Tier::Tier0 || 1.0 - f64::from(d.pred.confidence) <= bound {
        return Ok(());
    }
    let on_breach = state.routing.policy.current().cfg.on_breach;
    metrics::counter!(m::RISK_BREACHES_TOTAL, "route" => route.name.clone(), "action" => on_breach_name(on_breach)).increment(1);
    tracing::warn!(route = %route.name, cause = cause.as_str(), "the error bound needed the LLM and it could not take the request");
    match on_breach {
        tiergate_config::OnBreach::Degrade => {
            fall_back(out, DegradeReason::RiskBound);
            Ok(())
        }
        tiergate_config::OnBreach::Reject => Err(EngineError::RiskBound(format!(
            "the error bound (routing.max_error) needs the LLM for this request and it cannot take it \
             now ({}): retry later",
            cause.as_str()
        ))),
    }
}

fn on_breach_name(o: tiergate_config::OnBreach) -> &'static str {
    match o {
        tiergate_config::OnBreach::Degrade => "degrade",
        tiergate_config::OnBreach::Reject => "reject",
    }
}

/// Why a refused submission degrades.
pub(crate) fn reason_of(r: &Refused) -> DegradeReason {
    match r {
        Refused::NoLlm => DegradeReason::NoLlm,
        Refused::Queue(e) => queue_error_reason(e),
        Refused::Budget(_) => DegradeReason::Budget,
        Refused::Unreachable => DegradeReason::DeadlineUnreachable,
        Refused::BreakerOpen(_) => DegradeReason::BreakerOpen,
    }
}

/// Degrades on a refused submission (`out` says why); `Err` when the route rejects instead.
pub(crate) fn refused(state: &AppState, out: &mut Outcome, r: Refused) -> Result<(), EngineError> {
    match r {
        Refused::NoLlm => {
            out.degraded = Some(DegradeReason::NoLlm);
            Ok(())
        }
        Refused::Queue(e) => degrade(state, out, &e),
        // Over budget degrades whatever `on_escalation_failure` says: the tenant is answered, by Tier-0.
        Refused::Budget(_) => {
            fall_back(out, DegradeReason::Budget);
            Ok(())
        }
        // Neither does a budget too short for the LLM: the answer comes from Tier-0.
        Refused::Unreachable => {
            fall_back(out, DegradeReason::DeadlineUnreachable);
            Ok(())
        }
        Refused::BreakerOpen(_) => {
            fall_back(out, DegradeReason::BreakerOpen);
            Ok(())
        }
    }
}

/// A classify route's escalation through its cascade: each stage's LLM scores the candidates (with their
/// examples, under the route's templates), fused with the distribution so far by the head's fitted weights —
/// Tier-0's for the first stage, the previous stage's fused one after; the request goes on while the fused
/// ambiguity is above the next stage's θ. A later stage that cannot answer leaves the earlier stage's answer
/// (degraded, `out` says why). `None`: no stage answered (`out` says why).
pub(crate) async fn escalate_rerank(
    state: &Arc<AppState>,
    route: &Route,
    v: &Request,
    d: &Decided,
    out: &mut Outcome,
) -> Result<Option<Vec<(usize, f32)>>, EngineError> {
    if route.prefilter.is_none() {
        return Ok(None);
    }
    // At `tier0_only` no LLM job runs; the answer cache still answers what it holds.
    let shed = !out.brownout.reranks();
    if shed && state.cache.is_none() {
        fall_back(out, DegradeReason::Brownout);
        return Ok(None);
    }
    // On a route with an out-of-scope outcome the LLM may answer "none of these", which Tier-0's out-of-scope
    // call gives its share of the mass.
    let mut current = tier0_candidates(d);
    let mut answer: Option<Vec<(usize, f32)>> = None;
    for (k, stage) in route.stages.iter().enumerate() {
        // Under brownout the cascade sheds its later (bigger) stages first: the first stage's answer stands.
        if k > 0 && !out.brownout.cascades() {
            break;
        }
        if let Some(a) = &answer {
            let ambiguity = 1.0 - f64::from(a.first().map_or(0.0, |(_, p)| *p));
            let now = Instant::now();
            let theta = stage
                .policy
                .as_ref()
                .map_or(stage.theta, |p| p.theta_eff(now));
            let go_on = tiergate_core::fusion::goes_on(ambiguity, theta);
            if let Some(p) = &stage.policy {
                p.record_decision(now, ambiguity, go_on);
            }
            if !go_on {
                break;
            }
        }
        match rerank_stage(state, route, v, d, out, (k, shed), &current).await? {
            Some(fused) => {
                current = fused.clone();
                answer = Some(fused);
            }
            None => break,
        }
    }
    if answer.is_some() {
        // The last stage that answered says whose answer it is: the LLM's, or one the cache held.
        out.tier = if out.cache.is_some() {
            Tier::Cache
        } else {
            Tier::Llm
        };
    }
    Ok(answer)
}

/// Stage `k` of the cascade reranks `prior` (candidate, mass): from the answer cache when it holds the
/// verdict, else by its LLM (not when `shed`: the brownout ladder runs no LLM job). Its fused distribution,
/// sorted, or `None` when it did not answer (the first stage degrades or rejects as configured; a later one
/// always degrades).
async fn rerank_stage(
    state: &Arc<AppState>,
    route: &Route,
    v: &Request,
    d: &Decided,
    out: &mut Outcome,
    (k, shed): (usize, bool),
    prior: &[(usize, f32)],
) -> Result<Option<Vec<(usize, f32)>>, EngineError> {
    let Some(prefilter) = route.prefilter.as_ref() else {
        return Ok(None);
    };
    let candidates = crate::model::judge::candidates(
        prior,
        prefilter.labels(),
        prefilter.replies(),
        prefilter.descriptions(),
        |i| {
            if route.grounded {
                prefilter.examples_for(i, &d.pred)
            } else {
                prefilter.examples().get(i).cloned().unwrap_or_default()
            }
        },
        route.out_of_scope.as_ref(),
    );
    let Some(stage) = route.stages.get(k) else {
        return Ok(None);
    };
    let probe = crate::answer::cached::probe(state, v, &d.pred, stage, prior);
    if let Some(fused) =
        crate::answer::cached::answer(state, route, v, stage, prior, probe.as_ref()).await
    {
        out.cache = Some(CacheHit {
            kind: fused.kind,
            similarity: fused.similarity,
        });
        out.stage = Some(stage.name.clone());
        out.backend = Some(fused.backend);
        return Ok(Some(fused.fused));
    }
    if shed {
        fall_back(out, DegradeReason::Brownout);
        return Ok(None);
    }
    let job = Job::Rerank {
        text: v.text.clone(),
        candidates,
        prompt: route.prompts.clone(),
    };
    let t = Instant::now();
    let n = prior.len();
    let (scores, by) = match attempt(state, stage, v, &job, |s| rerank_scores(s, n)).await {
        Ok(answered) => answered,
        Err(r) if k == 0 => {
            refused(state, out, r)?;
            return Ok(None);
        }
        Err(r) => {
            fall_back(out, reason_of(&r));
            return Ok(None);
        }
    };
    out.timings.rerank_ms += t.elapsed().as_secs_f64() * 1e3;
    metrics::histogram!(m::RERANK_SECONDS, "stage" => stage.name.clone(), "backend" => by.clone())
        .record(t.elapsed().as_secs_f64());
    let fusion = stage.fusion_of(&by);
    let s = tiergate_core::fusion::step(prior, &scores, fusion.llm_weight, fusion.llm_temperature);
    if let Some(p) = probe {
        crate::answer::cached::keep(state, route, v, p, prior, scores, &s.fused, &by);
    }
    out.stage = Some(stage.name.clone());
    out.backend = Some(by);
    out.cache = None;
    if k == 0 {
        record(state, route, v, d, prior, &s.llm, &s.fused_p);
    }
    let fused = s.fused;
    Ok(Some(fused))
}

/// The candidates the LLM reranks with Tier-0's mass on each: its top labels, and on a route with an
/// out-of-scope outcome "none of these" ([`crate::model::out_of_scope::with_none`]).
fn tier0_candidates(d: &Decided) -> Vec<(usize, f32)> {
    match &d.call {
        Some(c) => crate::model::out_of_scope::with_none(&d.top, c),
        None => d.top.clone(),
    }
}

/// Records an answered rerank for `tiergate distill` (when `server.record_escalations` is set).
fn record(
    state: &AppState,
    route: &Route,
    v: &Request,
    d: &Decided,
    tier0: &[(usize, f32)],
    llm: &[f32],
    fused: &[f32],
) {
    let (Some(rec), Some(prefilter)) = (&state.evidence.recorder, &route.prefilter) else {
        return;
    };
    let labels = prefilter.labels();
    let oos_label = route.out_of_scope.as_ref().map(|o| o.label.as_str());
    let name = |i: usize| {
        labels
            .get(i)
            .map(String::as_str)
            .or(oos_label)
            .unwrap_or("")
    };
    rec.write(&serde_json::json!({
        "source": "llm",
        "ts": crate::evidence::ledger::now_ms() / 1000,
        "route": route.name,
        "text": v.text,
        "ambiguity": 1.0 - f64::from(d.pred.confidence),
        "candidates": tier0.iter().map(|(i, _)| name(*i)).collect::<Vec<_>>(),
        "tier0": tier0.iter().map(|(_, p)| *p).collect::<Vec<_>>(),
        "oos_score": d.call.map(|c| c.score),
        "llm": llm,
        "fused": fused,
    }));
}
