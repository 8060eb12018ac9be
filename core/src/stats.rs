//! Statistics used on the request path, in the policy, in evaluation and in the bench.

/// The 0-based index of the `q` quantile by nearest rank among `n` sorted values (`n` ≥ 1): the smallest
/// value with at least a fraction `q` of the values at or below it. `q` is clamped to [0, 1].
pub fn rank_index(n: usize, q: f64) -> usize {
    ((q.clamp(0.0, 1.0) * n as f64).ceil() as usize).clamp(1, n.max(1)) - 1
}

/// The `q` quantile (nearest rank) of `sorted` (ascending), or `None` when it is empty.
pub fn quantile_sorted<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    (!sorted.is_empty()).then(|| sorted[rank_index(sorted.len(), q)])
}

/// The `q` quantile (nearest rank) of `values` in any order (a selection, not a sort), or `None` when empty.
pub fn quantile(mut values: Vec<f64>, q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let at = rank_index(values.len(), q);
    let (_, v, _) = values.select_nth_unstable_by(at, f64::total_cmp);
    Some(*v)
}

/// Softmax of `logits / temperature`.
pub fn softmax(logits: &[f32], temperature: f64) -> Vec<f32> {
    let t = temperature as f32;
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = logits.iter().map(|&z| ((z - max) / t).exp()).collect();
    let sum: f32 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

/// Index and value of the largest entry, the first on ties (`(0, −∞)` for an empty slice).
pub fn argmax(p: &[f32]) -> (usize, f32) {
    p.iter()
        .copied()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |best, (i, v)| {
            if v > best.1 {
                (i, v)
            } else {
                best
            }
        })
}

/// One step of an exponentially weighted moving average: `alpha` of the new sample, the rest of the old
/// value; the first sample (`old` = `None`) is taken as it is.
pub fn ewma(old: Option<f64>, x: f64, alpha: f64) -> f64 {
    match old {
        Some(o) => alpha * x + (1.0 - alpha) * o,
        None => x,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let v: Vec<u32> = (1..=10).collect();
        assert_eq!(quantile_sorted(&v, 0.5), Some(5));
        assert_eq!(quantile_sorted(&v, 0.95), Some(10));
        assert_eq!(quantile_sorted(&v, 0.0), Some(1));
        assert_eq!(quantile_sorted(&v, 1.0), Some(10));
        assert_eq!(quantile_sorted(&v, 7.0), Some(10));
        assert_eq!(quantile_sorted::<u32>(&[], 0.5), None);
        let shuffled = vec![3.0, 9.0, 1.0, 10.0, 2.0, 8.0, 4.0, 7.0, 5.0, 6.0];
        assert_eq!(quantile(shuffled, 0.9), Some(9.0));
        assert_eq!(quantile(Vec::new(), 0.5), None);
        assert_eq!(rank_index(1, 0.99), 0);
    }

    #[test]
    fn softmax_argmax_ewma() {
        let p = softmax(&[1.0, 2.0, 3.0], 1.0);
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(p[2] > p[1] && p[1] > p[0]);
        let flat = softmax(&[1.0, 2.0, 3.0], 1e6);
        assert!(flat.iter().all(|x| (x - 1.0 / 3.0).abs() < 1e-4));
        assert_eq!(argmax(&[0.1, 0.5, 0.5]), (1, 0.5));
        assert_eq!(argmax(&[]).0, 0);
        assert_eq!(ewma(None, 4.0, 0.3), 4.0);
        assert!((ewma(Some(10.0), 0.0, 0.3) - 7.0).abs() < 1e-12);
    }
}
