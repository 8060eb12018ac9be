//! The transformer encoder: loads a BERT-family checkpoint from a local Hugging Face folder with candle and
//! turns a padded batch of token ids into pooled sentence vectors.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, D};
use candle_nn::VarBuilder;
use candle_transformers::models::{bert, distilbert, xlm_roberta};

use serde::Deserialize;
use tiergate_config::{PoolingConfig, Precision};

use crate::bert::{first_token, mean_pool, Packed, PackedBert};
use crate::error::{PrefilterError, Result};
use crate::tokenize::{TextTokenizer, Tokens};

/// Model families this encoder loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// BERT and its distillations (MiniLM, …).
    Bert,
    /// DistilBERT.
    DistilBert,
    /// XLM-RoBERTa (and RoBERTa checkpoints with the same layout).
    XlmRoberta,
}

enum Backbone {
    Bert(PackedBert),
    DistilBert(distilbert::DistilBertModel),
    XlmRoberta(xlm_roberta::XLMRobertaModel),
}

/// How token states are pooled into one sentence vector (resolved from [`PoolingConfig`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// Masked mean, optionally L2-normalised.
    Mean { normalize: bool },
    /// The first token's state.
    Cls,
}

/// Sentence-level outputs of the encoder for a batch.
pub struct Embedded {
    /// The first token's final state, `[batch, hidden]` (what checkpoint heads read).
    pub cls: Tensor,
    /// The pooled sentence vector, `[batch, hidden]` (what trained and few-shot heads read).
    pub pooled: Tensor,
}

/// A padded batch: `[batch, seq]` tensors (DistilBERT and XLM-R run padded).
struct Batch {
    /// Token ids, `u32`.
    pub ids: Tensor,
    /// Segment ids, `u32`.
    pub type_ids: Tensor,
    /// 1 for real tokens, 0 for padding, `u32`.
    pub mask: Tensor,
}

impl Batch {
    /// Pads token sequences to the longest one with `pad_id`.
    fn pad(seqs: &[&Tokens], pad_id: u32, device: &Device) -> Result<Self> {
        let len = seqs.iter().map(|s| s.ids.len()).max().unwrap_or(0).max(1);
        let n = seqs.len();
        let mut ids = vec![pad_id; n * len];
        let mut type_ids = vec![0u32; n * len];
        let mut mask = vec![0u32; n * len];
        for (row, s) in seqs.iter().enumerate() {
            let base = row * len;
            ids[base..base + s.ids.len()].copy_from_slice(&s.ids);
            type_ids[base..base + s.type_ids.len()].copy_from_slice(&s.type_ids);
            mask[base..base + s.ids.len()].fill(1);
        }
        Ok(Self {
            ids: Tensor::from_vec(ids, (n, len), device)?,
            type_ids: Tensor::from_vec(type_ids, (n, len), device)?,
            mask: Tensor::from_vec(mask, (n, len), device)?,
        })
    }
}

/// A loaded encoder with its pooling.
pub struct Encoder {
    backbone: Backbone,
    family: Family,
    pooling: Pooling,
    hidden_size: usize,
    dir: PathBuf,
    device: Device,
    pad_id: u32,
    precision: Precision,
}

#[derive(Deserialize)]
struct ModelType {
    model_type: Option<String>,
    hidden_size: Option<usize>,
    dim: Option<usize>,
}

/// Reads and parses a JSON file, naming it in any error.
pub(crate) fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| PrefilterError::file(path, e))?;
    serde_json::from_str(&text).map_err(|e| PrefilterError::corrupt(path, e))
}

/// Opens `model.safetensors` in `dir` (memory-mapped), naming the file in any error.
pub(crate) fn mmap_weights(dir: &Path, device: &Device) -> Result<VarBuilder<'static>> {
    let path = dir.join("model.safetensors");
    if !path.is_file() {
        return Err(PrefilterError::file(&path, "file not found"));
    }
    // SAFETY: the file is opened read-only and memory-mapped; like every safetensors loader we rely on nobody
    // truncating a model file while it is in use. A corrupt header is reported here, naming the file.
    unsafe { VarBuilder::from_mmaped_safetensors(&[&path], DType::F32, device) }
        .map_err(|e| PrefilterError::corrupt(&path, e))
}

