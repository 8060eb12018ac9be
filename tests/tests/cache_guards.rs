//! The answer cache's guards on the project's adversarial set (bench/workloads/cache_pairs.jsonl, written
//! for tiergate: paraphrases that must hit; negations, number changes, antonyms, entity swaps and other
//! questions that must not), through `tiergate cache-pairs` on the embedded head (all-MiniLM-L6-v2). On the
//! report half at the configured τ: no false hit on negation and number pairs, false hits ≤ 1% of hits — and
//! without the guards, at the same τ, false hits there are (so the guards, not the set, make the figure).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::process::Command;

use serde_json::Value;
use tiergate_tests::{binary, minilm_dir, root};

#[test]
fn the_guards_keep_negations_and_numbers_out_of_semantic_hits_on_the_report_half() {
    minilm_dir();
    let out = Command::new(binary("tiergate"))
        .current_dir(root())
        .args([
            "cache-pairs",
            "--pairs",
            "bench/workloads/cache_pairs.jsonl",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["pairs"].as_u64().unwrap() >= 300, "{v}");
    let [guarded, unguarded] = [&v["report_at_config_tau"][0], &v["report_at_config_tau"][1]];
    assert_eq!(guarded["guards"], true);
    let false_of = |f: &Value, kind: &str| -> u64 {
        f["false_hits"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k[0] == kind)
            .map_or(0, |k| k[1].as_u64().unwrap())
    };
    for kind in ["negation", "number"] {
        assert_eq!(false_of(guarded, kind), 0, "{kind}: {guarded}");
    }
    let hits = guarded["hits"].as_f64().unwrap();
    let false_total = guarded["false_total"].as_f64().unwrap();
    assert!(false_total <= 0.01 * hits, "{guarded}");
    let para =
        guarded["paraphrase_hits"].as_f64().unwrap() / guarded["paraphrases"].as_f64().unwrap();
    assert!(
        para >= 0.8,
        "the guards should not refuse most paraphrases: {guarded}"
    );
    assert!(
        false_of(unguarded, "negation") + false_of(unguarded, "number") > 0,
        "without guards the same τ lets negations or numbers through: {unguarded}"
    );
}

mod common;

/// A semantic hit end to end on the real server and the real MiniLM (the embedded head, the stub LLM, every
/// request escalated by the operator's θ = 0): a paraphrase of an answered question is a semantic hit in
/// Tier-0's top label bucket with its cosine at or above τ and the first answer's label; an unrelated
/// question in the same bucket, a negation and another number are misses that the LLM answers.
#[test]
fn a_paraphrase_is_a_semantic_hit_through_http_and_near_misses_are_not() {
    let s = common::start(&[
        "--set",
        "reranker.engine=\"stub\"",
        "--set",
        "cache.enabled=true",
        "--set",
        "routing.allow_header_override=true",
        "--set",
        "server.admin_token=\"cache-token\"",
    ]);
    let ask = |text: &str| {
        let r = ureq::post(&format!("{}/v1/chat/completions", s.base))
            .set("x-tiergate-threshold", "0")
            .set("x-tiergate-admin-token", "cache-token")
            .send_json(serde_json::json!({"model": "classify",
                "messages": [{"role": "user", "content": text}]}))
            .unwrap();
        let h = |k: &str| r.header(k).map(str::to_string);
        let (tier, kind, sim) = (
            h("x-tiergate-tier").unwrap(),
            h("x-tiergate-cache"),
            h("x-tiergate-cache-similarity").map(|v| v.parse::<f64>().unwrap()),
        );
        let v: Value = r.into_json().unwrap();
        let label = v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string();
        (tier, kind, sim, label)
    };
    let (tier, kind, _, first) = ask("when will my card arrive");
    assert_eq!((tier.as_str(), kind), ("llm", None));
    let (tier, kind, sim, label) = ask("when is my card going to arrive");
    assert_eq!(tier, "cache", "the paraphrase is a hit");
    assert_eq!(kind.as_deref(), Some("semantic"));
    let sim = sim.unwrap();
    assert!(
        (0.94..1.0).contains(&sim),
        "cosine {sim} at or above τ 0.94 and not exact"
    );
    assert_eq!(label, first, "the neighbour's verdict");
    // Near misses: another question about cards, a negation, a number swap. Each is the LLM's.
    ask("my new card still hasn't arrived after 3 days");
    for text in [
        "how do I activate my card",
        "my new card has arrived",
        "my new card still hasn't arrived after 5 days",
    ] {
        let (tier, kind, sim, _) = ask(text);
        assert_eq!(
            (tier.as_str(), kind.as_deref()),
            ("llm", None),
            "{text}: {sim:?}"
        );
    }
    // The repeat of an answered question is an exact hit, cosine 1.
    let (tier, kind, sim, _) = ask("how do I activate my card");
    assert_eq!(
        (tier.as_str(), kind.as_deref(), sim),
        ("cache", Some("exact"), Some(1.0))
    );
}
