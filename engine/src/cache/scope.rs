//! A stage's cache scope: a fingerprint of everything that makes its verdicts valid. Any change in it is
//! another scope — every earlier verdict a miss, never a stale hit: the route (name, kind, prompt templates,
//! out-of-scope outcome, grounding), the head (its version: a trained head's weights fingerprint; its labels,
//! examples, descriptions and replies; its config: encoder, head kind, folder), the stage (index, name, each
//! alternative's model identity — engine, model file or upstream model and URL, profile, scoring arithmetic,
//! its prompts and knobs — and its fusion). The text and the candidates are the key's other parts.
//!
//! The conversation before the last user turn is in the key only as far as the route reads it: a rerank
//! judges the text Tier-0 classified — the last user turn, with its earlier user turns on a route with
//! `context_turns` ([`crate::answer::context`]) — and that text is the key's; the context bounds are in the
//! scope, so a route that starts reading context starts afresh.

use tiergate_config::{Backend, Route as RouteConfig};
use tiergate_core::fnv::Fnv;
use tiergate_prefilter::PrefilterHandle;

use crate::routing::route::Stage;

/// The scope of stage `k` of route `r` (with its prefilter and head version) over the resolved `backends`.
pub(crate) fn scope(
    r: &RouteConfig,
    backends: &[Backend],
    prefilter: Option<&PrefilterHandle>,
    head_version: &str,
    k: usize,
    stage: &Stage,
) -> u64 {
    let mut h = Fnv::new();
    let mut eat = |v: serde_json::Value| {
        h.eat(v.to_string().as_bytes()).eat(&[0xff]);
    };
    eat(serde_json::json!({
        "route": r.name,
        "kind": r.kind,
        "prompts": r.prompts,
        "out_of_scope": r.out_of_scope,
        "head": r.head,
        "head_version": head_version,
        "context": [r.context_turns, r.context_chars],
    }));
    if let Some(p) = prefilter {
        eat(serde_json::json!({
            "labels": p.labels(),
            "examples": p.examples(),
            "descriptions": p.descriptions(),
            "replies": p.replies(),
            "trained": p.trained().map(|t| t.fingerprint.clone()),
        }));
    }
    eat(serde_json::json!({"stage": k, "name": stage.name}));
    for ((b, _), fusion) in stage.alternatives.iter().zip(&stage.fusions) {
        let Some(be) = backends.get(*b) else { continue };
        let c = &be.config;
        eat(serde_json::json!({
            "backend": be.name,
            "engine": c.engine,
            "model": c.model,
            "url": c.url,
            "profile": c.profile,
            "scoring_weights": c.scoring_weights,
            "f32_weights": c.f32_weights,
            "prompts": c.prompts,
            "extra_args": c.extra_args,
            "llm_weight": fusion.llm_weight,
            "llm_temperature": fusion.llm_temperature,
        }));
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::fusion::Fusion;

    fn stage(weight: f32) -> Stage {
        Stage {
            name: "default".into(),
            candidates: 5,
            alternatives: vec![(0, "default".into())],
            prefer: tiergate_config::Prefer::Quality,
            retries: 0,
            theta: 0.0,
            policy: None,
            fusions: vec![Fusion {
                llm_weight: weight,
                llm_temperature: 1.0,
                source: "config",
                fit: None,
            }],
            cache_scope: 0,
            pinned: None,
        }
    }

    /// Every part of what makes a verdict valid changes the scope; the same config gives the same scope.
    #[test]
    fn any_change_to_what_makes_a_verdict_valid_is_another_scope() {
        let cfg: tiergate_config::Config =
            toml::from_str(tiergate_config::DEFAULT_CONFIG).expect("the embedded config parses");
        let resolved = cfg.resolve().expect("the default config resolves");
        let (r, b) = (&resolved.routes[0], &resolved.backends);
        let base = scope(r, b, None, "v1", 0, &stage(0.5));
        assert_eq!(base, scope(r, b, None, "v1", 0, &stage(0.5)));
        let mut changed = Vec::new();
        changed.push(("head version", scope(r, b, None, "v2", 0, &stage(0.5))));
        changed.push(("stage index", scope(r, b, None, "v1", 1, &stage(0.5))));
        changed.push(("fusion", scope(r, b, None, "v1", 0, &stage(0.6))));
        let mut r2 = r.clone();
        r2.prompts.query = format!("{} ", r2.prompts.query);
        changed.push(("prompt", scope(&r2, b, None, "v1", 0, &stage(0.5))));
        let mut r3 = r.clone();
        r3.name = "other".into();
        changed.push(("route", scope(&r3, b, None, "v1", 0, &stage(0.5))));
        let mut b2 = b.clone();
        b2[0].config.model = "models/another.gguf".into();
        changed.push(("model", scope(r, &b2, None, "v1", 0, &stage(0.5))));
        let mut b3 = b.clone();
        b3[0].config.extra_args = vec!["--stub-delay-ms".into(), "1".into()];
        changed.push(("worker knobs", scope(r, &b3, None, "v1", 0, &stage(0.5))));
        let mut r4 = r.clone();
        if let tiergate_config::HeadConfig::FewShot { labels, .. } = &mut r4.head {
            labels[0].examples.push("one more example".into());
        }
        changed.push(("head examples", scope(&r4, b, None, "v1", 0, &stage(0.5))));
        for (what, s) in changed {
            assert_ne!(s, base, "{what} changed and the scope did not");
        }
    }

    /// A trained head at `dir` over `tiny`'s encoder, with `weights` scaling its rows and `examples` per label.
    fn trained_head(
        tiny: &tiergate_prefilter::testing::TinyModel,
        dir: &std::path::Path,
        weights: f32,
        examples: &[&str],
    ) -> PrefilterHandle {
        use candle_core::{DType, Device, Tensor};
        let w = (Tensor::ones((2, tiny.hidden), DType::F32, &Device::Cpu).unwrap()
            * f64::from(weights))
        .unwrap();
        let b = Tensor::new(&[0.5f32, -0.5], &Device::Cpu).unwrap();
        let meta = tiergate_prefilter::heads::TrainedHeadMeta {
            format: tiergate_prefilter::heads::HEAD_FORMAT,
            labels: vec!["a".into(), "b".into()],
            temperature: 1.0,
            encoder: tiny.dir.path().to_path_buf(),
            hidden_size: tiny.hidden,
            fine_tuned: false,
            dev: tiergate_prefilter::heads::DevReport {
                n: 2,
                accuracy: 1.0,
                ece_uncalibrated: 0.0,
                ece: 0.0,
                temperature_rows: 2,
                calibration_flaw: None,
            },
            examples: examples.iter().map(|e| vec![e.to_string()]).collect(),
            descriptions: Vec::new(),
            split: None,
        };
        tiergate_prefilter::heads::save_trained(dir, &meta, &w, &b).unwrap();
        let head = tiergate_config::HeadConfig::Trained(tiergate_config::TrainedHeadConfig {
            dir: dir.to_path_buf(),
        });
        let cfg = tiergate_prefilter::testing::tiny_config(tiny.dir.path(), head);
        let c = tiergate_prefilter::Classifier::from_config(&cfg).unwrap();
        PrefilterHandle::start(c, &cfg).unwrap()
    }

    /// The head in the prefilter is part of the scope, not only its config and version string: the same
    /// folder retrained (other weights) or re-grounded (other examples) under an unchanged config and version
    /// string is another scope, and the same head loaded twice is the same.
    #[test]
    fn the_head_itself_is_part_of_the_scope() {
        let cfg: tiergate_config::Config =
            toml::from_str(tiergate_config::DEFAULT_CONFIG).expect("the embedded config parses");
        let resolved = cfg.resolve().expect("the default config resolves");
        let (r, b) = (&resolved.routes[0], &resolved.backends);
        let tiny = tiergate_prefilter::testing::TinyModel::create(2).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let head = dir.path().join("head");
        let of = |p: &PrefilterHandle| scope(r, b, Some(p), "v1", 0, &stage(0.5));
        let first = of(&trained_head(&tiny, &head, 1.0, &["x", "y"]));
        assert_eq!(first, of(&trained_head(&tiny, &head, 1.0, &["x", "y"])));
        assert_ne!(
            first,
            scope(r, b, None, "v1", 0, &stage(0.5)),
            "the head's facts enter the scope"
        );
        let retrained = of(&trained_head(&tiny, &head, 2.0, &["x", "y"]));
        assert_ne!(first, retrained, "other weights in the same folder");
        let regrounded = of(&trained_head(&tiny, &head, 1.0, &["x", "z"]));
        assert_ne!(first, regrounded, "other examples the judge reads");
    }
}
