//! The escalation steps of a classify or answer request: decide (θ against ambiguity), then escalate to the
//! LLM (a grounded rerank, or an LLM-written answer), degrading to Tier-0 when the LLM side is full, down or
//! late.

use std::sync::Arc;
use std::time::Instant;

use axum::response::Response;
use tiergate_config::{display_label, render, RouteKind};
use tiergate_queue::{Job, Message};

use super::respond::respond_started;
use crate::error::ApiError;
use crate::validate::ValidChat;
use tiergate_engine::attempt::{attempt, first_event};
use tiergate_engine::cascade::{fall_back, refused, sampling, Decided, Meta};
use tiergate_engine::outcome::{DegradeReason, Tier};
use tiergate_engine::state::{AppState, Route};

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
    if state.brownout() >= tiergate_engine::brownout::Step::RerankOnly {
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
            meta.stage = Some(first.name.clone());
            meta.backend = Some(by);
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
