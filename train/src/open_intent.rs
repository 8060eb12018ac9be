//! Open-intent classification measured the way the field measures it (Shu et al. 2017; Lin & Xu 2019; Zhang,
//! Xu & Lin, "Deep Open Intent Classification with Adaptive Decision Boundary", AAAI 2021): a share of the
//! labels is kept as known, a head is trained on those only, and the test split holds every label, the
//! others counted as one unknown class. A query is called out of scope when its out-of-scope score
//! (`tiergate_prefilter::oos`) is above a threshold fitted on the known-only dev split for a target in-scope
//! recall. Reported: accuracy over all classes (unknown as one), macro-F1 over the known classes and unknown,
//! unknown recall and precision, and in-scope accuracy.

use candle_core::{Device, Tensor};
use candle_nn::Module;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;
use tiergate_prefilter::calibrate::{fit_temperature, softmax};
use tiergate_prefilter::error::Result;
use tiergate_prefilter::grounding::unit;
use tiergate_prefilter::oos::{self, OosMethod};

/// One test row: its gold label (`None`: out of scope), Tier-0's label and the out-of-scope score.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scored {
    pub gold: Option<usize>,
    pub pred: usize,
    pub score: f32,
}

/// The open-intent figures of a set of rows at one threshold.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct OpenIntentReport {
    /// Rows.
    pub n: usize,
    /// Scores above it are called out of scope.
    pub threshold: f32,
    /// Rows whose class (a known label, or unknown) is called right.
    pub accuracy: f64,
    /// Mean F1 over the known labels and the unknown class (a class with neither rows nor calls left out).
    pub macro_f1: f64,
    /// Out-of-scope rows called out of scope (`None` without such rows).
    pub oos_recall: Option<f64>,
    /// Out-of-scope calls that are out of scope (`None` without a call).
    pub oos_precision: Option<f64>,
    /// In-scope rows answered with their label.
    pub in_scope_accuracy: Option<f64>,
}

pub use tiergate_prefilter::oos::threshold_for_recall;

/// The figures of `rows` (known labels `0..n_known`) when scores above `threshold` are called out of scope.
pub fn report(rows: &[Scored], threshold: f32, n_known: usize) -> OpenIntentReport {
    // Classes 0..n_known are the known labels, n_known the unknown class.
    let class = |gold: Option<usize>| gold.unwrap_or(n_known).min(n_known);
    let called = |r: &Scored| {
        if r.score > threshold {
            n_known
        } else {
            r.pred.min(n_known)
        }
    };
    let (mut tp, mut support, mut calls) = (
        vec![0usize; n_known + 1],
        vec![0usize; n_known + 1],
        vec![0usize; n_known + 1],
    );
    for r in rows {
        let (g, c) = (class(r.gold), called(r));
        support[g] += 1;
        calls[c] += 1;
        if g == c {
            tp[g] += 1;
        }
    }
    let share = |a: usize, b: usize| (b > 0).then(|| a as f64 / b as f64);
    let f1s: Vec<f64> = (0..=n_known)
        .filter(|&k| support[k] + calls[k] > 0)
        .map(|k| 2.0 * tp[k] as f64 / (support[k] + calls[k]) as f64)
        .collect();
    let in_scope = rows.iter().filter(|r| r.gold.is_some()).count();
    let in_scope_right = rows
        .iter()
        .filter(|r| r.gold.is_some() && class(r.gold) == called(r))
        .count();
    OpenIntentReport {
        n: rows.len(),
        threshold,
        accuracy: share(tp.iter().sum(), rows.len()).unwrap_or(0.0),
        macro_f1: f1s.iter().sum::<f64>() / f1s.len().max(1) as f64,
        oos_recall: share(tp[n_known], support[n_known]),
        oos_precision: share(tp[n_known], calls[n_known]),
        in_scope_accuracy: share(in_scope_right, in_scope),
    }
}

