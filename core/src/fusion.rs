//! Fusing an LLM's scores with Tier-0's distribution, one implementation for serving (each cascade stage),
//! `tiergate eval --hybrid` and `fit-fusion` (which fit the weight and temperature): one [`step`] of a
//! cascade, and the rule by which it goes on ([`goes_on`]).

/// One stage of a cascade on a distribution: `prior` (candidate, mass) fused with the stage's LLM `scores`
/// (over the same candidates, in `prior`'s order) at weight `w` and temperature `t`. Serving
/// (the engine's cascade) and the cascade on recorded rows (`tiergate-train`) take this one step.
#[derive(Debug, Clone, PartialEq)]
pub struct Stepped {
    /// The LLM's distribution, in `prior`'s order.
    pub llm: Vec<f32>,
    /// The fused distribution in `prior`'s order.
    pub fused_p: Vec<f32>,
    /// The fused distribution as (candidate, mass), most likely first: what the next stage starts from.
    pub fused: Vec<(usize, f32)>,
    /// `order[j]`: the index in `prior` of `fused[j]` (to line up a next LLM's scores).
    pub order: Vec<usize>,
}

/// [`Stepped`] of `prior` and `scores` at weight `w`, temperature `t`.
pub fn step(prior: &[(usize, f32)], scores: &[f32], w: f32, t: f32) -> Stepped {
    let p0: Vec<f32> = prior.iter().map(|(_, p)| *p).collect();
    let llm = llm_probs(scores, t);
    let fused_p = fuse(&p0, &llm, w);
    let mut order: Vec<usize> = (0..fused_p.len().min(prior.len())).collect();
    order.sort_by(|a, b| fused_p[*b].total_cmp(&fused_p[*a]));
    let fused = order.iter().map(|&i| (prior[i].0, fused_p[i])).collect();
    Stepped {
        llm,
        fused_p,
        fused,
        order,
    }
}

/// The cascade's go-on rule: the next stage runs while the answer so far has an ambiguity (1 − its top mass)
/// above the next stage's θ.
pub fn goes_on(ambiguity: f64, theta: f64) -> bool {
    ambiguity > theta
}

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

/// The LLM's distribution over candidates: softmax of its scores (log-domain) at `temperature`.
pub fn llm_probs(scores: &[f32], temperature: f32) -> Vec<f32> {
    let t = if temperature.is_finite() && temperature > 0.0 {
        temperature
    } else {
        1.0
    };
    if !scores.iter().any(|s| s.is_finite()) {
        return normalise(&vec![0.0; scores.len()]);
    }
    // A non-finite score counts as impossible.
    let clean: Vec<f32> = scores
        .iter()
        .map(|&s| if s.is_finite() { s } else { f32::NEG_INFINITY })
        .collect();
    normalise(&crate::stats::softmax(&clean, f64::from(t)))
}

/// Index of the largest value (the first on ties); 0 for an empty slice.
pub fn argmax(p: &[f32]) -> usize {
    crate::stats::argmax(p).0
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

    #[test]
    fn llm_probs_is_a_tempered_softmax() {
        let p = llm_probs(&[0.0, 2f32.ln()], 1.0);
        assert!((p[0] - 1.0 / 3.0).abs() < 1e-6 && (p[1] - 2.0 / 3.0).abs() < 1e-6);
        let q = llm_probs(&[0.0, 2f32.ln()], 0.5);
        assert!((q[1] - 0.8).abs() < 1e-6, "{q:?}");
        assert_eq!(
            llm_probs(&[f32::NAN, f32::NEG_INFINITY], 1.0),
            vec![0.5, 0.5]
        );
        assert_eq!(argmax(&[0.1, 0.5, 0.5]), 1);
    }
}
