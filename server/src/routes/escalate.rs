//! The escalation steps of a classify or answer request: decide (θ against ambiguity), then escalate to the
//! LLM (a grounded rerank, or an LLM-written answer), degrading to Tier-0 when the LLM side is full, down or
//! late.

use std::sync::Arc;
use std::time::Instant;

use axum::http::HeaderMap;
use axum::response::Response;
use tiergate_config::{display_label, render, RouteKind};
use tiergate_prefilter::Prediction;
use tiergate_queue::{Job, Message, QueueError, Reply};

use super::respond::{degrade, sampling, stream_or_collect, Meta};
use crate::app::{AppState, Route};
use crate::error::ApiError;
use crate::llm::Refused;
use crate::metrics as m;
use crate::outcome::{DegradeReason, Tier};
use crate::validate::ValidChat;

/// Tier-0's view of one request and the decision taken on it.
pub(super) struct Decided {
    pub(super) pred: Prediction,
    /// Tier-0's top candidates (label index, probability), most likely first.
    pub(super) top: Vec<(usize, f32)>,
    pub(super) escalate: bool,
}

/// Decides whether to escalate: ambiguity against θ_eff (or a permitted per-request θ).
pub(super) fn decide(
    state: &AppState,
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
    let theta = override_theta.unwrap_or_else(|| state.policy.theta_eff(now));
    let escalate = ambiguity > theta;
    crate::trace::decision(
        &span,
        &crate::trace::Decision {
            ambiguity,
            theta,
            mode: crate::trace::mode_name(policy.cfg.mode),
            version: policy.version,
            escalated: escalate,
            forced: override_theta.is_some(),
        },
    );
    // A forced θ says nothing about the traffic: it stays out of the policy's statistics.
    meta.forced = override_theta.is_some();
    if !meta.forced {
        state.policy.record_decision(now, ambiguity, escalate);
    }
    meta.threshold = Some(theta);
    let k = state.config.reranker.candidates.min(pred.top.len()).max(1);
    let top = pred.top.iter().take(k).copied().collect();
    Ok(Decided {
        pred,
        top,
        escalate,
    })
}

/// Degrades on a refused submission (`meta` says why); `Err` when the route rejects instead.
fn refused(state: &AppState, meta: &mut Meta, r: Refused) -> Result<(), ApiError> {
    match r {
        Refused::NoLlm => {
            meta.degraded = Some(DegradeReason::NoLlm);
            Ok(())
        }
        Refused::Queue(e) => degrade(state, meta, &e),
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
    let lines: String = d
        .top
        .iter()
        .map(|(i, _)| {
            let label = display_label(&prefilter.labels()[*i]);
            let reply = prefilter.replies().get(*i).cloned().flatten();
            render(
                &route.prompts.answer_candidate,
                &[("label", &label), ("reply", reply.as_deref().unwrap_or(""))],
            )
        })
        .collect();
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
    match state.submit(&job, v.batch.as_ref()).await {
        Ok(submitted) => {
            meta.tier = Tier::Llm;
            let prompt_tokens = d.pred.tokens as u32;
            let resp = stream_or_collect(
                state,
                v,
                submitted.handle,
                meta.clone(),
                prompt_tokens,
                started,
            )
            .await?;
            Ok(Some(resp))
        }
        Err(r) => {
            refused(state, meta, r)?;
            Ok(None)
        }
    }
}

/// A classify route's escalation: the LLM scores Tier-0's candidates (with their examples, under the
/// route's templates), fused with Tier-0 by the head's fitted weights. `None`: degraded (`meta` says why).
pub(super) async fn escalate_rerank(
    state: &Arc<AppState>,
    route: &Route,
    v: &ValidChat,
    d: &Decided,
    meta: &mut Meta,
) -> Result<Option<Vec<(usize, f32)>>, ApiError> {
    let Some(prefilter) = route.prefilter.as_ref() else {
        return Ok(None);
    };
    let candidates =
        crate::judge::candidates(&d.top, prefilter.labels(), prefilter.replies(), |i| {
            if route.grounded {
                prefilter.examples_for(i, &d.pred)
            } else {
                prefilter.examples().get(i).cloned().unwrap_or_default()
            }
        });
    let job = Job::Rerank {
        text: v.text.clone(),
        candidates,
        prompt: route.prompts.clone(),
    };
    let t = Instant::now();
    let submitted = match state.submit(&job, v.batch.as_ref()).await {
        Ok(s) => s,
        Err(r) => {
            refused(state, meta, r)?;
            return Ok(None);
        }
    };
    let (llm, ahead) = (submitted.llm, submitted.ahead);
    match submitted.handle.reply().await {
        Ok(Reply::Rerank(r)) if r.scores.len() == d.top.len() => {
            meta.tier = Tier::Llm;
            meta.rerank_ms = t.elapsed().as_secs_f64() * 1e3;
            // Service time ≈ latency shared by the jobs that were queued with this one.
            llm.record_rerank(t.elapsed() / ahead);
            metrics::histogram!(m::RERANK_SECONDS).record(t.elapsed().as_secs_f64());
            let tier0: Vec<f32> = d.top.iter().map(|(_, p)| *p).collect();
            let (llm_p, fused_p) = route.fusion.apply(&tier0, &r.scores);
            record(state, route, v, d, &llm_p, &fused_p);
            let mut fused: Vec<(usize, f32)> = d
                .top
                .iter()
                .zip(fused_p)
                .map(|((i, _), p)| (*i, p))
                .collect();
            fused.sort_by(|a, b| b.1.total_cmp(&a.1));
            Ok(Some(fused))
        }
        Ok(_) => {
            degrade(
                state,
                meta,
                &QueueError::Protocol("unexpected reply".into()),
            )?;
            Ok(None)
        }
        Err(e) => {
            degrade(state, meta, &e)?;
            Ok(None)
        }
    }
}

/// Records an answered rerank for `tiergate distill` (when `server.record_escalations` is set).
fn record(state: &AppState, route: &Route, v: &ValidChat, d: &Decided, llm: &[f32], fused: &[f32]) {
    let (Some(rec), Some(prefilter)) = (&state.recorder, &route.prefilter) else {
        return;
    };
    let labels = prefilter.labels();
    rec.write(&serde_json::json!({
        "ts": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |t| t.as_secs()),
        "route": route.name,
        "text": v.text,
        "ambiguity": 1.0 - f64::from(d.pred.confidence),
        "candidates": d.top.iter().map(|(i, _)| labels[*i].as_str()).collect::<Vec<_>>(),
        "tier0": d.top.iter().map(|(_, p)| *p).collect::<Vec<_>>(),
        "llm": llm,
        "fused": fused,
    }));
}
