//! The escalation's cost on this machine: reranks of `bench/rerank_cases.json` (5 candidates with 4 examples
//! each, 8 queries) through the real shared-memory queue and a real `tiergate-reranker` (mistralrs engine)
//! worker process, for each scoring method of the default config's templates (choice with its default
//! `choice_orders`, label names only):
//! - cold: the first rerank (channel: the 5 label prefixes are prefilled then);
//! - warm: median and p90 over 2 × 8 reranks, one at a time;
//! - throughput: 4 reranks kept in flight for 10 s (escalations completed per second).
//!
//! `cargo run -p tiergate-reranker --example rerank_bench [-- MODEL.gguf] [--scoring-weights quantized]
//! [--methods choice,channel]`
//! The llama.cpp peer on the same cases and GGUF: `bench/llamacpp_rerank.py`.
//! `--upstream http://HOST:PORT/v1`: the same reranks through the `openai` engine (a worker that asks that
//! OpenAI-compatible server; two multiple-choice requests per rerank) instead of the local model.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tiergate_config::{Config, ScoringMethod};
use tiergate_queue::{
    Candidate, Client, Geometry, Job, Reply, Segment, Supervisor, SupervisorConfig,
};

#[derive(serde::Deserialize)]
struct Cases {
    candidates: Vec<Cand>,
    queries: Vec<String>,
}

#[derive(serde::Deserialize)]
struct Cand {
    label: String,
    examples: Vec<String>,
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let model = args
        .get(1)
        .filter(|a| !a.starts_with("--"))
        .cloned()
        .unwrap_or_else(|| "models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf".into());
    let weights = args
        .iter()
        .position(|a| a == "--scoring-weights")
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| "int8".into());
    let upstream = args
        .iter()
        .position(|a| a == "--upstream")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let only: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--methods")
        .and_then(|i| args.get(i + 1))
        .map(|m| m.split(',').map(str::to_string).collect());
    let cases: Cases = serde_json::from_str(&std::fs::read_to_string("bench/rerank_cases.json")?)?;
    let config = tiergate_config::load(None, Vec::new(), &[])?;
    let candidates: Vec<Candidate> = cases
        .candidates
        .iter()
        .map(|c| Candidate {
            label: c.label.clone(),
            reply: None,
            description: None,
            examples: c.examples.clone(),
            p: 0.2,
        })
        .collect();
    let methods = if upstream.is_some() {
        vec![ScoringMethod::Channel] // the remote engine always asks its multiple-choice question
    } else {
        vec![
            ScoringMethod::Channel,
            ScoringMethod::Likelihood,
            ScoringMethod::Choice,
        ]
    };
    let methods: Vec<ScoringMethod> = methods
        .into_iter()
        .filter(|m| {
            only.as_ref()
                .is_none_or(|o| o.iter().any(|n| n == m.name()))
        })
        .collect();
    for (tag, method) in methods.into_iter().enumerate() {
        // A fresh worker per method: cold figures start from empty caches.
        let (client, sup) = start_worker(&model, &weights, tag, upstream.as_deref())?;
        let job = |q: &str| Job::Rerank {
            text: q.into(),
            candidates: candidates.clone(),
            prompt: prompts(&config, method),
        };
        let once = |q: &str| -> anyhow::Result<(f64, usize, u32)> {
            let t = Instant::now();
            let Reply::Rerank(r) = client.call(&job(q), Duration::from_secs(120))? else {
                anyhow::bail!("unexpected reply")
            };
            let best = tiergate_core::stats::argmax(&r.scores).0;
            Ok((t.elapsed().as_secs_f64(), best, r.prompt_tokens))
        };
        let (cold, _, _) = once(&cases.queries[0])?;
        let mut times = Vec::new();
        let mut picks = Vec::new();
        let mut tokens = 0;
        for round in 0..2 {
            for q in &cases.queries {
                let (s, best, n) = once(q)?;
                times.push(s);
                tokens = n;
                if round == 0 {
                    picks.push(cases.candidates[best].label.clone());
                }
            }
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let p90 = times[times.len() * 9 / 10];
        let per_s = throughput(&client, &job(&cases.queries[1]), 4, Duration::from_secs(10))?;
        println!(
            "{}",
            serde_json::json!({"engine": if upstream.is_some() { "openai (remote)" } else { "tiergate" },
                "method": if upstream.is_some() { "choice".to_string() } else { format!("{method:?}").to_lowercase() },
                "scoring_weights": weights, "cold_s": round(cold), "median_s": round(median), "p90_s": round(p90),
                "escalations_per_s_4_in_flight": round(per_s), "tokens_per_rerank": tokens, "picks": picks})
        );
        drop(client);
        drop(sup);
    }
    Ok(())
}

fn round(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

fn prompts(config: &Config, method: ScoringMethod) -> tiergate_config::PromptConfig {
    let mut p = config.reranker.prompts.clone();
    p.method = method;
    p
}

/// Completed reranks per second with `in_flight` kept queued.
fn throughput(client: &Client, job: &Job, in_flight: usize, run: Duration) -> anyhow::Result<f64> {
    let t = Instant::now();
    let mut pending = std::collections::VecDeque::new();
    let mut done = 0usize;
    while t.elapsed() < run {
        while pending.len() < in_flight {
            pending.push_back(client.submit(job, Duration::from_secs(120))?);
        }
        if let Some(h) = pending.pop_front() {
            h.wait_reply()?;
            done += 1;
        }
    }
    for h in pending {
        h.wait_reply()?;
        done += 1;
    }
    Ok(done as f64 / t.elapsed().as_secs_f64())
}

fn start_worker(
    model: &str,
    weights: &str,
    tag: usize,
    upstream: Option<&str>,
) -> anyhow::Result<(Client, Supervisor)> {
    let name = format!("tiergate-rerank-bench-{}-{tag}", std::process::id());
    let seg = Arc::new(Segment::create(
        &name,
        Geometry {
            slots: 16,
            req_cap: 16384,
            resp_cap: 65536,
        },
    )?);
    let program = std::env::current_exe()?
        .parent()
        .and_then(|p| p.parent())
        .map(|p| p.join("tiergate-reranker"))
        .ok_or_else(|| anyhow::anyhow!("cannot locate tiergate-reranker"))?;
    let sup = Supervisor::start(
        seg.clone(),
        SupervisorConfig {
            workers: 1,
            program,
            args: {
                let mut r = Config::default().reranker;
                match upstream {
                    Some(url) => {
                        r.engine = tiergate_config::EngineKind::Openai;
                        r.url = url.into();
                        r.model = "bench".into();
                    }
                    None => {
                        r.engine = tiergate_config::EngineKind::Mistralrs;
                        r.model = model.into();
                        r.scoring_weights = tiergate_config::ScoringWeights::parse(weights)
                            .ok_or_else(|| {
                                anyhow::anyhow!(
                                    "--scoring-weights {weights}: int8, f32 or quantized"
                                )
                            })?;
                    }
                }
                vec![
                    "--spec".into(),
                    tiergate_config::WorkerSpec::of(&r).to_arg(),
                ]
            },
            segment: name,
            heartbeat_timeout: Duration::from_secs(10),
            load_timeout: Duration::from_secs(600),
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
    Ok((client, sup))
}
