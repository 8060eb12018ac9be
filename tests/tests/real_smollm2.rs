//! Real-model smoke test of the reranker worker: SmolLM2-135M-Instruct (fetched by scripts/fetch-models.sh)
//! behind the shared-memory queue. Easy rerank cases, scored through the one-pass channel path with a few
//! examples per candidate, pick the right candidate; generation streams tokens and
//! ends with usage.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::time::{Duration, Instant};

use tiergate_queue::{Candidate, Event, Job, Message, Reply, Sampling};
use tiergate_tests::root;

mod common;

/// A candidate as the server sends it: the label with a few example utterances (self-written here), which
/// is what the channel scoring reads.
fn cand(label: &str) -> Candidate {
    let examples: &[&str] = match label {
        "card lost" => &[
            "I lost my card",
            "my card was stolen",
            "I can't find my bank card",
        ],
        "exchange rate" => &[
            "what is the rate for euros",
            "how much is a dollar worth in pounds",
            "currency conversion rate today",
        ],
        "open account" => &[
            "I want to open a new account",
            "how do I become a customer",
            "sign me up for an account",
        ],
        "speak to human" => &[
            "let me talk to a person",
            "I need a real agent",
            "connect me to a member of staff",
        ],
        _ => &[],
    };
    Candidate {
        label: label.into(),
        reply: None,
        description: None,
        examples: examples.iter().map(|e| e.to_string()).collect(),
        p: 1.0 / 3.0,
    }
}

#[test]
fn smollm2_reranks_easy_cases_and_streams_a_reply() {
    let model = root().join("models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        model.is_file(),
        "{} missing: run scripts/fetch-models.sh",
        model.display()
    );
    let (client, _sup) = common::llm_worker(&model, "smollm2", Duration::from_secs(120));
    let cases = [
        (
            "What is the exchange rate from dollars to euros?",
            ["card lost", "exchange rate", "open account"],
            1,
        ),
        (
            "I want to speak to a human agent now",
            ["speak to human", "exchange rate", "card lost"],
            0,
        ),
        (
            "Someone stole my credit card yesterday",
            ["exchange rate", "open account", "card lost"],
            2,
        ),
    ];
    for (text, labels, want) in cases {
        let job = Job::Rerank {
            text: text.into(),
            candidates: labels.iter().map(|l| cand(l)).collect(),
            prompt: Default::default(),
        };
        let t = Instant::now();
        let Reply::Rerank(r) = client
            .submit(&job, Duration::from_secs(60))
            .unwrap()
            .wait_reply()
            .unwrap()
        else {
            panic!("not a rerank reply")
        };
        let llm = tiergate_core::fusion::llm_probs(&r.scores, 1.0);
        let best = llm
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0;
        eprintln!(
            "rerank {text:?}: {llm:?} in {:?} ({} prompt tokens)",
            t.elapsed(),
            r.prompt_tokens
        );
        assert_eq!(best, want, "{text}: {llm:?}");
    }
    let job = Job::Generate {
        messages: vec![Message {
            role: "user".into(),
            content: "Say hello in one short sentence.".into(),
            ..Default::default()
        }],
        sampling: Sampling {
            max_tokens: 24,
            temperature: Some(0.0),
            ..Default::default()
        },
        tools: None,
    };
    let h = client.submit(&job, Duration::from_secs(120)).unwrap();
    let mut chunks = Vec::new();
    let usage = loop {
        match h.events.recv_timeout(Duration::from_secs(120)).unwrap() {
            Event::Chunk(c) => chunks.push(c),
            Event::Reply(Reply::Generated(u)) => break u,
            other => panic!("unexpected {other:?}"),
        }
    };
    let text: String = chunks.concat();
    eprintln!("generated {text:?} {usage:?}");
    assert!(chunks.len() >= 2, "streamed in pieces: {chunks:?}");
    assert!(!text.trim().is_empty());
    assert!(usage.completion_tokens >= 1 && usage.completion_tokens <= 24);
    assert!(usage.prompt_tokens > 0);
}
