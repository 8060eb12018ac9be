//! LLM-side figures on this machine:
//! 1. a rerank job with 5 candidates and a ~30-token query through the real queue and a real
//!    `tiergate-reranker --engine mistralrs` worker process (end to end, and prefill tokens/s);
//! 2. the raw candle forward of the same GGUF file (candle-transformers' quantized llama) on the same number
//!    of tokens, for the overhead ratio.
//!
//! `cargo run -p tiergate-reranker --example llm_bench [-- MODEL.gguf [--f32-weights]]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use tiergate_queue::{
    Candidate, Client, Geometry, Job, Reply, Segment, Supervisor, SupervisorConfig,
};

const QUERY: &str = "Hello, I ordered a new debit card about two weeks ago and it still has not arrived at my home \
                     address, what should I do now?";
const LABELS: &[&str] = &[
    "card_arrival",
    "lost_or_stolen_card",
    "activate_card",
    "change_pin",
    "card_declined",
];

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let model = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf".into());
    let f32_weights = args.iter().any(|a| a == "--f32-weights");

    // 1. Through the queue.
    let name = format!("tiergate-llm-bench-{}", std::process::id());
    let seg = Arc::new(Segment::create(
        &name,
        Geometry {
            slots: 8,
            req_cap: 8192,
            resp_cap: 65536,
        },
    )?);
    let program = std::env::current_exe()?
        .parent()
        .and_then(|p| p.parent())
        .map(|p| p.join("tiergate-reranker"))
        .ok_or_else(|| anyhow::anyhow!("cannot locate tiergate-reranker"))?;
    let mut wargs = vec![
        "--engine".to_string(),
        "mistralrs".into(),
        "--model".into(),
        model.clone(),
    ];
    if f32_weights {
        wargs.push("--f32-weights".into());
    }
    let sup = Supervisor::start(
        seg.clone(),
        SupervisorConfig {
            workers: 1,
            program,
            args: wargs,
            segment: name,
            heartbeat_timeout: Duration::from_secs(10),
            backoff_initial: Duration::from_millis(200),
            backoff_max: Duration::from_secs(2),
            retry: false,
        },
    )?;
    let client = Client::new(seg, Duration::from_secs(10))?;
    let t = Instant::now();
    while client.live_workers() == 0 {
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(120),
            "worker did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let job = Job::Rerank {
        text: QUERY.into(),
        candidates: LABELS
            .iter()
            .map(|l| Candidate {
                label: (*l).into(),
                description: None,
                p: 0.2,
            })
            .collect(),
        llm_weight: 1.0,
    };
    let mut times = Vec::new();
    let mut prompt_tokens = 0;
    let mut llm = Vec::new();
    for i in 0..4 {
        let t = Instant::now();
        let Reply::Rerank(r) = client
            .submit(&job, Duration::from_secs(120))?
            .wait_reply()?
        else {
            anyhow::bail!("unexpected reply")
        };
        if i > 0 {
            times.push(t.elapsed().as_secs_f64());
        }
        prompt_tokens = r.prompt_tokens;
        llm = r.llm;
    }
    times.sort_by(f64::total_cmp);
    let rerank_s = times[times.len() / 2];
    // Each candidate is one prefill of prompt + label (~3 tokens).
    let tokens = (prompt_tokens as usize + 3) * LABELS.len();
    println!(
        "rerank via queue + worker ({}): 5 candidates, {prompt_tokens}-token prompt: median {:.0} ms, ~{:.0} prefill tok/s; P = {:?}",
        if f32_weights { "f32 weights" } else { "Q4_1" },
        rerank_s * 1e3,
        tokens as f64 / rerank_s,
        llm.iter().map(|p| (p * 1000.0).round() / 1000.0).collect::<Vec<_>>()
    );
    drop(client);
    drop(sup);

    // 2. Raw candle forward on the same file, same sequence length.
    if f32_weights {
        std::env::set_var("CANDLE_DEQUANTIZE_ALL", "1");
    }
    let mut file = std::fs::File::open(&model)?;
    let content = candle_core::quantized::gguf_file::Content::read(&mut file)?;
    let device = candle_core::Device::Cpu;
    let mut weights = candle_transformers::models::quantized_llama::ModelWeights::from_gguf(
        content, &mut file, &device,
    )?;
    let len = prompt_tokens as usize + 3;
    let ids: Vec<u32> = (0..len as u32).map(|i| 100 + i * 7).collect();
    let input = candle_core::Tensor::new(ids.as_slice(), &device)?.unsqueeze(0)?;
    weights.forward(&input, 0)?;
    let mut raw = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        weights.forward(&input, 0)?;
        raw.push(t.elapsed().as_secs_f64());
    }
    raw.sort_by(f64::total_cmp);
    let raw_s = raw[raw.len() / 2];
    println!(
        "raw candle forward, {len} tokens: {:.0} ms, {:.0} prefill tok/s; worker rerank / (5 x raw forward) = {:.2}",
        raw_s * 1e3,
        len as f64 / raw_s,
        rerank_s / (5.0 * raw_s)
    );
    Ok(())
}
