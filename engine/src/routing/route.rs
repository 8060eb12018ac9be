//! A route as requests see it: its head (prefilter), prompts, fusion, out-of-scope outcome, deadlines, cascade
//! and error bound. Built with the state at start, or for a candidate head (a live swap); held whole in
//! [`crate::routing::route_table::RouteTable`].

use std::sync::Arc;
use std::time::Duration;

use tiergate_config::{PromptConfig, RouteKind};
use tiergate_prefilter::PrefilterHandle;

use crate::routing::policy::Policy;

/// One route.
pub(crate) struct Route {
    /// The `model` name.
    pub name: String,
    /// What it does.
    pub kind: RouteKind,
    /// Its classifier (classify and answer routes).
    pub prefilter: Option<PrefilterHandle>,
    /// Its prompt templates (its own, else `[reranker.prompts]`).
    pub prompts: PromptConfig,
    /// How its escalations are fused.
    pub fusion: crate::routing::fusion::Fusion,
    /// The judge is shown examples per candidate in a formulation where they may differ per query
    /// (`choice`): each candidate's examples go nearest the query first.
    pub grounded: bool,
    /// What it answers for a query none of its labels covers (`None`: every query gets a label).
    pub out_of_scope: Option<crate::model::out_of_scope::OutOfScopeRoute>,
    /// A request's budget when it asks for none.
    pub deadline: Option<Duration>,
    /// The largest budget a request may ask for.
    pub max_deadline: Duration,
    /// Its cascade of LLM backends (at least one: the first backend by default).
    pub stages: Vec<Stage>,
    /// A digest of its stages as configured ([`stage_fingerprint`]): what a session pin records.
    pub stage_fingerprint: u64,
    /// Its head's calibration rows and the θ the error bound allows (`routing.max_error`).
    pub risk: Arc<crate::routing::risk::RouteRisk>,
    /// Its head's version in decision records (a fingerprint of labels and temperature).
    pub head_version: String,
    /// Its LLM-written answers and generations at temperature 0 may be cached (`cache_generations`).
    pub cache_generations: bool,
    /// A generate route steered by Tier-0 between its stages (`steer`).
    pub steer: Option<Steering>,
    /// Earlier user turns Tier-0 reads with the last, and at most how many characters of them.
    pub context_turns: usize,
    pub context_chars: usize,
    /// Other model names it answers to (exact names and `*` globs), and whether it answers unknown names
    /// ([`crate::routing::route_table::RouteTable::resolve`]).
    pub aliases: Vec<String>,
    pub default: bool,
    /// The most tokens one request may generate (a larger `max_tokens` is lowered to it).
    pub max_tokens: u32,
    /// The most characters of conversation text one request may carry.
    pub max_text_chars: usize,
    /// Every backend of its stages constrains decoding to a JSON Schema (mistralrs, an OpenAI-compatible
    /// upstream; not the stub): a request's `json_schema` is passed on rather than set aside.
    pub schema_decoding: bool,
}

/// A steered generate route's map over its head's labels, and its θ policy.
#[derive(Clone)]
pub(crate) struct Steering {
    /// The stage of each head label (index by label), none when the map does not name it.
    pub by_label: Vec<Option<usize>>,
    /// The stage of unsure requests and unmapped labels.
    pub default: usize,
    /// Its θ policy: a label is sure when its ambiguity (1 − p) is at most θ_eff (`/admin/routing?route=`).
    pub policy: Arc<Policy>,
    /// What each head label's generations are written with (index by label).
    pub overrides: Vec<Option<tiergate_config::SteerOverride>>,
    /// A session's switch budget, percent of its spend (`max_switch_spend_pct`).
    pub max_switch_spend_pct: f64,
}

/// Where a steered request goes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Steered {
    /// The stage.
    pub stage: usize,
    /// The label counted as sure (its mapped stage chosen).
    pub sure: bool,
    /// θ_eff it was judged by.
    pub theta: f64,
}

impl Steering {
    /// `steer` over `labels` (a label the head does not have is an error naming it).
    pub(crate) fn of(
        route: &str,
        steer: &tiergate_config::Steer,
        labels: &[String],
    ) -> anyhow::Result<Self> {
        let index = |label: &str, what: &str| {
            labels.iter().position(|l| l == label).ok_or_else(|| {
                anyhow::anyhow!(
                    "routes.{route}.steer.{what}: `{label}` is not a label of the route's head"
                )
            })
        };
        let mut by_label = vec![None; labels.len()];
        for (label, stage) in &steer.by_label {
            by_label[index(label, "by_label")?] = Some(*stage);
        }
        let mut overrides = vec![None; labels.len()];
        for (label, o) in &steer.overrides {
            overrides[index(label, "overrides")?] = Some(o.clone());
        }
        Ok(Self {
            by_label,
            default: steer.default,
            policy: Arc::new(Policy::new(steer.policy.clone())),
            overrides,
            max_switch_spend_pct: steer.max_switch_spend_pct,
        })
    }

