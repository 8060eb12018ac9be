//! The cascade's Tier −1 step (`cached.rs`), driven directly on the real state (the tiny few-shot classifier,
//! no worker: nothing here runs an LLM job): what a request's `Cache-Control` lets it look up and keep, an
//! exact hit fused anew with this request's prior, a semantic hit answering with its neighbour's fused
//! verdict, written answers kept apart from rerank verdicts, and the generation probe's conditions.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::sync::Arc;

use serde_json::json;
use tiergate_config::Config;
use tiergate_prefilter::testing::TinyModel;

use super::cached;
use crate::model::request::Request;
use crate::routing::route::{Route, Stage};
use crate::state::AppState;
use crate::tenancy::tenants::TenantId;

/// The state over the tiny encoder, no workers.
struct Rig {
    state: Arc<AppState>,
    _tiny: TinyModel,
}

fn rig(workers: usize, tweak: impl FnOnce(&mut Config)) -> Rig {
    assert_eq!(workers, 0, "no LLM job runs here");
    let tiny = TinyModel::create(2).unwrap();
    let mut cfg = crate::testing::config(&tiny);
    cfg.reranker.workers = 0;
    tweak(&mut cfg);
    let state = Arc::new(AppState::build_with(cfg, None, None, None).unwrap());
    Rig { state, _tiny: tiny }
}

fn cached_rig(semantic: bool) -> Rig {
    rig(0, |c| {
        c.cache.enabled = true;
        c.cache.semantic = semantic;
        // The tiny encoder puts near texts close: every other text of this file is far below 0.999.
        c.cache.tau = 0.999;
        c.routes.iter_mut().for_each(|r| r.cache_generations = true);
    })
}

/// A request to `route` as a door validates it: one user turn, `extra`'s `temperature`, and the
/// `Cache-Control` directives of `headers`.
fn valid(
    r: &Rig,
    route: &str,
    text: &str,
    extra: serde_json::Value,
    headers: &[(&str, &str)],
) -> Request {
    let kind = r.state.routing.routes.get(route).unwrap().kind;
    let mut v = Request::for_tests(route, kind, &[("user", text)]);
    v.tenant = TenantId("t".into());
    v.temperature = extra["temperature"].as_f64().map(|t| t as f32);
    for (k, d) in headers {
        assert_eq!(*k, "cache-control");
        for d in d.split(',').map(|d| d.trim().to_ascii_lowercase()) {
            v.cache.no_cache |= d == "no-cache";
            v.cache.no_store |= d == "no-store";
        }
    }
    v
}

fn route(r: &Rig, name: &str) -> (Arc<Route>, Stage) {
    let route = r.state.routing.routes.get(name).unwrap();
    let stage = route.stages[0].clone();
    (route, stage)
}

async fn predict(route: &Route, text: &str) -> tiergate_prefilter::Prediction {
    route
        .prefilter
        .as_ref()
        .unwrap()
        .classify(text)
        .await
        .unwrap()
}

