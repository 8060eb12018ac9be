//! Classification heads on top of the encoder, all producing logits over a label set:
//! the checkpoint's own sequence-classification head, a softmax head trained by `tiergate train`, and a
//! few-shot prototype head built from example utterances.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::Tensor;
use candle_nn::{Linear, Module, VarBuilder};
use serde::{Deserialize, Serialize};

use crate::encoder::{l2_normalize, read_json, Embedded, Encoder, Family};
use crate::error::{PrefilterError, Result};

/// The parameters that turn encoder output into logits.
pub enum HeadKind {
    /// `logits = pooled · Wᵀ + b` (trained by `tiergate train`).
    Linear(Linear),
    /// The checkpoint's own head, applied to the first token's state.
    Checkpoint {
        family: Family,
        dense: Linear,
        out: Linear,
    },
    /// Cosine similarity to per-label prototypes (mean of the normalised example embeddings), divided by a
    /// temperature.
    Prototypes {
        prototypes: Tensor,
        temperature: f64,
    },
}

/// A head with its labels and calibration temperature.
pub struct Head {
    /// How logits are computed.
    pub kind: HeadKind,
    /// Label names, in logit order.
    pub labels: Vec<String>,
    /// Calibration temperature: probabilities are `softmax(logits / temperature)`.
    pub temperature: f64,
}

impl Head {
    /// Logits `[batch, labels]` from the encoder's outputs.
    pub fn logits(&self, x: &Embedded) -> Result<Tensor> {
        let pooled = &x.pooled;
        Ok(match &self.kind {
            HeadKind::Linear(lin) => lin.forward(pooled)?,
            HeadKind::Checkpoint { family, dense, out } => {
                let hidden = dense.forward(&x.cls)?;
                let hidden = match family {
                    Family::DistilBert => hidden.relu()?,
                    Family::Bert | Family::XlmRoberta => hidden.tanh()?,
                };
                out.forward(&hidden)?
            }
            HeadKind::Prototypes {
                prototypes,
                temperature,
            } => (l2_normalize(pooled)?.matmul(&prototypes.t()?)? / *temperature)?,
        })
    }

    /// The weight `[labels, hidden]` and bias of a linear head (what `tiergate train` writes).
    pub fn linear_weights(&self) -> Result<(Tensor, Tensor)> {
        match &self.kind {
            HeadKind::Linear(lin) => Ok((
                lin.weight().clone(),
                lin.bias()
                    .cloned()
                    .ok_or_else(|| PrefilterError::Training("the head has no bias".into()))?,
            )),
            _ => Err(PrefilterError::Training(
                "only a trained linear head (`tiergate train`) can be distilled".into(),
            )),
        }
    }

    /// Calibrated probabilities `[batch, labels]`.
    pub fn probabilities(&self, x: &Embedded) -> Result<Tensor> {
        let logits = (self.logits(x)? / self.temperature)?;
        Ok(candle_nn::ops::softmax_last_dim(&logits)?)
    }

    /// Loads the sequence-classification head of a Hugging Face checkpoint (`id2label` from `config.json`).
    pub fn from_checkpoint(encoder: &Encoder, vb: &VarBuilder) -> Result<Self> {
        let dir = encoder.dir();
        let labels = checkpoint_labels(&dir.join("config.json"))?;
        let h = encoder.hidden_size();
        let n = labels.len();
        let weights = dir.join("model.safetensors");
        let missing = |what: &str, e: candle_core::Error| {
            PrefilterError::corrupt(
                &weights,
                format!("no sequence-classification head ({what}): {e}"),
            )
        };
        let (dense, out) = match encoder.family() {
            Family::Bert => {
                let pooler = ["bert.pooler.dense", "pooler.dense"]
                    .iter()
                    .find(|p| vb.contains_tensor(&format!("{p}.weight")))
                    .copied()
                    .unwrap_or("bert.pooler.dense");
                (
                    candle_nn::linear(h, h, vb.pp(pooler)).map_err(|e| missing(pooler, e))?,
                    candle_nn::linear(h, n, vb.pp("classifier"))
                        .map_err(|e| missing("classifier", e))?,
                )
            }
            Family::DistilBert => (
                candle_nn::linear(h, h, vb.pp("pre_classifier"))
                    .map_err(|e| missing("pre_classifier", e))?,
                candle_nn::linear(h, n, vb.pp("classifier"))
                    .map_err(|e| missing("classifier", e))?,
            ),
            Family::XlmRoberta => (
                candle_nn::linear(h, h, vb.pp("classifier.dense"))
                    .map_err(|e| missing("classifier.dense", e))?,
                candle_nn::linear(h, n, vb.pp("classifier.out_proj"))
                    .map_err(|e| missing("classifier.out_proj", e))?,
            ),
        };
        Ok(Self {
            kind: HeadKind::Checkpoint {
                family: encoder.family(),
                dense,
                out,
            },
            labels,
            temperature: 1.0,
        })
    }

