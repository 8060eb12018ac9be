//! `tiergate distill`: the LLM's verdicts on escalated requests (recorded by the server with
//! `server.record_escalations`) fed back into a trained head as soft targets, so that Tier-0 is sure where the
//! LLM was needed before.
//!
//! The head continues from its weights on the original training rows and the records shuffled together:
//! a training row contributes cross-entropy on its gold label (so nothing is forgotten), a record the
//! cross-entropy against the LLM's fused distribution at temperature T, scaled by T² (the KL of knowledge
//! distillation up to a constant) and by `weight`; then the head is recalibrated (temperature scaling) on the
//! original dev split. Before/after
//! figures on that dev split: accuracy, ECE and the escalated share at a given θ; and on the records: how
//! often Tier-0's answer is the LLM's.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;
use tiergate_config::{PoolingConfig, Precision};

use crate::data::{self, DataSpec};
use tiergate_prefilter::calibrate::{argmax, ece, fit_temperature, softmax};
use tiergate_prefilter::classifier::{embed_texts, load_encoder};
use tiergate_prefilter::error::{PrefilterError, Result};
use tiergate_prefilter::heads::{load_trained, save_trained};

/// What `tiergate distill` needs.
#[derive(Debug, Clone)]
pub struct DistillOptions {
    /// The trained head to refresh.
    pub head: PathBuf,
    /// The server's escalation records (JSON lines).
    pub records: PathBuf,
    /// The head's original training data (mixed in; its dev split recalibrates and measures).
    pub data: DataSpec,
    /// The split `tiergate train` used (same fraction and seed, so the dev rows stay unseen).
    pub dev_fraction: f64,
    pub seed: u64,
    /// Softening temperature of the records' distributions.
    pub temperature: f64,
    /// Weight of the records' loss against the training data's.
    pub weight: f64,
    /// Passes over the training data.
    pub epochs: usize,
    /// θ at which the escalated share is reported.
    pub theta: f64,
    pub max_tokens: usize,
    pub precision: Precision,
    /// Where the refreshed head goes.
    pub out: PathBuf,
}

/// Figures of one head on the dev split and the records.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Figures {
    pub dev_accuracy: f64,
    pub dev_ece: f64,
    /// Share of dev rows with ambiguity 1 − max p above θ.
    pub dev_escalated_share: f64,
    /// Share of records where Tier-0's top label is the LLM's (fused) top label.
    pub records_agreement: f64,
    pub temperature: f64,
}

/// What distillation did.
#[derive(Debug, Clone, Serialize)]
pub struct DistillReport {
    pub records_used: usize,
    pub records_skipped: usize,
    pub train_rows: usize,
    pub dev_rows: usize,
    pub theta: f64,
    pub before: Figures,
    pub after: Figures,
}

/// A record's text and its target distribution over the head's labels.
pub type Target = (String, Vec<f32>);

/// Soft targets read from a record file, and how many records were skipped.
pub fn read_records(path: &Path, labels: &[String]) -> Result<(Vec<Target>, usize)> {
    let raw = std::fs::read_to_string(path).map_err(|e| PrefilterError::file(path, e))?;
    let mut out = Vec::new();
    let mut skipped = 0;
    for line in raw.lines().filter(|l| !l.trim().is_empty()) {
        match record_target(line, labels) {
            Some(r) => out.push(r),
            None => skipped += 1,
        }
    }
    Ok((out, skipped))
}

/// One record's (text, target): the fused probabilities on its candidates, renormalised; `None` for a
/// record without text, with a label the head does not know, or with no probability mass.
pub fn record_target(line: &str, labels: &[String]) -> Option<Target> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let text = v["text"].as_str().filter(|t| !t.trim().is_empty())?;
    let candidates = v["candidates"].as_array()?;
    let fused = v["fused"].as_array()?;
    if candidates.len() != fused.len() || candidates.is_empty() {
        return None;
    }
    let mut target = vec![0f32; labels.len()];
    for (c, p) in candidates.iter().zip(fused) {
        let i = labels.iter().position(|l| Some(l.as_str()) == c.as_str())?;
        let p = p.as_f64()? as f32;
        if !(p.is_finite() && p >= 0.0) {
            return None;
        }
        target[i] += p;
    }
    let sum: f32 = target.iter().sum();
    (sum > 0.0).then(|| {
        target.iter_mut().for_each(|p| *p /= sum);
        (text.to_string(), target)
    })
}

