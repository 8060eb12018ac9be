//! Calibration: temperature scaling fitted by minimising the negative log-likelihood on held-out logits, and
//! the expected calibration error (ECE) that says whether "confidence 0.9" means right nine times in ten.

pub use tiergate_core::stats::{argmax, softmax};

/// Mean negative log-likelihood of the true labels under `softmax(logits / temperature)`.
pub fn nll(logits: &[Vec<f32>], labels: &[usize], temperature: f64) -> f64 {
    if logits.is_empty() {
        return 0.0;
    }
    let mut total = 0.0f64;
    for (row, &y) in logits.iter().zip(labels) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse = row
            .iter()
            .map(|&z| ((z as f64 - max) / temperature).exp())
            .sum::<f64>()
            .ln();
        let zy = row.get(y).copied().unwrap_or(f32::NEG_INFINITY) as f64;
        total += lse - (zy - max) / temperature;
    }
    total / logits.len() as f64
}

/// The temperature minimising the NLL (golden-section search over log T in [1/50, 50]; the NLL is convex in
/// 1/T, so unimodal along this line).
pub fn fit_temperature(logits: &[Vec<f32>], labels: &[usize]) -> f64 {
    let f = |log_t: f64| nll(logits, labels, log_t.exp());
    let (mut a, mut b) = ((1.0f64 / 50.0).ln(), 50.0f64.ln());
    let g = (5f64.sqrt() - 1.0) / 2.0;
    let mut c = b - g * (b - a);
    let mut d = a + g * (b - a);
    let (mut fc, mut fd) = (f(c), f(d));
    for _ in 0..60 {
        if fc < fd {
            b = d;
            d = c;
            fd = fc;
            c = b - g * (b - a);
            fc = f(c);
        } else {
            a = c;
            c = d;
            fc = fd;
            d = a + g * (b - a);
            fd = f(d);
        }
    }
    ((a + b) / 2.0).exp()
}

/// Expected calibration error with `bins` equal-width confidence bins: the share-weighted mean gap between
/// confidence and accuracy.
pub fn ece(probs: &[Vec<f32>], labels: &[usize], bins: usize) -> f64 {
    let bins = bins.max(1);
    let mut conf_sum = vec![0.0f64; bins];
    let mut correct = vec![0.0f64; bins];
    let mut count = vec![0usize; bins];
    for (p, &y) in probs.iter().zip(labels) {
        let (arg, conf) = argmax(p);
        let b = ((conf as f64 * bins as f64) as usize).min(bins - 1);
        conf_sum[b] += conf as f64;
        correct[b] += f64::from(u8::from(arg == y));
        count[b] += 1;
    }
    let n = probs.len().max(1) as f64;
    (0..bins)
        .filter(|&b| count[b] > 0)
        .map(|b| (conf_sum[b] - correct[b]).abs() / n)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Logits of a 4-class problem whose true confidence is moderate, then scaled ×4 (overconfident).
    fn overconfident(n: usize) -> (Vec<Vec<f32>>, Vec<usize>) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut logits = Vec::new();
        let mut labels = Vec::new();
        for _ in 0..n {
            let base: Vec<f32> = (0..4).map(|_| rng.gen_range(-1.0..1.0)).collect();
            // Sample the label from the *unscaled* softmax: that is the true distribution.
            let p = softmax(&base, 1.0);
            let u: f32 = rng.gen();
            let mut acc = 0.0;
            let mut y = 3;
            for (i, pi) in p.iter().enumerate() {
                acc += pi;
                if u < acc {
                    y = i;
                    break;
                }
            }
            logits.push(base.iter().map(|z| z * 4.0).collect());
            labels.push(y);
        }
        (logits, labels)
    }

    #[test]
    fn temperature_scaling_recovers_the_scale_and_lowers_ece() {
        let (logits, labels) = overconfident(20_000);
        let raw: Vec<Vec<f32>> = logits.iter().map(|l| softmax(l, 1.0)).collect();
        let t = fit_temperature(&logits, &labels);
        assert!((t - 4.0).abs() < 0.4, "fitted T = {t}, expected about 4");
        let cal: Vec<Vec<f32>> = logits.iter().map(|l| softmax(l, t)).collect();
        let before = ece(&raw, &labels, 15);
        let after = ece(&cal, &labels, 15);
        assert!(after < before / 3.0, "ECE {before} -> {after}");
        assert!(after < 0.02, "calibrated ECE {after}");
        assert!(nll(&logits, &labels, t) < nll(&logits, &labels, 1.0));
    }

    #[test]
    fn ece_of_a_perfect_predictor_is_zero() {
        let probs = vec![vec![1.0, 0.0], vec![0.0, 1.0]];
        assert!(ece(&probs, &[0, 1], 10).abs() < 1e-9);
        assert!((ece(&probs, &[1, 0], 10) - 1.0).abs() < 1e-9);
    }
}
