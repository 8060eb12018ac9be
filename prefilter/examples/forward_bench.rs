//! Raw encoder speed, without the batching runtime: `cargo run -p tiergate-prefilter --example forward_bench
//! -- models/all-MiniLM-L6-v2 [tokens] [iterations] [auto|f32|int8]`. Prints batch-1 latency and batch-32 throughput of the
//! packed forward (the number the runtime's figures should be compared with).

use std::time::Instant;

use tiergate_config::{PoolingConfig, Precision};
use tiergate_prefilter::classifier::load_encoder;
use tiergate_prefilter::tokenize::Tokens;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let dir = args
        .get(1)
        .map_or("models/all-MiniLM-L6-v2", String::as_str);
    let len: usize = args.get(2).map_or(Ok(16), |s| s.parse())?;
    let iters: usize = args.get(3).map_or(Ok(200), |s| s.parse())?;
    let precision: Precision = args
        .get(4)
        .map_or(Ok(Precision::Auto), |s| s.parse())
        .map_err(anyhow::Error::msg)?;
    let (_, mut enc) = load_encoder(std::path::Path::new(dir), PoolingConfig::Auto, 64)?;
    let used = enc.set_precision(precision)?;
    println!("precision: {used:?}");
    let t = Tokens {
        ids: (0..len as u32).map(|i| 1000 + i * 37).collect(),
        type_ids: vec![0; len],
        truncated: false,
    };
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    pool.install(|| -> anyhow::Result<()> {
        for batch in [1usize, 32] {
            let inputs: Vec<&Tokens> = (0..batch).map(|_| &t).collect();
            enc.embed(&inputs)?;
            let mut times = Vec::new();
            let n = if batch == 1 { iters } else { iters / 10 + 1 };
            for _ in 0..n {
                let s = Instant::now();
                enc.embed(&inputs)?;
                times.push(s.elapsed().as_secs_f64() * 1e3);
            }
            times.sort_by(f64::total_cmp);
            let p50 = times[times.len() / 2];
            println!(
                "batch {batch:>2} x {len} tokens, one thread: p50 {p50:.2} ms/forward, {:.0} sequences/s",
                batch as f64 * 1e3 / p50
            );
        }
        Ok(())
    })
}
