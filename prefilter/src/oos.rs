//! Out-of-scope scores: how unlike every known label a query is, higher = more likely out of scope. Each is a
//! known open-set method over what Tier-0 already computes — the calibrated distribution (maximum softmax
//! probability) or the pooled, L2-normalised embedding (distance to the nearest label centroid, or to the k
//! nearest training points). Which one serves is chosen by measurement (docs/tier0.md, "Out of scope").

use crate::grounding::unit;

/// The out-of-scope score methods (`oos.json` names the served one in its report spelling).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OosMethod {
    /// 1 − max p of the calibrated distribution (Hendrycks & Gimpel 2017).
    Msp,
    /// 1 − the cosine to the nearest label centroid (the mean of the label's training embeddings).
    Centroid,
    /// 1 − the mean cosine to the k nearest training embeddings (Sun et al. 2022), k = [`KNN_K`].
    Knn,
    /// [`OosMethod::Knn`] over the head's stored representatives only (the 8 training rows per label nearest the
    /// label's mean, which a trained head already keeps), instead of every training row.
    KnnRepresentatives,
    /// How far past its label's boundary a query lies: the distance to the predicted label's centroid minus
    /// that label's radius (the 95th percentile of its training rows' distances) — a per-label spherical
    /// boundary in the spirit of ADB (Zhang et al. 2021), set from the data instead of learned by a loss.
    Boundary,
    /// [`OosMethod::Knn`] over the training rows of Tier-0's [`TOP_LABELS`] most likely labels only (a tenth
    /// of the rows to read on Banking77).
    KnnTopLabels,
}

impl OosMethod {
    /// Every method, in report order.
    pub const ALL: [OosMethod; 6] = [
        OosMethod::Msp,
        OosMethod::Centroid,
        OosMethod::Knn,
        OosMethod::KnnRepresentatives,
        OosMethod::Boundary,
        OosMethod::KnnTopLabels,
    ];

    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            OosMethod::Msp => "msp",
            OosMethod::Centroid => "centroid",
            OosMethod::Knn => "knn",
            OosMethod::KnnRepresentatives => "knn_representatives",
            OosMethod::Boundary => "boundary",
            OosMethod::KnnTopLabels => "knn_top_labels",
        }
    }
}

/// The threshold that keeps `recall` of the in-scope `scores` in scope (nearest rank; +∞ without scores).
pub fn threshold_for_recall(scores: &[f32], recall: f64) -> f32 {
    let mut s: Vec<f32> = scores.to_vec();
    s.sort_by(f32::total_cmp);
    tiergate_core::stats::quantile_sorted(&s, recall.clamp(0.0, 1.0)).unwrap_or(f32::INFINITY)
}

/// Labels whose rows [`OosMethod::KnnTopLabels`] searches.
pub const TOP_LABELS: usize = 5;

/// The `m` most likely labels of `probs`.
pub fn top_labels(probs: &[f32], m: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..probs.len()).collect();
    idx.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
    idx.truncate(m);
    idx
}

/// [`knn_distance`] over the `points` whose label (`point_labels[i]`) is among `labels`.
pub fn knn_distance_within(
    query: &[f32],
    points: &[Vec<f32>],
    point_labels: &[usize],
    labels: &[usize],
    k: usize,
) -> f32 {
    let within: Vec<Vec<f32>> = points
        .iter()
        .zip(point_labels)
        .filter(|(_, l)| labels.contains(l))
        .map(|(p, _)| p.clone())
        .collect();
    knn_distance(query, &within, k)
}

/// Neighbours the k-NN score averages over.
pub const KNN_K: usize = 5;