    /// A few-shot head: each label's prototype is the normalised mean of its examples' embeddings.
    pub fn few_shot(
        labels: Vec<String>,
        example_embeddings: Vec<Tensor>,
        temperature: f64,
    ) -> Result<Self> {
        let mut protos = Vec::with_capacity(example_embeddings.len());
        for e in &example_embeddings {
            protos.push(l2_normalize(&l2_normalize(e)?.mean_keepdim(0)?)?);
        }
        let prototypes = Tensor::cat(&protos, 0)?;
        Ok(Self {
            kind: HeadKind::Prototypes {
                prototypes,
                temperature,
            },
            labels,
            temperature: 1.0,
        })
    }
}

/// Labels in id order from a checkpoint's `id2label`.
pub fn checkpoint_labels(config_path: &Path) -> Result<Vec<String>> {
    #[derive(Deserialize)]
    struct Id2Label {
        id2label: Option<HashMap<String, String>>,
    }
    let cfg: Id2Label = read_json(config_path)?;
    let map = cfg.id2label.ok_or_else(|| {
        PrefilterError::corrupt(
            config_path,
            "no `id2label`: not a sequence-classification checkpoint",
        )
    })?;
    let mut labels = vec![None; map.len()];
    for (k, v) in map {
        let i: usize = k.parse().map_err(|_| {
            PrefilterError::corrupt(config_path, format!("id2label key `{k}` is not an index"))
        })?;
        let slot = labels.get_mut(i).ok_or_else(|| {
            PrefilterError::corrupt(config_path, format!("id2label index {i} is out of range"))
        })?;
        *slot = Some(v);
    }
    labels
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .filter(|l| l.len() >= 2)
        .ok_or_else(|| {
            PrefilterError::corrupt(config_path, "id2label must hold indices 0..n, n >= 2")
        })
}

/// `head.json`: everything about a trained head except its weights (in `head.safetensors`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainedHeadMeta {
    /// Format version of this file.
    pub format: u32,
    /// Label names in logit order.
    pub labels: Vec<String>,
    /// Calibration temperature fitted on the dev split.
    pub temperature: f64,
    /// The encoder folder the head was trained on (relative paths are relative to the head folder).
    pub encoder: PathBuf,
    /// Pooled vector width.
    pub hidden_size: usize,
    /// Whether the encoder was fine-tuned (then `encoder` is `encoder/` inside the head folder).
    pub fine_tuned: bool,
    /// Dev-split figures measured at training time.
    pub dev: DevReport,
    /// Representative training utterances per label (label order): the ones nearest their label's mean
    /// embedding. What an escalation's LLM reads to know what a label means.
    #[serde(default)]
    pub examples: Vec<Vec<String>>,
    /// One sentence per label saying what it means (label order; `tiergate train --labels`), shown to the judge.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub descriptions: Vec<Option<String>>,
    /// How `tiergate train` drew its rows from the data, so that `distill` and `eval --split dev` can draw the
    /// same held-out rows again (absent in heads written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<TrainSplit>,
}

/// The draw of a head's training and dev rows.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct TrainSplit {
    pub dev_fraction: f64,
    pub seed: u64,
    /// `--per-label K`: at most K rows of each label, drawn before the split.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_label: Option<usize>,
}

