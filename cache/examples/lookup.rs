//! The answer cache's lookup time at 100k entries: `cargo run -p tiergate-cache --example lookup [CAP]`.
//! 100,000 entries with 384-dimension embeddings (MiniLM's) in 200 semantic buckets of at most CAP (256, as
//! `[cache] bucket_cap` by default; every bucket full); then 100,000 lookups of each kind, timed one by one: an
//! exact hit, and an exact miss followed by a semantic scan of a full bucket (the worst case: every entry's
//! cosine computed). Prints p50, p99, max.

use std::time::{Duration, Instant};

use tiergate_cache::{GuardWords, Guards, Limits, Query, Store, Weighed};

struct V([u8; 200]);
impl Weighed for V {
    fn bytes(&self) -> usize {
        self.0.len()
    }
}

/// A deterministic pseudo-random vector (xorshift), not normalised.
fn vector(seed: u64, dim: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..dim)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

fn quantiles(mut t: Vec<Duration>) -> (f64, f64, f64) {
    t.sort();
    let q = |p: f64| t[((t.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e6;
    (q(0.5), q(0.99), q(1.0))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (n, dim, buckets) = (100_000usize, 384usize, 200u64);
    let cap: usize = match std::env::args().nth(1) {
        Some(a) => a
            .parse()
            .map_err(|_| format!("CAP must be a count, not {a:?}"))?,
        None => 256,
    };
    let guards = Guards::new(&GuardWords::english()?)?;
    let mut store: Store<V> = Store::new(Limits {
        max_bytes: 1 << 30,
        ttl: Duration::from_secs(3600),
        bucket_cap: cap,
        tau: 0.94,
    });
    let now = Instant::now();
    let text = |i: usize| format!("customer question number {i} about a card payment");
    let t = Instant::now();
    for i in 0..n {
        let f = guards.features(&text(i));
        store.insert(
            &format!("{:016x}|1,2,3,4,5|{}", i as u64 % buckets, text(i)),
            V([0; 200]),
            Some((i as u64 % buckets, vector(i as u64, dim), f)),
            now,
        );
    }
    println!(
        "{} entries, {:.1} MiB as counted, filled in {:.2} s",
        store.len(),
        store.bytes() as f64 / (1 << 20) as f64,
        t.elapsed().as_secs_f64()
    );
    let mut exact = Vec::with_capacity(n);
    let mut scan = Vec::with_capacity(n);
    let mut hits = 0usize;
    for i in 0..n {
        let key = format!("{:016x}|1,2,3,4,5|{}", i as u64 % buckets, text(i));
        let t = Instant::now();
        hits += usize::from(store.exact(&key, now).is_some());
        exact.push(t.elapsed());
        // A question not stored: the exact miss, then the whole bucket scanned.
        let asked = format!("another question {i}");
        let e = vector(1_000_000 + i as u64, dim);
        let t = Instant::now();
        let miss = store.exact(&asked, now).is_none();
        let f = guards.features(&asked);
        let s = store.semantic(
            &Query {
                bucket: i as u64 % buckets,
                embedding: &e,
                features: &f,
            },
            &guards,
            now,
        );
        scan.push(t.elapsed());
        assert!(miss && s.hit.is_none());
    }
    assert_eq!(hits, n);
    let (p50, p99, max) = quantiles(exact);
    println!("exact hit:                      p50 {p50:.1} µs  p99 {p99:.1} µs  max {max:.1} µs");
    let (p50, p99, max) = quantiles(scan);
    println!("miss + full-bucket scan ({cap}):  p50 {p50:.1} µs  p99 {p99:.1} µs  max {max:.1} µs");
    Ok(())
}
