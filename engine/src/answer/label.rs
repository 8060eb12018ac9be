//! A classify or answer route's request: Tier-0 classifies, the decision is taken, and an escalation goes to
//! the LLM — an answer route's reply written by its first stage ([`super::generation`]), or a rerank through
//! the cascade — degrading to Tier-0's answer when the LLM side cannot take it; the error bound is held last.

use std::sync::Arc;
use std::time::Instant;

use tiergate_config::{display_label, render, RouteKind};
use tiergate_prefilter::Prediction;
use tiergate_queue::{Job, Message};
use tiergate_telemetry::TARGET;
use tracing::Instrument;

use super::generation::{generate, Declined as NoGeneration};
use super::{Body, Labelled};
use crate::answer::cascade::{
    decide, escalate_rerank, fall_back, hold_bound, refused, sampling, Decided,
};
use crate::error::EngineError;
use crate::model::out_of_scope::NONE;
use crate::model::outcome::{DegradeReason, Outcome, Tier};
use crate::model::request::Request;
use crate::state::{AppState, Route};

pub(super) async fn classified(
    state: &Arc<AppState>,
    route: &Route,
    v: &Request,
    out: &mut Outcome,
) -> Result<Body, EngineError> {
    let pred = super::tier0::tier0(route, v, out).await?;
    let mut d = decide(state, route, pred, v.forced, out);
    // Classified with context, outside the bound's calibration: while a bound is set, the LLM decides.
    if out.context > 0 && d.bound.is_some() && !d.escalate() {
        d.verdict = crate::model::out_of_scope::Verdict::Escalate;
    }
    state
        .routing
        .heads
        .shadow(state, route, &v.text, &d.pred, out.threshold);
    out.ambiguity = Some(1.0 - f64::from(d.pred.confidence));
    out.top = named(route, &d.top);
    // Tier-0's answer (a label, or out of scope) is also the degraded fallback.
    let mut answer = d.tier0_answer();
    if !d.escalate() {
        record_tier0(state, route, v, &d, &answer);
        return Ok(Body::Label(labelled(route, v, &d.pred, answer, out)));
    }
    let span = tracing::info_span!(target: TARGET, "escalation");
    if let Some(written) = escalate_answer(state, route, v, &d, out)
        .instrument(span.clone())
        .await?
    {
        return Ok(written);
    }
    let reranked = escalate_rerank(state, route, v, &d, out)
        .instrument(span)
        .await?;
    if let Some(fused) = reranked {
        answer = fused;
    }
    hold_bound(state, route, &d, out)?;
    // The escalated latency the policy steers by is the LLM's: a cache hit costs it nothing.
    if !out.forced && out.tier != Tier::Cache {
        state
            .routing
            .policy
            .record_escalated_latency(Instant::now(), v.started.elapsed().as_secs_f64() * 1e3);
    }
    Ok(Body::Label(labelled(route, v, &d.pred, answer, out)))
}

/// An answer route's escalation: the LLM writes the reply, grounded in the candidates' approved replies — or
/// the answer cache holds one it wrote (`cache_generations`, temperature 0; served under brownout too).
/// `None`: not an answer route, or degraded (then `out` says why): the label's configured reply stands.
async fn escalate_answer(
    state: &Arc<AppState>,
    route: &Route,
    v: &Request,
    d: &Decided,
    out: &mut Outcome,
) -> Result<Option<Body>, EngineError> {
    if v.kind != RouteKind::Answer {
        return Ok(None);
    }
    let (Some(job), Some(first)) = (answer_job(route, v, d), route.stages.first()) else {
        return Ok(None);
    };
    // An answer route's reply is written by its first stage (its alternatives, retried before a byte).
    match generate(state, route, first, v, job, d.pred.tokens as u32, out).await {
        Ok(body) => Ok(Some(body)),
        // From `rerank_only` on, an answer route gets its label's configured reply.
        Err(NoGeneration::Paused) => {
            fall_back(out, DegradeReason::Brownout);
            Ok(None)
        }
        Err(NoGeneration::Refused(r)) => {
            refused(state, out, r)?;
            Ok(None)
        }
    }
}

/// The job that has the LLM write an answer route's reply: its system prompt lists Tier-0's candidates with
/// their approved replies (and the route's out-of-scope reply), then the user's text.
fn answer_job(route: &Route, v: &Request, d: &Decided) -> Option<Job> {
    let prefilter = route.prefilter.as_ref()?;
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
            ..Default::default()
        },
        Message {
            role: "user".into(),
            content: v.text.clone(),
            ..Default::default()
        },
    ];
    Some(Job::Generate {
        messages,
        sampling: sampling(v),
        tools: None,
    })
}

/// A label answered by Tier-0 alone and sure, as a pseudo-label for `tiergate distill`
/// (`server.record_tier0`).
fn record_tier0(
    state: &AppState,
    route: &Route,
    v: &Request,
    d: &Decided,
    answer: &[(usize, f32)],
) {
    let (true, Some(rec), Some(p)) = (
        state.config.server.record_tier0,
        &state.evidence.recorder,
        &route.prefilter,
    ) else {
        return;
    };
    if let Some(label) = answer.first().and_then(|(i, _)| p.labels().get(*i)) {
        rec.write_tier0(
            &route.name,
            &v.text,
            label,
            1.0 - f64::from(d.pred.confidence),
        );
    }
}

/// A label index by name: a label, or "none of these" (the route's out-of-scope label).
fn name(route: &Route, i: usize) -> String {
    let label = route.prefilter.as_ref().and_then(|p| p.labels().get(i));
    match (label, &route.out_of_scope) {
        (Some(l), _) => l.clone(),
        (None, Some(o)) => o.label.clone(),
        (None, None) => String::new(),
    }
}

fn named(route: &Route, probs: &[(usize, f32)]) -> Vec<(String, f32)> {
    probs.iter().map(|(i, p)| (name(route, *i), *p)).collect()
}

/// The label answer: the final distribution's best (Tier-0's prediction when it is empty), and on an answer
/// route the label's configured reply.
fn labelled(
    route: &Route,
    v: &Request,
    pred: &Prediction,
    answer: Vec<(usize, f32)>,
    out: &mut Outcome,
) -> Labelled {
    let (best, p) = answer
        .first()
        .copied()
        .unwrap_or((pred.label, pred.confidence));
    if matches!(out.tier, Tier::Llm | Tier::Cache) {
        out.confidence = Some(p);
    }
    out.out_of_scope = best == NONE;
    let label = name(route, best);
    out.label = Some(label.clone());
    let reply = (v.kind == RouteKind::Answer).then(|| match &route.out_of_scope {
        Some(o) if best == NONE => o.reply.clone(),
        _ => route
            .prefilter
            .as_ref()
            .and_then(|p| p.replies().get(best).cloned().flatten()),
    });
    Labelled {
        label,
        p,
        candidates: named(route, &answer),
        tier0_top: named(route, &pred.top),
        reply: reply.flatten(),
        prompt_tokens: pred.tokens as u32,
    }
}
