//! `tiergate eval`: accuracy, macro-F1, top-5 recall, calibration, the selective-prediction table the routing
//! threshold is chosen from, and speed (latency at batch 1, throughput through the batching thread).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde::Serialize;
use tiergate_config::PrefilterConfig;

use crate::data::Example;
use tiergate_prefilter::calibrate::{argmax, ece};
use tiergate_prefilter::classifier::Classifier;
use tiergate_prefilter::error::{PrefilterError, Result};
use tiergate_prefilter::runtime::{Prediction, PrefilterHandle};

/// One row of the selective-prediction table.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SelectiveRow {
    /// Escalate when the ambiguity `1 - max p` is above this.
    pub threshold: f64,
    /// Share of queries escalated.
    pub escalated: f64,
    /// Accuracy on the queries Tier-0 keeps (`null` when it keeps none).
    pub accuracy_kept: Option<f64>,
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LatencyMs {
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
}

/// Everything `tiergate eval` reports (`--json` prints this object).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EvalReport {
    /// Rows evaluated.
    pub n: usize,
    /// Top-1 accuracy.
    pub accuracy: f64,
    /// Unweighted mean of per-label F1 over the labels present in gold or predictions.
    pub macro_f1: f64,
    /// Share of rows whose gold label is among the top 5.
    pub top5_recall: f64,
    /// Expected calibration error, 15 bins.
    pub ece: f64,
    /// Selective prediction for thresholds 0.05 … 0.95.
    pub selective: Vec<SelectiveRow>,
    /// End-to-end latency of one query at a time (tokenise + queue + forward).
    pub latency_ms: LatencyMs,
    /// Queries per second with many in flight (the batching thread groups them up to `max_batch`).
    pub throughput_per_s: f64,
    /// Rows whose gold label the classifier does not know (counted as errors).
    pub unknown_labels: usize,
    /// Mean batch size seen in the throughput run.
    pub mean_batch: f64,
}

/// Options for [`evaluate`].
#[derive(Debug, Clone)]
pub struct EvalOptions {
    /// Batching settings for the runtime (max batch, wait, budget, queue).
    pub prefilter: PrefilterConfig,
    /// How many queries to time one at a time.
    pub latency_samples: usize,
}

/// Runs the classifier over `rows` through the real batching runtime and computes the report.
pub fn evaluate(
    classifier: Classifier,
    rows: &[Example],
    opts: &EvalOptions,
) -> Result<EvalReport> {
    if rows.is_empty() {
        return Err(PrefilterError::InvalidInput("no rows to evaluate".into()));
    }
    let mut cfg = opts.prefilter.clone();
    cfg.top_k = cfg.top_k.max(5);
    let handle = PrefilterHandle::start(classifier, &cfg)?;
    let index: HashMap<&str, usize> = handle
        .labels()
        .iter()
        .enumerate()
        .map(|(i, l)| (l.as_str(), i))
        .collect();

    let started = Instant::now();
    let preds = predict_all(&handle, rows, &cfg)?;
    let elapsed = started.elapsed().as_secs_f64();
    let mean_batch = preds.iter().map(|p| p.batch_size as f64).sum::<f64>() / preds.len() as f64;

    // Latency: one query at a time.
    let mut lat = Vec::new();
    for row in rows.iter().cycle().take(opts.latency_samples.max(1)) {
        let t = Instant::now();
        handle.classify_blocking(&row.text)?;
        lat.push(t.elapsed());
    }

    let gold: Vec<Option<usize>> = rows
        .iter()
        .map(|r| index.get(r.label.as_str()).copied())
        .collect();
    let mut report = metrics(&preds, &gold);
    report.latency_ms = LatencyMs {
        p50: percentile_ms(&mut lat, 0.50),
        p95: percentile_ms(&mut lat, 0.95),
    };
    report.throughput_per_s = rows.len() as f64 / elapsed;
    report.mean_batch = mean_batch;
    Ok(report)
}

/// Each row's ambiguity (`1 − max p`, what the router compares with θ) and whether Tier-0's top label is
/// wrong (a label the head does not know is wrong): the rows `tiergate eval --risk` measures θ on.
pub fn risk_rows(
    classifier: Classifier,
    rows: &[Example],
    cfg: &PrefilterConfig,
) -> Result<Vec<tiergate_core::risk::Row>> {
    if rows.is_empty() {
        return Err(PrefilterError::InvalidInput("no rows to evaluate".into()));
    }
    let handle = PrefilterHandle::start(classifier, cfg)?;
    let preds = predict_all(&handle, rows, cfg)?;
    let labels = handle.labels();
    Ok(preds
        .iter()
        .zip(rows)
        .map(|(p, r)| tiergate_core::risk::Row {
            ambiguity: (1.0 - f64::from(p.confidence)).clamp(0.0, 1.0),
            wrong: labels.get(p.label) != Some(&r.label),
        })
        .collect())
}

