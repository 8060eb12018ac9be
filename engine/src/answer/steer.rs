//! A steered generate route ([`crate::routing::route::Steering`]): Tier-0 classifies the conversation, a
//! sure label goes to the stage the route maps it to, anything else to its default stage; the label's
//! overrides (a system prompt, sampling) shape the job its stage is sent.

use tiergate_queue::{Job, Message, Sampling};

use crate::answer::cascade::sampling;
use crate::error::EngineError;
use crate::metrics as m;
use crate::model::outcome::Outcome;
use crate::model::request::Request;
use crate::state::Route;

/// Where a request goes: its stage, the label whose overrides apply (a sure label), and Tier-0's confidence
/// that the stage is right (a sure label's probability; for the default stage, 1 − it).
#[derive(Debug, Clone, Copy)]
pub(super) struct Steer {
    pub stage: usize,
    pub label: Option<usize>,
    pub confidence: f64,
}

/// The stage a steered route sends `v` to, or the first stage of a route not steered.
pub(super) async fn steered(
    route: &Route,
    v: &Request,
    out: &mut Outcome,
) -> Result<Steer, EngineError> {
    let Some(s) = &route.steer else {
        return Ok(Steer {
            stage: 0,
            label: None,
            confidence: 1.0,
        });
    };
    let pred = super::tier0::tier0(route, v, out).await?;
    let to = s.stage(pred.label, pred.confidence, std::time::Instant::now());
    out.threshold = Some(to.theta);
    out.ambiguity = Some(1.0 - f64::from(pred.confidence));
    let stage = route.stages.get(to.stage).map_or("", |st| st.name.as_str());
    let labels = [
        ("route", route.name.clone()),
        ("stage", stage.to_string()),
        ("sure", to.sure.to_string()),
    ];
    metrics::counter!(m::STEERED_TOTAL, &labels).increment(1);
    tracing::debug!(route = %route.name, label = pred.label, p = pred.confidence, sure = to.sure, stage = to.stage, "steered");
    let p = f64::from(pred.confidence);
    Ok(Steer {
        stage: to.stage,
        label: to.sure.then_some(pred.label),
        confidence: if to.sure { p } else { 1.0 - p },
    })
}

/// The generation job for `v`: its conversation and sampling, with the sure label's overrides (its system
/// prompt first, its temperature and top_p in place of the client's, its max_tokens as a cap).
pub(super) fn job(route: &Route, steer: &Steer, v: &Request) -> Job {
    let o = route
        .steer
        .as_ref()
        .zip(steer.label)
        .and_then(|(s, l)| s.override_of(l));
    let mut messages: Vec<Message> = super::jobs::messages(v);
    let mut sampling: Sampling = sampling(v);
    if let Some(o) = o {
        if let Some(system) = &o.system {
            match messages.first_mut() {
                Some(first) if first.role == "system" => {
                    first.content = format!("{system}\n\n{}", first.content);
                }
                _ => messages.insert(
                    0,
                    Message {
                        role: "system".into(),
                        content: system.clone(),
                        ..Message::default()
                    },
                ),
            }
        }
        sampling.temperature = o.temperature.or(sampling.temperature);
        sampling.top_p = o.top_p.or(sampling.top_p);
        if let Some(max) = o.max_tokens {
            sampling.max_tokens = sampling.max_tokens.min(max);
        }
    }
    Job::Generate {
        messages,
        sampling,
        tools: super::jobs::tools(v),
    }
}
