//! The one-pass scorer on the real SmolLM2-135M GGUF (fetched by scripts/fetch-models.sh):
//! - our llama forward matches candle-transformers' `quantized_llama` (the reference) on the same file;
//! - channel scores from cached prefixes and one shared forward equal k separate full prefills;
//! - likelihood scores off one shared prompt equal k separate full prefills;
//! - the content-free prior is subtracted.
//!
//! Tolerance: 2e-3 on mean log-probabilities. Both sides run the same f32 arithmetic in a different order
//! (one block-masked forward over all candidates vs one causal forward each: other matmul shapes, so other
//! summation orders, and −∞-masked columns that add exact zeros); observed differences are ~1e-5–1e-4, and a
//! real mistake (a wrong position, a leaked prefix) moves scores by 0.1 or more.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use candle_core::{Device, Tensor};
use tiergate_config::{PromptConfig, ScoringMethod};
use tiergate_queue::Candidate;
use tiergate_reranker::llama::{Llama, Segment, WeightFormat};
use tiergate_reranker::prompt;
use tiergate_reranker::scoring::{full_prefill_score, shared_prompt_scores, Scorer, Tokenize};
use tiergate_reranker::EngineError;
use tiergate_tests::root;

const TOL: f32 = 2e-3;

/// Bytes as token ids (offset past the special tokens): any text, valid ids, no tokenizer file needed.
struct Bytes;
impl Tokenize for Bytes {
    fn encode(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        Ok(text.bytes().map(|b| 200 + u32::from(b)).collect())
    }
}

fn model_path() -> std::path::PathBuf {
    let p = root().join("models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.is_file(),
        "{} missing: run scripts/fetch-models.sh",
        p.display()
    );
    p
}

fn cand(label: &str, examples: &[&str]) -> Candidate {
    Candidate {
        label: label.into(),
        reply: None,
        description: None,
        examples: examples.iter().map(|s| s.to_string()).collect(),
        p: 0.2,
    }
}

#[test]
fn forward_matches_candle_quantized_llama() {
    let path = model_path();
    let ours = Llama::load(&path, WeightFormat::Quantized).unwrap();
    let mut file = std::fs::File::open(&path).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
    let mut reference = candle_transformers::models::quantized_llama::ModelWeights::from_gguf(
        content,
        &mut file,
        &Device::Cpu,
    )
    .unwrap();
    let ids: Vec<u32> = (0..23u32).map(|i| 300 + i * 37).collect();
    let input = Tensor::new(ids.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let want = candle_nn::ops::log_softmax(&reference.forward(&input, 0).unwrap(), 1)
        .unwrap()
        .squeeze(0)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let (hidden, _) = ours
        .forward(
            &[Segment {
                tokens: ids.clone(),
                start_pos: 0,
                sees_past: 0..0,
                sees_segments: vec![],
            }],
            None,
        )
        .unwrap();
    let got = ours
        .log_probs(&hidden.narrow(0, ids.len() - 1, 1).unwrap())
        .unwrap()
        .squeeze(0)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let diff = want
        .iter()
        .zip(&got)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    println!("max |Δ log p| over the vocabulary vs quantized_llama: {diff:.2e}");
    assert!(diff < TOL, "{diff}");
}

#[test]
fn one_pass_scores_equal_k_full_prefills() {
    let model = Llama::load(&model_path(), WeightFormat::F32).unwrap();
    let scorer = Scorer::new(model, 64 << 20).unwrap();
    let candidates = vec![
        cand(
            "card_arrival",
            &["my card has not come", "where is my new card"],
        ),
        cand(
            "exchange_rate",
            &["what rate do you use", "how much is a dollar in euro"],
        ),
        cand("top_up_failed", &["my top-up did not work"]),
        cand("pin_blocked", &[]),
    ];
    let text = "my card still has not arrived";
    for method in [ScoringMethod::Channel, ScoringMethod::Likelihood] {
        // With a content-free prior, so its subtraction is checked too.
        let p = PromptConfig {
            method,
            content_free: "N/A".into(),
            ..PromptConfig::default()
        };
        // Twice: the second run reads the cached prefixes and priors.
        for round in 0..2 {
            let got = scorer
                .score(&Bytes, text, &candidates, &p, &|| false)
                .unwrap()
                .scores;
            let tok = |s: &str| Bytes.encode(s).unwrap();
            let want: Vec<f32> = candidates
                .iter()
                .map(|c| match method {
                    ScoringMethod::Channel => {
                        let pre = tok(&prompt::channel_prefix(c, &p));
                        full_prefill_score(
                            scorer.model(),
                            &pre,
                            &tok(&prompt::channel_query(text, &p)),
                        )
                        .unwrap()
                            - full_prefill_score(
                                scorer.model(),
                                &pre,
                                &tok(&prompt::channel_query(&p.content_free, &p)),
                            )
                            .unwrap()
                    }
                    ScoringMethod::Likelihood => {
                        let cand = tok(&prompt::likelihood_candidate(c, &p));
                        full_prefill_score(
                            scorer.model(),
                            &tok(&prompt::likelihood_prompt(text, &p)),
                            &cand,
                        )
                        .unwrap()
                            - full_prefill_score(
                                scorer.model(),
                                &tok(&prompt::likelihood_prompt(&p.content_free, &p)),
                                &cand,
                            )
                            .unwrap()
                    }
                    other => panic!("{other:?} is tested below"),
                })
                .collect();
            let diff = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            println!(
                "{method:?} round {round}: one pass {got:?}, k prefills {want:?}, max Δ {diff:.2e}"
            );
            assert!(diff < TOL, "{method:?}: {got:?} vs {want:?}");
        }
    }
    // The shared-prompt helper on its own, without priors.
    let head = Bytes.encode("Message: hello\nTopic:").unwrap();
    let cands = vec![
        Bytes.encode(" greeting\n").unwrap(),
        Bytes.encode(" a\n").unwrap(),
    ];
    let got = shared_prompt_scores(scorer.model(), &head, &cands).unwrap();
    for (g, c) in got.iter().zip(&cands) {
        let w = full_prefill_score(scorer.model(), &head, c).unwrap();
        assert!((g - w).abs() < TOL, "{g} vs {w}");
    }
}
