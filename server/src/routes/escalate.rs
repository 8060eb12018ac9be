//! The escalation steps of a classify or answer request: decide (θ against ambiguity), then escalate to the
//! LLM (a grounded rerank, or an LLM-written answer), degrading to Tier-0 when the LLM side is full, down or
//! late.

use std::sync::Arc;
use std::time::Instant;

use axum::http::HeaderMap;
use axum::response::Response;
use tiergate_config::{display_label, render, RouteKind};
use tiergate_prefilter::Prediction;
use tiergate_queue::{Job, Message};

use super::attempt::{attempt, first_event, scores as rerank_scores};
use super::respond::{degrade, fall_back, respond_started, sampling, Meta};
use crate::app::{AppState, Route};
use crate::error::ApiError;
use crate::llm::Refused;
use crate::metrics as m;
use crate::out_of_scope::{verdict, Call, Verdict, NONE};
use crate::outcome::{DegradeReason, Tier};
use crate::validate::ValidChat;

/// Tier-0's view of one request and the decision taken on it.
pub(super) struct Decided {
    pub(super) pred: Prediction,
    /// Tier-0's top candidates (label index, probability), most likely first.
    pub(super) top: Vec<(usize, f32)>,
    /// Tier-0's out-of-scope call (routes with an out-of-scope outcome).
    pub(super) call: Option<Call>,
    pub(super) verdict: Verdict,
    /// The θ the error bound allows, when one is set (`routing.max_error`) and θ was not forced.
    pub(super) bound: Option<f64>,
}

impl Decided {
    pub(super) fn escalate(&self) -> bool {
        self.verdict == Verdict::Escalate
    }

    /// Tier-0's own answer, also the fallback of a degraded escalation: its candidates, led by "none of these"
    /// ([`NONE`]) when its out-of-scope call says so.
    pub(super) fn tier0_answer(&self) -> Vec<(usize, f32)> {
        match self.call {
            Some(c) if c.out_of_scope() => std::iter::once((NONE, c.none_mass()))
                .chain(self.top.iter().copied())
                .collect(),
            _ => self.top.clone(),
        }
    }
}

/// Decides: ambiguity against θ_eff (or a permitted per-request θ), and on a route with an out-of-scope outcome
/// Tier-0's out-of-scope score against its threshold ([`verdict`]).
pub(super) fn decide(
    state: &AppState,
    route: &Route,
    pred: Prediction,
    headers: &HeaderMap,
    meta: &mut Meta,
) -> Result<Decided, ApiError> {
    let span = tracing::info_span!(target: tiergate_telemetry::TARGET, "decision");
    let ambiguity = 1.0 - f64::from(pred.confidence);
    let policy = state.policy.current();
    let allowed = policy.cfg.allow_header_override;
    let override_theta = crate::auth::threshold_override(state.admin_token(), allowed, headers)?;
    let now = Instant::now();
    // The error bound caps the policy's θ (a forced θ is the operator's own and is not capped).
    let bound = override_theta
        .is_none()
        .then(|| route.risk.theta(&policy.cfg))
        .flatten();
    let theta =
        override_theta.unwrap_or_else(|| crate::risk::cap(state.policy.theta_eff(now), bound));
    let call = route.out_of_scope.as_ref().map(|o| Call {
        score: pred.oos_score.unwrap_or(1.0 - pred.confidence),
        threshold: policy.cfg.oos_threshold.unwrap_or(o.threshold),
        margin: policy.cfg.oos_margin,
    });
    meta.oos_score = call.map(|c| c.score);
    if let Some(c) = &call {
        metrics::histogram!(m::OOS_SCORE, "route" => route.name.clone()).record(f64::from(c.score));
    }
    let verdict = verdict(ambiguity, theta, call.as_ref());
    let escalate = verdict == Verdict::Escalate;
    crate::trace::decision(
        &span,
        &crate::trace::Decision {
            ambiguity,
            theta,
            mode: crate::trace::mode_name(policy.cfg.mode),
            version: policy.version,
            escalated: escalate,
            forced: override_theta.is_some(),
            oos_score: meta.oos_score,
            verdict: verdict.as_str(),
        },
    );
    // A forced θ says nothing about the traffic: it stays out of the policy's statistics.
    meta.forced = override_theta.is_some();
    if !meta.forced {
        state.policy.record_decision(now, ambiguity, escalate);
    }
    meta.threshold = Some(theta);
    let k = route
        .stages
        .first()
        .map_or(1, |s| s.candidates)
        .min(pred.top.len())
        .max(1);
    let top = pred.top.iter().take(k).copied().collect();
    Ok(Decided {
        pred,
        top,
        call,
        verdict,
        bound,
    })
}

