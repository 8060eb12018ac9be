//! What the judge sees and says for one multiple-choice question: the tokens of the chat-templated prompt and
//! the letter distribution, with quantized, int8 and f32 weights (printed, never asserted).
//!
//! `cargo run -p tiergate-reranker --example choice_probe [-- MODEL.gguf]` (default: the Qwen2.5-Coder-0.5B
//! that `scripts/fetch-models.sh --judge qwen2.5-0.5b` fetches).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a probe: failing loudly is the point

use std::path::PathBuf;

use tiergate_queue::Candidate;
use tiergate_reranker::llama::{Llama, Segment as Seg, WeightFormat};

fn main() {
    use tiergate_reranker::scoring::Tokenize;
    let model: PathBuf = std::env::args().nth(1).map_or_else(
        || {
            PathBuf::from(
                "models/qwen2.5-coder-0.5b-instruct/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            )
        },
        PathBuf::from,
    );
    let engine = tiergate_reranker::llm::MistralEngine::load(&tiergate_reranker::llm::LlmOptions {
        model: model.clone(),
        isq: None,
        max_seqs: 1,
        scoring_weights: WeightFormat::Quantized,
        prefix_cache_bytes: 1 << 20,
        profile: String::new(),
    })
    .unwrap();
    let t = tiergate_config::template("qwen2").unwrap();
    let p = tiergate_config::PromptConfig::default();
    let labels = [
        "open account",
        "exchange rate",
        "lost card",
        "speak to a human",
    ];
    let cands: Vec<Candidate> = labels
        .iter()
        .map(|l| Candidate {
            label: (*l).into(),
            reply: None,
            description: None,
            examples: Vec::new(),
            p: 0.25,
        })
        .collect();
    let q = tiergate_reranker::prompt::choice_question(
        "Someone stole my credit card yesterday",
        &cands,
        &[0, 1, 2, 3],
        &p,
        0,
    );
    let text = t.single_turn(&q);
    let ids = engine.encode(&text).unwrap();
    println!("{text}\n{} tokens: {ids:?}", ids.len());
    println!(
        "A: {:?}, ' A': {:?}",
        engine.encode("A").unwrap(),
        engine.encode(" A").unwrap()
    );
    for fmt in [
        WeightFormat::Quantized,
        WeightFormat::Int8,
        WeightFormat::F32,
    ] {
        let m = Llama::load(&model, fmt).unwrap();
        let letters: Vec<Vec<u32>> = ["A", "B", "C", "D"]
            .iter()
            .map(|l| engine.encode(l).unwrap())
            .collect();
        let lp =
            tiergate_reranker::scoring::letter_logprobs(&m, std::slice::from_ref(&ids), &letters)
                .unwrap();
        let (hidden, _) = m
            .forward(
                &[Seg {
                    tokens: ids.clone(),
                    start_pos: 0,
                    sees_past: 0..0,
                    sees_segments: vec![],
                }],
                None,
            )
            .unwrap();
        let all = m
            .log_probs(&hidden.narrow(0, ids.len() - 1, 1).unwrap())
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let mut top: Vec<(usize, f32)> = all.iter().copied().enumerate().collect();
        top.sort_by(|a, b| b.1.total_cmp(&a.1));
        println!(
            "{fmt:?}: letters {:?}; top tokens {:?}",
            lp[0].iter().map(|v| v.exp()).collect::<Vec<_>>(),
            &top[..5]
        );
    }
}