/// Continues a linear head (`w`, `b`) on hard labels and soft targets mixed in one shuffled set (a record
/// counts `weight` times a training row); returns the new weights.
pub fn distill_head(
    (w, b): (&Tensor, &Tensor),
    (x_train, y_train): (&Tensor, &[u32]),
    (x_rec, t_rec): (&Tensor, &Tensor),
    o: &DistillOptions,
) -> Result<(Tensor, Tensor)> {
    let w = Var::from_tensor(w)?;
    let b = Var::from_tensor(b)?;
    let mut opt = AdamW::new(
        vec![w.clone(), b.clone()],
        ParamsAdamW {
            lr: 1e-3,
            weight_decay: 1e-4,
            ..Default::default()
        },
    )?;
    let device = Device::Cpu;
    let logits = |x: &Tensor| -> Result<Tensor> { Ok(x.matmul(&w.t()?)?.broadcast_add(&b)?) };
    let mut rng = rand::rngs::StdRng::seed_from_u64(o.seed);
    let (n, m) = (y_train.len(), t_rec.dim(0)?);
    // Indices below n are training rows, from n on records.
    let mut order: Vec<u32> = (0..(n + m) as u32).collect();
    let t = o.temperature;
    for _ in 0..o.epochs.max(1) {
        order.shuffle(&mut rng);
        for chunk in order.chunks(64) {
            let (rows, recs): (Vec<u32>, Vec<u32>) = chunk.iter().partition(|&&i| (i as usize) < n);
            let mut loss = Tensor::zeros((), DType::F32, &device)?;
            if !rows.is_empty() {
                let idx = Tensor::new(rows.as_slice(), &device)?;
                let yb = Tensor::new(
                    rows.iter()
                        .map(|&i| y_train[i as usize])
                        .collect::<Vec<u32>>(),
                    &device,
                )?;
                let ce =
                    candle_nn::loss::cross_entropy(&logits(&x_train.index_select(&idx, 0)?)?, &yb)?;
                loss = (loss + (ce * rows.len() as f64)?)?;
            }
            if !recs.is_empty() {
                let ridx = Tensor::new(
                    recs.iter().map(|&i| i - n as u32).collect::<Vec<u32>>(),
                    &device,
                )?;
                let log_p = candle_nn::ops::log_softmax(
                    &(logits(&x_rec.index_select(&ridx, 0)?)? / t)?,
                    1,
                )?;
                let soft = (t_rec.index_select(&ridx, 0)? * log_p)?.sum_all()?.neg()?;
                loss = (loss + (soft * (o.weight * t * t))?)?;
            }
            opt.backward_step(&(loss / chunk.len() as f64)?)?;
        }
    }
    Ok((w.as_tensor().clone(), b.as_tensor().clone()))
}

