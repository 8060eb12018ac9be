//! `tiergate train`: a softmax head on pooled sentence embeddings, optionally with the encoder fine-tuned,
//! then temperature scaling fitted on a held-out dev split.

use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{AdamW, Linear, Module, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use tiergate_config::{PoolingConfig, Precision};

use crate::data::{self, DataSpec, Example};
use tiergate_prefilter::calibrate::{argmax, ece, fit_temperature, softmax};
use tiergate_prefilter::classifier::{embed_texts, load_encoder};
use tiergate_prefilter::encoder::Encoder;
use tiergate_prefilter::error::{PrefilterError, Result};
use tiergate_prefilter::heads::{
    save_trained, DevReport, TrainSplit, TrainedHeadMeta, HEAD_FORMAT,
};
use tiergate_prefilter::out_of_scope::{OosMeta, OutOfScope, OOS_FORMAT};
use tiergate_prefilter::risk_rows::{CalibrationRows, CALIBRATION_FORMAT};
use tiergate_prefilter::tokenize::{TextTokenizer, Tokens};

/// Everything `tiergate train` needs.
#[derive(Debug, Clone)]
pub struct TrainOptions {
    /// The encoder folder.
    pub encoder: PathBuf,
    /// The training data.
    pub data: DataSpec,
    /// Share of each label held out for calibration and the dev figures.
    pub dev_fraction: f64,
    /// Seed for the split and the optimiser's shuffling.
    pub seed: u64,
    /// Also fine-tune the encoder (slower; usually more accurate).
    pub fine_tune: bool,
    /// Epochs of encoder fine-tuning.
    pub fine_tune_epochs: usize,
    /// Inputs are truncated to this many tokens.
    pub max_tokens: usize,
    /// Output folder.
    pub out: PathBuf,
    /// Arithmetic of the inference encoder whose embeddings the head is fitted on (use what serving uses).
    pub precision: Precision,
    /// In-scope recall the out-of-scope threshold is fitted for on the dev split.
    pub oos_recall: f64,
    /// Rows with this label are out-of-scope examples: never a label of the head; their dev share is scored.
    pub oos_label: Option<String>,
    /// Use at most this many rows of each label (drawn with `seed`), dev rows included: a few-shot day-0 head.
    pub per_label: Option<usize>,
    /// A labels file (`data::read_labels`): the head's labels are exactly its labels, with their descriptions.
    pub labels: Option<PathBuf>,
    /// Also write the rows drawn (CSV `text,category,part` with part `train` or `dev`): what the head saw, so
    /// that traffic or test rows can be kept apart from them.
    pub rows_out: Option<PathBuf>,
}

/// What training measured.
#[derive(Debug, Clone)]
pub struct TrainReport {
    /// Training rows.
    pub train_n: usize,
    /// Bad rows skipped.
    pub skipped: usize,
    /// Number of labels.
    pub labels: usize,
    /// Dev-split figures.
    pub dev: DevReport,
    /// Fitted temperature.
    pub temperature: f64,
    /// The out-of-scope scorer's fit.
    pub oos: OosMeta,
    /// Wall time of the whole run.
    pub seconds: f64,
}

const HEAD_EPOCHS: usize = 60;
const HEAD_BATCH: usize = 64;
const HEAD_LR: f64 = 5e-3;
const MIN_HEAD_STEPS: usize = 1_500;
const FT_BATCH: usize = 16;
const FT_LR: f64 = 4e-5;

/// Trains, calibrates and writes a head; `progress` receives human-readable progress lines.
pub fn train(opts: &TrainOptions, progress: &mut dyn FnMut(&str)) -> Result<TrainReport> {
    let started = Instant::now();
    if !(0.0..0.9).contains(&opts.dev_fraction) || opts.dev_fraction <= 0.0 {
        return Err(PrefilterError::Training(format!(
            "--dev-fraction {} must be in (0, 0.9)",
            opts.dev_fraction
        )));
    }
    if !(opts.oos_recall > 0.0 && opts.oos_recall <= 1.0) {
        return Err(PrefilterError::Training(format!(
            "--oos-recall {} must be in (0, 1]",
            opts.oos_recall
        )));
    }
    let dataset = data::read(&opts.data)?;
    let examples = match opts.per_label {
        Some(0) => {
            return Err(PrefilterError::Training(
                "--per-label must be at least 1".into(),
            ))
        }
        Some(k) => data::per_label(&dataset.examples, k, opts.seed),
        None => dataset.examples.clone(),
    };
    let (train_rows, dev_rows) = data::split(&examples, opts.dev_fraction, opts.seed);
    if let Some(path) = &opts.rows_out {
        write_rows(path, &train_rows, &dev_rows)?;
    }
    let is_oos = |e: &Example| opts.oos_label.as_deref() == Some(e.label.as_str());
    let dev_oos: Vec<Example> = dev_rows.iter().filter(|e| is_oos(e)).cloned().collect();
    let mut train_rows: Vec<Example> = train_rows.into_iter().filter(|e| !is_oos(e)).collect();
    let file_labels = match &opts.labels {
        Some(path) => {
            let file = data::read_labels(path)?;
            let added = data::hold_to_labels(
                &file,
                &mut train_rows,
                &dev_rows,
                opts.oos_label.as_deref(),
                path,
            )?;
            if added > 0 {
                progress(&format!(
                    "{added} labels of {} have no training row: each trains on its description",
                    path.display()
                ));
            }
            file
        }
        None => Vec::new(),
    };
    if let (Some(name), true) = (&opts.oos_label, dev_oos.is_empty()) {
        return Err(PrefilterError::Training(format!(
            "--oos-label {name}: no dev row has that label"
        )));
    }
    // A labels file's order is the head's (a user's label list is theirs); without one, sorted.
    let labels: Vec<String> = if file_labels.is_empty() {
        let mut l: Vec<String> = train_rows.iter().map(|e| e.label.clone()).collect();
        l.sort();
        l.dedup();
        l
    } else {
        let present: std::collections::HashSet<&str> =
            train_rows.iter().map(|e| e.label.as_str()).collect();
        file_labels
            .iter()
            .filter(|f| present.contains(f.name.as_str()))
            .map(|f| f.name.clone())
            .collect()
    };
    if labels.len() < 2 {
        return Err(PrefilterError::Training("need at least two labels".into()));
    }
    if dev_rows.is_empty() {
        return Err(PrefilterError::Training(
            "the dev split is empty: add rows or raise --dev-fraction".into(),
        ));
    }
    let positions: std::collections::HashMap<&str, usize> = labels
        .iter()
        .enumerate()
        .map(|(i, l)| (l.as_str(), i))
        .collect();
    let index = |l: &str| positions.get(l).copied();
    let descriptions: Vec<Option<String>> = if file_labels.is_empty() {
        Vec::new()
    } else {
        labels
            .iter()
            .map(|l| {
                file_labels
                    .iter()
                    .find(|f| &f.name == l)
                    .and_then(|f| f.description.clone())
            })
            .collect()
    };
    let y_train: Vec<u32> = train_rows
        .iter()
        .filter_map(|e| index(&e.label).map(|i| i as u32))
        .collect();
    let dev_rows: Vec<Example> = dev_rows
        .into_iter()
        .filter(|e| index(&e.label).is_some())
        .collect();
    let y_dev: Vec<usize> = dev_rows.iter().filter_map(|e| index(&e.label)).collect();
    progress(&format!(
        "data: {} train / {} dev rows, {} labels ({} bad rows skipped)",
        train_rows.len(),
        dev_rows.len(),
        labels.len(),
        dataset.skipped
    ));

    let device = Device::Cpu;
    let mut rng = rand::rngs::StdRng::seed_from_u64(opts.seed);
    let mut examples = Vec::new();
    let mut embedded = None;
    let (encoder_dir, hidden, head_w, head_b, dev_logits) = if opts.fine_tune {
        fine_tune(
            opts,
            &train_rows,
            &y_train,
            &dev_rows,
            labels.len(),
            &mut rng,
            progress,
        )?
    } else {
        let (tokenizer, mut encoder) =
            load_encoder(&opts.encoder, PoolingConfig::Auto, opts.max_tokens)?;
        encoder.set_precision(opts.precision)?;
        let t0 = Instant::now();
        let x_train = embed_all(&tokenizer, &encoder, &train_rows)?;
        let x_dev = embed_all(&tokenizer, &encoder, &dev_rows)?;
        progress(&format!(
            "embedded {} texts in {:.1}s",
            train_rows.len() + dev_rows.len(),
            t0.elapsed().as_secs_f64()
        ));
        let head = fit_linear_head(
            &x_train,
            &y_train,
            labels.len(),
            HEAD_EPOCHS,
            &mut rng,
            &device,
        )?;
        let dev_logits = head.forward(&x_dev)?.to_vec2::<f32>()?;
        examples = representatives(&x_train, &y_train, &train_rows, labels.len())?;
        let x_oos = embed_some(&tokenizer, &encoder, &dev_oos)?;
        embedded = Some((x_train, x_dev, x_oos));
        let w = head.weight().clone();
        let b = head
            .bias()
            .cloned()
            .ok_or_else(|| PrefilterError::Training("head has no bias".into()))?;
        (
            absolute(&opts.encoder)?,
            encoder.hidden_size(),
            w,
            b,
            dev_logits,
        )
    };

    let (x_train, x_dev, x_oos) = match embedded {
        Some(x) => x,
        None => {
            // Fine-tuned: pick them with the tuned encoder, which is what serves (its path is relative to the
            // head folder).
            let dir = if encoder_dir.is_absolute() {
                encoder_dir.clone()
            } else {
                opts.out.join(&encoder_dir)
            };
            let (tokenizer, mut encoder) =
                load_encoder(&dir, PoolingConfig::Auto, opts.max_tokens)?;
            encoder.set_precision(opts.precision)?;
            let x_train = embed_all(&tokenizer, &encoder, &train_rows)?;
            examples = representatives(&x_train, &y_train, &train_rows, labels.len())?;
            let x_dev = embed_all(&tokenizer, &encoder, &dev_rows)?;
            let x_oos = embed_some(&tokenizer, &encoder, &dev_oos)?;
            (x_train, x_dev, x_oos)
        }
    };
    let raw: Vec<Vec<f32>> = dev_logits.iter().map(|l| softmax(l, 1.0)).collect();
    let halves = DevHalves::of(&y_dev);
    if let Some(w) = halves.flaw() {
        progress(&format!(
            "warning: calibration rows: {w}; `routing.max_error` and `mode = \"risk\"` refuse this head unless \
             routing.allow_flawed_calibration = true"
        ));
    }
    let temperature = fit_temperature(
        &halves
            .fit
            .iter()
            .map(|&i| dev_logits[i].clone())
            .collect::<Vec<_>>(),
        &halves.fit.iter().map(|&i| y_dev[i]).collect::<Vec<_>>(),
    );
    let cal: Vec<Vec<f32>> = dev_logits.iter().map(|l| softmax(l, temperature)).collect();
    let dev = halves.report(&raw, &cal, &y_dev);
    let calibration = halves.calibration_rows(&cal, &y_dev, temperature);
    let meta = TrainedHeadMeta {
        format: HEAD_FORMAT,
        labels: labels.clone(),
        temperature,
        encoder: encoder_dir,
        hidden_size: hidden,
        fine_tuned: opts.fine_tune,
        dev: dev.clone(),
        examples,
        descriptions,
        split: Some(TrainSplit {
            dev_fraction: opts.dev_fraction,
            seed: opts.seed,
            per_label: opts.per_label,
        }),
    };
    save_trained(&opts.out, &meta, &head_w, &head_b)?;
    calibration.save(&opts.out)?;
    // The out-of-scope rows' calibrated distributions (which labels' rows their k-NN searches).
    let oos_probs = match &x_oos {
        Some(x) => {
            let logits = x.matmul(&head_w.t()?)?.broadcast_add(&head_b)?;
            let rows = logits.to_vec2::<f32>()?;
            Some(
                rows.iter()
                    .map(|l| softmax(l, temperature))
                    .collect::<Vec<_>>(),
            )
        }
        None => None,
    };
    let oos = fit_out_of_scope(
        opts,
        (&x_train, &y_train, labels.len()),
        (&x_dev, &cal),
        x_oos.as_ref().zip(oos_probs),
    )?;
    progress(&format!(
        "out of scope: knn threshold {:.4} for {:.0}% in-scope dev recall{}",
        oos.threshold,
        opts.oos_recall * 100.0,
        oos.dev_oos_recall.map_or(String::new(), |r| format!(
            ", {:.1}% of {} out-of-scope dev rows caught",
            r * 100.0,
            oos.dev_oos_rows
        ))
    ));
    Ok(TrainReport {
        train_n: y_train.len(),
        skipped: dataset.skipped,
        labels: labels.len(),
        dev,
        temperature,
        oos,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Writes the drawn rows as CSV `text,category,part`.
fn write_rows(path: &std::path::Path, train: &[Example], dev: &[Example]) -> Result<()> {
    let mut w = csv::Writer::from_path(path).map_err(|e| PrefilterError::file(path, e))?;
    let rows = train
        .iter()
        .map(|e| (e, "train"))
        .chain(dev.iter().map(|e| (e, "dev")));
    w.write_record(["text", "category", "part"])
        .map_err(|e| PrefilterError::file(path, e))?;
    for (e, part) in rows {
        w.write_record([e.text.as_str(), e.label.as_str(), part])
            .map_err(|e| PrefilterError::file(path, e))?;
    }
    w.flush().map_err(|e| PrefilterError::file(path, e))
}

/// The dev split in two halves, every other row of each label: `fit` fits the temperature and orders the
/// risk grid, `held` (rows neither the head nor the temperature saw) gives the dev figures and the risk
/// calibration rows. A dev split of one row is both halves (and says so: `temperature_rows` = `n`).
pub(crate) struct DevHalves {
    pub(crate) fit: Vec<usize>,
    pub(crate) held: Vec<usize>,
    /// No label had a second dev row: `held` is `fit` (in-sample).
    pub(crate) in_sample: bool,
    /// Labels whose only dev row is in `fit` (absent from `held`), when `held` is its own half.
    pub(crate) labels_left_out: usize,
}

impl DevHalves {
    pub(crate) fn of(y: &[usize]) -> Self {
        let mut seen = std::collections::HashMap::new();
        let (mut fit, mut held) = (Vec::new(), Vec::new());
        for (i, label) in y.iter().enumerate() {
            let k = seen.entry(*label).or_insert(0usize);
            if *k % 2 == 0 {
                fit.push(i)
            } else {
                held.push(i)
            }
            *k += 1;
        }
        let in_sample = held.is_empty();
        if in_sample {
            held.clone_from(&fit);
        }
        let labels_left_out = if in_sample {
            0
        } else {
            seen.values().filter(|&&k| k == 1).count()
        };
        Self {
            fit,
            held,
            in_sample,
            labels_left_out,
        }
    }

    /// Why the calibration rows of these halves are flawed, when they are.
    pub(crate) fn flaw(&self) -> Option<String> {
        tiergate_prefilter::risk_rows::flaw(self.in_sample, self.labels_left_out)
    }

    pub(crate) fn report(&self, raw: &[Vec<f32>], cal: &[Vec<f32>], y: &[usize]) -> DevReport {
        let pick = |v: &[Vec<f32>]| self.held.iter().map(|&i| v[i].clone()).collect::<Vec<_>>();
        let y_held: Vec<usize> = self.held.iter().map(|&i| y[i]).collect();
        let cal_held = pick(cal);
        let correct = cal_held
            .iter()
            .zip(&y_held)
            .filter(|(p, &g)| argmax(p).0 == g)
            .count();
        DevReport {
            n: y_held.len(),
            accuracy: correct as f64 / y_held.len().max(1) as f64,
            ece_uncalibrated: ece(&pick(raw), &y_held, 15),
            ece: ece(&cal_held, &y_held, 15),
            temperature_rows: self.fit.len(),
            calibration_flaw: self.flaw(),
        }
    }

    pub(crate) fn calibration_rows(
        &self,
        cal: &[Vec<f32>],
        y: &[usize],
        temperature: f64,
    ) -> CalibrationRows {
        let rows = |idx: &[usize]| {
            idx.iter()
                .map(|&i| {
                    let (top, p) = argmax(&cal[i]);
                    ((1.0 - f64::from(p)).clamp(0.0, 1.0), top != y[i])
                })
                .collect()
        };
        CalibrationRows {
            format: CALIBRATION_FORMAT,
            temperature,
            ordering: rows(&self.fit),
            rows: rows(&self.held),
            in_sample: self.in_sample,
            labels_left_out: self.labels_left_out,
        }
    }
}

/// The top-label k-NN out-of-scope scorer over the training embeddings (`train`: rows, labels, label count), its
/// threshold fitted for `opts.oos_recall` of the in-scope dev rows (`dev`: embeddings and calibrated
/// distributions; their neighbours are training rows only), written beside the head.
fn fit_out_of_scope(
    opts: &TrainOptions,
    train: (&Tensor, &[u32], usize),
    dev: (&Tensor, &[Vec<f32>]),
    oos: Option<(&Tensor, Vec<Vec<f32>>)>,
) -> Result<OosMeta> {
    let (k, top) = (
        tiergate_prefilter::oos::KNN_K,
        tiergate_prefilter::oos::TOP_LABELS,
    );
    let scorer = OutOfScope::knn_top_labels(train.0, train.1, train.2, top, k, f32::INFINITY)?;
    let dev_scores = scorer.scores(dev.0, dev.1)?;
    let threshold = tiergate_prefilter::oos::threshold_for_recall(&dev_scores, opts.oos_recall);
    let scorer = scorer.with_threshold(threshold);
    let oos_scores = match &oos {
        Some((x, p)) => scorer.scores(x, p)?,
        None => Vec::new(),
    };
    let caught = oos_scores.iter().filter(|&&s| s > threshold).count();
    let meta = OosMeta {
        format: OOS_FORMAT,
        method: tiergate_prefilter::oos::OosMethod::KnnTopLabels,
        k,
        top_labels: top,
        threshold,
        recall_target: opts.oos_recall,
        dev_rows: dev_scores.len(),
        dev_oos_rows: oos_scores.len(),
        dev_oos_recall: (!oos_scores.is_empty()).then(|| caught as f64 / oos_scores.len() as f64),
    };
    scorer.save(&opts.out, &meta)?;
    Ok(meta)
}

/// Representative utterances kept per label.
const REPRESENTATIVES: usize = 8;

/// Per label, the distinct training texts nearest the label's mean (cosine on pooled embeddings), nearest
/// first: what the label's examples look like, without keeping the training set.
pub fn representatives(
    x: &Tensor,
    y: &[u32],
    rows: &[Example],
    n_labels: usize,
) -> Result<Vec<Vec<String>>> {
    let x = x.to_vec2::<f32>()?;
    let unit = |v: &[f32]| -> Vec<f32> {
        let n = v.iter().map(|a| a * a).sum::<f32>().sqrt().max(1e-12);
        v.iter().map(|a| a / n).collect()
    };
    let mut out = Vec::with_capacity(n_labels);
    for label in 0..n_labels as u32 {
        let members: Vec<usize> = (0..y.len()).filter(|&i| y[i] == label).collect();
        let Some(first) = members.first() else {
            out.push(Vec::new());
            continue;
        };
        let mut mean = vec![0f32; x[*first].len()];
        for &i in &members {
            for (m, v) in mean.iter_mut().zip(unit(&x[i])) {
                *m += v;
            }
        }
        let mean = unit(&mean);
        let mut scored: Vec<(f32, usize)> = members
            .iter()
            .map(|&i| (unit(&x[i]).iter().zip(&mean).map(|(a, b)| a * b).sum(), i))
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0));
        let mut picked: Vec<String> = Vec::new();
        for (_, i) in scored {
            let t = rows[i].text.trim();
            if !picked.iter().any(|p| p.eq_ignore_ascii_case(t)) {
                picked.push(t.to_string());
            }
            if picked.len() == REPRESENTATIVES {
                break;
            }
        }
        out.push(picked);
    }
    Ok(out)
}

fn absolute(p: &Path) -> Result<PathBuf> {
    std::path::absolute(p).map_err(|e| PrefilterError::file(p, e))
}

/// The embeddings of `rows`, `None` when there are none.
fn embed_some(
    tokenizer: &TextTokenizer,
    encoder: &Encoder,
    rows: &[Example],
) -> Result<Option<Tensor>> {
    if rows.is_empty() {
        return Ok(None);
    }
    embed_all(tokenizer, encoder, rows).map(Some)
}

fn embed_all(tokenizer: &TextTokenizer, encoder: &Encoder, rows: &[Example]) -> Result<Tensor> {
    let texts: Vec<&str> = rows.iter().map(|e| e.text.as_str()).collect();
    embed_texts(tokenizer, encoder, &texts, 64)
}

/// Softmax regression on fixed features with AdamW and mini-batches (what `tiergate train` fits on a frozen
/// encoder, with its epochs).
pub fn fit_frozen_head(
    x: &Tensor,
    y: &[u32],
    n_labels: usize,
    rng: &mut rand::rngs::StdRng,
) -> Result<Linear> {
    fit_linear_head(x, y, n_labels, HEAD_EPOCHS, rng, &Device::Cpu)
}

/// Softmax regression on fixed features with AdamW and mini-batches.
fn fit_linear_head(
    x: &Tensor,
    y: &[u32],
    n_labels: usize,
    epochs: usize,
    rng: &mut rand::rngs::StdRng,
    device: &Device,
) -> Result<Linear> {
    // Weights drawn from the seeded generator (uniform ±1/√hidden, biases 0), so one seed trains one head.
    use rand::Rng;
    let hidden = x.dim(1)?;
    let bound = 1.0 / (hidden as f32).sqrt();
    let init: Vec<f32> = (0..n_labels * hidden)
        .map(|_| rng.gen_range(-bound..bound))
        .collect();
    let w = Var::from_tensor(&Tensor::from_vec(init, (n_labels, hidden), device)?)?;
    let b = Var::zeros(n_labels, DType::F32, device)?;
    let head = Linear::new(w.as_tensor().clone(), Some(b.as_tensor().clone()));
    let mut opt = AdamW::new(
        vec![w, b],
        ParamsAdamW {
            lr: HEAD_LR,
            weight_decay: 1e-4,
            ..Default::default()
        },
    )?;
    let n = y.len();
    let mut order: Vec<u32> = (0..n as u32).collect();
    // Small data sets get more passes: at least MIN_HEAD_STEPS optimiser steps in all.
    let epochs = epochs.max(MIN_HEAD_STEPS.div_ceil(n.div_ceil(HEAD_BATCH).max(1)));
    for _ in 0..epochs {
        order.shuffle(rng);
        for chunk in order.chunks(HEAD_BATCH) {
            let idx = Tensor::new(chunk, device)?;
            let xb = x.index_select(&idx, 0)?;
            let yb = Tensor::new(
                chunk.iter().map(|&i| y[i as usize]).collect::<Vec<u32>>(),
                device,
            )?;
            let loss = candle_nn::loss::cross_entropy(&head.forward(&xb)?, &yb)?;
            opt.backward_step(&loss)?;
        }
    }
    Ok(head)
}

type Trained = (PathBuf, usize, Tensor, Tensor, Vec<Vec<f32>>);

/// Fine-tunes the encoder together with a head (first fitted on frozen features) and writes the tuned encoder
/// to `out/encoder/`.
fn fine_tune(
    opts: &TrainOptions,
    train_rows: &[Example],
    y_train: &[u32],
    dev_rows: &[Example],
    n_labels: usize,
    rng: &mut rand::rngs::StdRng,
    progress: &mut dyn FnMut(&str),
) -> Result<Trained> {
    let device = Device::Cpu;
    let tokenizer =
        TextTokenizer::from_file(&opts.encoder.join("tokenizer.json"), opts.max_tokens)?;
    let weights = opts.encoder.join("model.safetensors");
    // Every checkpoint tensor becomes a trainable variable under its own name, so the model finds the same
    // names (with or without a `bert.` prefix) it finds when loading from the file.
    let enc_map = VarMap::new();
    {
        let tensors = candle_core::safetensors::load(&weights, &device)
            .map_err(|e| PrefilterError::corrupt(&weights, e))?;
        let mut vars = enc_map
            .data()
            .lock()
            .map_err(|_| PrefilterError::Training("variable map lock poisoned".into()))?;
        for (name, t) in tensors {
            if t.dtype() == DType::F32 {
                vars.insert(name, Var::from_tensor(&t)?);
            }
        }
    }
    let vb = VarBuilder::from_varmap(&enc_map, DType::F32, &device);
    let encoder = Encoder::load(
        &opts.encoder,
        PoolingConfig::Auto,
        vb,
        tokenizer.pad_id(),
        true,
    )?;

    // Start from the frozen-feature head so fine-tuning does not begin with random gradients into the encoder.
    // The features come from the inference encoder (same weights, faster kernels).
    let t0 = Instant::now();
    let x_train = {
        let (tok, frozen_encoder) =
            load_encoder(&opts.encoder, PoolingConfig::Auto, opts.max_tokens)?;
        embed_all(&tok, &frozen_encoder, train_rows)?
    };
    let frozen = fit_linear_head(&x_train, y_train, n_labels, HEAD_EPOCHS, rng, &device)?;
    progress(&format!(
        "frozen head fitted in {:.1}s",
        t0.elapsed().as_secs_f64()
    ));
    let head_w = Var::from_tensor(frozen.weight())?;
    let head_b = Var::from_tensor(
        frozen
            .bias()
            .ok_or_else(|| PrefilterError::Training("no bias".into()))?,
    )?;
    let mut enc_opt = AdamW::new(
        enc_map.all_vars(),
        ParamsAdamW {
            lr: FT_LR,
            weight_decay: 0.01,
            ..Default::default()
        },
    )?;
    let mut head_opt = AdamW::new(
        vec![head_w.clone(), head_b.clone()],
        ParamsAdamW {
            lr: 1e-3,
            weight_decay: 1e-4,
            ..Default::default()
        },
    )?;
    let tokens: Vec<Tokens> = train_rows
        .iter()
        .map(|e| tokenizer.encode(&e.text))
        .collect::<Result<_>>()?;
    let mut order: Vec<usize> = (0..tokens.len()).collect();
    for epoch in 0..opts.fine_tune_epochs.max(1) {
        order.shuffle(rng);
        let t = Instant::now();
        let mut total = 0.0f64;
        let mut steps = 0usize;
        for chunk in order.chunks(FT_BATCH) {
            let refs: Vec<&Tokens> = chunk.iter().map(|&i| &tokens[i]).collect();
            let pooled = encoder.embed(&refs)?.pooled;
            let logits = pooled
                .matmul(&head_w.as_tensor().t()?)?
                .broadcast_add(head_b.as_tensor())?;
            let yb = Tensor::new(
                chunk.iter().map(|&i| y_train[i]).collect::<Vec<u32>>(),
                &device,
            )?;
            let loss = candle_nn::loss::cross_entropy(&logits, &yb)?;
            let grads = loss.backward()?;
            enc_opt.step(&grads)?;
            head_opt.step(&grads)?;
            total += loss.to_scalar::<f32>()? as f64;
            steps += 1;
            if steps.is_multiple_of(25) {
                progress(&format!(
                    "fine-tune epoch {} step {steps}/{}: loss {:.4} ({:.0} rows/s)",
                    epoch + 1,
                    order.len().div_ceil(FT_BATCH),
                    total / steps as f64,
                    (steps * FT_BATCH) as f64 / t.elapsed().as_secs_f64()
                ));
            }
        }
        progress(&format!(
            "fine-tune epoch {} done in {:.0}s, mean loss {:.4}",
            epoch + 1,
            t.elapsed().as_secs_f64(),
            total / steps.max(1) as f64
        ));
    }
    // Save the tuned encoder, then reload it through the inference path (no autograd graph, fast kernels) to
    // refit the head on the tuned features and score the dev split.
    let enc_out = opts.out.join("encoder");
    std::fs::create_dir_all(&enc_out).map_err(|e| PrefilterError::file(&enc_out, e))?;
    let saved = enc_out.join("model.safetensors");
    enc_map
        .save(&saved)
        .map_err(|e| PrefilterError::file(&saved, e))?;
    for f in [
        "config.json",
        "tokenizer.json",
        "modules.json",
        "1_Pooling/config.json",
    ] {
        let src = opts.encoder.join(f);
        if src.is_file() {
            let dst = enc_out.join(f);
            if let Some(parent) = dst.parent() {
                std::fs::create_dir_all(parent).map_err(|e| PrefilterError::file(parent, e))?;
            }
            std::fs::copy(&src, &dst).map_err(|e| PrefilterError::file(&dst, e))?;
        }
    }
    drop(encoder);
    let (tokenizer, mut tuned) = load_encoder(&enc_out, PoolingConfig::Auto, opts.max_tokens)?;
    tuned.set_precision(opts.precision)?;
    let x_train = embed_all(&tokenizer, &tuned, train_rows)?;
    let head = fit_linear_head(&x_train, y_train, n_labels, HEAD_EPOCHS / 2, rng, &device)?;
    let x_dev = embed_all(&tokenizer, &tuned, dev_rows)?;
    let dev_logits = head.forward(&x_dev)?.to_vec2::<f32>()?;
    let b = head
        .bias()
        .cloned()
        .ok_or_else(|| PrefilterError::Training("no bias".into()))?;
    Ok((
        PathBuf::from("encoder"),
        tuned.hidden_size(),
        head.weight().clone(),
        b,
        dev_logits,
    ))
}
