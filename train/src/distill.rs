//! `tiergate distill`: what traffic taught ([`crate::harvest`]: the LLM's verdicts on escalated requests,
//! labelled audits, trusted feedback, recorded by the server in `server.record_escalations`) fed back into a
//! trained head, so that Tier-0 is sure where the LLM was needed before and right where it was wrong alone.
//!
//! The head continues from its weights on the original training rows and the records shuffled together:
//! a training row contributes cross-entropy on its gold label (so nothing is forgotten); an LLM record the
//! cross-entropy against the fused distribution at temperature T, scaled by T² (the KL of knowledge
//! distillation up to a constant) and by `weight`; a gold record (audit, feedback) cross-entropy on its label,
//! scaled by its weight (an audit's 1/p). Then the head is recalibrated (temperature scaling) on half the
//! original dev split and measured on the other half, as `tiergate train` does, and its risk calibration rows
//! are written beside it. The report compares the candidate with the current head on that dev split (accuracy, ECE, the
//! escalated share at θ), on the LLM records (agreement) and on a held-out share of the labelled audits.

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;
use tiergate_config::{PoolingConfig, Precision};

use crate::data::{self, DataSpec};
use crate::harvest::{self, HarvestCounts, Harvested, Source};
use crate::train::DevHalves;
use tiergate_prefilter::calibrate::{argmax, fit_temperature, softmax};
use tiergate_prefilter::classifier::{embed_texts, load_encoder};
use tiergate_prefilter::error::{PrefilterError, Result};
use tiergate_prefilter::heads::{load_trained, save_trained, DevReport, TrainSplit};
use tiergate_prefilter::risk_rows::CalibrationRows;

/// What `tiergate distill` needs.
#[derive(Debug, Clone)]
pub struct DistillOptions {
    /// The trained head to refresh.
    pub head: PathBuf,
    /// The server's record file (JSON lines: LLM verdicts, audits, feedback).
    pub records: PathBuf,
    /// The head's original training data (mixed in; its dev split recalibrates and measures).
    pub data: DataSpec,
    /// The draw `tiergate train` made: what the head recorded (or 0.1, 42, all rows for a head from before
    /// it recorded one), with these fields replaced where given.
    pub dev_fraction: Option<f64>,
    pub seed: Option<u64>,
    pub per_label: Option<usize>,
    /// Softening temperature of the LLM records' distributions.
    pub temperature: f64,
    /// Weight of an LLM record's loss against a training row's.
    pub weight: f64,
    /// Weight of a Tier-0 pseudo-label (`tier0` record) against a training row's.
    pub tier0_weight: f64,
    /// An audit counts 1/p training rows, at most this many.
    pub max_audit_weight: f64,
    /// Share of the audited texts held out of training to measure both heads on.
    pub holdout_audits: f64,
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
    /// Share of the LLM records where Tier-0's top label is the LLM's (fused) top label.
    pub records_agreement: f64,
    /// Accuracy on the held-out labelled audits (none held out: `None`).
    pub audit_accuracy: Option<f64>,
    pub temperature: f64,
}

/// What distillation did.
#[derive(Debug, Clone, Serialize)]
pub struct DistillReport {
    /// The records read, by source, after gold overrode the LLM.
    pub harvest: HarvestCounts,
    /// Records trained on (the held-out audits excluded).
    pub records_used: usize,
    pub records_skipped: usize,
    /// Records dropped because their text is a row of the dev split the report measures on (the head would
    /// otherwise be taught the rows it is judged on).
    pub records_in_dev: usize,
    /// Labelled audits held out of training, to measure on.
    pub audits_held_out: usize,
    pub train_rows: usize,
    pub dev_rows: usize,
    /// The draw the dev rows came from.
    pub split: TrainSplit,
    pub theta: f64,
    pub before: Figures,
    pub after: Figures,
}

/// The records to train on, each with its target, weight and softening temperature, as tensors.
struct Records {
    x: Tensor,
    target: Tensor,
    /// Per record: its weight × T² (m).
    scale: Tensor,
    /// Per record: its softening temperature (m × 1).
    temperature: Tensor,
}

