//! Fusing the LLM's candidate distribution with Tier-0's.

/// `(1 - w) · tier0' + w · llm`, where `tier0'` is Tier-0's probabilities renormalised over the candidates.
/// Non-finite or negative inputs count as 0; an all-zero side falls back to uniform.
pub fn fuse(tier0: &[f32], llm: &[f32], llm_weight: f32) -> Vec<f32> {
    let w = if llm_weight.is_finite() {
        llm_weight.clamp(0.0, 1.0)
    } else {
        0.5
    };
    let a = normalise(tier0);
    let b = normalise(llm);
    a.iter()
        .zip(&b)
        .map(|(x, y)| (1.0 - w) * x + w * y)
        .collect()
}

/// Clean and normalise to sum 1 (uniform when nothing is left).
pub fn normalise(p: &[f32]) -> Vec<f32> {
    let clean: Vec<f32> = p
        .iter()
        .map(|&x| if x.is_finite() && x > 0.0 { x } else { 0.0 })
        .collect();
    let sum: f32 = clean.iter().sum();
    if sum <= 0.0 {
        return vec![1.0 / p.len().max(1) as f32; p.len()];
    }
    clean.iter().map(|x| x / sum).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fusion_weights_and_normalises() {
        let f = fuse(&[0.6, 0.2], &[0.0, 1.0], 0.5);
        assert!(
            (f[0] - 0.375).abs() < 1e-6 && (f[1] - 0.625).abs() < 1e-6,
            "{f:?}"
        );
        assert_eq!(fuse(&[0.6, 0.2], &[0.1, 0.9], 0.0), normalise(&[0.6, 0.2]));
        assert_eq!(fuse(&[0.6, 0.2], &[0.1, 0.9], 1.0), vec![0.1, 0.9]);
        let g = fuse(&[f32::NAN, -1.0], &[0.0, 0.0], 0.5);
        assert!((g[0] - 0.5).abs() < 1e-6 && (g[1] - 0.5).abs() < 1e-6);
    }
}
