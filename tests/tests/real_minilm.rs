//! Real-model tests on all-MiniLM-L6-v2 (fetched by scripts/fetch-models.sh): embedding quality, numeric
//! parity of our packed BERT with candle-transformers' BertModel, the embedded default label set, and the
//! `tiergate train` / `tiergate eval` commands end to end on the project's own labelled workload.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::process::Command;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert;
use tiergate_config::PoolingConfig;
use tiergate_prefilter::classifier::{embed_texts, load_encoder};
use tiergate_prefilter::{Classifier, PrefilterHandle};
use tiergate_tests::{binary, minilm_dir};

fn cosine(a: &Tensor, b: &Tensor) -> f32 {
    let dot = |x: &Tensor, y: &Tensor| {
        (x * y)
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    };
    dot(a, b) / (dot(a, a) * dot(b, b)).sqrt()
}

#[test]
fn paraphrases_score_closer_than_unrelated_sentences() {
    let (tok, enc) = load_encoder(&minilm_dir(), PoolingConfig::Auto, 64).unwrap();
    let texts = [
        "my card has not arrived yet",
        "I am still waiting for my new card to be delivered",
        "what is the exchange rate for dollars",
        "how do I reset my online banking password",
        "I forgot the password for the app",
        "the weather is lovely at the beach today",
    ];
    let e = embed_texts(&tok, &enc, &texts, 8).unwrap();
    let row = |i: usize| e.get(i).unwrap();
    let norm = row(0)
        .sqr()
        .unwrap()
        .sum_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(
        (norm - 1.0).abs() < 1e-4,
        "MiniLM pooling normalises: |e|^2 = {norm}"
    );
    let para = cosine(&row(0), &row(1));
    for other in [2, 3, 5] {
        let c = cosine(&row(0), &row(other));
        assert!(
            para > c + 0.15,
            "card paraphrase {para} vs sentence {other} {c}"
        );
    }
    let para2 = cosine(&row(3), &row(4));
    assert!(para2 > cosine(&row(3), &row(2)) + 0.15);
    assert!(para2 > cosine(&row(3), &row(5)) + 0.15);
}

