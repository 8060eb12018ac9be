//! The out-of-scope scorer a head serves with: which score ([`crate::oos`]), its threshold, and for k-NN the
//! reference embeddings. `tiergate train` fits it (the training rows' embeddings, the threshold for a target
//! in-scope recall on the dev split) and writes `oos.json` + `oos.safetensors` beside the head; a head without
//! them can still serve the maximum softmax probability with a configured threshold.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::encoder::{l2_normalize, read_json};
use crate::error::{PrefilterError, Result};
use crate::oos::{self, OosMethod};

/// `oos.json`: the served score and how its threshold was fitted.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OosMeta {
    /// Format version of this file.
    pub format: u32,
    /// `knn` or `msp`.
    pub method: String,
    /// Neighbours averaged (k-NN).
    pub k: usize,
    /// Scores above it are called out of scope.
    pub threshold: f32,
    /// The in-scope recall the threshold was fitted for on the dev split.
    pub recall_target: f64,
    /// Dev rows it was fitted on (in scope).
    pub dev_rows: usize,
    /// Out-of-scope dev rows (`tiergate train --oos-label`), and the share of them called out of scope.
    #[serde(default)]
    pub dev_oos_rows: usize,
    #[serde(default)]
    pub dev_oos_recall: Option<f64>,
}

/// Current `oos.json` format.
pub const OOS_FORMAT: u32 = 1;

/// A fitted out-of-scope scorer.
#[derive(Debug, Clone)]
pub struct OutOfScope {
    /// The score.
    pub method: OosMethod,
    /// Scores above it are called out of scope.
    pub threshold: f32,
    /// Neighbours averaged (k-NN).
    pub k: usize,
    /// Unit reference embeddings `[rows, hidden]` (k-NN), on the CPU.
    reference: Option<Tensor>,
}

impl OutOfScope {
    /// The maximum-softmax-probability scorer (no reference data): `1 − max p > threshold` is out of scope.
    pub fn msp(threshold: f32) -> Self {
        Self {
            method: OosMethod::Msp,
            threshold,
            k: 0,
            reference: None,
        }
    }

    /// The k-NN scorer over `reference` (`[rows, hidden]`, normalised here).
    pub fn knn(reference: &Tensor, k: usize, threshold: f32) -> Result<Self> {
        if reference.dims().len() != 2 || reference.dims()[0] == 0 || k == 0 {
            return Err(PrefilterError::Training(format!(
                "k-NN out-of-scope scoring needs k >= 1 and reference rows, got k = {k}, shape {:?}",
                reference.dims()
            )));
        }
        Ok(Self {
            method: OosMethod::Knn,
            threshold,
            k,
            reference: Some(l2_normalize(&reference.to_dtype(candle_core::DType::F32)?)?),
        })
    }

    /// Reference rows (0 for msp).
    pub fn reference_rows(&self) -> usize {
        self.reference.as_ref().map_or(0, |r| r.dims()[0])
    }

    /// The score of each input: `pooled` `[batch, hidden]` embeddings, `probs` their calibrated distributions.
    pub fn scores(&self, pooled: &Tensor, probs: &[Vec<f32>]) -> Result<Vec<f32>> {
        let Some(reference) = &self.reference else {
            return Ok(probs.iter().map(|p| oos::msp(p)).collect());
        };
        let q = l2_normalize(&pooled.to_dtype(candle_core::DType::F32)?)?;
        // One matrix product per batch: the cosine of every input to every reference row.
        let sims = q.matmul(&reference.t()?)?.to_vec2::<f32>()?;
        Ok(sims
            .into_iter()
            .map(|mut s| mean_of_top(&mut s, self.k))
            .collect())
    }

    /// Writes `oos.json` (+ `oos.safetensors` for k-NN) into `dir`.
    pub fn save(&self, dir: &Path, meta: &OosMeta) -> Result<()> {
        if let Some(r) = &self.reference {
            let path = dir.join("oos.safetensors");
            let tensors: HashMap<String, Tensor> = [("reference".to_string(), r.clone())].into();
            candle_core::safetensors::save(&tensors, &path)
                .map_err(|e| PrefilterError::file(&path, e))?;
        }
        let path = dir.join("oos.json");
        let text =
            serde_json::to_string_pretty(meta).map_err(|e| PrefilterError::corrupt(&path, e))?;
        std::fs::write(&path, text).map_err(|e| PrefilterError::file(&path, e))
    }