/// Runs `tiergate distill`: writes the refreshed head to `o.out` and reports before and after.
pub fn distill(o: &DistillOptions, progress: &mut dyn FnMut(&str)) -> Result<DistillReport> {
    if !(o.temperature.is_finite() && o.temperature > 0.0 && (0.0..=1.0).contains(&o.theta)) {
        return Err(PrefilterError::Training(
            "--temperature must be positive and --theta in [0, 1]".into(),
        ));
    }
    let (meta, head) = load_trained(&o.head)?;
    let (w0, b0) = head.linear_weights()?;
    let labels = meta.labels.clone();
    let (records, skipped) = read_records(&o.records, &labels)?;
    if records.is_empty() {
        return Err(PrefilterError::Training(format!(
            "{}: no usable record ({skipped} skipped: no text, unknown labels or no probability)",
            o.records.display()
        )));
    }
    let dataset = data::read(&o.data)?;
    let (train_rows, dev_rows) = data::split(&dataset.examples, o.dev_fraction, o.seed);
    let index = |l: &str| labels.iter().position(|x| x == l);
    let train: Vec<(&str, u32)> = train_rows
        .iter()
        .filter_map(|e| Some((e.text.as_str(), index(&e.label)? as u32)))
        .collect();
    let dev: Vec<(&str, usize)> = dev_rows
        .iter()
        .filter_map(|e| Some((e.text.as_str(), index(&e.label)?)))
        .collect();
    if train.is_empty() || dev.is_empty() {
        return Err(PrefilterError::Training(
            "the training data shares no label with the head".into(),
        ));
    }
    let encoder_dir = meta.encoder_dir(&o.head);
    let (tokenizer, mut encoder) = load_encoder(&encoder_dir, PoolingConfig::Auto, o.max_tokens)?;
    encoder.set_precision(o.precision)?;
    let embed = |texts: Vec<&str>| embed_texts(&tokenizer, &encoder, &texts, 64);
    progress(&format!(
        "embedding {} training rows, {} dev rows, {} records",
        train.len(),
        dev.len(),
        records.len()
    ));
    let x_train = embed(train.iter().map(|r| r.0).collect())?;
    let x_dev = embed(dev.iter().map(|r| r.0).collect())?;
    let x_rec = embed(records.iter().map(|r| r.0.as_str()).collect())?;
    let flat: Vec<f32> = records.iter().flat_map(|r| r.1.iter().copied()).collect();
    let t_rec = Tensor::from_vec(flat, (records.len(), labels.len()), &Device::Cpu)?;
    let y_train: Vec<u32> = train.iter().map(|r| r.1).collect();
    let y_dev: Vec<usize> = dev.iter().map(|r| r.1).collect();
    let rec_top: Vec<usize> = records.iter().map(|r| argmax(&r.1).0).collect();
    let measure =
        |w: &Tensor, b: &Tensor| figures((w, b), (&x_dev, &y_dev), (&x_rec, &rec_top), o.theta);
    let before = measure(&w0, &b0)?;
    progress("distilling");
    let (w, b) = distill_head((&w0, &b0), (&x_train, &y_train), (&x_rec, &t_rec), o)?;
    let after = measure(&w, &b)?;
    let mut meta = meta.clone();
    meta.encoder = encoder_dir
        .canonicalize()
        .map_err(|e| PrefilterError::file(&encoder_dir, e))?;
    meta.temperature = after.temperature;
    meta.dev.accuracy = after.dev_accuracy;
    meta.dev.ece = after.dev_ece;
    save_trained(
        &o.out,
        &meta,
        &w.to_dtype(DType::F32)?,
        &b.to_dtype(DType::F32)?,
    )?;
    Ok(DistillReport {
        records_used: records.len(),
        records_skipped: skipped,
        train_rows: train.len(),
        dev_rows: dev.len(),
        theta: o.theta,
        before,
        after,
    })
}

