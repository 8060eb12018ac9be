//! A complete Tier-0 classifier: tokenizer + encoder + head, loaded from config or from a folder.

use std::path::Path;

use tiergate_config::{HeadConfig, PoolingConfig, Precision, PrefilterConfig};

pub use crate::encoder::embed_texts;
use crate::encoder::{mmap_weights, Encoder};
use crate::error::{PrefilterError, Result};
use crate::heads::{self, Head};
use crate::tokenize::{TextTokenizer, Tokens};

/// One `Vec<f32>` per input.
pub type Rows = Vec<Vec<f32>>;

/// Tokenizer, encoder and head, used from one thread at a time (the batching thread owns it at run time).
pub struct Classifier {
    /// The tokenizer (shared with callers so they can tokenise outside the model thread).
    pub tokenizer: std::sync::Arc<TextTokenizer>,
    /// The encoder.
    pub encoder: Encoder,
    /// The head.
    pub head: Head,
    /// Reply text per label (answer routes), where configured.
    pub replies: Vec<Option<String>>,
    /// One sentence per label saying what it means, where given (shown to the judge).
    pub descriptions: Vec<Option<String>>,
    /// Example utterances per label (few-shot examples, or a trained head's representatives).
    pub examples: Vec<Vec<String>>,
    /// The fusion fitted for this head (`fusion.json` in a trained head's folder).
    pub fusion: Option<crate::heads::FittedFusion>,
    /// The fits of cascade stages after the first (`fusion.STAGE.json`), by stage name.
    pub stage_fusions: Vec<(String, crate::heads::FittedFusion)>,
    /// The held-out labelled rows `mode = "risk"` bounds Tier-0's error with (`calibration.json` in a
    /// trained head's folder).
    pub calibration: Option<crate::risk_rows::CalibrationRows>,
    /// The examples with their embeddings, once [`Classifier::ground`] ran: predictions then carry the
    /// query's embedding so the examples nearest it can be shown to a judge.
    pub representatives: Option<std::sync::Arc<crate::grounding::Representatives>>,
    /// Predictions carry the query's pooled embedding even when not grounded (the answer cache's semantic
    /// lookup reads it).
    pub keep_embeddings: bool,
    /// The out-of-scope scorer (`oos.json` in a trained head's folder, or one set by the server for a route).
    pub out_of_scope: Option<crate::out_of_scope::OutOfScope>,
    /// A trained head's identity and held-out figures (none for few-shot and checkpoint heads).
    pub trained: Option<TrainedFacts>,
}

/// What a trained head's folder says about it.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainedFacts {
    /// [`crate::heads::fingerprint`].
    pub fingerprint: String,
    /// Its dev accuracy as trained (or distilled).
    pub dev_accuracy: f64,
    /// The draw of its dev rows.
    pub split: Option<crate::heads::TrainSplit>,
    /// Why a fit in its folder is not used (fitted for another head), when one is not.
    pub notes: Vec<String>,
}

/// What one forward computes per input.
#[derive(Debug, Default)]
pub struct Forward {
    /// Calibrated probabilities.
    pub probs: Rows,
    /// Pooled embeddings when grounded or asked for (else empty rows).
    pub embeddings: Rows,
    /// Out-of-scope scores when the classifier has a scorer (else empty).
    pub oos: Vec<f32>,
}