impl Encoder {
    /// Loads the encoder in `dir` with weights from `vb` (see [`mmap_weights`]); the pooling is resolved from
    /// the folder's sentence-transformers files when `pooling` is `Auto`. `pad_id` pads batches of the
    /// families that run padded. `trainable` selects ops with a backward pass (BERT family only).
    pub fn load(
        dir: &Path,
        pooling: PoolingConfig,
        vb: VarBuilder,
        pad_id: u32,
        trainable: bool,
    ) -> Result<Self> {
        let config_path = dir.join("config.json");
        let head: ModelType = read_json(&config_path)?;
        let model_type = head.model_type.as_deref().unwrap_or("bert");
        let family = match model_type {
            "bert" => Family::Bert,
            "distilbert" => Family::DistilBert,
            "xlm-roberta" | "roberta" => Family::XlmRoberta,
            other => {
                return Err(PrefilterError::Unsupported(format!(
                "model_type `{other}` in {} (supported: bert, distilbert, xlm-roberta, roberta)",
                config_path.display()
            )))
            }
        };
        let hidden_size = head.hidden_size.or(head.dim).ok_or_else(|| {
            PrefilterError::corrupt(&config_path, "neither `hidden_size` nor `dim` is set")
        })?;
        let weights = dir.join("model.safetensors");
        let corrupt = |e: candle_core::Error| PrefilterError::corrupt(&weights, e);
        let backbone = match family {
            Family::Bert => {
                let cfg: bert::Config = read_json(&config_path)?;
                Backbone::Bert(PackedBert::load(vb, &cfg, trainable).map_err(|e| match e {
                    PrefilterError::Candle(c) => corrupt(c),
                    other => other,
                })?)
            }
            Family::DistilBert => {
                let cfg: distilbert::Config = read_json(&config_path)?;
                Backbone::DistilBert(distilbert::DistilBertModel::load(vb, &cfg).map_err(corrupt)?)
            }
            Family::XlmRoberta => {
                let cfg: xlm_roberta::Config = read_json(&config_path)?;
                let vb = if vb.contains_tensor("roberta.embeddings.word_embeddings.weight") {
                    vb.pp("roberta")
                } else {
                    vb
                };
                Backbone::XlmRoberta(xlm_roberta::XLMRobertaModel::new(&cfg, vb).map_err(corrupt)?)
            }
        };
        let pooling = resolve_pooling(dir, pooling)?;
        Ok(Self {
            backbone,
            family,
            pooling,
            hidden_size,
            dir: dir.to_path_buf(),
            device: Device::Cpu,
            pad_id,
            precision: Precision::F32,
        })
    }

    /// Sets the arithmetic of the dense layers; returns what is used. `Auto` picks int8 for the BERT family
    /// on a CPU with AVX-512 VNNI, else f32; `Int8` fails where it cannot run. Switching back to f32 after
    /// int8 needs a reload.
    pub fn set_precision(&mut self, p: Precision) -> Result<Precision> {
        let can = tiergate_kernels::int8::available();
        let used = match (p, &mut self.backbone) {
            (Precision::F32, _) => self.precision,
            (Precision::Auto | Precision::Int8, Backbone::Bert(m)) if can => {
                m.to_int8()?;
                Precision::Int8
            }
            (Precision::Auto, _) => self.precision,
            (Precision::Int8, Backbone::Bert(_)) => {
                return Err(PrefilterError::Unsupported(
                    "prefilter.precision = int8 needs a CPU with AVX-512 VNNI; use auto or f32".into(),
                ))
            }
            (Precision::Int8, _) => {
                return Err(PrefilterError::Unsupported(format!(
                "prefilter.precision = int8 is implemented for BERT-family encoders, not {:?}; use auto or f32",
                self.family
            )))
            }
        };
        self.precision = used;
        Ok(used)
    }

    /// The arithmetic of the dense layers in use (`F32` or `Int8`).
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The model family.
    pub fn family(&self) -> Family {
        self.family
    }

    /// Width of the token states and of the pooled vector.
    pub fn hidden_size(&self) -> usize {
        self.hidden_size
    }

