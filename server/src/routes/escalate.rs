//! The escalation steps of a classify or answer request: decide (θ against ambiguity), then escalate to the
//! LLM (a grounded rerank, or an LLM-written answer), degrading to Tier-0 when the LLM side is full, down or
//! late.

use std::sync::Arc;
use std::time::Instant;

use axum::response::Response;
use tiergate_config::{display_label, render, RouteKind};
use tiergate_queue::{Job, Message};

use super::respond::{respond_started, respond_text};
use crate::error::ApiError;
use crate::openai::Usage;
use crate::validate::ValidChat;
use tiergate_engine::attempt::{attempt, first_event};
use tiergate_engine::cache::CacheHitKind as HitKind;
use tiergate_engine::cache::Verdict;
use tiergate_engine::cached;
use tiergate_engine::cascade::{fall_back, refused, sampling, CacheHit, Decided, Meta};
use tiergate_engine::outcome::{DegradeReason, Tier};
use tiergate_engine::state::{AppState, Route, Stage};

/// An answer route's escalation: the LLM writes the reply, grounded in the candidates' approved replies — or
/// the answer cache holds one it wrote for the same tenant and conversation (`cache_generations`, temperature 0;
/// served under brownout too). `None`: not an answer route, or degraded (then `meta` says why).
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
    let (Some(job), Some(first)) = (answer_job(route, v, d), route.stages.first()) else {
        return Ok(None);
    };
    let prompt_tokens = d.pred.tokens as u32;
    let probe = cached::generation_probe(state, route, first, v, &job);
    if let Some(hit) = cached::written(state, route, first, v, probe.as_ref()).await {
        return Ok(Some(respond_cached(
            state,
            v,
            &hit,
            meta,
            first,
            prompt_tokens,
        )));
    }
    // From `rerank_only` on, an answer route gets its label's configured reply.
    if state.brownout() >= tiergate_engine::brownout::Step::RerankOnly {
        fall_back(meta, DegradeReason::Brownout);
        return Ok(None);
    }
    // An answer route's reply is written by its first stage (its alternatives, retried before a byte).
    match attempt(state, first, v, &job, first_event).await {
        Ok((gen, by)) => {
            meta.tier = Tier::Llm;
            meta.stage = Some(first.name.clone());
            let keep = cached::KeepWritten::new(state, route, v, probe, &by);
            meta.backend = Some(by);
            let resp =
                respond_started(state, v, gen, meta.clone(), prompt_tokens, started, keep).await?;
            Ok(Some(resp))
        }
        Err(r) => {
            refused(state, meta, r)?;
            Ok(None)
        }
    }
}

/// The job that has the LLM write an answer route's reply: its system prompt lists Tier-0's candidates with
/// their approved replies (and the route's out-of-scope reply), then the user's text.
fn answer_job(route: &Route, v: &ValidChat, d: &Decided) -> Option<Job> {
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
        },
        Message {
            role: "user".into(),
            content: v.text.clone(),
        },
    ];
    Some(Job::Generate {
        messages,
        sampling: sampling(v),
    })
}

/// A written answer from the cache, as a one-piece answer (JSON, or a short SSE stream).
pub(super) fn respond_cached(
    state: &AppState,
    v: &ValidChat,
    hit: &Verdict,
    meta: &mut Meta,
    stage: &Stage,
    prompt_tokens: u32,
) -> Response {
    meta.tier = Tier::Cache;
    meta.cache = Some(CacheHit {
        kind: HitKind::Exact,
        similarity: 1.0,
    });
    meta.stage = Some(stage.name.clone());
    meta.backend = Some(hit.backend.clone());
    let text = hit.text.clone().unwrap_or_default();
    let usage = Usage::new(prompt_tokens, hit.completion_tokens);
    respond_text(state, v, text, None, usage, meta.clone())
}