impl Classifier {
    /// Builds the classifier a [`PrefilterConfig`] describes.
    pub fn from_config(cfg: &PrefilterConfig) -> Result<Self> {
        match &cfg.head {
            HeadConfig::Trained(t) => Self::from_trained_dir(&t.dir, cfg.max_tokens, cfg.precision),
            HeadConfig::Checkpoint => {
                Self::from_checkpoint_dir(&cfg.encoder, cfg.max_tokens, cfg.precision)
            }
            HeadConfig::FewShot {
                labels,
                temperature,
            } => {
                let (tokenizer, mut encoder) =
                    load_encoder(&cfg.encoder, cfg.pooling, cfg.max_tokens)?;
                // Before the label embeddings, so examples and queries go through the same arithmetic.
                encoder.set_precision(cfg.precision)?;
                let mut embeddings = Vec::with_capacity(labels.len());
                for l in labels {
                    let texts: Vec<&str> = l
                        .examples
                        .iter()
                        .map(|s| s.trim())
                        .filter(|s| !s.is_empty())
                        .collect();
                    embeddings.push(embed_texts(&tokenizer, &encoder, &texts, 32)?);
                }
                let names = labels.iter().map(|l| l.label.clone()).collect();
                let head = Head::few_shot(names, embeddings, *temperature)?;
                Ok(Self {
                    tokenizer: tokenizer.into(),
                    encoder,
                    head,
                    replies: labels.iter().map(|l| l.reply.clone()).collect(),
                    descriptions: labels.iter().map(|l| l.description.clone()).collect(),
                    examples: labels.iter().map(|l| l.examples.clone()).collect(),
                    fusion: None,
                    stage_fusions: Vec::new(),
                    calibration: None,
                    representatives: None,
                    keep_embeddings: false,
                    out_of_scope: None,
                    trained: None,
                })
            }
        }
    }

    /// Embeds the examples so that predictions carry the query's embedding and examples can be ranked by
    /// nearness to it (`crate::grounding`).
    pub fn ground(&mut self) -> Result<()> {
        if self.representatives.is_none() {
            let r = crate::grounding::Representatives::embed(
                &self.tokenizer,
                &self.encoder,
                &self.examples,
            )?;
            self.representatives = Some(std::sync::Arc::new(r));
        }
        Ok(())
    }

    /// The label's examples, nearest `query` first when grounded (else as stored).
    pub fn examples_for(&self, label: usize, query: &[f32]) -> Vec<String> {
        match &self.representatives {
            Some(r) => r.nearest(label, query),
            None => self.examples.get(label).cloned().unwrap_or_default(),
        }
    }

    /// Loads `dir` as either a folder written by `tiergate train` (it has `head.json`) or a Hugging Face
    /// sequence-classification checkpoint.
    pub fn from_dir(dir: &Path, max_tokens: usize, precision: Precision) -> Result<Self> {
        if dir.join("head.json").is_file() {
            Self::from_trained_dir(dir, max_tokens, precision)
        } else if dir.join("config.json").is_file() {
            Self::from_checkpoint_dir(dir, max_tokens, precision)
        } else {
            Err(PrefilterError::file(
                dir,
                "neither head.json (a `tiergate train` folder) nor config.json (a checkpoint) found",
            ))
        }
    }

    fn from_trained_dir(dir: &Path, max_tokens: usize, precision: Precision) -> Result<Self> {
        let (meta, head) = heads::load_trained(dir)?;
        let encoder_dir = meta.encoder_dir(dir);
        let (tokenizer, mut encoder) = load_encoder(&encoder_dir, PoolingConfig::Auto, max_tokens)?;
        encoder.set_precision(precision)?;
        if encoder.hidden_size() != meta.hidden_size {
            return Err(PrefilterError::corrupt(
                dir.join("head.json"),
                format!(
                    "head expects {} hidden units but {} has {}",
                    meta.hidden_size,
                    encoder_dir.display(),
                    encoder.hidden_size()
                ),
            ));
        }
        let replies = vec![None; head.labels.len()];
        let mut examples = meta.examples.clone();
        examples.resize(head.labels.len(), Vec::new());
        let mut descriptions = meta.descriptions.clone();
        descriptions.resize(head.labels.len(), None);
        let fingerprint = crate::heads::fingerprint(dir)?;
        let mut notes = Vec::new();
        let mut own = |f: crate::heads::FittedFusion, file: String| match &f.head {
            Some(h) if *h != fingerprint => {
                let note = format!(
                    "{file} was fitted for head {h}, not this one ({fingerprint}): not used"
                );
                tracing::warn!(dir = %dir.display(), "{note}");
                notes.push(note);
                None
            }
            _ => Some(f),
        };
        let fusion = crate::heads::FittedFusion::load(dir)?
            .and_then(|f| own(f, crate::heads::FittedFusion::FILE.to_string()));
        let stage_fusions = crate::heads::FittedFusion::load_stages(dir)?
            .into_iter()
            .filter_map(|(st, f)| {
                let file = crate::heads::FittedFusion::stage_file(&st);
                Some((st, own(f, file)?))
            })
            .collect();
        let trained = Some(TrainedFacts {
            fingerprint: fingerprint.clone(),
            dev_accuracy: meta.dev.accuracy,
            split: meta.split,
            notes,
        });
        Ok(Self {
            tokenizer: tokenizer.into(),
            encoder,
            head,
            replies,
            descriptions,
            examples,
            fusion,
            stage_fusions,
            calibration: crate::risk_rows::CalibrationRows::load(dir)?,
            representatives: None,
            keep_embeddings: false,
            out_of_scope: crate::out_of_scope::OutOfScope::load(
                dir,
                meta.hidden_size,
                meta.labels.len(),
            )?
            .map(|(s, _)| s),
            trained,
        })
    }

