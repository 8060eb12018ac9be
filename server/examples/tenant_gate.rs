//! What the tenant gate costs on the Tier-0 path: `identify` (hash the bearer key, look its digest up, take a
//! token from the tenant's bucket) over 1,000 tenants, one thread, and with two threads on one tenant (its
//! bucket's lock contended). Prints p50 / p99 / p99.9 in microseconds; the target is p99 ≤ 10 µs.
//!
//! `cargo run -p tiergate-server --example tenant_gate`

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a benchmark: failing loudly is the point

use std::time::Instant;

use sha2::{Digest, Sha256};
use tiergate_config::TenantConfig;
use tiergate_engine::tenancy::tenants::Tenants;
use tiergate_server::adapt::identify;

fn hex(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
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

fn run(tenants: &Tenants, keys: &[String], n: usize) -> Vec<u64> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let mut h = axum::http::HeaderMap::new();
        h.insert(
            "authorization",
            format!("Bearer {}", keys[i % keys.len()]).parse().unwrap(),
        );
        let t = Instant::now();
        let r = identify(tenants, &h, Instant::now());
        out.push(t.elapsed().as_nanos() as u64);
        assert!(r.is_ok());
    }
    out
}

fn main() {
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
    let _ = run(&tenants, &keys, 10_000);
    println!(
        "1,000 tenants, one thread: {}",
        quantiles(run(&tenants, &keys, 200_000))
    );
    let one = &keys[..1];
    let both: Vec<u64> = std::thread::scope(|s| {
        let a = s.spawn(|| run(&tenants, one, 100_000));
        let b = s.spawn(|| run(&tenants, one, 100_000));
        let mut v = a.join().unwrap();
        v.extend(b.join().unwrap());
        v
    });
    println!("one tenant, two threads: {}", quantiles(both));
}
