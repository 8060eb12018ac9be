//! The cascade's Tier −1 step, before each stage's LLM: the probe (the stage's scope, the candidates in the
//! order the LLM would see them, the text, Tier-0's top label and embedding), the lookup — unless the request
//! says `Cache-Control: no-cache` — and, after a fresh verdict, keeping it — unless it says `no-store`. An exact
//! hit's scores are fused anew with this request's prior (the same candidates: they are in the key); a semantic
//! hit answers with its neighbour's fused verdict. A hit runs no LLM job: it takes no fair-share slot and
//! charges no tenant budget, and it is served under brownout. Written answers (answer routes) and generations
//! (generate routes) are cached only where the route says `cache_generations`, at temperature 0, by exact key
//! (the tenant's included: one tenant's conversation never answers another's).

use std::sync::Arc;

use tiergate_cache::HitKind;
use tiergate_prefilter::Prediction;

use crate::cache::{Probe, Verdict};
use crate::metrics as m;
use crate::model::request::Request;
use crate::routing::route::{Route, Stage};
use crate::state::AppState;

/// A stage's answer from the cache.
pub(crate) struct FromCache {
    /// The fused distribution, most likely first.
    pub fused: Vec<(usize, f32)>,
    pub kind: HitKind,
    pub similarity: f32,
    /// The backend that computed the verdict.
    pub backend: String,
}

/// The probe for stage `stage` on `prior`, when the cache is on and the request lets it look or keep.
pub(crate) fn probe(
    state: &AppState,
    v: &Request,
    pred: &Prediction,
    stage: &Stage,
    prior: &[(usize, f32)],
) -> Option<Probe> {
    let cache = state.cache.as_ref()?;
    if v.cache.no_cache && v.cache.no_store {
        return None;
    }
    let candidates: Vec<usize> = prior.iter().map(|(i, _)| *i).collect();
    Some(cache.probe(
        tenant_scope(state, v, stage.cache_scope),
        &candidates,
        &v.text,
        pred.label,
        &pred.embedding,
    ))
}

/// `scope` for the verdicts of `v`'s tenant: its cache group's (its own unless tenants share one by name), so
/// that no tenant's question is another's hit — nor its `x-tiergate-cache` a sign of another's traffic.
fn tenant_scope(state: &AppState, v: &Request, scope: u64) -> u64 {
    let group = state
        .tenants()
        .named(&v.tenant.0)
        .map(|t| t.cache_group.clone());
    let group = group.unwrap_or_else(|| v.tenant.0.clone());
    tiergate_core::fnv::Fnv::new()
        .eat(&scope.to_le_bytes())
        .eat(group.as_bytes())
        .finish()
}

/// The stage's answer from the cache, when it holds one the request may take.
pub async fn answer(
    state: &AppState,
    route: &Route,
    v: &Request,
    stage: &Stage,
    prior: &[(usize, f32)],
    probe: Option<&Probe>,
) -> Option<FromCache> {
    let (cache, p) = (state.cache.as_ref()?, probe?);
    if v.cache.no_cache {
        return None;
    }
    let found = cache.lookup(p).await.filter(|f| f.verdict.text.is_none());
    let result = found.as_ref().map_or("miss", |f| f.kind.as_str());
    metrics::counter!(m::CACHE_LOOKUPS_TOTAL, "route" => route.name.clone(), "stage" => stage.name.clone(), "result" => result).increment(1);
    let f = found?;
    let v = &f.verdict;
    let same = v.candidates.len() == prior.len()
        && v.candidates.iter().zip(prior).all(|(c, (i, _))| c == i)
        && v.scores.len() == prior.len();
    let fused = if f.kind == HitKind::Exact && same {
        let fusion = stage.fusion_of(&v.backend);
        tiergate_core::fusion::step(prior, &v.scores, fusion.llm_weight, fusion.llm_temperature)
            .fused
    } else {
        v.fused.clone()
    };
    Some(FromCache {
        fused,
        kind: f.kind,
        similarity: f.similarity,
        backend: v.backend.clone(),
    })
}