/// Continues a linear head (`w`, `b`) on hard labels and records mixed in one shuffled set (a record counts
/// its weight times a training row); returns the new weights.
fn distill_head(
    (w, b): (&Tensor, &Tensor),
    (x_train, y_train): (&Tensor, &[u32]),
    rec: &Records,
    (epochs, seed): (usize, u64),
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
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (n, m) = (y_train.len(), rec.target.dim(0)?);
    // Indices below n are training rows, from n on records.
    let mut order: Vec<u32> = (0..(n + m) as u32).collect();
    for _ in 0..epochs.max(1) {
        order.shuffle(&mut rng);
        for chunk in order.chunks(64) {
            let (rows, recs): (Vec<u32>, Vec<u32>) = chunk.iter().partition(|&&i| (i as usize) < n);
            let mut loss = Tensor::zeros((), DType::F32, &device)?;
            if !rows.is_empty() {
                let idx = Tensor::new(rows.as_slice(), &device)?;
                let yb: Vec<u32> = rows.iter().map(|&i| y_train[i as usize]).collect();
                let yb = Tensor::new(yb, &device)?;
                let ce =
                    candle_nn::loss::cross_entropy(&logits(&x_train.index_select(&idx, 0)?)?, &yb)?;
                loss = (loss + (ce * rows.len() as f64)?)?;
            }
            if !recs.is_empty() {
                let ridx: Vec<u32> = recs.iter().map(|&i| i - n as u32).collect();
                let ridx = Tensor::new(ridx, &device)?;
                let t = rec.temperature.index_select(&ridx, 0)?;
                let z = logits(&rec.x.index_select(&ridx, 0)?)?.broadcast_div(&t)?;
                let log_p = candle_nn::ops::log_softmax(&z, 1)?;
                let per_record = (rec.target.index_select(&ridx, 0)? * log_p)?.sum(1)?;
                let soft = (per_record * rec.scale.index_select(&ridx, 0)?)?
                    .sum_all()?
                    .neg()?;
                loss = (loss + soft)?;
            }
            opt.backward_step(&(loss / chunk.len() as f64)?)?;
        }
    }
    Ok((w.as_tensor().clone(), b.as_tensor().clone()))
}

/// The dev split's rows and the records: read, split and checked against the head's labels.
struct Inputs {
    train: Vec<(String, u32)>,
    dev: Vec<(String, usize)>,
    /// Records trained on.
    records: Vec<Harvested>,
    /// Records dropped for being dev rows.
    in_dev: usize,
    /// Labelled audits held out: text and gold label index.
    held_out: Vec<(String, usize)>,
    harvest: HarvestCounts,
    split: TrainSplit,
}

fn inputs(o: &DistillOptions, labels: &[String], recorded: Option<TrainSplit>) -> Result<Inputs> {
    let (all, harvest) = harvest::read(&o.records, labels, o.max_audit_weight)?;
    let (held, records): (Vec<Harvested>, Vec<Harvested>) = all.into_iter().partition(|h| {
        h.source == Source::Audit && harvest::held_out(&h.text, o.holdout_audits, 0x5eed)
    });
    if records.is_empty() {
        return Err(PrefilterError::Training(format!(
            "{}: no usable record ({} skipped: no text, unknown labels or no probability; {} audits held out)",
            o.records.display(),
            harvest.skipped,
            held.len()
        )));
    }
    let base = recorded.unwrap_or(TrainSplit {
        dev_fraction: 0.1,
        seed: 42,
        per_label: None,
    });
    let split = TrainSplit {
        dev_fraction: o.dev_fraction.unwrap_or(base.dev_fraction),
        seed: o.seed.unwrap_or(base.seed),
        per_label: o.per_label.or(base.per_label),
    };
    let dataset = data::read(&o.data)?;
    let rows = match split.per_label {
        Some(k) => data::per_label(&dataset.examples, k, split.seed),
        None => dataset.examples,
    };
    let (train_rows, dev_rows) = data::split(&rows, split.dev_fraction, split.seed);
    let index = |l: &str| labels.iter().position(|x| x == l);
    let train: Vec<(String, u32)> = train_rows
        .into_iter()
        .filter_map(|e| Some((e.text, index(&e.label)? as u32)))
        .collect();
    let dev: Vec<(String, usize)> = dev_rows
        .into_iter()
        .filter_map(|e| Some((e.text, index(&e.label)?)))
        .collect();
    if train.is_empty() || dev.is_empty() {
        return Err(PrefilterError::Training(
            "the training data shares no label with the head".into(),
        ));
    }
    // No record may teach a dev row: the dev split is what both heads are measured (and the new head
    // calibrated) on.
    let dev_texts: std::collections::HashSet<&str> = dev.iter().map(|(t, _)| t.trim()).collect();
    let before = records.len();
    let records: Vec<Harvested> = records
        .into_iter()
        .filter(|r| !dev_texts.contains(r.text.trim()))
        .collect();
    let in_dev = before - records.len();
    if records.is_empty() {
        return Err(PrefilterError::Training(format!(
            "{}: every usable record is a row of the dev split ({in_dev})",
            o.records.display()
        )));
    }
    let held_out = held
        .into_iter()
        .map(|h| {
            let y = argmax(&h.target).0;
            (h.text, y)
        })
        .collect();
    Ok(Inputs {
        train,
        dev,
        records,
        in_dev,
        held_out,
        harvest,
        split,
    })
}

