//! Tier-0 channel through HTTP: the real server in this process (embedded default config, real MiniLM, no LLM
//! workers, θ fixed at 1 so nothing escalates) and keep-alive HTTP/1.1 clients on loopback.
//! 1. Overhead: p50 of one-at-a-time HTTP requests minus p50 of the raw prefilter call, same texts.
//! 2. Closed-loop load with 1…32 concurrent clients: throughput, p50/p99.
//!
//! `cargo run -p tiergate-server --example tier0_http [-- REQUESTS]` (from the repository root)

use std::time::{Duration, Instant};

use tiergate_prefilter::{Classifier, PrefilterHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TEXTS: &[&str] = &[
    "my new card still hasn't shown up",
    "what's the exchange rate for dollars",
    "someone stole my wallet with my card",
    "how do I top up my account",
    "I want to close my account",
    "why was my payment declined at the shop",
];

/// The nearest-rank `q` quantile of `v` (NaN when empty), by the one implementation (`core::stats`).
fn pct(v: &mut [f64], q: f64) -> f64 {
    tiergate_core::stats::quantile(v.to_vec(), q).unwrap_or(f64::NAN)
}

async fn request(stream: &mut TcpStream, text: &str, buf: &mut Vec<u8>) -> anyhow::Result<()> {
    let body =
        serde_json::json!({"model": "classify", "messages": [{"role": "user", "content": text}]})
            .to_string();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(req.as_bytes()).await?;
    buf.clear();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await?;
        anyhow::ensure!(n > 0, "connection closed");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            anyhow::ensure!(head.starts_with("http/1.1 200"), "status: {head}");
            let len: usize = head
                .lines()
                .find_map(|l| {
                    l.strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap_or(0))
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return Ok(());
            }
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args().nth(1).map_or(Ok(600), |s| s.parse())?;
    // `TIERGATE__…` variables apply (e.g. TIERGATE__PREFILTER__LEND_IDLE_CORE=false).
    let mut cfg = tiergate_config::load(None, std::env::vars(), &[])?;
    cfg.reranker.workers = 0;
    cfg.routing.mode = tiergate_config::RoutingMode::Static;
    cfg.routing.theta_base = 1.0;
    cfg.server.listen = "127.0.0.1:0".parse()?;
    cfg.server.admin_listen = "127.0.0.1:0".parse()?;

    // Raw prefilter: the same classifier, called directly.
    let classifier = Classifier::from_config(&cfg.prefilter)?;
    let raw = PrefilterHandle::start(classifier, &cfg.prefilter)?;
    for t in TEXTS {
        raw.classify(t).await?;
    }
    let mut raw_ms = Vec::new();
    for i in 0..n {
        let t = Instant::now();
        raw.classify(TEXTS[i % TEXTS.len()]).await?;
        raw_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    drop(raw);

    let (tx, rx) = tokio::sync::oneshot::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(tiergate_server::serve::run(
        cfg,
        None,
        async move {
            let _ = stop_rx.await;
        },
        Some(tx),
    ));
    let bound: tiergate_server::serve::Bound = rx.await?;
    let addr = bound.public;
    let mut s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let mut buf = Vec::new();
    for t in TEXTS {
        request(&mut s, t, &mut buf).await?;
    }
    let mut http_ms = Vec::new();
    for i in 0..n {
        let t = Instant::now();
        request(&mut s, TEXTS[i % TEXTS.len()], &mut buf).await?;
        http_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let (r50, h50, h99) = (
        pct(&mut raw_ms, 0.5),
        pct(&mut http_ms, 0.5),
        pct(&mut http_ms, 0.99),
    );
    println!("one at a time, {n} requests: raw prefilter p50 {r50:.2} ms; HTTP p50 {h50:.2} ms (p99 {h99:.2} ms); overhead p50 {:.2} ms", h50 - r50);

    for clients in [1usize, 2, 4, 8, 16, 32] {
        let start = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..clients {
            tasks.push(tokio::spawn(async move {
                let mut s = TcpStream::connect(addr).await?;
                s.set_nodelay(true)?;
                let mut buf = Vec::new();
                let mut lat = Vec::new();
                let deadline = Instant::now() + Duration::from_secs(6);
                let mut i = c;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    request(&mut s, TEXTS[i % TEXTS.len()], &mut buf).await?;
                    lat.push(t.elapsed().as_secs_f64() * 1e3);
                    i += 1;
                }
                anyhow::Ok(lat)
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await??);
        }
        let secs = start.elapsed().as_secs_f64();
        let count = all.len();
        println!(
            "closed loop, {clients:>2} clients: {:>5.0} req/s, p50 {:>6.2} ms, p99 {:>6.2} ms",
            count as f64 / secs,
            pct(&mut all, 0.5),
            pct(&mut all, 0.99)
        );
    }
    let _ = stop_tx.send(());
    server.await??;
    Ok(())
}
