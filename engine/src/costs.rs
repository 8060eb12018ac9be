//! What two steps of the request path cost, as benchmarks that print their figures (ignored by the suite;
//! run on a quiet machine):
//!
//! - `select_cost`: what latency-graded selection adds to an escalation — per alternative, the predicted
//!   completion (`backends::deadline::predict`, as `Llm::predict` runs it: the fair share's load and the
//!   tenant's jobs ahead, the service-time window's mean and P95 over 128 samples), then the order
//!   (`answer::select::order`). Two and four alternatives, one thread and two threads on the same backends;
//!   estimates reused between samples (as serving sees them) and a new sample before every prediction (the
//!   worst case). Target: p99 ≤ 20 µs a request.
//! - `tenant_gate`: what the tenant gate costs on the Tier-0 path — `tenancy::identify` (hash the key, look
//!   its digest up, take a token from the tenant's bucket) over 1,000 tenants, one thread, and two threads on
//!   one tenant (its bucket's lock contended). Target: p99 ≤ 10 µs.
//!
//! `cargo test -p tiergate-engine --lib costs -- --ignored --nocapture --test-threads 1`

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a benchmark: failing loudly is the point

use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tiergate_config::{Prefer, TenantConfig};

use crate::backends::deadline::{predict, ServiceTimes};
use crate::backends::fair::Share;
use crate::tenancy::tenants::Tenants;

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
        let order = crate::answer::select::order(&predicted, Prefer::Latency, left);
        out.push(t.elapsed().as_nanos() as u64);
        picked += order.first().copied().unwrap_or(0);
    }
    assert!(picked < n * b.len(), "the fastest is picked");
    out
}

#[test]
#[ignore = "a benchmark: run it on a quiet machine"]
fn select_cost() {
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

fn hex(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn identify_each(tenants: &Tenants, keys: &[String], n: usize) -> Vec<u64> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let key = keys[i % keys.len()].as_str();
        let t = Instant::now();
        let r = crate::tenancy::identify(tenants, Some(key), Instant::now());
        out.push(t.elapsed().as_nanos() as u64);
        assert!(r.is_ok());
    }
    out
}

#[test]
#[ignore = "a benchmark: run it on a quiet machine"]
fn tenant_gate() {
    let keys: Vec<String> = (0..1000)
        .map(|i| format!("sk-tenant-{i:04}-{}", "x".repeat(32)))
        .collect();
    let cfg: Vec<TenantConfig> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| TenantConfig {
            name: format!("t{i}"),
            key_sha256: hex(k),
            routes: None,
            rate_per_s: Some(1e9),
            burst: Some(1e9),
            ..TenantConfig::default()
        })
        .collect();
    let tenants = Tenants::new(&cfg);
    let _ = identify_each(&tenants, &keys, 10_000);
    println!(
        "1,000 tenants, one thread: {}",
        quantiles(identify_each(&tenants, &keys, 200_000))
    );
    let one = &keys[..1];
    let both: Vec<u64> = std::thread::scope(|s| {
        let a = s.spawn(|| identify_each(&tenants, one, 100_000));
        let b = s.spawn(|| identify_each(&tenants, one, 100_000));
        let mut v = a.join().unwrap();
        v.extend(b.join().unwrap());
        v
    });
    println!("one tenant, two threads: {}", quantiles(both));
}
