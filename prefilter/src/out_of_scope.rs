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
    /// The served method: `knn_top_labels`, `knn` or `msp`.
    pub method: OosMethod,
    /// Neighbours averaged (k-NN).
    pub k: usize,
    /// Labels whose rows are searched per query (`knn_top_labels`).
    #[serde(default)]
    pub top_labels: usize,
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
#[derive(Clone)]
pub struct OutOfScope {
    /// The score.
    pub method: OosMethod,
    /// Scores above it are called out of scope.
    pub threshold: f32,
    /// Neighbours averaged (k-NN).
    pub k: usize,
    /// Unit reference embeddings `[rows, hidden]` (k-NN), on the CPU.
    reference: Option<Tensor>,
    /// The same rows as an int8 layer (CPUs with AVX-512 VNNI): the cosines come from one int8 product, a
    /// quarter of the memory traffic of the f32 one (which made the score cost ~1 ms per query).
    int8: Option<std::sync::Arc<tiergate_kernels::int8::QDense>>,
    /// For [`OosMethod::KnnTopLabels`]: the reference rows grouped by label.
    by_label: Option<std::sync::Arc<ByLabel>>,
}

/// Reference rows grouped by label: each label's rows are searched only for queries Tier-0 thinks may be it.
struct ByLabel {
    /// Labels searched per query.
    top: usize,
    /// Label `l`'s rows are `offsets[l]..offsets[l + 1]` of `rows`.
    offsets: Vec<usize>,
    /// Unit rows sorted by label, `[rows · hidden]`.
    rows: Vec<f32>,
    hidden: usize,
    /// Each label's rows as an int8 layer (CPUs with AVX-512 VNNI).
    int8: Vec<Option<tiergate_kernels::int8::QDense>>,
    /// The label of each sorted row (what `oos.safetensors` stores).
    labels: Vec<u32>,
}

impl ByLabel {
    fn new(unit: &[Vec<f32>], labels: &[u32], n_labels: usize, top: usize) -> Self {
        let hidden = unit.first().map_or(0, Vec::len);
        let mut order: Vec<usize> = (0..unit.len()).collect();
        order.sort_by_key(|&i| labels[i]);
        let mut offsets = vec![0usize; n_labels + 1];
        for &l in labels {
            offsets[(l as usize).min(n_labels - 1) + 1] += 1;
        }
        for l in 0..n_labels {
            offsets[l + 1] += offsets[l];
        }
        let rows: Vec<f32> = order
            .iter()
            .flat_map(|&i| unit[i].iter().copied())
            .collect();
        let vnni = tiergate_kernels::int8::available();
        let int8 = (0..n_labels)
            .map(|l| {
                let (a, b) = (offsets[l], offsets[l + 1]);
                (vnni && b > a).then(|| {
                    let zeros = vec![0f32; b - a];
                    tiergate_kernels::int8::QDense::new(
                        &rows[a * hidden..b * hidden],
                        &zeros,
                        b - a,
                        hidden,
                    )
                })
            })
            .collect();
        Self {
            top,
            offsets,
            labels: order.iter().map(|&i| labels[i]).collect(),
            rows,
            hidden,
            int8,
        }
    }

    /// The cosines of unit query `q` to the rows of `labels`.
    fn sims(&self, q: &[f32], labels: &[usize]) -> Vec<f32> {
        let mut out = Vec::new();
        for &l in labels {
            let (a, b) = (self.offsets[l], self.offsets[l + 1]);
            match self.int8.get(l).and_then(Option::as_ref) {
                Some(layer) => out.extend(layer.forward(q, 1)),
                None => out.extend(
                    self.rows[a * self.hidden..b * self.hidden]
                        .chunks(self.hidden)
                        .map(|r| r.iter().zip(q).map(|(x, y)| x * y).sum::<f32>()),
                ),
            }
        }
        out
    }
}