#[test]
fn packed_minilm_matches_candle_transformers_within_1e4() {
    let dir = minilm_dir();
    let (tok, enc) = load_encoder(&dir, PoolingConfig::Mean, 64).unwrap();
    let texts = [
        "hi",
        "where is the card I ordered two weeks ago?",
        "top up failed",
    ];
    let ours = embed_texts(&tok, &enc, &texts, 8).unwrap();
    let cfg: bert::Config =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let vb = unsafe {
        VarBuilder::from_mmaped_safetensors(
            &[dir.join("model.safetensors")],
            DType::F32,
            &Device::Cpu,
        )
        .unwrap()
    };
    let reference = bert::BertModel::load(vb, &cfg).unwrap();
    for (i, text) in texts.iter().enumerate() {
        let t = tok.encode(text).unwrap();
        let ids = Tensor::new(t.ids.as_slice(), &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let states = reference
            .forward(&ids, &ids.zeros_like().unwrap(), None)
            .unwrap();
        let want = states.mean(1).unwrap().squeeze(0).unwrap();
        let diff = (ours.get(i).unwrap() - want)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(diff < 1e-4, "{text}: max abs diff {diff}");
    }
}

#[test]
fn embedded_default_label_set_routes_plain_queries() {
    let mut cfg = tiergate_config::load(None, Vec::new(), &[]).unwrap();
    cfg.prefilter.encoder = minilm_dir();
    let c = Classifier::from_config(&cfg.prefilter).unwrap();
    let h = PrefilterHandle::start(c, &cfg.prefilter).unwrap();
    let cases = [
        ("somebody stole my debit card", "lost_or_stolen_card"),
        ("I need to talk to a person", "speak_to_human"),
        ("how much money is in my account", "check_balance"),
        ("how can I change my PIN code", "change_pin"),
    ];
    for (text, want) in cases {
        let p = h.classify_blocking(text).unwrap();
        assert_eq!(h.labels()[p.label], want, "{text}: top {:?}", p.top);
        assert!(h.replies()[p.label].is_some());
    }
}

/// On the project's own labelled workload (`bench/workloads/bank24.jsonl`: 150 self-written rows over 24
/// intents), so the suite runs in a bare clone; Banking77 figures are benchmarks (README).
#[test]
fn cli_train_then_eval_json_on_the_project_workload() {
    let work = tempfile::tempdir().unwrap();
    let data = tiergate_tests::root().join("bench/workloads/bank24.jsonl");
    let head = work.path().join("head");
    let out = Command::new(binary("tiergate"))
        .args(["train", "--encoder"])
        .arg(minilm_dir())
        .arg("--data")
        .arg(&data)
        .arg("--out")
        .arg(&head)
        .args(["--dev-fraction", "0.25"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "train failed: {}\n{}",
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("dev: n="), "{stdout}");
    assert!(head.join("head.json").is_file() && head.join("head.safetensors").is_file());

    let out = Command::new(binary("tiergate"))
        .args([
            "eval",
            "--json",
            "--split",
            "dev",
            "--dev-fraction",
            "0.25",
            "--latency-samples",
            "20",
            "--classifier",
        ])
        .arg(&head)
        .arg("--data")
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "eval failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in [
        "n",
        "accuracy",
        "macro_f1",
        "top5_recall",
        "ece",
        "selective",
        "latency_ms",
        "throughput_per_s",
    ] {
        assert!(v.get(key).is_some(), "missing `{key}` in {v}");
    }
    // ~37 held-out rows over 24 intents, a quarter of them indirect: far above chance (1/24), not a benchmark.
    let acc = v["accuracy"].as_f64().unwrap();
    assert!(acc > 0.6, "dev accuracy on 24 intents: {acc}");
    // Representative utterances per label are stored with the head (what an escalation's LLM reads).
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(head.join("head.json")).unwrap()).unwrap();
    assert_eq!(meta["examples"].as_array().map(Vec::len), Some(24));
    assert_eq!(v["selective"].as_array().unwrap().len(), 19);
    assert!(v["latency_ms"]["p50"].as_f64().unwrap() > 0.0);

    // A bad row is reported with its line number, or skipped and counted on request.
    let bad = work.path().join("bad.csv");
    std::fs::write(
        &bad,
        "text,category\nfine,card_arrival\n\"unterminated,x\nok,lost_or_stolen_card\n,empty\n",
    )
    .unwrap();
    let out = Command::new(binary("tiergate"))
        .args(["eval", "--classifier"])
        .arg(&head)
        .arg("--data")
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.csv:"), "{err}");
}

/// int8 dense layers (AVX-512 VNNI) against f32 on the real MiniLM: the same sentence vectors to within a
/// cosine of 0.99, and the same nearest neighbours.
#[test]
fn int8_encoder_agrees_with_f32() {
    use tiergate_config::Precision;
    let (tok, f32_enc) = load_encoder(&minilm_dir(), PoolingConfig::Auto, 64).unwrap();
    let (_, mut q_enc) = load_encoder(&minilm_dir(), PoolingConfig::Auto, 64).unwrap();
    let used = q_enc.set_precision(Precision::Auto).unwrap();
    if used != Precision::Int8 {
        eprintln!("no AVX-512 VNNI on this CPU: the f32 path serves, nothing to compare");
        return;
    }
    let texts = [
        "my card has not arrived yet",
        "I am still waiting for my new card to be delivered",
        "what is the exchange rate for dollars",
        "how do I reset my online banking password",
        "the weather is lovely at the beach today",
        "a",
    ];
    let a = embed_texts(&tok, &f32_enc, &texts, 4).unwrap();
    let b = embed_texts(&tok, &q_enc, &texts, 4).unwrap();
    for (i, t) in texts.iter().enumerate() {
        let c = cosine(&a.get(i).unwrap(), &b.get(i).unwrap());
        assert!(c > 0.99, "{t}: cosine {c}");
    }
    // Nearest other sentence of the first one is its paraphrase under both.
    let best = |e: &candle_core::Tensor| {
        (1..texts.len())
            .max_by(|&x, &y| {
                cosine(&e.get(0).unwrap(), &e.get(x).unwrap())
                    .total_cmp(&cosine(&e.get(0).unwrap(), &e.get(y).unwrap()))
            })
            .unwrap()
    };
    assert_eq!(best(&a), 1);
    assert_eq!(best(&b), 1);
}