/// `fusion.json` next to a head: how the LLM's scores are fused with Tier-0's, fitted by `tiergate
/// fit-fusion` on a dev split with the LLM actually deployed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FittedFusion {
    /// Weight of the LLM's distribution (0: the LLM changes nothing).
    pub llm_weight: f32,
    /// Temperature of the LLM's scores.
    pub llm_temperature: f32,
    /// The LLM (file name) and scoring method the fit was made with.
    pub llm: String,
    /// Escalated dev rows the fit saw.
    pub rows: usize,
    /// Tier-0 accuracy on those rows.
    pub tier0_accuracy: f64,
    /// Fused accuracy on those rows with the fitted values.
    pub fused_accuracy: f64,
    /// The most accurate weight on the grid, before the significance check (`llm_weight` is 0 when its
    /// gain could be luck).
    #[serde(default)]
    pub best_weight: f32,
    /// Its temperature.
    #[serde(default)]
    pub best_temperature: f32,
    /// Rows that weight fixes relative to Tier-0.
    #[serde(default)]
    pub rows_fixed: usize,
    /// Rows it breaks.
    #[serde(default)]
    pub rows_broken: usize,
    /// One-sided sign-test p-value of fixed vs broken.
    #[serde(default)]
    pub p_value: f64,
    /// `rows_fixed`, `rows_broken` and `p_value` are measured on the half of the rows the choice of weight did
    /// not see; these are the rows that weight fixes and breaks on the half it was chosen on (in-sample).
    /// Absent in fits made before the split (their figures are in-sample).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chosen_on: Option<(usize, usize)>,
    /// A cascade stage's fit (`fusion.STAGE.json`): the LLMs of the stages before it, in order, whose fused
    /// distribution it fuses with (empty: the first stage, fused with Tier-0's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<String>,
    /// The head it was fitted on ([`fingerprint`]): a fit copied next to another head is not used there.
    /// Absent in fits made before it was recorded (used with any head).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<String>,
}

/// A trained head's fingerprint: FNV-1a over its labels, temperature and weights file, hex. Two heads with
/// the same labels but other weights differ.
pub fn fingerprint(dir: &Path) -> Result<String> {
    let meta_path = dir.join("head.json");
    let meta: TrainedHeadMeta = read_json(&meta_path)?;
    let weights_path = dir.join("head.safetensors");
    let weights =
        std::fs::read(&weights_path).map_err(|e| PrefilterError::file(&weights_path, e))?;
    let mut h = tiergate_core::fnv::Fnv::new();
    for l in &meta.labels {
        h.eat(l.as_bytes()).eat(&[0]);
    }
    h.eat(&meta.temperature.to_bits().to_le_bytes())
        .eat(&weights);
    Ok(h.hex())
}

impl FittedFusion {
    /// File name inside the head folder.
    pub const FILE: &'static str = "fusion.json";

    /// The file of cascade stage `stage`'s fit (a stage after the first, by its backend's name).
    pub fn stage_file(stage: &str) -> String {
        format!("fusion.{stage}.json")
    }

    /// Reads `dir/fusion.json` when present.
    pub fn load(dir: &Path) -> Result<Option<Self>> {
        Self::load_file(dir, Self::FILE)
    }

