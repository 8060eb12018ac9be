//! The int8 dense layer's speed on the shapes the two tiers run, one thread: `cargo run -p
//! tiergate-kernels --example int8_bench [iterations]`. Prints ms per call and GMAC/s (multiply-adds per
//! second, quantising the activations and writing f32 included) per shape, and the fraction of the peak
//! given as `PEAK_GMACS` (default 198: one 64-MAC `vpdpbusd` zmm per cycle at 3.1 GHz, this machine's Zen 4).

use std::time::Instant;

use tiergate_kernels::int8::{available, QDense};

/// (what, rows, in, out)
const SHAPES: &[(&str, usize, usize, usize)] = &[
    ("MiniLM batch 1 (16 tokens): qkv", 16, 384, 1152),
    ("MiniLM batch 1: ffn up", 16, 384, 1536),
    ("MiniLM batch 1: ffn down", 16, 1536, 384),
    ("MiniLM batch 32 (18 tokens): ffn up", 576, 384, 1536),
    ("SmolLM2 rerank (150 tokens): mlp up", 150, 576, 1536),
    ("SmolLM2 rerank: mlp down", 150, 1536, 576),
    ("Qwen 0.5B rerank (300 tokens): mlp up", 300, 896, 4864),
    ("Qwen 1.5B rerank (300 tokens): mlp up", 300, 1536, 8960),
    ("Qwen 1.5B rerank: mlp down", 300, 8960, 1536),
    ("one row: 1536 → 1536", 1, 1536, 1536),
];

fn main() -> anyhow::Result<()> {
    anyhow::ensure!(
        available(),
        "this CPU has no AVX-512 VNNI: the int8 kernel does not run here"
    );
    let iters: usize = std::env::args().nth(1).map_or(Ok(30), |s| s.parse())?;
    let peak: f64 = std::env::var("PEAK_GMACS").map_or(Ok(198.0), |s| s.parse())?;
    println!(
        "{:<42} {:>9} {:>9} {:>7}",
        "shape (rows × in → out)", "ms p50", "GMAC/s", "of peak"
    );
    for &(what, m, k, out) in SHAPES {
        let w: Vec<f32> = (0..out * k)
            .map(|i| ((i * 7919) % 255) as f32 / 255.0 - 0.5)
            .collect();
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 104_729) % 251) as f32 / 251.0 - 0.5)
            .collect();
        let q = QDense::new(&w, &vec![0.0; out], out, k);
        let macs = (m * k * out) as f64;
        let n = ((2e9 / macs) as usize).clamp(3, 2000) * iters / 30;
        std::hint::black_box(q.forward(&x, m));
        let mut times: Vec<f64> = (0..n.max(3))
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(q.forward(&x, m));
                t.elapsed().as_secs_f64()
            })
            .collect();
        times.sort_by(f64::total_cmp);
        let p50 = times[times.len() / 2];
        let g = macs / p50 / 1e9;
        println!(
            "{:<42} {:>9.3} {:>9.1} {:>6.0}%",
            format!("{what} ({m} × {k} → {out})"),
            p50 * 1e3,
            g,
            100.0 * g / peak
        );
    }
    Ok(())
}