/// Every row's prediction through the batching thread, with a window of requests in flight so it always has a
/// full batch to take.
pub(crate) fn predict_all(
    handle: &PrefilterHandle,
    rows: &[Example],
    cfg: &PrefilterConfig,
) -> Result<Vec<Prediction>> {
    let window = (cfg.max_batch * 4).min(cfg.queue_capacity).max(1);
    let mut preds: Vec<Option<Prediction>> = vec![None; rows.len()];
    let mut inflight = std::collections::VecDeque::new();
    for (i, row) in rows.iter().enumerate() {
        if inflight.len() >= window {
            collect_one(&mut inflight, &mut preds)?;
        }
        inflight.push_back((i, handle.submit(&row.text)?));
    }
    while !inflight.is_empty() {
        collect_one(&mut inflight, &mut preds)?;
    }
    Ok(preds.into_iter().flatten().collect())
}

/// `tiergate eval --oos`: the open-intent figures of a head on rows of which some are out of scope.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct OosEvalReport {
    /// The out-of-scope score (`knn` from the head's `oos.json`, else `msp`).
    pub method: &'static str,
    /// Labels the head knows.
    pub known_labels: usize,
    /// Rows with a label the head knows.
    pub in_scope_rows: usize,
    /// Rows out of scope (a label the head does not know, or the `--oos-label`).
    pub oos_rows: usize,
    /// `n`, `threshold`, `accuracy`, `macro_f1`, `oos_recall`, `oos_precision`, `in_scope_accuracy`.
    #[serde(flatten)]
    pub figures: crate::open_intent::OpenIntentReport,
}

/// Runs the classifier over `rows` and scores its out-of-scope calls: rows whose label the head does not know,
/// or `oos_label`, are out of scope; scores above `threshold` (by default the head's fitted one) are called
/// out of scope.
pub fn evaluate_out_of_scope(
    classifier: Classifier,
    rows: &[Example],
    cfg: &PrefilterConfig,
    oos_label: Option<&str>,
    threshold: Option<f32>,
) -> Result<OosEvalReport> {
    if rows.is_empty() {
        return Err(PrefilterError::InvalidInput("no rows to evaluate".into()));
    }
    let handle = PrefilterHandle::start(classifier, cfg)?;
    let fitted = handle.out_of_scope();
    let threshold = threshold.or(fitted.map(|(_, t)| t)).ok_or_else(|| {
        PrefilterError::InvalidInput(
            "the head has no fitted out-of-scope threshold (oos.json): pass --oos-threshold".into(),
        )
    })?;
    let method = fitted.map_or(tiergate_prefilter::oos::OosMethod::Msp, |(m, _)| m);
    let preds = predict_all(&handle, rows, cfg)?;
    let scored = open_intent_rows(&preds, rows, handle.labels(), oos_label);
    let in_scope_rows = scored.iter().filter(|r| r.gold.is_some()).count();
    Ok(OosEvalReport {
        method: method.name(),
        known_labels: handle.labels().len(),
        in_scope_rows,
        oos_rows: scored.len() - in_scope_rows,
        figures: crate::open_intent::report(&scored, threshold, handle.labels().len()),
    })
}

/// Each row's gold class (`None`: out of scope), Tier-0's label and its out-of-scope score (1 − max p when the
/// head serves none).
pub fn open_intent_rows(
    preds: &[Prediction],
    rows: &[Example],
    labels: &[String],
    oos_label: Option<&str>,
) -> Vec<crate::open_intent::Scored> {
    preds
        .iter()
        .zip(rows)
        .map(|(p, r)| crate::open_intent::Scored {
            gold: (oos_label != Some(r.label.as_str()))
                .then(|| labels.iter().position(|l| *l == r.label))
                .flatten(),
            pred: p.label,
            score: p.oos_score.unwrap_or(1.0 - p.confidence),
        })
        .collect()
}

type Inflight =
    std::collections::VecDeque<(usize, tokio::sync::oneshot::Receiver<Result<Prediction>>)>;

fn collect_one(inflight: &mut Inflight, preds: &mut [Option<Prediction>]) -> Result<()> {
    if let Some((i, rx)) = inflight.pop_front() {
        preds[i] = Some(rx.blocking_recv().map_err(|_| PrefilterError::Closed)??);
    }
    Ok(())
}