/// The records as tensors: LLM records at the softening temperature with weight × T², gold at 1.
fn record_tensors(x: Tensor, records: &[Harvested], o: &DistillOptions) -> Result<Records> {
    let k = records[0].target.len();
    let flat: Vec<f32> = records
        .iter()
        .flat_map(|r| r.target.iter().copied())
        .collect();
    let (scale, temperature): (Vec<f32>, Vec<f32>) = records
        .iter()
        .map(|r| match r.source {
            Source::Llm => (
                (o.weight * o.temperature * o.temperature) as f32,
                o.temperature as f32,
            ),
            Source::Tier0 => ((r.weight * o.tier0_weight) as f32, 1.0),
            Source::Audit | Source::Feedback => (r.weight as f32, 1.0),
        })
        .unzip();
    let m = records.len();
    Ok(Records {
        x,
        target: Tensor::from_vec(flat, (m, k), &Device::Cpu)?,
        scale: Tensor::from_vec(scale, m, &Device::Cpu)?,
        temperature: Tensor::from_vec(temperature, (m, 1), &Device::Cpu)?,
    })
}

/// Runs `tiergate distill`: writes the refreshed head to `o.out` and reports before and after.
pub fn distill(o: &DistillOptions, progress: &mut dyn FnMut(&str)) -> Result<DistillReport> {
    if !(o.temperature.is_finite() && o.temperature > 0.0 && (0.0..=1.0).contains(&o.theta)) {
        return Err(PrefilterError::Training(
            "--temperature must be positive and --theta in [0, 1]".into(),
        ));
    }
    if !(o.max_audit_weight >= 1.0 && (0.0..1.0).contains(&o.holdout_audits)) {
        return Err(PrefilterError::Training(
            "--max-audit-weight must be at least 1 and --holdout-audits in [0, 1)".into(),
        ));
    }
    let (meta, head) = load_trained(&o.head)?;
    let (w0, b0) = head.linear_weights()?;
    let inp = inputs(o, &meta.labels, meta.split)?;
    let encoder_dir = meta.encoder_dir(&o.head);
    let (tokenizer, mut encoder) = load_encoder(&encoder_dir, PoolingConfig::Auto, o.max_tokens)?;
    encoder.set_precision(o.precision)?;
    let embed = |texts: Vec<&str>| embed_texts(&tokenizer, &encoder, &texts, 64);
    progress(&format!(
        "embedding {} training rows, {} dev rows, {} records, {} held-out audits",
        inp.train.len(),
        inp.dev.len(),
        inp.records.len(),
        inp.held_out.len()
    ));
    let x_train = embed(inp.train.iter().map(|r| r.0.as_str()).collect())?;
    let x_dev = embed(inp.dev.iter().map(|r| r.0.as_str()).collect())?;
    let x_rec = embed(inp.records.iter().map(|r| r.text.as_str()).collect())?;
    let x_held = match inp.held_out.is_empty() {
        true => None,
        false => Some(embed(inp.held_out.iter().map(|r| r.0.as_str()).collect())?),
    };
    let rec = record_tensors(x_rec, &inp.records, o)?;
    let y_train: Vec<u32> = inp.train.iter().map(|r| r.1).collect();
    let y_dev: Vec<usize> = inp.dev.iter().map(|r| r.1).collect();
    let y_held: Vec<usize> = inp.held_out.iter().map(|r| r.1).collect();
    let llm_rows: Vec<u32> = (0..inp.records.len() as u32)
        .filter(|&i| inp.records[i as usize].source == Source::Llm)
        .collect();
    let llm_top: Vec<usize> = llm_rows
        .iter()
        .map(|&i| argmax(&inp.records[i as usize].target).0)
        .collect();
    let x_llm = rec
        .x
        .index_select(&Tensor::new(llm_rows.as_slice(), &Device::Cpu)?, 0)?;
    let measure = |w: &Tensor, b: &Tensor| {
        figures(
            (w, b),
            (&x_dev, &y_dev),
            (&x_llm, &llm_top),
            x_held.as_ref().map(|x| (x, y_held.as_slice())),
            o.theta,
        )
    };
    let (before, _, _) = measure(&w0, &b0)?;
    progress("distilling");
    let (w, b) = distill_head(
        (&w0, &b0),
        (&x_train, &y_train),
        &rec,
        (o.epochs, inp.split.seed),
    )?;
    let (after, dev_report, calibration) = measure(&w, &b)?;
    let mut meta = meta.clone();
    meta.encoder = encoder_dir
        .canonicalize()
        .map_err(|e| PrefilterError::file(&encoder_dir, e))?;
    meta.temperature = after.temperature;
    meta.dev = dev_report;
    meta.split = Some(inp.split);
    save_trained(
        &o.out,
        &meta,
        &w.to_dtype(DType::F32)?,
        &b.to_dtype(DType::F32)?,
    )?;
    // The error bound (`routing.max_error`) of the new head rests on its own held-out rows.
    calibration.save(&o.out)?;
    Ok(DistillReport {
        records_used: inp.records.len(),
        records_skipped: inp.harvest.skipped,
        records_in_dev: inp.in_dev,
        audits_held_out: inp.held_out.len(),
        harvest: inp.harvest,
        train_rows: inp.train.len(),
        dev_rows: inp.dev.len(),
        split: inp.split,
        theta: o.theta,
        before,
        after,
    })
}

