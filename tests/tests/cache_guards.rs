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