/// 1 − max p (0 for an empty distribution).
pub fn msp(probs: &[f32]) -> f32 {
    1.0 - probs.iter().copied().fold(0.0, f32::max)
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Unit centroids of each label's embeddings (`rows[i]` belongs to `labels[i]`, `n` labels; a label without
/// rows gets a zero centroid, which is never the nearest).
pub fn centroids(rows: &[Vec<f32>], labels: &[usize], n: usize) -> Vec<Vec<f32>> {
    let dim = rows.first().map_or(0, Vec::len);
    let mut sum = vec![vec![0.0f32; dim]; n];
    for (r, &l) in rows.iter().zip(labels) {
        if let Some(s) = sum.get_mut(l) {
            for (a, b) in s.iter_mut().zip(r) {
                *a += b;
            }
        }
    }
    sum.iter().map(|s| unit(s)).collect()
}

/// 1 − the cosine of `query` to the nearest of `centroids` (unit vectors; 1 when there are none).
pub fn centroid_distance(query: &[f32], centroids: &[Vec<f32>]) -> f32 {
    if centroids.is_empty() {
        return 1.0;
    }
    let q = unit(query);
    1.0 - centroids
        .iter()
        .map(|c| dot(&q, c))
        .fold(f32::NEG_INFINITY, f32::max)
}

/// Each label's radius: the `q` quantile (nearest rank) of its rows' cosine distances to its centroid (unit
/// `rows`, `labels[i]` of `rows[i]`; 0 for a label without rows).
pub fn radii(rows: &[Vec<f32>], labels: &[usize], centroids: &[Vec<f32>], q: f64) -> Vec<f32> {
    let mut d: Vec<Vec<f32>> = vec![Vec::new(); centroids.len()];
    for (r, &l) in rows.iter().zip(labels) {
        if let Some(c) = centroids.get(l) {
            d[l].push(1.0 - dot(r, c));
        }
    }
    d.into_iter()
        .map(|mut v| {
            v.sort_by(f32::total_cmp);
            tiergate_core::stats::quantile_sorted(&v, q).unwrap_or(0.0)
        })
        .collect()
}

/// How far past label `label`'s boundary `query` lies: its cosine distance to the label's centroid minus the
/// label's radius (negative inside).
pub fn boundary_excess(query: &[f32], label: usize, centroids: &[Vec<f32>], radii: &[f32]) -> f32 {
    let (Some(c), Some(r)) = (centroids.get(label), radii.get(label)) else {
        return 1.0;
    };
    1.0 - dot(&unit(query), c) - r
}

/// Per label, its `per_label` rows nearest the label's centroid (unit `rows`, `labels[i]` of `rows[i]`), as
/// a trained head keeps its representatives.
pub fn representatives(
    rows: &[Vec<f32>],
    labels: &[usize],
    centroids: &[Vec<f32>],
    per_label: usize,
) -> Vec<Vec<f32>> {
    let mut by_label: Vec<Vec<(f32, usize)>> = vec![Vec::new(); centroids.len()];
    for (i, (r, &l)) in rows.iter().zip(labels).enumerate() {
        if let Some(c) = centroids.get(l) {
            by_label[l].push((dot(r, c), i));
        }
    }
    by_label
        .into_iter()
        .flat_map(|mut v| {
            v.sort_by(|a, b| b.0.total_cmp(&a.0));
            v.into_iter().take(per_label).map(|(_, i)| rows[i].clone())
        })
        .collect()
}

/// 1 − the mean cosine of `query` to its `k` nearest `points` (unit vectors; 1 when there are none).
pub fn knn_distance(query: &[f32], points: &[Vec<f32>], k: usize) -> f32 {
    let q = unit(query);
    let mut sims: Vec<f32> = points.iter().map(|p| dot(&q, p)).collect();
    if sims.is_empty() || k == 0 {
        return 1.0;
    }
    let k = k.min(sims.len());
    sims.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
    1.0 - sims[..k].iter().sum::<f32>() / k as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two labels around the x and y axes of a 3-d space; an out-of-scope query along z.
    fn space() -> (Vec<Vec<f32>>, Vec<usize>) {
        let rows = vec![
            unit(&[1.0, 0.1, 0.0]),
            unit(&[1.0, -0.1, 0.0]),
            unit(&[0.1, 1.0, 0.0]),
            unit(&[-0.1, 1.0, 0.0]),
        ];
        (rows, vec![0, 0, 1, 1])
    }

    #[test]
    fn distances_separate_a_query_off_every_label() {
        let (rows, labels) = space();
        let c = centroids(&rows, &labels, 2);
        assert!(
            (c[0][0] - 1.0).abs() < 1e-6 && c[0][1].abs() < 1e-6,
            "{c:?}"
        );
        let inside = [2.0, 0.05, 0.0];
        let outside = [0.0, 0.0, 1.0];
        assert!(centroid_distance(&inside, &c) < 0.01);
        assert!((centroid_distance(&outside, &c) - 1.0).abs() < 1e-6);
        // The scale of the query does not matter (cosine).
        assert!(
            (centroid_distance(&[4.0, 0.1, 0.0], &c) - centroid_distance(&inside, &c)).abs() < 1e-6
        );
        assert!(knn_distance(&inside, &rows, 2) < 0.01);
        assert!((knn_distance(&outside, &rows, 2) - 1.0).abs() < 1e-6);
        // k nearest: the two x-axis rows, cos = 1/√1.01 each.
        let d = knn_distance(&[1.0, 0.0, 0.0], &rows, 2);
        assert!((d - (1.0 - 1.0 / 1.01f32.sqrt())).abs() < 1e-6, "{d}");
        assert_eq!(knn_distance(&inside, &[], 3), 1.0);
        assert_eq!(centroid_distance(&inside, &[]), 1.0);
    }

    #[test]
    fn a_label_boundary_is_its_rows_spread() {
        let (rows, labels) = space();
        let c = centroids(&rows, &labels, 2);
        let r = radii(&rows, &labels, &c, 1.0);
        // Every row sits at the same angle from its centroid: cos = 1/√1.01.
        let d = 1.0 - 1.0 / 1.01f32.sqrt();
        assert!((r[0] - d).abs() < 1e-6 && (r[1] - d).abs() < 1e-6, "{r:?}");
        assert!(boundary_excess(&[1.0, 0.0, 0.0], 0, &c, &r) < 0.0);
        assert!(boundary_excess(&[0.0, 0.0, 1.0], 0, &c, &r) > 0.9);
        assert_eq!(boundary_excess(&[1.0, 0.0, 0.0], 5, &c, &r), 1.0);
        // One representative per label: the row nearest its centroid (both tie here: the first is kept).
        let reps = representatives(&rows, &labels, &c, 1);
        assert_eq!(reps, vec![rows[0].clone(), rows[2].clone()]);
    }

    #[test]
    fn msp_is_one_minus_the_top_probability() {
        assert!((msp(&[0.7, 0.2, 0.1]) - 0.3).abs() < 1e-6);
        assert!((msp(&[0.34, 0.33, 0.33]) - 0.66).abs() < 1e-6);
        assert_eq!(msp(&[]), 1.0);
    }
}