/// Quality metrics from predictions and gold label indices (`None`: a label the classifier does not know).
pub fn metrics(preds: &[Prediction], gold: &[Option<usize>]) -> EvalReport {
    let n = preds.len();
    let probs: Vec<Vec<f32>> = preds.iter().map(|p| p.probs.clone()).collect();
    let n_labels = probs.first().map_or(0, Vec::len);
    let mut tp = vec![0usize; n_labels + 1];
    let mut fp = vec![0usize; n_labels + 1];
    let mut fneg = vec![0usize; n_labels + 1];
    let mut correct = 0usize;
    let mut top5 = 0usize;
    // Unknown gold labels get the extra index `n_labels`: always wrong, still counted.
    let gold_idx: Vec<usize> = gold.iter().map(|g| g.unwrap_or(n_labels)).collect();
    for (p, &g) in probs.iter().zip(&gold_idx) {
        let (arg, _) = argmax(p);
        if arg == g {
            correct += 1;
            tp[g] += 1;
        } else {
            fp[arg] += 1;
            fneg[g] += 1;
        }
        let mut order: Vec<usize> = (0..p.len()).collect();
        order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
        if order.iter().take(5).any(|&i| i == g) {
            top5 += 1;
        }
    }
    let f1s: Vec<f64> = (0..=n_labels)
        .filter(|&i| tp[i] + fp[i] + fneg[i] > 0)
        .map(|i| 2.0 * tp[i] as f64 / (2 * tp[i] + fp[i] + fneg[i]) as f64)
        .collect();
    let selective = (1..=19)
        .map(|k| {
            let threshold = k as f64 * 0.05;
            let kept: Vec<bool> = probs
                .iter()
                .zip(&gold_idx)
                .filter(|(p, _)| 1.0 - argmax(p).1 as f64 <= threshold)
                .map(|(p, &g)| argmax(p).0 == g)
                .collect();
            SelectiveRow {
                threshold: (threshold * 100.0).round() / 100.0,
                escalated: 1.0 - kept.len() as f64 / n.max(1) as f64,
                accuracy_kept: (!kept.is_empty())
                    .then(|| kept.iter().filter(|&&c| c).count() as f64 / kept.len() as f64),
            }
        })
        .collect();
    EvalReport {
        n,
        accuracy: correct as f64 / n.max(1) as f64,
        macro_f1: f1s.iter().sum::<f64>() / f1s.len().max(1) as f64,
        top5_recall: top5 as f64 / n.max(1) as f64,
        ece: ece(&probs, &gold_idx, 15),
        selective,
        latency_ms: LatencyMs { p50: 0.0, p95: 0.0 },
        throughput_per_s: 0.0,
        unknown_labels: gold.iter().filter(|g| g.is_none()).count(),
        mean_batch: 0.0,
    }
}

/// The `q` quantile (nearest rank) in milliseconds; sorts `samples`.
pub fn percentile_ms(samples: &mut [Duration], q: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.sort();
    samples[tiergate_core::stats::rank_index(samples.len(), q)].as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiergate_prefilter::runtime::Timings;

    fn pred(probs: Vec<f32>) -> Prediction {
        let (label, confidence) = argmax(&probs);
        Prediction {
            embedding: Vec::new(),
            probs,
            top: Vec::new(),
            label,
            confidence,
            oos_score: None,
            tokens: 3,
            truncated: false,
            batch_size: 1,
            timings: Timings::default(),
        }
    }

    #[test]
    fn metrics_on_a_hand_computed_case() {
        let preds = vec![
            pred(vec![0.9, 0.1, 0.0]), // gold 0: right, confident
            pred(vec![0.2, 0.7, 0.1]), // gold 1: right
            pred(vec![0.6, 0.4, 0.0]), // gold 1: wrong, ambiguous
            pred(vec![0.5, 0.3, 0.2]), // gold unknown: wrong
        ];
        let gold = vec![Some(0), Some(1), Some(1), None];
        let r = metrics(&preds, &gold);
        assert_eq!(r.n, 4);
        assert!((r.accuracy - 0.5).abs() < 1e-9);
        assert_eq!(r.unknown_labels, 1);
        assert!((r.top5_recall - 0.75).abs() < 1e-9);
        // F1: label0 tp1 fp2 fn0 -> 0.5; label1 tp1 fp0 fn1 -> 2/3; unknown tp0 fn1 -> 0.
        assert!(
            (r.macro_f1 - (0.5 + 2.0 / 3.0) / 3.0).abs() < 1e-9,
            "{}",
            r.macro_f1
        );
        // θ = 0.35: ambiguities are 0.1, 0.3, 0.4, 0.5 -> two kept, both right.
        let row = r
            .selective
            .iter()
            .find(|s| (s.threshold - 0.35).abs() < 1e-9)
            .unwrap();
        assert!((row.escalated - 0.5).abs() < 1e-9);
        assert_eq!(row.accuracy_kept, Some(1.0));
        let row = r
            .selective
            .iter()
            .find(|s| (s.threshold - 0.05).abs() < 1e-9)
            .unwrap();
        assert_eq!((row.escalated, row.accuracy_kept), (1.0, None));
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let mut v: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        assert_eq!(percentile_ms(&mut v, 0.5), 50.0);
        assert_eq!(percentile_ms(&mut v, 0.95), 95.0);
        assert_eq!(percentile_ms(&mut [], 0.5), 0.0);
    }
}