    /// The stage for Tier-0's `label` at probability `p`: its mapped stage when sure (ambiguity at most θ_eff
    /// now), else the default; the decision is recorded in the policy (sent to the default stage counts as
    /// escalated).
    pub(crate) fn stage(&self, label: usize, p: f32, now: std::time::Instant) -> Steered {
        let theta = self.policy.theta_eff(now);
        let ambiguity = 1.0 - f64::from(p);
        let sure = ambiguity <= theta;
        let to = match self.by_label.get(label).copied().flatten() {
            Some(k) if sure => k,
            _ => self.default,
        };
        self.policy
            .record_decision(now, ambiguity, to == self.default);
        Steered {
            stage: to,
            sure,
            theta,
        }
    }

    /// What `label`'s generations are written with, if the route says.
    pub(crate) fn override_of(&self, label: usize) -> Option<&tiergate_config::SteerOverride> {
        self.overrides.get(label).and_then(Option::as_ref)
    }
}

/// One stage of a route's cascade.
#[derive(Clone)]
pub(crate) struct Stage {
    /// Its name in the route (`stages[].name`, by default its first backend's): its policy's key.
    pub name: String,
    /// Candidates its LLM reranks (its first backend's `candidates`).
    pub candidates: usize,
    /// Its alternatives (index, name), the first included, and how to choose and retry among them.
    pub alternatives: Vec<(usize, String)>,
    pub prefer: tiergate_config::Prefer,
    pub retries: u32,
    /// A request goes on to this stage when the previous stage's fused ambiguity is above it (unused on the
    /// first stage: the routing policy decides that escalation).
    pub theta: f64,
    /// Its own policy (stages after the first): θ_eff, modes, live changes (`/admin/routing?route=&stage=`).
    pub policy: Option<Arc<Policy>>,
    /// How each alternative's scores are fused with the distribution so far (Tier-0's for the first stage,
    /// the previous stage's fused one after), in `alternatives` order: the head's fit, or the backend's values.
    pub fusions: Vec<crate::routing::fusion::Fusion>,
    /// Its answer-cache scope ([`crate::cache::scope`]): the part of a cached verdict's key that changes with
    /// anything that makes its verdicts valid.
    pub cache_scope: u64,
    /// A session's backend (index) tried first when it fits the budget (set on one request's copy only).
    pub pinned: Option<usize>,
}

/// A digest of `stages` as configured (each stage's name and its alternatives in order): a session pin made
/// under other stages or backends (a config change, a rollout) does not match it.
pub(crate) fn stage_fingerprint(stages: &[Stage]) -> u64 {
    let stages: Vec<Vec<&str>> = stages
        .iter()
        .map(|s| {
            let alternatives = s.alternatives.iter().map(|(_, n)| n.as_str());
            std::iter::once(s.name.as_str())
                .chain(alternatives)
                .collect()
        })
        .collect();
    fingerprint(&stages)
}

/// A digest of stages given as (name, alternatives…) lists, lengths and boundaries included.
fn fingerprint(stages: &[Vec<&str>]) -> u64 {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for stage in stages {
        for part in stage {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        h.update([0xff]);
    }
    let d = h.finalize();
    u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
}

impl Stage {
    /// This stage for one request of a session pinned to its alternative `backend` (by name; the stage as it
    /// is when that is not one of its alternatives).
    pub(crate) fn pinned_to(&self, backend: &str) -> Self {
        let mut s = self.clone();
        s.pinned = self
            .alternatives
            .iter()
            .find(|(_, n)| n == backend)
            .map(|(i, _)| *i);
        s
    }

    /// The fusion of the alternative named `backend` (the first's when it is not one).
    pub(crate) fn fusion_of(&self, backend: &str) -> &crate::routing::fusion::Fusion {
        let i = self
            .alternatives
            .iter()
            .position(|(_, n)| n == backend)
            .unwrap_or(0);
        &self.fusions[i]
    }
}

#[cfg(test)]
mod tests {
    use super::fingerprint;

    #[test]
    fn a_fingerprint_changes_with_any_stage_or_backend() {
        let two = fingerprint(&[vec!["small", "small"], vec!["big", "big"]]);
        assert_eq!(
            two,
            fingerprint(&[vec!["small", "small"], vec!["big", "big"]])
        );
        for other in [
            vec![vec!["small", "small"], vec!["big", "bigger"]],
            vec![vec!["big", "big"], vec!["small", "small"]],
            vec![vec!["small", "small"]],
            vec![vec!["small", "small", "big"], vec!["big"]],
        ] {
            assert_ne!(fingerprint(&other), two, "{other:?}");
        }
    }
}