/// Tier-0's top candidates as the prior a stage fuses with.
fn prior(p: &tiergate_prefilter::Prediction) -> Vec<(usize, f32)> {
    p.top.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_verdict_is_found_again_and_fused_with_the_new_prior() {
    let r = cached_rig(false);
    let (route, stage) = route(&r, "classify");
    let v = valid(&r, "classify", "card lost", json!({}), &[]);
    let pred = predict(&route, &v.text).await;
    let pri = prior(&pred);
    let probe = cached::probe(&r.state, &v, &pred, &stage, &pri).unwrap();
    assert!(
        cached::answer(&r.state, &route, &v, &stage, &pri, Some(&probe))
            .await
            .is_none(),
        "empty"
    );
    // The LLM's scores put the last candidate first.
    let scores: Vec<f32> = (0..pri.len()).map(|i| i as f32 * 5.0).collect();
    let fused = tiergate_core::fusion::step(&pri, &scores, 0.5, 1.0).fused;
    cached::keep(
        &r.state,
        &route,
        &v,
        probe,
        &pri,
        scores.clone(),
        &fused,
        "default",
    );
    let again = cached::probe(&r.state, &v, &pred, &stage, &pri).unwrap();
    let hit = cached::answer(&r.state, &route, &v, &stage, &pri, Some(&again))
        .await
        .unwrap();
    assert_eq!(hit.kind, tiergate_cache::HitKind::Exact);
    assert_eq!(hit.backend, "default");
    // Re-fused with this request's prior and the stage's own fusion, not copied.
    let f = stage.fusion_of("default");
    let want = tiergate_core::fusion::step(&pri, &scores, f.llm_weight, f.llm_temperature).fused;
    assert_eq!(hit.fused, want);
    // Another text is another key.
    let other = valid(&r, "classify", "pay bill", json!({}), &[]);
    let p2 = predict(&route, &other.text).await;
    let probe2 = cached::probe(&r.state, &other, &p2, &stage, &prior(&p2)).unwrap();
    assert!(
        cached::answer(&r.state, &route, &other, &stage, &prior(&p2), Some(&probe2))
            .await
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_control_decides_what_is_looked_up_and_kept() {
    let r = cached_rig(false);
    let (route, stage) = route(&r, "classify");
    let keep_one = |v: &Request, pred: &tiergate_prefilter::Prediction| {
        let pri = prior(pred);
        if let Some(p) = cached::probe(&r.state, v, pred, &stage, &pri) {
            let scores = vec![1.0; pri.len()];
            cached::keep(&r.state, &route, v, p, &pri, scores, &pri, "default");
        }
    };
    // no-store: looked up, never kept.
    let v = valid(
        &r,
        "classify",
        "hello hi",
        json!({}),
        &[("cache-control", "no-store")],
    );
    let pred = predict(&route, &v.text).await;
    keep_one(&v, &pred);
    let plain = valid(&r, "classify", "hello hi", json!({}), &[]);
    let p = cached::probe(&r.state, &plain, &pred, &stage, &prior(&pred)).unwrap();
    assert!(
        cached::answer(&r.state, &route, &plain, &stage, &prior(&pred), Some(&p))
            .await
            .is_none(),
        "no-store kept nothing"
    );
    // no-cache: kept, but its own lookup skipped; the next plain request finds it.
    let nc = valid(
        &r,
        "classify",
        "hello hi",
        json!({}),
        &[("cache-control", "no-cache")],
    );
    let p = cached::probe(&r.state, &nc, &pred, &stage, &prior(&pred)).unwrap();
    assert!(
        cached::answer(&r.state, &route, &nc, &stage, &prior(&pred), Some(&p))
            .await
            .is_none()
    );
    keep_one(&nc, &pred);
    let p = cached::probe(&r.state, &plain, &pred, &stage, &prior(&pred)).unwrap();
    assert!(
        cached::answer(&r.state, &route, &plain, &stage, &prior(&pred), Some(&p))
            .await
            .is_some()
    );
    // Both: no probe at all.
    let both = valid(
        &r,
        "classify",
        "hello hi",
        json!({}),
        &[("cache-control", "no-cache, No-Store")],
    );
    assert!(cached::probe(&r.state, &both, &pred, &stage, &prior(&pred)).is_none());
    // With the cache off nothing is probed.
    let off = rig(0, |_| {});
    let (route_off, stage_off) = self::route(&off, "classify");
    let v_off = valid(&off, "classify", "hello hi", json!({}), &[]);
    let pred_off = predict(&route_off, &v_off.text).await;
    assert!(cached::probe(&off.state, &v_off, &pred_off, &stage_off, &prior(&pred_off)).is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semantic_hit_answers_with_its_neighbours_fused_verdict() {
    let r = rig(0, |c| {
        c.cache.enabled = true;
        c.cache.tau = 0.5;
    });
    let (route, stage) = route(&r, "classify");
    let v = valid(&r, "classify", "card lost", json!({}), &[]);
    let pred = predict(&route, &v.text).await;
    assert!(!pred.embedding.is_empty(), "the cache keeps embeddings");
    let pri = prior(&pred);
    let probe = cached::probe(&r.state, &v, &pred, &stage, &pri).unwrap();
    let scores = vec![0.0; pri.len()];
    let fused: Vec<(usize, f32)> = pri.iter().rev().copied().collect();
    cached::keep(&r.state, &route, &v, probe, &pri, scores, &fused, "default");
    // A near text in the same top-label bucket.
    let near = valid(&r, "classify", "card lost my", json!({}), &[]);
    let p2 = predict(&route, &near.text).await;
    assert_eq!(p2.label, pred.label, "same bucket");
    let probe2 = cached::probe(&r.state, &near, &p2, &stage, &prior(&p2)).unwrap();
    let hit = cached::answer(&r.state, &route, &near, &stage, &prior(&p2), Some(&probe2))
        .await
        .unwrap();
    assert_eq!(hit.kind, tiergate_cache::HitKind::Semantic);
    assert!(
        hit.similarity >= 0.5 && hit.similarity < 1.0,
        "{}",
        hit.similarity
    );
    assert_eq!(hit.fused, fused, "the neighbour's verdict as it was fused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn written_answers_are_kept_apart_and_generations_only_at_temperature_zero() {
    let r = cached_rig(false);
    let (route, stage) = route(&r, "generate");
    let job = |v: &Request| tiergate_queue::Job::Generate {
        messages: vec![tiergate_queue::Message {
            role: "user".into(),
            content: v.text.clone(),
            ..Default::default()
        }],
        sampling: tiergate_queue::Sampling::default(),
        tools: None,
    };
    let warm = valid(&r, "generate", "say hi", json!({"temperature": 0.7}), &[]);
    assert!(
        cached::generation_probe(&r.state, &route, &stage, &warm, &job(&warm)).is_none(),
        "a sampled generation is never cached"
    );
    let cold = valid(&r, "generate", "say hi", json!({"temperature": 0.0}), &[]);
    let probe = cached::generation_probe(&r.state, &route, &stage, &cold, &job(&cold)).unwrap();
    assert!(
        cached::written(&r.state, &route, &stage, &cold, Some(&probe))
            .await
            .is_none()
    );
    cached::KeepWritten::new(&r.state, &route, &cold, Some(probe), "default")
        .unwrap()
        .keep("hi there".into(), "stop", 2);
    let probe = cached::generation_probe(&r.state, &route, &stage, &cold, &job(&cold)).unwrap();
    let w = cached::written(&r.state, &route, &stage, &cold, Some(&probe))
        .await
        .unwrap();
    assert_eq!(
        (
            w.text.as_deref(),
            w.finish_reason.as_str(),
            w.completion_tokens
        ),
        (Some("hi there"), "stop", 2)
    );
    // A rerank lookup on the same key does not take a written answer.
    let v = valid(&r, "generate", "say hi", json!({"temperature": 0.0}), &[]);
    assert!(
        cached::answer(&r.state, &route, &v, &stage, &[], Some(&probe))
            .await
            .is_none()
    );
    // The same conversation with tools has another key (a written answer without them is not its answer),
    // and so has another set of tools.
    let tools = |name: &str| {
        Some(tiergate_queue::Tools {
            list: vec![tiergate_queue::Tool {
                name: name.into(),
                description: None,
                parameters: "{}".into(),
            }],
            ..Default::default()
        })
    };
    let with = |t| match job(&cold) {
        tiergate_queue::Job::Generate {
            messages, sampling, ..
        } => tiergate_queue::Job::Generate {
            messages,
            sampling,
            tools: t,
        },
        other => other,
    };
    let p_weather =
        cached::generation_probe(&r.state, &route, &stage, &cold, &with(tools("weather"))).unwrap();
    let p_time =
        cached::generation_probe(&r.state, &route, &stage, &cold, &with(tools("time"))).unwrap();
    assert_ne!(p_weather.key, probe.key);
    assert_ne!(p_weather.key, p_time.key);
    assert!(
        cached::written(&r.state, &route, &stage, &cold, Some(&p_weather))
            .await
            .is_none()
    );
    // Another tenant's identical request has another key.
    let mut other = cold.clone();
    other.tenant = crate::tenancy::tenants::TenantId("u".into());
    let p_other = cached::generation_probe(&r.state, &route, &stage, &other, &job(&other)).unwrap();
    assert_ne!(p_other.key, probe.key);
    assert!(
        cached::written(&r.state, &route, &stage, &other, Some(&p_other))
            .await
            .is_none()
    );
    // no-store: no keeper; a route without cache_generations: no probe.
    let ns = valid(
        &r,
        "generate",
        "say hi",
        json!({"temperature": 0.0}),
        &[("cache-control", "no-store")],
    );
    let p = cached::generation_probe(&r.state, &route, &stage, &ns, &job(&ns));
    assert!(cached::KeepWritten::new(&r.state, &route, &ns, p, "default").is_none());
    let plain = rig(0, |c| c.cache.enabled = true);
    let (route_p, stage_p) = self::route(&plain, "generate");
    let v = valid(
        &plain,
        "generate",
        "say hi",
        json!({"temperature": 0.0}),
        &[],
    );
    assert!(cached::generation_probe(&plain.state, &route_p, &stage_p, &v, &job(&v)).is_none());
}
