//! The escalated channel under an offered load above the LLM's capacity: the real server in-process
//! (embedded default config: MiniLM few-shot head, one real SmolLM2 worker), open-loop arrivals at a fixed
//! rate, a mix of clear and ambiguous queries. Reports per channel (Tier-0 / escalated / degraded) counts and
//! p50/p99, θ_eff and utilisation over time, and the escalation queue depth, for one routing mode.
//!
//! `cargo run -p tiergate-server --example overload -- [load|static|none] [RATE] [SECONDS]`
//! (`none`: no LLM workers, the Tier-0 baseline). Run from the repository root.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CLEAR: &[&str] = &[
    "my new card still hasn't shown up",
    "what's the exchange rate for dollars",
    "someone stole my wallet with my card",
    "I want to close my account",
];
const AMBIGUOUS: &[&str] = &[
    "I have a question about my thing",
    "it is not working again",
    "can you check this for me",
];

/// The nearest-rank `q` quantile of `v` (NaN when empty), by the one implementation (`core::stats`).
fn pct(v: &mut [f64], q: f64) -> f64 {
    tiergate_core::stats::quantile(v.to_vec(), q).unwrap_or(f64::NAN)
}

/// One request on a fresh connection; returns (tier, degraded?) from the headers.
async fn one(addr: std::net::SocketAddr, text: &str) -> anyhow::Result<(String, bool)> {
    let mut s = TcpStream::connect(addr).await?;
    let body =
        serde_json::json!({"model": "classify", "messages": [{"role": "user", "content": text}]})
            .to_string();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await?;
    let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
    anyhow::ensure!(
        head.starts_with("http/1.1 200"),
        "{}",
        head.lines().next().unwrap_or("")
    );
    let tier = head
        .lines()
        .find_map(|l| {
            l.strip_prefix("x-tiergate-tier:")
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_default();
    Ok((tier, head.contains("x-tiergate-degraded:")))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).cloned().unwrap_or_else(|| "load".into());
    let rate: f64 = args.get(2).map_or(Ok(8.0), |s| s.parse())?;
    let secs: u64 = args.get(3).map_or(Ok(40), |s| s.parse())?;
    let mut cfg = tiergate_config::load(None, Vec::new(), &[])?;
    cfg.server.listen = "127.0.0.1:0".parse()?;
    cfg.server.admin_listen = "127.0.0.1:0".parse()?;
    cfg.reranker.rerank_deadline_ms = 15_000;
    match mode.as_str() {
        "none" => cfg.reranker.workers = 0,
        "static" => cfg.routing.mode = tiergate_config::RoutingMode::Static,
        _ => cfg.routing.mode = tiergate_config::RoutingMode::Load,
    }
    let program = std::env::current_exe()?
        .parent()
        .and_then(|p| p.parent())
        .map(|p| p.join("tiergate-reranker"));
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(tiergate_server::serve::run(
        cfg,
        program,
        async move {
            let _ = stop_rx.await;
        },
        Some(tx),
    ));
    let bound: tiergate_server::serve::Bound = rx.await?;
    let addr = bound.public;
    // Wait for the worker (model load).
    let t = Instant::now();
    while mode != "none" && t.elapsed() < Duration::from_secs(120) {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(b"GET /ready HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await?;
        let mut b = Vec::new();
        s.read_to_end(&mut b).await?;
        if b.starts_with(b"HTTP/1.1 200") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let results: Arc<Mutex<Vec<(String, bool, f64)>>> = Arc::default();
    let errors = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let total = (rate * secs as f64) as usize;
    let series: Arc<Mutex<Vec<String>>> = Arc::default();
    let series2 = series.clone();
    let sampler = tokio::spawn(async move {
        let series = series2;
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            let Ok(mut s) = TcpStream::connect(bound.admin).await else {
                break;
            };
            if s.write_all(b"GET /admin/routing HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                .await
                .is_err()
            {
                break;
            }
            let mut b = Vec::new();
            let _ = s.read_to_end(&mut b).await;
            let text = String::from_utf8_lossy(&b).to_string();
            if let Some(json) = text.split("\r\n\r\n").nth(1) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(json) {
                    let Ok(mut series) = series.lock() else { break };
                    let n = series.len();
                    series.push(format!(
                        "t={:>3}s θ_eff={:.3} u={:.2} ({}) queue_depth={} escalated_10s={:.2}",
                        n * 5 + 5,
                        v["theta_eff"].as_f64().unwrap_or(0.0),
                        v["utilization"].as_f64().unwrap_or(0.0),
                        v["utilization_in_use"].as_str().unwrap_or(""),
                        v["queue_depth"],
                        v["escalated_share_10s"].as_f64().unwrap_or(0.0)
                    ));
                }
            }
        }
    });
    let mut tasks = Vec::new();
    for i in 0..total {
        // Open loop: each request is sent at its scheduled time; latency counts from that time.
        let due = start + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(due.into()).await;
        let text = if i % 4 == 3 {
            AMBIGUOUS[i % AMBIGUOUS.len()]
        } else {
            CLEAR[i % CLEAR.len()]
        };
        let (results, errors) = (results.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            match one(addr, text).await {
                Ok((tier, degraded)) => {
                    results
                        .lock()
                        .map(|mut r| r.push((tier, degraded, due.elapsed().as_secs_f64() * 1e3)))
                        .ok();
                }
                Err(e) => {
                    eprintln!("request error: {e}");
                    errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let _ = stop_tx.send(());
    sampler.abort();
    let r = results.lock().map(|r| r.clone()).unwrap_or_default();
    println!("mode {mode}, {rate} req/s open loop for {secs} s (1 in 4 ambiguous): {} answered, {} errors", r.len(), errors.load(std::sync::atomic::Ordering::Relaxed));
    for (name, pick) in [
        (
            "tier0 (not escalated)",
            Box::new(|t: &str, d: bool| t == "tier0" && !d) as Box<dyn Fn(&str, bool) -> bool>,
        ),
        ("escalated (llm)", Box::new(|t: &str, _| t == "llm")),
        ("degraded", Box::new(|_: &str, d: bool| d)),
    ] {
        let mut v: Vec<f64> = r
            .iter()
            .filter(|(t, d, _)| pick(t, *d))
            .map(|x| x.2)
            .collect();
        println!(
            "  {name:<22} n={:>4}  p50 {:>8.1} ms  p99 {:>8.1} ms",
            v.len(),
            pct(&mut v, 0.5),
            pct(&mut v, 0.99)
        );
    }
    for line in series.lock().map(|s| s.clone()).unwrap_or_default() {
        println!("  {line}");
    }
    let _ = server.await;
    Ok(())
}