    fn from_checkpoint_dir(dir: &Path, max_tokens: usize, precision: Precision) -> Result<Self> {
        let tokenizer = TextTokenizer::from_file(&dir.join("tokenizer.json"), max_tokens)?;
        let vb = mmap_weights(dir, &candle_core::Device::Cpu)?;
        let mut encoder = Encoder::load(
            dir,
            PoolingConfig::Cls,
            vb.clone(),
            tokenizer.pad_id(),
            false,
        )?;
        encoder.set_precision(precision)?;
        let head = Head::from_checkpoint(&encoder, &vb)?;
        let replies = vec![None; head.labels.len()];
        let descriptions = vec![None; head.labels.len()];
        let examples = vec![Vec::new(); head.labels.len()];
        Ok(Self {
            tokenizer: tokenizer.into(),
            encoder,
            head,
            replies,
            descriptions,
            examples,
            fusion: None,
            stage_fusions: Vec::new(),
            calibration: None,
            representatives: None,
            keep_embeddings: false,
            out_of_scope: None,
            trained: None,
        })
    }

    /// Label names in probability order.
    pub fn labels(&self) -> &[String] {
        &self.head.labels
    }

    /// Calibrated label probabilities for a batch of tokenised inputs, one row per input.
    pub fn probabilities(&self, inputs: &[&Tokens]) -> Result<Vec<Vec<f32>>> {
        Ok(self.forward(inputs)?.probs)
    }

    /// Probabilities; when grounded the pooled embedding of each input; with a scorer the out-of-scope scores.
    pub fn forward(&self, inputs: &[&Tokens]) -> Result<Forward> {
        if inputs.is_empty() {
            return Ok(Forward::default());
        }
        let x = self.encoder.embed(inputs)?;
        let probs = self.head.probabilities(&x)?.to_vec2::<f32>()?;
        let embeddings = if self.representatives.is_some() || self.keep_embeddings {
            x.pooled.to_vec2::<f32>()?
        } else {
            vec![Vec::new(); probs.len()]
        };
        let oos = match &self.out_of_scope {
            Some(s) => s.scores(&x.pooled, &probs)?,
            None => Vec::new(),
        };
        Ok(Forward {
            probs,
            embeddings,
            oos,
        })
    }
}

/// Loads the tokenizer and encoder of a folder.
pub fn load_encoder(
    dir: &Path,
    pooling: PoolingConfig,
    max_tokens: usize,
) -> Result<(TextTokenizer, Encoder)> {
    let tokenizer = TextTokenizer::from_file(&dir.join("tokenizer.json"), max_tokens)?;
    let vb = mmap_weights(dir, &candle_core::Device::Cpu)?;
    let encoder = Encoder::load(dir, pooling, vb, tokenizer.pad_id(), false)?;
    Ok((tokenizer, encoder))
}
