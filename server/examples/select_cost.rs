//! What latency-graded selection adds to an escalation's path: per alternative, the predicted completion
//! ([`tiergate_engine::backends::deadline::predict`], as `Llm::predict` runs it: the fair share's load and the tenant's
//! jobs ahead, the service-time window's mean and P95 over 128 samples), then the order
//! ([`tiergate_engine::answer::select::order`]). Two and four alternatives, one thread, and two threads on the same
//! backends (their share's lock and window contended); with estimates reused between samples (as serving sees
//! them: a few samples a second, an estimate kept 100 ms) and with a new sample before every prediction (each
//! estimate computed from the window: the worst case). Prints p50 / p99 / p99.9 in microseconds; the target is
//! p99 ≤ 20 µs per request.
//!
//! `cargo build --workspace --examples`, then `$CARGO_TARGET_DIR/debug/examples/select_cost`

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a benchmark: failing loudly is the point

use std::time::{Duration, Instant};

use tiergate_config::Prefer;
use tiergate_engine::backends::deadline::{predict, ServiceTimes};
use tiergate_engine::backends::fair::Share;

struct Backend {
    share: std::sync::Arc<Share>,
    times: ServiceTimes,
}

fn backends(n: usize) -> Vec<Backend> {
    (0..n)
        .map(|b| {
            let times = ServiceTimes::new(Duration::from_millis(1000));
            // A full window: 128 samples around (b + 1) × 200 ms.
            for i in 0..128u64 {
                times.record(Duration::from_millis((b as u64 + 1) * 200 + i % 37));
            }
            Backend {
                share: Share::new(4, 60),
                times,
            }
        })
        .collect()
}

fn quantiles(mut ns: Vec<u64>) -> String {
    ns.sort_unstable();
    let q = |p: f64| tiergate_core::stats::quantile_sorted(&ns, p).unwrap_or(0) as f64 / 1e3;
    format!(
        "p50 {:.2} µs, p99 {:.2} µs, p99.9 {:.2} µs",
        q(0.5),
        q(0.99),
        q(0.999)
    )
}

/// `fresh`: every backend gets a new sample before each prediction (outside the timing), so each estimate is
/// computed from the window — the worst case; otherwise estimates are reused as between samples.
fn run(b: &[Backend], n: usize, fresh: bool) -> Vec<u64> {
    let mut out = Vec::with_capacity(n);
    let mut picked = 0usize;
    for i in 0..n {
        if fresh {
            for be in b {
                be.times
                    .record(Duration::from_millis(200 + (i % 37) as u64));
            }
        }
        let t = Instant::now();
        let predicted: Vec<(usize, Duration)> = b
            .iter()
            .enumerate()
            .map(|(k, be)| (k, predict(&be.share, &be.times, 4, "tenant").0))
            .collect();
        let left = (i % 2 == 0).then_some(Duration::from_millis(700));
        let order = tiergate_engine::answer::select::order(&predicted, Prefer::Latency, left);
        out.push(t.elapsed().as_nanos() as u64);
        picked += order.first().copied().unwrap_or(0);
    }
    assert!(picked < n * b.len(), "the fastest is picked");
    out
}

fn main() {
    for fresh in [false, true] {
        let what = if fresh {
            "a new sample before each"
        } else {
            "estimates reused between samples"
        };
        for n in [2, 4] {
            let b = backends(n);
            let _ = run(&b, 10_000, fresh);
            println!(
                "{n} alternatives, {what}, one thread: {}",
                quantiles(run(&b, 200_000, fresh))
            );
            let both: Vec<u64> = std::thread::scope(|s| {
                let x = s.spawn(|| run(&b, 100_000, fresh));
                let y = s.spawn(|| run(&b, 100_000, fresh));
                let mut v = x.join().unwrap();
                v.extend(y.join().unwrap());
                v
            });
            println!("{n} alternatives, {what}, two threads: {}", quantiles(both));
        }
    }
}
