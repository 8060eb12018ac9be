//! `POST /v1/chat/completions`: validate, classify (Tier-0), decide, escalate or answer, respond (JSON or SSE).

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tiergate_config::RouteKind;
use tiergate_prefilter::Prediction;
use tiergate_queue::{Job, Message};

use crate::error::ApiError;
use crate::extract::{ApiJson, Asking};
use crate::openai::{ChatRequest, Logprobs, TokenLogprob, TopLogprob, Usage};
use crate::validate::{validate, Caller, RouteFacts, ValidChat};
use tiergate_engine::brownout::Step;
use tiergate_engine::metrics as m;
use tiergate_engine::out_of_scope::NONE;
use tiergate_engine::outcome::{Outcome, Tier};
use tiergate_engine::state::{AppState, Route};
use tiergate_telemetry::TARGET;
use tracing::Instrument;

use super::escalate::escalate_answer;
use super::respond::{respond_started, respond_text};
use tiergate_engine::attempt::{attempt, first_event};
use tiergate_engine::cached;
use tiergate_engine::cascade::{decide, escalate_rerank, hold_bound, sampling, Decided, Meta};

/// The handler.
pub async fn chat(
    State(state): State<Arc<AppState>>,
    asking: Asking,
    ApiJson(req): ApiJson<ChatRequest>,
) -> Response {
    let started = Instant::now();
    let tenant = asking.tenant.clone();
    let caller = Caller {
        tenant: tenant.clone(),
        batch: asking.batch.clone(),
        headers: &asking.headers,
        started,
    };
    let facts = |name: &str| {
        state.routes.get(name).map(|r| RouteFacts {
            kind: r.kind,
            deadline: r.deadline,
            max_deadline: r.max_deadline,
        })
    };
    let validated =
        tracing::info_span!(target: TARGET, "validate").in_scope(|| validate(req, facts, caller));
    let valid = match validated {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    if let Err(e) = state.tenants().permit(&tenant, &valid.route) {
        return ApiError::from(e).into_response();
    }
    let step = state.brownout();
    // A generation paused under brownout is refused after its cache lookup (a hit runs no LLM job).
    let paused = tiergate_engine::brownout::refusal(step, valid.kind);
    if let Some(e) = paused.filter(|_| valid.kind != RouteKind::Generate || step == Step::Shed) {
        return crate::adapt::mark_brownout(ApiError::from(e).into_response(), step);
    }
    let route = valid.route.clone();
    let asked = tiergate_engine::answered::Asked::of(&state, &valid);
    tracing::debug!(route = %route, user = valid.user.as_deref().unwrap_or(""), stream = valid.stream, "chat request");
    let variant =
        state
            .experiments
            .assign(&route, valid.user.as_deref(), asking.request_id.as_deref());
    let result = match valid.kind {
        RouteKind::Generate => {
            let span = tracing::info_span!(target: TARGET, "generation");
            generate(&state, valid, started, step)
                .instrument(span)
                .await
        }
        RouteKind::Classify | RouteKind::Answer => {
            classified(&state, valid, asking.forced.clone(), started).await
        }
    };
    let mut resp = match result {
        Ok((resp, outcome)) => {
            // The bench's channels: Tier-0 answers, escalations the LLM answered, escalations degraded to Tier-0.
            let (tier, channel) = (outcome.tier.as_str(), outcome.channel().as_str());
            metrics::counter!(m::REQUESTS_TOTAL, "route" => route.clone(), "tier" => tier, "channel" => channel, "outcome" => "ok", "tenant" => tenant.0.to_string()).increment(1);
            metrics::histogram!(m::REQUEST_SECONDS, "route" => route.clone(), "tier" => tier, "channel" => channel)
                .record(started.elapsed().as_secs_f64());
            state.decisions.record(&route, &outcome, started.elapsed());
            state.tenant_figures.answered(&tenant, &outcome);
            tiergate_engine::answered::answered(&state, asked, &outcome);
            resp
        }
        Err(e) => {
            let code = e.parts().0.as_u16().to_string();
            metrics::counter!(m::REQUESTS_TOTAL, "route" => route.clone(), "tier" => "none", "channel" => "error", "outcome" => code, "tenant" => tenant.0.to_string()).increment(1);
            state.tenant_figures.failed(&tenant);
            e.into_response()
        }
    };
    // A latency experiment's delay comes last, out of the request metrics above (its own metrics have it).
    if let Some(v) = &variant {
        crate::adapt::apply_variant(v, &route, &mut resp, started).await;
    }
    crate::adapt::mark_brownout(resp, step)
}

async fn classified(
    state: &Arc<AppState>,
    v: ValidChat,
    forced: Result<Option<f64>, ApiError>,
    started: Instant,
) -> Result<(Response, Outcome), ApiError> {
    // The route as it is now, kept to the end of the request: a head promoted meanwhile is not half seen.
    let route = state
        .routes
        .get(&v.route)
        .ok_or_else(|| ApiError::UnknownModel(v.route.clone()))?;
    let route = &*route;
    let prefilter = route
        .prefilter
        .as_ref()
        .ok_or_else(|| ApiError::Internal("route without a classifier".into()))?;
    let span = tracing::info_span!(target: TARGET, "prefilter");
    let at = std::time::SystemTime::now();
    let pred = prefilter.classify(&v.text).instrument(span.clone()).await?;
    tiergate_engine::trace::prefilter_steps(&span, at, &pred);
    drop(span);
    metrics::histogram!(m::PREFILTER_BATCH_SIZE).record(pred.batch_size as f64);
    metrics::histogram!(m::PREFILTER_SECONDS).record(pred.timings.infer.as_secs_f64());
    metrics::histogram!(m::PREFILTER_QUEUE_SECONDS).record(pred.timings.queue.as_secs_f64());
    let mut meta = Meta {
        tier: Tier::Tier0,
        confidence: Some(pred.confidence),
        prefilter_ms: started.elapsed().as_secs_f64() * 1e3,
        infer_ms: pred.timings.infer.as_secs_f64() * 1e3,
        head: Some(route.head_version.clone()),
        ..Meta::default()
    };
    let d = decide(state, route, pred, forced?, &mut meta);
    state
        .heads
        .shadow(state, route, &v.text, &d.pred, meta.threshold);
    meta.ambiguity = Some(1.0 - f64::from(d.pred.confidence));
    meta.top = d
        .top
        .iter()
        .filter_map(|(i, p)| Some((prefilter.labels().get(*i)?.clone(), *p)))
        .collect();
    // Tier-0's answer (a label, or out of scope) is also the degraded fallback.
    let mut final_probs = d.tier0_answer();
    if d.escalate() {
        let span = tracing::info_span!(target: TARGET, "escalation");
        let answered = escalate_answer(state, route, &v, &d, &mut meta, started)
            .instrument(span.clone())
            .await?;
        if let Some(resp) = answered {
            return Ok((resp, meta.outcome(None)));
        }
        let reranked = escalate_rerank(state, route, &v, &d, &mut meta)
            .instrument(span)
            .await?;
        if let Some(fused) = reranked {
            final_probs = fused;
        }
        hold_bound(state, route, &d, &mut meta)?;
        // The escalated latency the policy steers by is the LLM's: a cache hit costs it nothing.
        if !meta.forced && meta.tier != Tier::Cache {
            state
                .policy
                .record_escalated_latency(Instant::now(), started.elapsed().as_secs_f64() * 1e3);
        }
    }
    if !d.escalate() {
        record_tier0(state, route, &v, &d, &final_probs);
    }
    tracing::info_span!(target: TARGET, "response")
        .in_scope(|| respond_label(state, route, &v, &d.pred, final_probs, meta))
}

/// A label Tier-0 answered alone and sure, as a pseudo-label for `tiergate distill` (`server.record_tier0`).
fn record_tier0(
    state: &AppState,
    route: &Route,
    v: &ValidChat,
    d: &Decided,
    answer: &[(usize, f32)],
) {
    let (true, Some(rec), Some(p)) = (
        state.config.server.record_tier0,
        &state.recorder,
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

/// The label answer (classify), or the label's reply (answer route, not escalated or degraded).
fn respond_label(
    state: &AppState,
    route: &Route,
    v: &ValidChat,
    pred: &Prediction,
    final_probs: Vec<(usize, f32)>,
    mut meta: Meta,
) -> Result<(Response, Outcome), ApiError> {
    let prefilter = route
        .prefilter
        .as_ref()
        .ok_or_else(|| ApiError::Internal("route without a classifier".into()))?;
    let oos = route.out_of_scope.as_ref();
    // A label index, or "none of these" (the route's out-of-scope label).
    let name = |i: usize| -> String {
        match (prefilter.labels().get(i), oos) {
            (Some(l), _) => l.clone(),
            (None, Some(o)) => o.label.clone(),
            (None, None) => String::new(),
        }
    };
    let (best, best_p) = final_probs
        .first()
        .copied()
        .unwrap_or((pred.label, pred.confidence));
    if matches!(meta.tier, Tier::Llm | Tier::Cache) {
        meta.confidence = Some(best_p);
    }
    meta.out_of_scope = best == NONE;
    let label = name(best);
    let content = if v.json_object {
        json!({
            "label": label,
            "confidence": best_p,
            "tier": meta.tier.as_str(),
            "out_of_scope": meta.out_of_scope,
            "candidates": final_probs.iter().map(|(i, p)| json!({"label": name(*i), "p": p})).collect::<Vec<_>>(),
        })
        .to_string()
    } else if v.kind == RouteKind::Answer {
        let reply = match oos {
            Some(o) if best == NONE => o.reply.clone(),
            _ => prefilter.replies().get(best).cloned().flatten(),
        };
        reply.unwrap_or_else(|| label.clone())
    } else {
        label.clone()
    };
    let logprobs = v
        .logprobs
        .then(|| label_logprobs(pred, &name, &label, best_p, &final_probs, v.top_logprobs));
    let outcome = meta.outcome(Some(label));
    let resp = respond_text(
        state,
        v,
        content,
        logprobs,
        Usage::new(pred.tokens as u32, 1),
        meta,
    );
    Ok((resp, outcome))
}

fn label_logprobs(
    pred: &Prediction,
    name: &dyn Fn(usize) -> String,
    label: &str,
    p: f32,
    final_probs: &[(usize, f32)],
    k: usize,
) -> Logprobs {
    let ln = |p: f32| f64::from(p.max(1e-12)).ln();
    let alts: Vec<(usize, f32)> = if final_probs.len() >= k {
        final_probs.to_vec()
    } else {
        pred.top.clone()
    };
    Logprobs {
        content: vec![TokenLogprob {
            token: label.to_string(),
            logprob: ln(p),
            bytes: Some(label.as_bytes().to_vec()),
            top_logprobs: alts
                .iter()
                .take(k)
                .map(|(i, p)| TopLogprob {
                    token: name(*i),
                    logprob: ln(*p),
                    bytes: Some(name(*i).into_bytes()),
                })
                .collect(),
        }],
    }
}

async fn generate(
    state: &Arc<AppState>,
    v: ValidChat,
    started: Instant,
    step: Step,
) -> Result<(Response, Outcome), ApiError> {
    let messages = v
        .messages
        .iter()
        .map(|m| Message {
            role: m.role.clone(),
            content: m.content.clone(),
        })
        .collect();
    let job = Job::Generate {
        messages,
        sampling: sampling(&v),
    };
    // A generate route's first stage generates: its alternatives in selection order, each retried while no
    // byte has come.
    let route = state.routes.get(&v.route);
    let Some((route, stage)) = route.as_deref().and_then(|r| Some((r, r.stages.first()?))) else {
        return Err(ApiError::Internal(format!(
            "route `{}` has no stage",
            v.route
        )));
    };
    let probe = cached::generation_probe(state, route, stage, &v, &job);
    let mut meta = Meta::default();
    if let Some(hit) = cached::written(state, route, stage, &v, probe.as_ref()).await {
        let resp = super::escalate::respond_cached(state, &v, &hit, &mut meta, stage, 0);
        return Ok((resp, meta.outcome(None)));
    }
    if let Some(e) = tiergate_engine::brownout::refusal(step, RouteKind::Generate) {
        return Err(e.into());
    }
    let (gen, by) = attempt(state, stage, &v, &job, first_event)
        .await
        .map_err(|r| ApiError::refused_generation(r, &v.tenant.0))?;
    let keep = cached::KeepWritten::new(state, route, &v, probe, &by);
    let meta = Meta {
        tier: Tier::Llm,
        stage: Some(stage.name.clone()),
        backend: Some(by),
        ..meta
    };
    let outcome = meta.outcome(None);
    let resp = respond_started(state, &v, gen, meta, 0, started, keep).await?;
    Ok((resp, outcome))
}
