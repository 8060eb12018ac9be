//! Timing probes of the scoring forward (printed, never asserted; figures depend on the machine): our llama
//! forward and LM head on a GGUF with each weight format at 1–150 tokens, and candle's matmul with a strided
//! against a contiguous right-hand side.
//!
//! `cargo run -p tiergate-reranker --example forward_probe [-- MODEL.gguf]` (default: the SmolLM2-135M that
//! `scripts/fetch-models.sh` fetches).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a probe: failing loudly is the point

use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use tiergate_reranker::llama::{Llama, Segment, WeightFormat};

fn main() {
    let model: PathBuf = std::env::args().nth(1).map_or_else(
        || PathBuf::from("models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"),
        PathBuf::from,
    );
    forward_speed(&model);
    matmul_layout();
}

fn forward_speed(model_path: &Path) {
    for fmt in [
        WeightFormat::Int8,
        WeightFormat::F32,
        WeightFormat::Quantized,
    ] {
        let model = Llama::load(model_path, fmt).unwrap();
        for n in [1usize, 10, 47, 150] {
            let seg = [Segment {
                tokens: (0..n as u32).map(|i| 300 + i).collect(),
                start_pos: 0,
                sees_past: 0..0,
                sees_segments: vec![],
            }];
            model.forward(&seg, None).unwrap();
            let t = std::time::Instant::now();
            let (h, _) = model.forward(&seg, None).unwrap();
            let f = t.elapsed();
            let t = std::time::Instant::now();
            model.log_probs(&h).unwrap();
            println!("{fmt:?} n={n}: forward {:?}, lm head {:?}", f, t.elapsed());
        }
    }
}

fn matmul_layout() {
    let dev = Device::Cpu;
    for (n, out, inn) in [
        (150usize, 1536usize, 576usize),
        (47, 1536, 576),
        (150, 49152, 576),
    ] {
        let x = Tensor::randn(0f32, 1.0, (n, inn), &dev).unwrap();
        let w = Tensor::randn(0f32, 1.0, (out, inn), &dev).unwrap();
        let wt = w.t().unwrap().contiguous().unwrap();
        for (name, rhs) in [
            ("strided w.t()", w.t().unwrap()),
            ("contiguous wt", wt.clone()),
        ] {
            x.matmul(&rhs).unwrap();
            let t = std::time::Instant::now();
            for _ in 0..10 {
                x.matmul(&rhs).unwrap();
            }
            let s = t.elapsed().as_secs_f64() / 10.0;
            println!(
                "{n}x{inn} @ {inn}x{out} {name}: {:.2} ms, {:.1} GFLOP/s",
                s * 1e3,
                2.0 * (n * inn * out) as f64 / s / 1e9
            );
        }
    }
}