    /// Reads `dir/oos.json` (and its reference) when present; `hidden` is the head's embedding width.
    pub fn load(dir: &Path, hidden: usize) -> Result<Option<(Self, OosMeta)>> {
        let path = dir.join("oos.json");
        if !path.is_file() {
            return Ok(None);
        }
        let meta: OosMeta = read_json(&path)?;
        if meta.format != OOS_FORMAT {
            return Err(PrefilterError::corrupt(
                &path,
                format!(
                    "format {} is not supported (expected {OOS_FORMAT})",
                    meta.format
                ),
            ));
        }
        if !meta.threshold.is_finite() {
            return Err(PrefilterError::corrupt(&path, "threshold must be a number"));
        }
        let scorer = match meta.method.as_str() {
            "msp" => Self::msp(meta.threshold),
            "knn" => {
                let weights = dir.join("oos.safetensors");
                let tensors = candle_core::safetensors::load(&weights, &Device::Cpu)
                    .map_err(|e| PrefilterError::corrupt(&weights, e))?;
                let r = tensors.get("reference").ok_or_else(|| {
                    PrefilterError::corrupt(&weights, "tensor `reference` missing")
                })?;
                if r.dims().len() != 2 || r.dims()[1] != hidden {
                    return Err(PrefilterError::corrupt(
                        &weights,
                        format!("reference {:?} is not [rows, {hidden}]", r.dims()),
                    ));
                }
                Self::knn(r, meta.k, meta.threshold)
                    .map_err(|e| PrefilterError::corrupt(&path, e))?
            }
            other => {
                return Err(PrefilterError::corrupt(
                    &path,
                    format!("method `{other}` is not served (knn or msp)"),
                ))
            }
        };
        Ok(Some((scorer, meta)))
    }
}

/// 1 − the mean of the `k` largest of `sims` (1 when empty).
fn mean_of_top(sims: &mut [f32], k: usize) -> f32 {
    let k = k.min(sims.len());
    if k == 0 {
        return 1.0;
    }
    sims.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
    1.0 - sims[..k].iter().sum::<f32>() / k as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grounding::unit;

    fn reference() -> Tensor {
        let rows: Vec<f32> = [
            [1.0, 0.1, 0.0],
            [1.0, -0.1, 0.0],
            [0.1, 1.0, 0.0],
            [-0.1, 1.0, 0.0],
        ]
        .concat();
        Tensor::from_vec(rows, (4, 3), &Device::Cpu).unwrap()
    }

    /// The batched score is the per-query k-NN distance of `crate::oos`, and separates a query off every label.
    #[test]
    fn batched_knn_matches_the_reference_score() {
        let s = OutOfScope::knn(&reference(), 2, 0.5).unwrap();
        let queries = [[2.0f32, 0.05, 0.0], [0.0, 0.0, 1.0], [0.3, 0.3, 0.1]];
        let pooled = Tensor::from_vec(queries.concat(), (3, 3), &Device::Cpu).unwrap();
        let got = s.scores(&pooled, &[vec![], vec![], vec![]]).unwrap();
        let rows: Vec<Vec<f32>> = reference()
            .to_vec2::<f32>()
            .unwrap()
            .iter()
            .map(|r| unit(r))
            .collect();
        for (q, g) in queries.iter().zip(&got) {
            let want = oos::knn_distance(q, &rows, 2);
            assert!((want - g).abs() < 1e-5, "{want} vs {g}");
        }
        assert!(got[0] < 0.01 && got[1] > 0.99, "{got:?}");
    }

    #[test]
    fn msp_needs_no_reference() {
        let s = OutOfScope::msp(0.4);
        let pooled = Tensor::zeros((2, 3), candle_core::DType::F32, &Device::Cpu).unwrap();
        let got = s
            .scores(&pooled, &[vec![0.9, 0.1], vec![0.5, 0.5]])
            .unwrap();
        assert!((got[0] - 0.1).abs() < 1e-6 && (got[1] - 0.5).abs() < 1e-6);
        assert_eq!(s.reference_rows(), 0);
    }

    #[test]
    fn saved_and_loaded_alike_and_bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let s = OutOfScope::knn(&reference(), 2, 0.25).unwrap();
        let meta = OosMeta {
            format: OOS_FORMAT,
            method: "knn".into(),
            k: 2,
            threshold: 0.25,
            recall_target: 0.95,
            dev_rows: 4,
            dev_oos_rows: 0,
            dev_oos_recall: None,
        };
        s.save(dir.path(), &meta).unwrap();
        let (back, m) = OutOfScope::load(dir.path(), 3).unwrap().unwrap();
        assert_eq!(m, meta);
        assert_eq!(
            (back.method, back.k, back.threshold),
            (OosMethod::Knn, 2, 0.25)
        );
        assert_eq!(back.reference_rows(), 4);
        // A head of another width is refused, naming the file.
        let e = OutOfScope::load(dir.path(), 4).unwrap_err().to_string();
        assert!(e.contains("oos.safetensors"), "{e}");
        // An unknown method is refused.
        std::fs::write(
            dir.path().join("oos.json"),
            serde_json::to_string(&OosMeta {
                method: "energy".into(),
                ..meta
            })
            .unwrap(),
        )
        .unwrap();
        let e = OutOfScope::load(dir.path(), 3).unwrap_err().to_string();
        assert!(e.contains("energy"), "{e}");
        assert!(OutOfScope::load(&dir.path().join("none"), 3)
            .unwrap()
            .is_none());
    }
}