    /// Every cascade stage's fit in `dir` (`fusion.STAGE.json`), by stage name.
    pub fn load_stages(dir: &Path) -> Result<Vec<(String, Self)>> {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(stage) = name
                .strip_prefix("fusion.")
                .and_then(|n| n.strip_suffix(".json"))
            else {
                continue;
            };
            if let Some(f) = Self::load_file(dir, &name)? {
                out.push((stage.to_string(), f));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    fn load_file(dir: &Path, file: &str) -> Result<Option<Self>> {
        let path = dir.join(file);
        if !path.is_file() {
            return Ok(None);
        }
        let f: Self = read_json(&path)?;
        let weight_ok = f.llm_weight.is_finite() && (0.0..=1.0).contains(&f.llm_weight);
        let temperature_ok = f.llm_temperature.is_finite() && f.llm_temperature > 0.0;
        if !(weight_ok && temperature_ok) {
            return Err(PrefilterError::corrupt(
                &path,
                "llm_weight must be in [0, 1] and llm_temperature positive",
            ));
        }
        Ok(Some(f))
    }

    /// Writes `dir/fusion.json`, or a cascade stage's `dir/fusion.STAGE.json`.
    pub fn save(&self, dir: &Path, stage: Option<&str>) -> Result<()> {
        let path = dir.join(stage.map_or_else(|| Self::FILE.to_string(), Self::stage_file));
        let text =
            serde_json::to_string_pretty(self).map_err(|e| PrefilterError::corrupt(&path, e))?;
        std::fs::write(&path, text).map_err(|e| PrefilterError::file(&path, e))
    }
}

/// Figures measured when the head was trained, on the half of the dev split the temperature was not fitted
/// on (heads trained before the split: on the whole dev split, in-sample, `temperature_rows` = 0).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DevReport {
    /// Rows measured (the held-out half of the dev split).
    pub n: usize,
    /// Top-1 accuracy.
    pub accuracy: f64,
    /// Expected calibration error (15 bins) before temperature scaling.
    pub ece_uncalibrated: f64,
    /// Expected calibration error after temperature scaling.
    pub ece: f64,
    /// Dev rows the temperature was fitted on (the other half).
    #[serde(default)]
    pub temperature_rows: usize,
    /// Why its calibration rows are not a sound held-out sample (in-sample halves, labels left out), when
    /// they are not: the same flag as `calibration.json`'s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration_flaw: Option<String>,
}

/// Current `head.json` format.
pub const HEAD_FORMAT: u32 = 1;

impl TrainedHeadMeta {
    /// The encoder folder, resolved against the head folder.
    pub fn encoder_dir(&self, head_dir: &Path) -> PathBuf {
        if self.encoder.is_absolute() {
            self.encoder.clone()
        } else {
            head_dir.join(&self.encoder)
        }
    }
}

/// Reads `head.json` + `head.safetensors` from a folder written by `tiergate train`.
pub fn load_trained(dir: &Path) -> Result<(TrainedHeadMeta, Head)> {
    let meta_path = dir.join("head.json");
    let meta: TrainedHeadMeta = read_json(&meta_path)?;
    if meta.format != HEAD_FORMAT {
        return Err(PrefilterError::corrupt(
            &meta_path,
            format!(
                "format {} is not supported (expected {HEAD_FORMAT})",
                meta.format
            ),
        ));
    }
    if !(meta.temperature.is_finite() && meta.temperature > 0.0) {
        return Err(PrefilterError::corrupt(
            &meta_path,
            "temperature must be positive",
        ));
    }
    let weights_path = dir.join("head.safetensors");
    if !weights_path.is_file() {
        return Err(PrefilterError::file(&weights_path, "file not found"));
    }
    let tensors = candle_core::safetensors::load(&weights_path, &candle_core::Device::Cpu)
        .map_err(|e| PrefilterError::corrupt(&weights_path, e))?;
    let get = |name: &str| {
        tensors.get(name).cloned().ok_or_else(|| {
            PrefilterError::corrupt(&weights_path, format!("tensor `{name}` missing"))
        })
    };
    let weight = get("weight")?;
    let bias = get("bias")?;
    let n = meta.labels.len();
    if weight.dims() != [n, meta.hidden_size] || bias.dims() != [n] {
        return Err(PrefilterError::corrupt(
            &weights_path,
            format!(
                "shapes {:?}/{:?} do not match {n} labels x {} hidden",
                weight.dims(),
                bias.dims(),
                meta.hidden_size
            ),
        ));
    }
    let head = Head {
        kind: HeadKind::Linear(Linear::new(weight, Some(bias))),
        labels: meta.labels.clone(),
        temperature: meta.temperature,
    };
    Ok((meta, head))
}

/// Writes a trained linear head.
pub fn save_trained(
    dir: &Path,
    meta: &TrainedHeadMeta,
    weight: &Tensor,
    bias: &Tensor,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| PrefilterError::file(dir, e))?;
    let weights_path = dir.join("head.safetensors");
    let tensors: HashMap<String, Tensor> = [
        ("weight".to_string(), weight.clone()),
        ("bias".to_string(), bias.clone()),
    ]
    .into();
    candle_core::safetensors::save(&tensors, &weights_path)
        .map_err(|e| PrefilterError::file(&weights_path, e))?;
    let meta_path = dir.join("head.json");
    let text =
        serde_json::to_string_pretty(meta).map_err(|e| PrefilterError::corrupt(&meta_path, e))?;
    std::fs::write(&meta_path, text).map_err(|e| PrefilterError::file(&meta_path, e))
}

/// A head's fit, if it was made with the LLM named `running` after the stages `after` (the LLMs before it in
/// the cascade; empty for the first stage); a fit made with another LLM or another chain is refused, and the
/// refusal logged.
pub fn fit_for<'a>(
    fit: Option<&'a FittedFusion>,
    running: &str,
    after: &[String],
) -> Option<&'a FittedFusion> {
    let f = fit?;
    if f.llm == running && f.after == after {
        return Some(f);
    }
    tracing::warn!(
        fitted_with = %f.llm,
        fitted_after = ?f.after,
        running = %running,
        after = ?after,
        "the head's fusion fit was made with another LLM or cascade: not used (run tiergate fit-fusion with this one)"
    );
    None
}
