//! Tier-0's encoder on real texts, as the runtime runs it: `cargo run -p tiergate-prefilter --example
//! encoder_bench -- MODEL_DIR TEXTS_FILE [auto|f32|int8]` (one text per line). Prints one JSON object:
//! batch-1 latency on one thread and with the idle core lent (`prefilter.lend_idle_core`), and batch-16
//! throughput on one thread and on two (the runtime's two workers). `bench/encoder_peers.sh` runs it beside
//! onnxruntime on the same texts.

use std::sync::Arc;
use std::time::Instant;

use tiergate_config::{PoolingConfig, Precision};
use tiergate_prefilter::classifier::load_encoder;
use tiergate_prefilter::encoder::Encoder;
use tiergate_prefilter::tokenize::Tokens;

fn one_thread() -> anyhow::Result<rayon::ThreadPool> {
    Ok(rayon::ThreadPoolBuilder::new().num_threads(1).build()?)
}

/// p50 and p95 of one-at-a-time forwards over `texts` (at least 300 calls), in ms.
fn batch1(
    enc: &Encoder,
    texts: &[Tokens],
    lend: Option<&Arc<rayon::ThreadPool>>,
) -> anyhow::Result<(f64, f64)> {
    let calls = texts.len().max(300);
    let mut ms: Vec<f64> = (0..calls)
        .map(|i| -> anyhow::Result<f64> {
            let t = Instant::now();
            let run = || enc.embed(&[&texts[i % texts.len()]]).map(|e| e.pooled);
            let out = match lend {
                Some(h) => tiergate_kernels::int8::with_helper(h, None, run),
                None => run(),
            };
            std::hint::black_box(out?);
            Ok(t.elapsed().as_secs_f64() * 1e3)
        })
        .collect::<anyhow::Result<_>>()?;
    ms.sort_by(f64::total_cmp);
    Ok((ms[ms.len() / 2], ms[ms.len() * 95 / 100]))
}

/// Sequences per second, `threads` threads each running batches of 16 over its share of `texts`.
fn batch16(enc: &Encoder, texts: &[Tokens], threads: usize) -> anyhow::Result<f64> {
    let reps = (2000 / texts.len()).max(1);
    let t = Instant::now();
    std::thread::scope(|s| -> anyhow::Result<()> {
        let handles: Vec<_> = (0..threads)
            .map(|w| {
                s.spawn(move || -> anyhow::Result<()> {
                    one_thread()?.install(|| -> anyhow::Result<()> {
                        for _ in 0..reps {
                            for chunk in texts.chunks(16).skip(w).step_by(threads) {
                                let refs: Vec<&Tokens> = chunk.iter().collect();
                                std::hint::black_box(enc.embed(&refs)?.pooled);
                            }
                        }
                        Ok(())
                    })
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("a bench thread panicked"))??;
        }
        Ok(())
    })?;
    Ok((reps * texts.len()) as f64 / t.elapsed().as_secs_f64())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(
        args.len() >= 3,
        "usage: encoder_bench MODEL_DIR TEXTS_FILE [auto|f32|int8]"
    );
    let precision: Precision = args
        .get(3)
        .map_or(Ok(Precision::Auto), |s| s.parse())
        .map_err(anyhow::Error::msg)?;
    let (tok, mut enc) = load_encoder(std::path::Path::new(&args[1]), PoolingConfig::Auto, 64)?;
    let used = enc.set_precision(precision)?;
    let texts: Vec<Tokens> = std::fs::read_to_string(&args[2])?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| tok.encode(l))
        .collect::<Result<_, _>>()?;
    anyhow::ensure!(!texts.is_empty(), "{}: no texts", args[2]);
    let mean_tokens = texts.iter().map(|t| t.ids.len()).sum::<usize>() as f64 / texts.len() as f64;
    let helper = Arc::new(one_thread()?);
    let pool = one_thread()?;
    let ((p50, p95), (lp50, lp95), one) = pool.install(|| -> anyhow::Result<_> {
        batch1(&enc, &texts, None)?;
        Ok((
            batch1(&enc, &texts, None)?,
            batch1(&enc, &texts, Some(&helper))?,
            batch16(&enc, &texts, 1)?,
        ))
    })?;
    let two = batch16(&enc, &texts, 2)?;
    println!(
        "{}",
        serde_json::json!({
            "engine": "tiergate",
            "precision": format!("{used:?}").to_lowercase(),
            "texts": texts.len(),
            "mean_tokens": mean_tokens,
            "batch1_ms_p50": p50,
            "batch1_ms_p95": p95,
            "batch1_two_cores_ms_p50": lp50,
            "batch1_two_cores_ms_p95": lp95,
            "batch16_one_thread_seq_s": one,
            "batch16_two_threads_seq_s": two,
        })
    );
    Ok(())
}