/// Keeps a fresh verdict: here at once, in the shared store in the background.
#[allow(clippy::too_many_arguments)]
pub(crate) fn keep(
    state: &Arc<AppState>,
    route: &Route,
    v: &Request,
    p: Probe,
    prior: &[(usize, f32)],
    scores: Vec<f32>,
    fused: &[(usize, f32)],
    by: &str,
) {
    let Some(cache) = state.cache.as_ref() else {
        return;
    };
    if v.cache.no_store {
        return;
    }
    let verdict = Verdict {
        key: p.key.clone(),
        candidates: prior.iter().map(|(i, _)| *i).collect(),
        scores,
        fused: fused.to_vec(),
        backend: by.to_string(),
        at_ms: crate::evidence::ledger::now_ms(),
        text: None,
        finish_reason: String::new(),
        completion_tokens: 0,
    };
    metrics::counter!(m::CACHE_STORES_TOTAL, "route" => route.name.clone()).increment(1);
    if cache.is_shared() {
        let (state, key, shared) = (state.clone(), p.key.clone(), verdict.clone());
        let epoch = p.shared_epoch();
        tokio::spawn(async move {
            if let Some(c) = &state.cache {
                c.share(&key, epoch, &shared).await;
            }
        });
    }
    cache.put(&p, verdict);
}

/// The probe for a written answer or generation of `job` on `stage`: only where the route allows
/// (`cache_generations`), at temperature 0, and when the request lets the cache look or keep. Exact only, keyed
/// by the stage's scope, the tenant and the whole job (messages, rendered prompts and sampling).
pub(crate) fn generation_probe(
    state: &AppState,
    route: &Route,
    stage: &Stage,
    v: &Request,
    job: &tiergate_queue::Job,
) -> Option<Probe> {
    let cache = state.cache.as_ref()?;
    if !route.cache_generations
        || v.temperature != Some(0.0)
        || (v.cache.no_cache && v.cache.no_store)
    {
        return None;
    }
    let job = serde_json::to_string(job).ok()?;
    Some(cache.exact_probe(format!(
        "{:016x}|gen|{}|{job}",
        stage.cache_scope, v.tenant.0
    )))
}

/// A written answer the cache holds for `probe`, unless the request says `no-cache`.
pub(crate) async fn written(
    state: &AppState,
    route: &Route,
    stage: &Stage,
    v: &Request,
    probe: Option<&Probe>,
) -> Option<Arc<Verdict>> {
    let (cache, p) = (state.cache.as_ref()?, probe?);
    if v.cache.no_cache {
        return None;
    }
    let found = cache.lookup(p).await.filter(|f| f.verdict.text.is_some());
    let result = found.as_ref().map_or("miss", |f| f.kind.as_str());
    metrics::counter!(m::CACHE_LOOKUPS_TOTAL, "route" => route.name.clone(), "stage" => stage.name.clone(), "result" => result).increment(1);
    found.map(|f| f.verdict)
}

/// What keeps a generation once it has ended: the state, the probe and who wrote it.
pub(crate) struct KeepWritten {
    state: Arc<AppState>,
    route: String,
    probe: Probe,
    backend: String,
}

impl KeepWritten {
    /// A keeper for `probe` (none when the request says `no-store`).
    pub(crate) fn new(
        state: &Arc<AppState>,
        route: &Route,
        v: &Request,
        probe: Option<Probe>,
        backend: &str,
    ) -> Option<Self> {
        if v.cache.no_store {
            return None;
        }
        Some(Self {
            state: state.clone(),
            route: route.name.clone(),
            probe: probe?,
            backend: backend.to_string(),
        })
    }

    /// Keeps the whole text of a generation that ended well (a cut or failed one is never kept).
    pub(crate) fn keep(self, text: String, finish_reason: &str, completion_tokens: u32) {
        let Some(cache) = self.state.cache.as_ref() else {
            return;
        };
        let verdict = Verdict {
            key: self.probe.key.clone(),
            candidates: Vec::new(),
            scores: Vec::new(),
            fused: Vec::new(),
            backend: self.backend,
            at_ms: crate::evidence::ledger::now_ms(),
            text: Some(text),
            finish_reason: finish_reason.to_string(),
            completion_tokens,
        };
        metrics::counter!(m::CACHE_STORES_TOTAL, "route" => self.route).increment(1);
        if cache.is_shared() {
            let (state, key, shared) =
                (self.state.clone(), self.probe.key.clone(), verdict.clone());
            let epoch = self.probe.shared_epoch();
            tokio::spawn(async move {
                if let Some(c) = &state.cache {
                    c.share(&key, epoch, &shared).await;
                }
            });
        }
        cache.put(&self.probe, verdict);
    }
}