    /// The folder the encoder was loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The device tensors live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Runs the encoder over a batch of tokenised inputs.
    pub fn embed(&self, inputs: &[&Tokens]) -> Result<Embedded> {
        let (cls, mean) = match &self.backbone {
            Backbone::Bert(m) => {
                let seqs: Vec<(&[u32], &[u32])> = inputs
                    .iter()
                    .map(|t| (t.ids.as_slice(), t.type_ids.as_slice()))
                    .collect();
                let packed = Packed::new(&seqs, &self.device)?;
                let states = m.forward(&packed)?;
                let cls = first_token(&states, &packed)?;
                let mean = match self.pooling {
                    Pooling::Mean { .. } => Some(mean_pool(&states, &packed)?),
                    Pooling::Cls => None,
                };
                (cls, mean)
            }
            Backbone::DistilBert(m) => {
                let batch = Batch::pad(inputs, self.pad_id, &self.device)?;
                // candle's DistilBERT fills positions where the mask is 1 with -inf: pass "is padding".
                let (b, t) = batch.mask.dims2()?;
                let pad = batch.mask.eq(0u32)?.reshape((b, 1, 1, t))?;
                let states = m.forward(&batch.ids, &pad)?;
                padded_outputs(&states, &batch.mask, self.pooling)?
            }
            Backbone::XlmRoberta(m) => {
                let batch = Batch::pad(inputs, self.pad_id, &self.device)?;
                let states =
                    m.forward(&batch.ids, &batch.mask, &batch.type_ids, None, None, None)?;
                padded_outputs(&states, &batch.mask, self.pooling)?
            }
        };
        let pooled = match (self.pooling, mean) {
            (Pooling::Mean { normalize: true }, Some(m)) => l2_normalize(&m)?,
            (Pooling::Mean { normalize: false }, Some(m)) => m,
            _ => cls.clone(),
        };
        Ok(Embedded { cls, pooled })
    }
}

/// First-token states and (for mean pooling) masked means of padded states `[batch, seq, hidden]`.
fn padded_outputs(
    states: &Tensor,
    mask: &Tensor,
    pooling: Pooling,
) -> Result<(Tensor, Option<Tensor>)> {
    let cls = states.narrow(1, 0, 1)?.squeeze(1)?;
    let mean = match pooling {
        Pooling::Cls => None,
        Pooling::Mean { .. } => {
            let m = mask.to_dtype(states.dtype())?.unsqueeze(2)?;
            let sum = states.broadcast_mul(&m)?.sum(1)?;
            let count = m.sum(1)?.clamp(1e-9, f64::MAX)?;
            Some(sum.broadcast_div(&count)?)
        }
    };
    Ok((cls, mean))
}

/// Rows scaled to unit L2 norm.
pub fn l2_normalize(x: &Tensor) -> Result<Tensor> {
    let norm = x
        .sqr()?
        .sum_keepdim(D::Minus1)?
        .sqrt()?
        .clamp(1e-12, f64::MAX)?;
    Ok(x.broadcast_div(&norm)?)
}

#[derive(Deserialize)]
struct StModule {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    path: String,
}

#[derive(Deserialize)]
struct StPooling {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
}

fn resolve_pooling(dir: &Path, cfg: PoolingConfig) -> Result<Pooling> {
    Ok(match cfg {
        PoolingConfig::MeanNormalized => Pooling::Mean { normalize: true },
        PoolingConfig::Mean => Pooling::Mean { normalize: false },
        PoolingConfig::Cls => Pooling::Cls,
        PoolingConfig::Auto => {
            let modules_path = dir.join("modules.json");
            if !modules_path.is_file() {
                return Ok(Pooling::Mean { normalize: false });
            }
            let modules: Vec<StModule> = read_json(&modules_path)?;
            let normalize = modules.iter().any(|m| m.kind.ends_with(".Normalize"));
            let mut pooling = Pooling::Mean { normalize };
            if let Some(m) = modules.iter().find(|m| m.kind.ends_with(".Pooling")) {
                let p: StPooling = read_json(&dir.join(&m.path).join("config.json"))?;
                if p.pooling_mode_cls_token && !p.pooling_mode_mean_tokens {
                    pooling = Pooling::Cls;
                }
            }
            pooling
        }
    })
}

/// Pooled embeddings `[n, hidden]` of `texts`, computed in length-sorted batches (less padding).
pub fn embed_texts(
    tokenizer: &TextTokenizer,
    encoder: &Encoder,
    texts: &[&str],
    batch: usize,
) -> Result<Tensor> {
    if texts.is_empty() {
        return Err(PrefilterError::InvalidInput("no texts to embed".into()));
    }
    let tokens = texts
        .iter()
        .map(|t| tokenizer.encode(t))
        .collect::<Result<Vec<_>>>()?;
    let mut order: Vec<usize> = (0..tokens.len()).collect();
    order.sort_by_key(|&i| tokens[i].ids.len());
    let mut rows: Vec<Option<Tensor>> = vec![None; tokens.len()];
    for chunk in order.chunks(batch.max(1)) {
        let refs: Vec<&Tokens> = chunk.iter().map(|&i| &tokens[i]).collect();
        let pooled = encoder.embed(&refs)?.pooled;
        for (j, &i) in chunk.iter().enumerate() {
            rows[i] = Some(pooled.get(j)?);
        }
    }
    let rows: Vec<Tensor> = rows.into_iter().flatten().collect();
    Ok(Tensor::stack(&rows, 0)?)
}