/// One setting of the protocol and its figures per method.
#[derive(Debug, Clone, Serialize)]
pub struct ProtocolRun {
    /// Share of the labels kept as known.
    pub known_share: f64,
    pub seed: u64,
    pub known_labels: usize,
    /// (method, figures on the test split)
    pub methods: Vec<(&'static str, OpenIntentReport)>,
    /// The closed-set accuracy of the head on the known test rows (no out-of-scope calls).
    pub closed_accuracy: f64,
}

/// Representatives a trained head keeps per label (`tiergate train`).
const REPRESENTATIVES: usize = 8;

/// Test and dev shares of each label's rows in the protocol's split (the rest trains).
const TEST_SHARE: f64 = 0.2;
const DEV_SHARE: f64 = 0.1;

/// The protocol's split of one setting: which labels are known (renumbered `0..n_known`), and the rows.
pub struct Split {
    /// Each label's number among the known ones (`None`: unknown).
    pub known: Vec<Option<usize>>,
    pub n_known: usize,
    /// The known labels' train and dev rows, and every label's test rows.
    pub train: Vec<usize>,
    pub dev: Vec<usize>,
    pub test: Vec<usize>,
}

/// Draws `known_share` of the labels as known and splits each label's rows 70/10/20 (seeded by `rng`, the
/// same draws [`run`] makes).
pub fn split(
    labels: &[usize],
    n_labels: usize,
    known_share: f64,
    rng: &mut rand::rngs::StdRng,
) -> Split {
    let mut all: Vec<usize> = (0..n_labels).collect();
    all.shuffle(rng);
    let n_known = ((n_labels as f64 * known_share).round() as usize).clamp(2, n_labels);
    let mut known = vec![None; n_labels];
    for (new, &old) in all[..n_known].iter().enumerate() {
        known[old] = Some(new);
    }
    let (mut train, mut dev, mut test) = (Vec::new(), Vec::new(), Vec::new());
    for (l, k) in known.iter().enumerate() {
        let mut rows: Vec<usize> = (0..labels.len()).filter(|&i| labels[i] == l).collect();
        rows.shuffle(rng);
        let n_test = (rows.len() as f64 * TEST_SHARE).round() as usize;
        let n_dev = (rows.len() as f64 * DEV_SHARE).round() as usize;
        test.extend(rows[..n_test].iter().copied());
        if k.is_some() {
            dev.extend(rows[n_test..n_test + n_dev].iter().copied());
            train.extend(rows[n_test + n_dev..].iter().copied());
        }
    }
    Split {
        known,
        n_known,
        train,
        dev,
        test,
    }
}

/// The split of (`known_share`, `seed`) as [`run`] draws it.
pub fn split_of(labels: &[usize], n_labels: usize, known_share: f64, seed: u64) -> Split {
    split(
        labels,
        n_labels,
        known_share,
        &mut rand::rngs::StdRng::seed_from_u64(seed),
    )
}

/// Runs the protocol on pooled embeddings `x` (`labels[i]` of `n_labels`): per label, a seeded 70/10/20
/// train/dev/test split; `known_share` of the labels drawn as known; a frozen head trained and calibrated on
/// their train and dev rows; each method's threshold fitted on the dev rows for `recall`; figures on the whole
/// test split.
pub fn run(
    x: &[Vec<f32>],
    labels: &[usize],
    n_labels: usize,
    known_share: f64,
    seed: u64,
    recall: f64,
) -> Result<ProtocolRun> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let Split {
        known,
        n_known,
        train,
        dev,
        test,
    } = split(labels, n_labels, known_share, &mut rng);
    let tensor = |rows: &[usize]| -> Result<Tensor> {
        let flat: Vec<f32> = rows.iter().flat_map(|&i| x[i].iter().copied()).collect();
        Ok(Tensor::from_vec(
            flat,
            (rows.len(), x[0].len()),
            &Device::Cpu,
        )?)
    };
    let y =
        |rows: &[usize]| -> Vec<usize> { rows.iter().filter_map(|&i| known[labels[i]]).collect() };
    let train_y = y(&train);
    let y_train: Vec<u32> = train_y.iter().map(|&l| l as u32).collect();
    let head = crate::train::fit_frozen_head(&tensor(&train)?, &y_train, n_known, &mut rng)?;
    let logits = |rows: &[usize]| -> Result<Vec<Vec<f32>>> {
        Ok(head.forward(&tensor(rows)?)?.to_vec2::<f32>()?)
    };
    let (dev_logits, test_logits) = (logits(&dev)?, logits(&test)?);
    let t = fit_temperature(&dev_logits, &y(&dev));
    let train_x: Vec<Vec<f32>> = train.iter().map(|&i| unit(&x[i])).collect();
    let centroids = oos::centroids(&train_x, &train_y, n_known);
    let radii = oos::radii(&train_x, &train_y, &centroids, 0.95);
    let reps = oos::representatives(&train_x, &train_y, &centroids, REPRESENTATIVES);
    let score = |method: OosMethod, row: usize, p: &[f32]| match method {
        OosMethod::Msp => oos::msp(p),
        OosMethod::Centroid => oos::centroid_distance(&x[row], &centroids),
        OosMethod::Knn => oos::knn_distance(&x[row], &train_x, oos::KNN_K),
        OosMethod::KnnRepresentatives => oos::knn_distance(&x[row], &reps, oos::KNN_K),
        OosMethod::Boundary => {
            let label = tiergate_core::stats::argmax(p).0;
            oos::boundary_excess(&x[row], label, &centroids, &radii)
        }
        OosMethod::KnnTopLabels => oos::knn_distance_within(
            &x[row],
            &train_x,
            &train_y,
            &oos::top_labels(p, oos::TOP_LABELS),
            oos::KNN_K,
        ),
    };
    let probs = |l: &[Vec<f32>]| -> Vec<Vec<f32>> { l.iter().map(|z| softmax(z, t)).collect() };
    let (dev_p, test_p) = (probs(&dev_logits), probs(&test_logits));
    let mut methods = Vec::new();
    for m in OosMethod::ALL {
        let dev_scores: Vec<f32> = dev
            .iter()
            .zip(&dev_p)
            .map(|(&i, p)| score(m, i, p))
            .collect();
        let threshold = threshold_for_recall(&dev_scores, recall);
        let rows: Vec<Scored> = test
            .iter()
            .zip(&test_p)
            .map(|(&i, p)| Scored {
                gold: known[labels[i]],
                pred: tiergate_core::stats::argmax(p).0,
                score: score(m, i, p),
            })
            .collect();
        methods.push((m.name(), report(&rows, threshold, n_known)));
    }
    let known_test: Vec<(usize, &Vec<f32>)> = test
        .iter()
        .zip(&test_p)
        .filter_map(|(&i, p)| Some((known[labels[i]]?, p)))
        .collect();
    let closed = known_test
        .iter()
        .filter(|(g, p)| tiergate_core::stats::argmax(p).0 == *g)
        .count();
    Ok(ProtocolRun {
        known_share,
        seed,
        known_labels: n_known,
        methods,
        closed_accuracy: closed as f64 / known_test.len().max(1) as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(gold: Option<usize>, pred: usize, score: f32) -> Scored {
        Scored { gold, pred, score }
    }

    /// Two known labels and the unknown class, figures worked out by hand.
    #[test]
    fn figures_of_a_hand_counted_fixture() {
        let rows = [
            row(Some(0), 0, 0.1), // right
            row(Some(0), 1, 0.2), // wrong label
            row(Some(1), 1, 0.9), // in scope, called out of scope
            row(None, 0, 0.8),    // out of scope, caught
            row(None, 1, 0.3),    // out of scope, missed
        ];
        let r = report(&rows, 0.5, 2);
        assert_eq!(r.n, 5);
        // Right: rows 1 and 4 → 2 / 5.
        assert!((r.accuracy - 0.4).abs() < 1e-12);
        // Label 0: support 2 (rows 1, 2), called once (row 1), right once → F1 2·1 / (2 + 1) = 2/3.
        // Label 1: support 1 (row 3), called twice (rows 2, 5), never right → F1 0.
        // Unknown: support 2 (rows 4, 5), called twice (rows 3, 4), right once → F1 2·1 / (2 + 2) = 1/2.
        assert!(
            (r.macro_f1 - (2.0 / 3.0 + 0.0 + 0.5) / 3.0).abs() < 1e-12,
            "{r:?}"
        );
        assert_eq!(r.oos_recall, Some(0.5));
        assert_eq!(r.oos_precision, Some(0.5));
        assert_eq!(r.in_scope_accuracy, Some(1.0 / 3.0));
        // Nothing called out of scope: precision undefined, recall 0.
        let r = report(&rows, 1.0, 2);
        assert_eq!((r.oos_recall, r.oos_precision), (Some(0.0), None));
    }

    #[test]
    fn the_threshold_keeps_the_target_share_in_scope() {
        let scores: Vec<f32> = (1..=100).map(|i| i as f32 / 100.0).collect();
        let t = threshold_for_recall(&scores, 0.95);
        assert!((t - 0.95).abs() < 1e-6, "{t}");
        assert_eq!(scores.iter().filter(|&&s| s <= t).count(), 95);
        assert_eq!(threshold_for_recall(&[], 0.95), f32::INFINITY);
    }
}
