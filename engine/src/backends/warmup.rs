//! The warm-up a local worker scores before it says it is ready: the judge's label prefixes are built from a
//! job's candidates, so the worker cannot warm alone — the server writes, per backend, one rerank job per chunk
//! of each escalating route's labels (the candidates exactly as an escalation shows them, so the prefixes the
//! worker caches are the ones real jobs look up) and hands the file to every worker it starts, restarts
//! included. A worker scores them within `[reranker] warmup_ms`, then turns ready; `/ready` waits for that.

use std::collections::HashMap;
use std::io::Write;

use tiergate_config::RouteKind;
use tiergate_queue::Job;

use crate::model::out_of_scope::NONE;
use crate::routing::route::Route;

/// The warm-up jobs of backend `backend` (its index in the resolved backends): for each classify or answer
/// route whose stages rerank on it, its labels in chunks of the stage's candidate count ("none of these"
/// with the first chunk on a route with an out-of-scope outcome), each job's text a label's first example
/// (the label itself where it has none). Identical jobs (routes sharing a head and templates) appear once.
pub(crate) fn jobs(backend: usize, routes: &HashMap<String, Route>, order: &[String]) -> Vec<Job> {
    let mut out: Vec<Job> = Vec::new();
    for route in order.iter().filter_map(|n| routes.get(n)) {
        if route.kind == RouteKind::Generate {
            continue;
        }
        let Some(p) = route.prefilter.as_ref() else {
            continue;
        };
        let Some(stage) = route
            .stages
            .iter()
            .find(|s| s.alternatives.iter().any(|(i, _)| *i == backend))
        else {
            continue;
        };
        let mut labels: Vec<usize> = (0..p.labels().len()).collect();
        if route.out_of_scope.is_some() {
            labels.insert(1.min(labels.len()), NONE);
        }
        for chunk in labels.chunks(stage.candidates.max(1)) {
            let top: Vec<(usize, f32)> = chunk
                .iter()
                .map(|&i| (i, 1.0 / chunk.len() as f32))
                .collect();
            let candidates = crate::model::judge::candidates(
                &top,
                p.labels(),
                p.replies(),
                p.descriptions(),
                |i| p.examples().get(i).cloned().unwrap_or_default(),
                route.out_of_scope.as_ref(),
            );
            let Some(first) = candidates.first() else {
                continue;
            };
            let text = first.examples.first().unwrap_or(&first.label).clone();
            let job = Job::Rerank {
                text,
                candidates,
                prompt: route.prompts.clone(),
            };
            if !out.contains(&job) {
                out.push(job);
            }
        }
    }
    out
}

/// Whether a backend's workers warm up: local (`mistralrs`) ones with a time for it (`warmup_ms` > 0); the
/// stub and the remote engine have nothing local to warm.
pub(crate) fn wanted(r: &tiergate_config::RerankerConfig) -> bool {
    r.engine.is_local() && r.warmup_ms > 0
}

/// Writes `jobs` where the backend's workers read them (a temporary file removed when the backend is
/// dropped); `None` when there is nothing to warm.
pub(crate) fn write(jobs: &[Job]) -> anyhow::Result<Option<tempfile::TempPath>> {
    if jobs.is_empty() {
        return Ok(None);
    }
    let mut f = tempfile::Builder::new()
        .prefix("tiergate-warmup-")
        .suffix(".json")
        .tempfile()?;
    serde_json::to_writer(&mut f, jobs)?;
    f.flush()?;
    Ok(Some(f.into_temp_path()))
}