/// After an escalation: when Tier-0 answers one whose ambiguity is above the bound's θ (the LLM was full,
/// shed, broken or late), the bound is breached; `routing.on_breach` degrades (`risk_bound`) or rejects.
pub(super) fn hold_bound(
    state: &AppState,
    route: &Route,
    d: &Decided,
    meta: &mut Meta,
) -> Result<(), ApiError> {
    let (Some(bound), Some(cause)) = (d.bound, meta.degraded) else {
        return Ok(());
    };
    if meta.tier != Tier::Tier0 || 1.0 - f64::from(d.pred.confidence) <= bound {
        return Ok(());
    }
    let on_breach = state.policy.current().cfg.on_breach;
    metrics::counter!(m::RISK_BREACHES_TOTAL, "route" => route.name.clone(), "action" => on_breach_name(on_breach)).increment(1);
    tracing::warn!(route = %route.name, cause = cause.as_str(), "the error bound needed the LLM and it could not take the request");
    match on_breach {
        tiergate_config::OnBreach::Degrade => {
            fall_back(meta, DegradeReason::RiskBound);
            Ok(())
        }
        tiergate_config::OnBreach::Reject => Err(ApiError::RiskBound(format!(
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
fn reason_of(r: &Refused) -> DegradeReason {
    match r {
        Refused::NoLlm => DegradeReason::NoLlm,
        Refused::Queue(e) => super::respond::queue_error_reason(e),
        Refused::Budget(_) => DegradeReason::Budget,
        Refused::Unreachable => DegradeReason::DeadlineUnreachable,
        Refused::BreakerOpen(_) => DegradeReason::BreakerOpen,
    }
}

/// Degrades on a refused submission (`meta` says why); `Err` when the route rejects instead.
fn refused(state: &AppState, meta: &mut Meta, r: Refused) -> Result<(), ApiError> {
    match r {
        Refused::NoLlm => {
            meta.degraded = Some(DegradeReason::NoLlm);
            Ok(())
        }
        Refused::Queue(e) => degrade(state, meta, &e),
        // Over budget degrades whatever `on_escalation_failure` says: the tenant is answered, by Tier-0.
        Refused::Budget(_) => {
            fall_back(meta, DegradeReason::Budget);
            Ok(())
        }
        // Neither does a budget too short for the LLM: the answer comes from Tier-0.
        Refused::Unreachable => {
            fall_back(meta, DegradeReason::DeadlineUnreachable);
            Ok(())
        }
        Refused::BreakerOpen(_) => {
            fall_back(meta, DegradeReason::BreakerOpen);
            Ok(())
        }
    }
}

/// An answer route's escalation: the LLM writes the reply, grounded in the candidates' approved replies.
/// `None`: not an answer route, or degraded (then `meta` says why).
pub(super) async fn escalate_answer(
    state: &Arc<AppState>,
    route: &Route,
    v: &ValidChat,
    d: &Decided,
    meta: &mut Meta,
    started: Instant,
) -> Result<Option<Response>, ApiError> {
    if v.kind != RouteKind::Answer {
        return Ok(None);
    }
    let Some(prefilter) = route.prefilter.as_ref() else {
        return Ok(None);
    };
    // From `rerank_only` on, an answer route gets its label's configured reply.
    if state.brownout() >= crate::brownout::Step::RerankOnly {
        fall_back(meta, DegradeReason::Brownout);
        return Ok(None);
    }
    let line = |label: &str, reply: Option<&str>| {
        render(
            &route.prompts.answer_candidate,
            &[("label", label), ("reply", reply.unwrap_or(""))],
        )
    };
    let mut lines: String = d
        .top
        .iter()
        .map(|(i, _)| {
            let reply = prefilter.replies().get(*i).cloned().flatten();
            line(&display_label(&prefilter.labels()[*i]), reply.as_deref())
        })
        .collect();
    // A route that may answer out of scope offers its reply as one more candidate.
    if let Some(o) = &route.out_of_scope {
        lines.push_str(&line(&o.none_candidate, o.reply.as_deref()));
    }
    let system = render(&route.prompts.answer_system, &[("candidates", &lines)]);
    let messages = vec![
        Message {
            role: "system".into(),
            content: system,
        },
        Message {
            role: "user".into(),
            content: v.text.clone(),
        },
    ];
    let job = Job::Generate {
        messages,
        sampling: sampling(v),
    };
    // An answer route's reply is written by its first stage (its alternatives, retried before a byte).
    let Some(first) = route.stages.first() else {
        return Ok(None);
    };
    match attempt(state, first, v, &job, first_event).await {
        Ok((gen, by)) => {
            meta.tier = Tier::Llm;
            meta.stage = Some(by);
            let prompt_tokens = d.pred.tokens as u32;
            let resp = respond_started(state, v, gen, meta.clone(), prompt_tokens, started).await?;
            Ok(Some(resp))
        }
        Err(r) => {
            refused(state, meta, r)?;
            Ok(None)
        }
    }
}

/// A classify route's escalation through its cascade: each stage's LLM scores the candidates (with their
/// examples, under the route's templates), fused with the distribution so far by the head's fitted weights —
/// Tier-0's for the first stage, the previous stage's fused one after; the request goes on while the fused
/// ambiguity is above the next stage's θ. A later stage that cannot answer leaves the earlier stage's answer
/// (degraded, `meta` says why). `None`: no stage answered (`meta` says why).
pub(super) async fn escalate_rerank(
    state: &Arc<AppState>,
    route: &Route,
    v: &ValidChat,
    d: &Decided,
    meta: &mut Meta,
) -> Result<Option<Vec<(usize, f32)>>, ApiError> {
    if route.prefilter.is_none() {
        return Ok(None);
    }
    if state.brownout() >= crate::brownout::Step::Tier0Only {
        fall_back(meta, DegradeReason::Brownout);
        return Ok(None);
    }
    // On a route with an out-of-scope outcome the LLM may answer "none of these", which Tier-0's out-of-scope
    // call gives its share of the mass.
    let mut current = tier0_candidates(d);
    let mut answer: Option<Vec<(usize, f32)>> = None;
    for (k, stage) in route.stages.iter().enumerate() {
        // Under brownout the cascade sheds its later (bigger) stages first: the first stage's answer stands.
        if k > 0 && state.brownout() > crate::brownout::Step::Normal {
            break;
        }
        if let Some(a) = &answer {
            let ambiguity = 1.0 - f64::from(a.first().map_or(0.0, |(_, p)| *p));
            let now = Instant::now();
            let theta = stage
                .policy
                .as_ref()
                .map_or(stage.theta, |p| p.theta_eff(now));
            let go_on = ambiguity > theta;
            if let Some(p) = &stage.policy {
                p.record_decision(now, ambiguity, go_on);
            }
            if !go_on {
                break;
            }
        }
        match rerank_stage(state, route, v, d, meta, k, &current).await? {
            Some(fused) => {
                current = fused.clone();
                answer = Some(fused);
            }
            None => break,
        }
    }
    if answer.is_some() {
        meta.tier = Tier::Llm;
    }
    Ok(answer)
}

/// Stage `k` of the cascade reranks `prior` (candidate, mass); its fused distribution, sorted, or `None` when
/// it did not answer (the first stage degrades or rejects as configured; a later one always degrades).
async fn rerank_stage(
    state: &Arc<AppState>,
    route: &Route,
    v: &ValidChat,
    d: &Decided,
    meta: &mut Meta,
    k: usize,
    prior: &[(usize, f32)],
) -> Result<Option<Vec<(usize, f32)>>, ApiError> {
    let Some(prefilter) = route.prefilter.as_ref() else {
        return Ok(None);
    };
    let candidates = crate::judge::candidates(
        prior,
        prefilter.labels(),
        prefilter.replies(),
        |i| {
            if route.grounded {
                prefilter.examples_for(i, &d.pred)
            } else {
                prefilter.examples().get(i).cloned().unwrap_or_default()
            }
        },
        route.out_of_scope.as_ref(),
    );
    let job = Job::Rerank {
        text: v.text.clone(),
        candidates,
        prompt: route.prompts.clone(),
    };
    let t = Instant::now();
    let Some(stage) = route.stages.get(k) else {
        return Ok(None);
    };
    let n = prior.len();
    let (scores, by) = match attempt(state, stage, v, &job, |s| rerank_scores(s, n)).await {
        Ok(answered) => answered,
        Err(r) if k == 0 => {
            refused(state, meta, r)?;
            return Ok(None);
        }
        Err(r) => {
            fall_back(meta, reason_of(&r));
            return Ok(None);
        }
    };
    meta.rerank_ms += t.elapsed().as_secs_f64() * 1e3;
    metrics::histogram!(m::RERANK_SECONDS, "stage" => stage.name.clone(), "backend" => by.clone())
        .record(t.elapsed().as_secs_f64());
    let prior_p: Vec<f32> = prior.iter().map(|(_, p)| *p).collect();
    let (llm_p, fused_p) = stage.fusion_of(&by).apply(&prior_p, &scores);
    meta.stage = Some(by);
    if k == 0 {
        record(state, route, v, d, prior, &llm_p, &fused_p);
    }
    let mut fused: Vec<(usize, f32)> = prior
        .iter()
        .zip(fused_p)
        .map(|((i, _), p)| (*i, p))
        .collect();
    fused.sort_by(|a, b| b.1.total_cmp(&a.1));
    Ok(Some(fused))
}

/// The candidates the LLM reranks with Tier-0's mass on each: its top labels, and on a route with an
/// out-of-scope outcome "none of these" ([`crate::out_of_scope::with_none`]).
fn tier0_candidates(d: &Decided) -> Vec<(usize, f32)> {
    match &d.call {
        Some(c) => crate::out_of_scope::with_none(&d.top, c),
        None => d.top.clone(),
    }
}

/// Records an answered rerank for `tiergate distill` (when `server.record_escalations` is set).
fn record(
    state: &AppState,
    route: &Route,
    v: &ValidChat,
    d: &Decided,
    tier0: &[(usize, f32)],
    llm: &[f32],
    fused: &[f32],
) {
    let (Some(rec), Some(prefilter)) = (&state.recorder, &route.prefilter) else {
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
        "ts": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |t| t.as_secs()),
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