impl OutOfScope {
    /// The maximum-softmax-probability scorer (no reference data): `1 − max p > threshold` is out of scope.
    pub fn msp(threshold: f32) -> Self {
        Self {
            method: OosMethod::Msp,
            threshold,
            k: 0,
            reference: None,
            int8: None,
            by_label: None,
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
        let unit = l2_normalize(&reference.to_dtype(candle_core::DType::F32)?)?;
        let int8 = if tiergate_kernels::int8::available() {
            let (rows, hidden) = unit.dims2()?;
            let w = unit.flatten_all()?.to_vec1::<f32>()?;
            let b = vec![0f32; rows];
            Some(std::sync::Arc::new(tiergate_kernels::int8::QDense::new(
                &w, &b, rows, hidden,
            )))
        } else {
            None
        };
        Ok(Self {
            method: OosMethod::Knn,
            threshold,
            k,
            reference: Some(unit),
            int8,
            by_label: None,
        })
    }

    /// The k-NN scorer over the rows of each query's `top` most likely labels only ([`OosMethod::KnnTopLabels`]):
    /// `reference` `[rows, hidden]` (normalised here), `labels[i]` the label of row `i` among `n_labels`.
    pub fn knn_top_labels(
        reference: &Tensor,
        labels: &[u32],
        n_labels: usize,
        top: usize,
        k: usize,
        threshold: f32,
    ) -> Result<Self> {
        let (rows, _) = reference.dims2()?;
        if rows == 0 || k == 0 || top == 0 || labels.len() != rows || n_labels == 0 {
            return Err(PrefilterError::Training(format!(
                "top-label k-NN needs rows, k >= 1, top >= 1 and one label per row: {rows} rows, {} labels, k = {k}, top = {top}",
                labels.len()
            )));
        }
        if let Some(&bad) = labels.iter().find(|&&l| l as usize >= n_labels) {
            return Err(PrefilterError::Training(format!(
                "reference label {bad} is not below {n_labels}"
            )));
        }
        let unit = l2_normalize(&reference.to_dtype(candle_core::DType::F32)?)?;
        let by_label = ByLabel::new(&unit.to_vec2::<f32>()?, labels, n_labels, top);
        Ok(Self {
            method: OosMethod::KnnTopLabels,
            threshold,
            k,
            reference: Some(unit),
            int8: None,
            by_label: Some(std::sync::Arc::new(by_label)),
        })
    }

    /// The same scorer with another threshold.
    pub fn with_threshold(mut self, threshold: f32) -> Self {
        self.threshold = threshold;
        self
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
        if let Some(g) = &self.by_label {
            let q = q.to_vec2::<f32>()?;
            return Ok(q
                .iter()
                .zip(probs)
                .map(|(q, p)| mean_of_top(&mut g.sims(q, &oos::top_labels(p, g.top)), self.k))
                .collect());
        }
        // One matrix product per batch: the cosine of every input to every reference row.
        let sims = match &self.int8 {
            Some(layer) => {
                let (m, _) = q.dims2()?;
                let rows = layer.out_features();
                let flat = layer.forward(&q.flatten_all()?.to_vec1::<f32>()?, m);
                flat.chunks(rows.max(1)).map(<[f32]>::to_vec).collect()
            }
            None => q.matmul(&reference.t()?)?.to_vec2::<f32>()?,
        };
        Ok(sims
            .into_iter()
            .map(|mut s| mean_of_top(&mut s, self.k))
            .collect())
    }

    /// Writes `oos.json` (+ `oos.safetensors` for k-NN) into `dir`.
    pub fn save(&self, dir: &Path, meta: &OosMeta) -> Result<()> {
        if let Some(r) = &self.reference {
            let path = dir.join("oos.safetensors");
            let mut tensors: HashMap<String, Tensor> =
                [("reference".to_string(), r.clone())].into();
            if let Some(g) = &self.by_label {
                // Rows sorted by label, as they are kept.
                let n = g.labels.len();
                let sorted = Tensor::from_vec(g.rows.clone(), (n, g.hidden), &Device::Cpu)?;
                tensors.insert("reference".into(), sorted);
                tensors.insert(
                    "labels".into(),
                    Tensor::from_vec(g.labels.clone(), n, &Device::Cpu)?,
                );
            }
            candle_core::safetensors::save(&tensors, &path)
                .map_err(|e| PrefilterError::file(&path, e))?;
        }
        let path = dir.join("oos.json");
        let text =
            serde_json::to_string_pretty(meta).map_err(|e| PrefilterError::corrupt(&path, e))?;
        std::fs::write(&path, text).map_err(|e| PrefilterError::file(&path, e))
    }

    /// Reads `dir/oos.json` (and its reference) when present; `hidden` is the head's embedding width,
    /// `n_labels` its label count.
    pub fn load(dir: &Path, hidden: usize, n_labels: usize) -> Result<Option<(Self, OosMeta)>> {
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
        let scorer = match meta.method {
            OosMethod::Msp => Self::msp(meta.threshold),
            OosMethod::Knn | OosMethod::KnnTopLabels => {
                let weights = dir.join("oos.safetensors");
                let tensors = candle_core::safetensors::load(&weights, &Device::Cpu)
                    .map_err(|e| PrefilterError::corrupt(&weights, e))?;
                let get = |name: &str| {
                    tensors.get(name).ok_or_else(|| {
                        PrefilterError::corrupt(&weights, format!("tensor `{name}` missing"))
                    })
                };
                let r = get("reference")?;
                if r.dims().len() != 2 || r.dims()[1] != hidden {
                    return Err(PrefilterError::corrupt(
                        &weights,
                        format!("reference {:?} is not [rows, {hidden}]", r.dims()),
                    ));
                }
                let scorer = if meta.method == OosMethod::Knn {
                    Self::knn(r, meta.k, meta.threshold)
                } else {
                    let labels = get("labels")?
                        .to_dtype(candle_core::DType::U32)
                        .and_then(|t| t.to_vec1::<u32>())
                        .map_err(|e| PrefilterError::corrupt(&weights, e))?;
                    Self::knn_top_labels(
                        r,
                        &labels,
                        n_labels,
                        meta.top_labels,
                        meta.k,
                        meta.threshold,
                    )
                };
                scorer.map_err(|e| PrefilterError::corrupt(&path, e))?
            }
            other => {
                return Err(PrefilterError::corrupt(
                    &path,
                    format!(
                        "method `{}` is not served (knn_top_labels, knn or msp)",
                        other.name()
                    ),
                ))
            }
        };
        Ok(Some((scorer, meta)))
    }
}

impl std::fmt::Debug for OutOfScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutOfScope")
            .field("method", &self.method)
            .field("threshold", &self.threshold)
            .field("k", &self.k)
            .field("reference_rows", &self.reference_rows())
            .field("int8", &self.int8.is_some())
            .finish()
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
            // The int8 product (CPUs with VNNI) is within its quantisation error of the f32 one.
            assert!((want - g).abs() < 2e-2, "{want} vs {g}");
        }
        assert!(got[0] < 0.01 && got[1] > 0.99, "{got:?}");
    }

    /// Where the CPU has VNNI, the int8 product's scores stay within a few thousandths of the f32 product's on
    /// embedding-like data (384 wide, 500 rows).
    #[test]
    fn the_int8_product_scores_like_the_f32_one() {
        let mut seed = 7u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) as f32 / (1u64 << 31) as f32) - 0.5
        };
        let reference: Vec<f32> = (0..500 * 384).map(|_| next()).collect();
        let queries: Vec<f32> = (0..8 * 384).map(|_| next()).collect();
        let r = Tensor::from_vec(reference, (500, 384), &Device::Cpu).unwrap();
        let q = Tensor::from_vec(queries, (8, 384), &Device::Cpu).unwrap();
        let s = OutOfScope::knn(&r, 5, 0.5).unwrap();
        let mut f32_only = s.clone();
        f32_only.int8 = None;
        let (a, b) = (
            s.scores(&q, &[]).unwrap(),
            f32_only.scores(&q, &[]).unwrap(),
        );
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() < 5e-3, "{x} vs {y}");
        }
    }

    /// Top-label k-NN searches only the rows of the query's most likely labels, and round-trips through disk.
    #[test]
    fn top_label_knn_searches_the_likely_labels_only() {
        // Rows 0, 1 are label 0 (x axis), rows 2, 3 label 1 (y axis).
        let s = OutOfScope::knn_top_labels(&reference(), &[0, 0, 1, 1], 2, 1, 2, 0.5).unwrap();
        let q = Tensor::from_vec(vec![1.0f32, 0.0, 0.0], (1, 3), &Device::Cpu).unwrap();
        let near = s.scores(&q, &[vec![0.9, 0.1]]).unwrap()[0];
        let far = s.scores(&q, &[vec![0.1, 0.9]]).unwrap()[0];
        // Searching label 0: the two x-axis rows; searching label 1 only: the y-axis rows, cosine ~0.1.
        assert!(near < 0.01 && far > 0.85, "{near} {far}");
        let dir = tempfile::tempdir().unwrap();
        let meta = OosMeta {
            format: OOS_FORMAT,
            method: OosMethod::KnnTopLabels,
            k: 2,
            top_labels: 1,
            threshold: 0.5,
            recall_target: 0.95,
            dev_rows: 4,
            dev_oos_rows: 0,
            dev_oos_recall: None,
        };
        s.save(dir.path(), &meta).unwrap();
        let (back, _) = OutOfScope::load(dir.path(), 3, 2).unwrap().unwrap();
        assert_eq!(back.method, OosMethod::KnnTopLabels);
        let again = back.scores(&q, &[vec![0.1, 0.9]]).unwrap()[0];
        assert!((again - far).abs() < 1e-6);
        // A label beyond the head's is refused.
        assert!(OutOfScope::load(dir.path(), 3, 1).is_err());
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
            method: OosMethod::Knn,
            k: 2,
            top_labels: 0,
            threshold: 0.25,
            recall_target: 0.95,
            dev_rows: 4,
            dev_oos_rows: 0,
            dev_oos_recall: None,
        };
        s.save(dir.path(), &meta).unwrap();
        let (back, m) = OutOfScope::load(dir.path(), 3, 2).unwrap().unwrap();
        assert_eq!(m, meta);
        assert_eq!(
            (back.method, back.k, back.threshold),
            (OosMethod::Knn, 2, 0.25)
        );
        assert_eq!(back.reference_rows(), 4);
        // A head of another width is refused, naming the file.
        let e = OutOfScope::load(dir.path(), 4, 2).unwrap_err().to_string();
        assert!(e.contains("oos.safetensors"), "{e}");
        // An unknown method is refused, and so is one that is measured but not served.
        let mut v = serde_json::to_value(&meta).unwrap();
        v["method"] = "energy".into();
        std::fs::write(dir.path().join("oos.json"), v.to_string()).unwrap();
        let e = OutOfScope::load(dir.path(), 3, 2).unwrap_err().to_string();
        assert!(e.contains("energy"), "{e}");
        let boundary = OosMeta {
            method: OosMethod::Boundary,
            ..meta
        };
        std::fs::write(
            dir.path().join("oos.json"),
            serde_json::to_string(&boundary).unwrap(),
        )
        .unwrap();
        let e = OutOfScope::load(dir.path(), 3, 2).unwrap_err().to_string();
        assert!(e.contains("`boundary` is not served"), "{e}");
        assert!(OutOfScope::load(&dir.path().join("none"), 3, 2)
            .unwrap()
            .is_none());
    }
}