/// The share of `logits`' rows whose top label is `y`'s.
fn accuracy(logits: &[Vec<f32>], y: &[usize]) -> f64 {
    let right = logits
        .iter()
        .zip(y)
        .filter(|(l, &y)| argmax(l).0 == y)
        .count();
    right as f64 / y.len().max(1) as f64
}

/// A head's figures, the way `tiergate train` measures them: its temperature fitted on one half of the dev
/// split (every other row of each label), everything on the other half (rows neither the head nor its
/// temperature saw); with the dev report and the risk calibration rows written beside a head.
fn figures(
    (w, b): (&Tensor, &Tensor),
    (x_dev, y_dev): (&Tensor, &[usize]),
    (x_llm, llm_top): (&Tensor, &[usize]),
    held: Option<(&Tensor, &[usize])>,
    theta: f64,
) -> Result<(Figures, DevReport, CalibrationRows)> {
    let logits = |x: &Tensor| -> Result<Vec<Vec<f32>>> {
        Ok(x.matmul(&w.t()?)?.broadcast_add(b)?.to_vec2::<f32>()?)
    };
    let dev_logits = logits(x_dev)?;
    let halves = DevHalves::of(y_dev);
    let pick = |v: &[Vec<f32>]| halves.fit.iter().map(|&i| v[i].clone()).collect::<Vec<_>>();
    let y_fit: Vec<usize> = halves.fit.iter().map(|&i| y_dev[i]).collect();
    let temperature = fit_temperature(&pick(&dev_logits), &y_fit);
    let cal: Vec<Vec<f32>> = dev_logits.iter().map(|l| softmax(l, temperature)).collect();
    let raw: Vec<Vec<f32>> = dev_logits.iter().map(|l| softmax(l, 1.0)).collect();
    let report = halves.report(&raw, &cal, y_dev);
    let escalated = halves
        .held
        .iter()
        .filter(|&&i| 1.0 - f64::from(argmax(&cal[i]).1) > theta)
        .count();
    let records_agreement = match llm_top.is_empty() {
        true => 0.0,
        false => accuracy(&logits(x_llm)?, llm_top),
    };
    let audit_accuracy = match held {
        Some((x, y)) => Some(accuracy(&logits(x)?, y)),
        None => None,
    };
    let f = Figures {
        dev_accuracy: report.accuracy,
        dev_ece: report.ece,
        dev_escalated_share: escalated as f64 / halves.held.len().max(1) as f64,
        records_agreement,
        audit_accuracy,
        temperature,
    };
    Ok((f, report, halves.calibration_rows(&cal, y_dev, temperature)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> DistillOptions {
        DistillOptions {
            head: PathBuf::new(),
            records: PathBuf::new(),
            data: DataSpec::new(PathBuf::new()),
            dev_fraction: None,
            seed: None,
            per_label: None,
            temperature: 2.0,
            weight: 1.0,
            tier0_weight: 1.0,
            max_audit_weight: 20.0,
            holdout_audits: 0.0,
            epochs: 600,
            theta: 0.5,
            max_tokens: 16,
            precision: Precision::F32,
            out: PathBuf::new(),
        }
    }

    fn top(w: &Tensor, b: &Tensor, x: &Tensor) -> Vec<usize> {
        x.matmul(&w.t().unwrap())
            .unwrap()
            .broadcast_add(b)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap()
            .iter()
            .map(|l| argmax(l).0)
            .collect()
    }

    fn start() -> (Tensor, [u32; 6], Tensor, Tensor) {
        // Three labels on the axes of R³; the head starts right on the training data.
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
        let w0 = Tensor::new(&[[4f32, 0.0, 0.0], [0.0, 4.0, 0.0], [0.0, 0.0, 4.0]], &dev).unwrap();
        let b0 = Tensor::zeros(3, DType::F32, &dev).unwrap();
        (x, [0, 1, 2, 0, 1, 2], w0, b0)
    }

    fn harvested(source: Source, target: [f32; 3], weight: f64) -> Harvested {
        Harvested {
            text: String::new(),
            target: target.to_vec(),
            source,
            weight,
        }
    }

    #[test]
    fn soft_targets_move_the_head_and_the_gold_data_keeps_it() {
        // Records near the middle between a and b say "b" (the LLM's verdict); after distillation the head
        // follows them there and still classifies the training data.
        let (x, y, w0, b0) = start();
        let x_rec = Tensor::new(&[[0.55f32, 0.45, 0.0], [0.6, 0.4, 0.0]], &Device::Cpu).unwrap();
        let r = [0.05, 0.95, 0.0];
        let recs = [
            harvested(Source::Llm, r, 1.0),
            harvested(Source::Llm, r, 1.0),
        ];
        let rec = record_tensors(x_rec.clone(), &recs, &options()).unwrap();
        assert_eq!(top(&w0, &b0, &x_rec), [0, 0], "before: Tier-0 says a");
        let (w, b) = distill_head((&w0, &b0), (&x, &y), &rec, (600, 1)).unwrap();
        assert_eq!(top(&w, &b, &x_rec), [1, 1], "after: the LLM's b");
        assert_eq!(top(&w, &b, &x), [0, 1, 2, 0, 1, 2], "nothing forgotten");
    }

    #[test]
    fn an_audits_weight_is_what_moves_the_head() {
        // Two training rows at a point say "a"; one gold record at the same point says "b". At weight 1 the
        // rows win; at its inverse sampling probability (20: drawn at 5%) the audit stands for the answers it
        // was drawn from and wins there; the other labels' rows keep theirs.
        let (x, _, w0, b0) = start();
        let dev = Device::Cpu;
        let at = Tensor::new(&[[0.9f32, 0.1, 0.0]], &dev).unwrap();
        let x = Tensor::cat(&[&x, &at], 0).unwrap();
        let y = [0u32, 1, 2, 0, 1, 2, 0];
        let after = |weight: f64| {
            let recs = [harvested(Source::Audit, [0.0, 1.0, 0.0], weight)];
            let rec = record_tensors(at.clone(), &recs, &options()).unwrap();
            let (w, b) = distill_head((&w0, &b0), (&x, &y), &rec, (2000, 1)).unwrap();
            (top(&w, &b, &at)[0], top(&w, &b, &x))
        };
        let (light, kept) = after(1.0);
        assert_eq!(light, 0, "weight 1: one record against two rows");
        assert_eq!(kept, [0, 1, 2, 0, 1, 2, 0]);
        let (heavy, kept) = after(20.0);
        assert_eq!(heavy, 1, "weight 20: twenty rows' worth against two");
        assert_eq!(
            [kept[1], kept[2], kept[4], kept[5]],
            [1, 2, 1, 2],
            "the other labels' rows kept"
        );
    }
}