/// A head's figures: calibrated on the dev split (its own temperature fitted there), then measured.
fn figures(
    (w, b): (&Tensor, &Tensor),
    (x_dev, y_dev): (&Tensor, &[usize]),
    (x_rec, rec_top): (&Tensor, &[usize]),
    theta: f64,
) -> Result<Figures> {
    let logits = |x: &Tensor| -> Result<Vec<Vec<f32>>> {
        Ok(x.matmul(&w.t()?)?.broadcast_add(b)?.to_vec2::<f32>()?)
    };
    let dev_logits = logits(x_dev)?;
    let temperature = fit_temperature(&dev_logits, y_dev);
    let cal: Vec<Vec<f32>> = dev_logits.iter().map(|l| softmax(l, temperature)).collect();
    let n = y_dev.len() as f64;
    let correct = cal
        .iter()
        .zip(y_dev)
        .filter(|(p, &y)| argmax(p).0 == y)
        .count();
    let escalated = cal
        .iter()
        .filter(|p| 1.0 - f64::from(argmax(p).1) > theta)
        .count();
    let rec = logits(x_rec)?;
    let agree = rec
        .iter()
        .zip(rec_top)
        .filter(|(l, &t)| argmax(l).0 == t)
        .count();
    Ok(Figures {
        dev_accuracy: correct as f64 / n,
        dev_ece: ece(&cal, y_dev, 15),
        dev_escalated_share: escalated as f64 / n,
        records_agreement: agree as f64 / rec_top.len().max(1) as f64,
        temperature,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels() -> Vec<String> {
        ["a", "b", "c"].iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn records_become_soft_targets_over_the_heads_labels() {
        let l = labels();
        let (t, p) = record_target(
            r#"{"text":"x","candidates":["c","a"],"fused":[0.6,0.2]}"#,
            &l,
        )
        .unwrap();
        assert_eq!(t, "x");
        assert_eq!(p, vec![0.25, 0.0, 0.75]);
        for bad in [
            r#"{"candidates":["a"],"fused":[1.0]}"#,
            r#"{"text":"x","candidates":["z"],"fused":[1.0]}"#,
            r#"{"text":"x","candidates":["a"],"fused":[0.0]}"#,
            r#"{"text":"x","candidates":["a","b"],"fused":[1.0]}"#,
            "not json",
        ] {
            assert!(record_target(bad, &l).is_none(), "{bad}");
        }
    }

    #[test]
    fn soft_targets_move_the_head_and_the_gold_data_keeps_it() {
        // Three labels on the axes of R³; the head starts right on the training data. Records near the
        // middle between a and b say "b" (the LLM's verdict); after distillation the head follows them there
        // and still classifies the training data.
        let dev = Device::Cpu;
        let x = Tensor::new(
            &[
                [1f32, 0.0, 0.0],
                [0.0, 1.0, 0.0],
                [0.0, 0.0, 1.0],
                [0.9, 0.1, 0.0],
                [0.1, 0.9, 0.0],
                [0.0, 0.1, 0.9],
            ],
            &dev,
        )
        .unwrap();
        let y = [0u32, 1, 2, 0, 1, 2];
        let w0 = Tensor::new(&[[4f32, 0.0, 0.0], [0.0, 4.0, 0.0], [0.0, 0.0, 4.0]], &dev).unwrap();
        let b0 = Tensor::zeros(3, DType::F32, &dev).unwrap();
        let x_rec = Tensor::new(&[[0.55f32, 0.45, 0.0], [0.6, 0.4, 0.0]], &dev).unwrap();
        let t_rec = Tensor::new(&[[0.05f32, 0.95, 0.0], [0.05, 0.95, 0.0]], &dev).unwrap();
        let o = DistillOptions {
            head: PathBuf::new(),
            records: PathBuf::new(),
            data: DataSpec::new(PathBuf::new()),
            dev_fraction: 0.1,
            seed: 1,
            temperature: 2.0,
            weight: 1.0,
            epochs: 600,
            theta: 0.5,
            max_tokens: 16,
            precision: Precision::F32,
            out: PathBuf::new(),
        };
        let top = |w: &Tensor, b: &Tensor, x: &Tensor| -> Vec<usize> {
            x.matmul(&w.t().unwrap())
                .unwrap()
                .broadcast_add(b)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap()
                .iter()
                .map(|l| argmax(l).0)
                .collect()
        };
        assert_eq!(top(&w0, &b0, &x_rec), [0, 0], "before: Tier-0 says a");
        let (w, b) = distill_head((&w0, &b0), (&x, &y), (&x_rec, &t_rec), &o).unwrap();
        assert_eq!(top(&w, &b, &x_rec), [1, 1], "after: the LLM's b");
        assert_eq!(top(&w, &b, &x), [0, 1, 2, 0, 1, 2], "nothing forgotten");
    }
}
