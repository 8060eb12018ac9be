//! A llama-family decoder over GGUF weights (`llama` and `qwen2`), written for scoring rather than generation.
//!
//! candle-transformers' `quantized_llama` returns the logits of the last position only and keeps one linear
//! KV cache per model, so scoring k candidates after one prompt takes k forwards (or k model clones fed one
//! token at a time). This forward takes explicit positions, an optional past (keys/values of earlier
//! tokens, possibly several unrelated prefixes concatenated) and a block mask, and returns the final hidden
//! state of every position: all candidates of a rerank go through one forward, each seeing only its own
//! prefix. Weight names follow the GGUF layout: `llama` with the interleaved RoPE (as `quantized_llama`),
//! `qwen2` with biases on the q/k/v projections and the half-split RoPE (as `quantized_qwen2`).

use std::ops::Range;
use std::path::Path;

use candle_core::quantized::{gguf_file, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor, D};
use tiergate_kernels::int8::QDense;

/// The architectures this forward runs (`general.architecture` in the GGUF file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama and its look-alikes (SmolLM2): no projection biases, interleaved RoPE pairs.
    Llama,
    /// Qwen2 / Qwen2.5: biases on q, k and v, RoPE over the two halves of a head.
    Qwen2,
}

impl Arch {
    /// The metadata key prefix and the name in `general.architecture`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [Self::Llama, Self::Qwen2]
            .into_iter()
            .find(|a| a.name() == s)
    }
}

/// Shapes read from the GGUF metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// Architecture.
    pub arch: Arch,
    /// Vocabulary size.
    pub vocab: usize,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention).
    pub n_kv_head: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Residual width.
    pub hidden: usize,
    /// RMS-norm epsilon.
    pub eps: f64,
    /// Longest position the RoPE tables cover.
    pub max_positions: usize,
}

/// How the projection weights are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    /// As stored in the file (candle's quantized kernels; activations are quantized to 8 bits).
    Quantized,
    /// Dequantised to f32 at load (about 4x the memory, ~3-4x faster prefill on CPU; see the README).
    F32,
    /// Re-quantised to 8 bits per output channel at load, activations to 8 bits per row at run time, on
    /// AVX-512 VNNI (the prefilter's int8 kernel, two threads); f32 where the CPU lacks VNNI.
    Int8,
}

/// A projection `y = x·Wᵀ` in one of the formats.
enum Linear {
    Candle(QMatMul),
    /// f32 `Wᵀ`, `[in, out]` contiguous.
    F32T(Tensor),
    Int8(QDense),
}

impl Linear {
    fn load(q: QTensor, format: WeightFormat) -> candle_core::Result<Self> {
        Ok(match format {
            WeightFormat::Quantized => Self::Candle(QMatMul::from_qtensor(q)?),
            WeightFormat::Int8 if tiergate_kernels::int8::available() => {
                let w = q.dequantize(&Device::Cpu)?;
                let (out, k) = w.dims2()?;
                let wv = w.flatten_all()?.to_vec1::<f32>()?;
                Self::Int8(QDense::new(&wv, &vec![0.0; out], out, k))
            }
            WeightFormat::F32 | WeightFormat::Int8 => {
                // Stored transposed and contiguous: candle's matmul runs ~1.3x faster on it than on a
                // transposed view (measured by `reranker/examples/forward_probe.rs`).
                Self::F32T(q.dequantize(&Device::Cpu)?.t()?.contiguous()?)
            }
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        // The 2-D formats see `x` as rows `[m, k]`; the result takes `x`'s shape with `out` last.
        let dims = x.dims().to_vec();
        let k = dims.last().copied().unwrap_or(0);
        let m = x.elem_count() / k.max(1);
        let shaped = |out: usize| {
            let mut shape = dims.clone();
            if let Some(last) = shape.last_mut() {
                *last = out;
            }
            shape
        };
        match self {
            Self::Candle(q) => q.forward(x),
            Self::F32T(wt) => x.reshape((m, k))?.matmul(wt)?.reshape(shaped(wt.dim(1)?)),
            Self::Int8(q) => {
                let xv = x.flatten_all()?.to_vec1::<f32>()?;
                let y = match int8_helper() {
                    Some(h) => tiergate_kernels::int8::with_helper(h, None, || q.forward(&xv, m)),
                    None => q.forward(&xv, m),
                };
                Tensor::from_vec(y, shaped(q.out_features()), &Device::Cpu)
            }
        }
    }
}

/// The thread the int8 layers borrow (`tiergate_kernels::int8::with_helper`: rows, or outputs when there are
/// few rows, split over two threads); none on a one-core machine. One forward runs at a time (the scorer's lock).
fn int8_helper() -> Option<&'static std::sync::Arc<rayon::ThreadPool>> {
    static HELPER: std::sync::OnceLock<Option<std::sync::Arc<rayon::ThreadPool>>> =
        std::sync::OnceLock::new();
    HELPER
        .get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            (cores > 1)
                .then(|| {
                    rayon::ThreadPoolBuilder::new()
                        .num_threads(1)
                        .thread_name(|_| "tiergate-int8-helper".into())
                        .build()
                        .ok()
                })
                .flatten()
                .map(std::sync::Arc::new)
        })
        .as_ref()
}

struct Layer {
    /// q/k/v biases (Qwen2).
    bias: Option<[Tensor; 3]>,
    wq: Linear,
    wk: Linear,
    wv: Linear,
    wo: Linear,
    gate: Linear,
    down: Linear,
    up: Linear,
    attn_norm: Tensor,
    ffn_norm: Tensor,
}

/// The model. Immutable after load: callers keep their own [`KvCache`]s, so one model serves many threads.
pub struct Llama {
    cfg: LlamaConfig,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    output: Linear,
    /// The output projection is the embedding matrix (tied weights): one logit is one dot product with a row.
    tied: bool,
    cos: Tensor,
    sin: Tensor,
    device: Device,
}

/// Keys and values of a processed token sequence, per layer `[1, n_kv_head, len, head_dim]` (RoPE applied).
#[derive(Debug, Clone)]
pub struct KvCache {
    /// `(k, v)` per layer.
    pub layers: Vec<(Tensor, Tensor)>,
    /// Tokens held.
    pub len: usize,
}

impl KvCache {
    /// Several caches side by side (along the sequence axis): the past of a forward whose segments each
    /// see one of them.
    pub fn concat(parts: &[&KvCache]) -> candle_core::Result<KvCache> {
        let Some(first) = parts.first() else {
            candle_core::bail!("no caches to concatenate")
        };
        let mut layers = Vec::with_capacity(first.layers.len());
        for l in 0..first.layers.len() {
            let ks: Vec<&Tensor> = parts.iter().map(|p| &p.layers[l].0).collect();
            let vs: Vec<&Tensor> = parts.iter().map(|p| &p.layers[l].1).collect();
            layers.push((Tensor::cat(&ks, 2)?, Tensor::cat(&vs, 2)?));
        }
        Ok(KvCache {
            layers,
            len: parts.iter().map(|p| p.len).sum(),
        })
    }

    /// Bytes held (for cache accounting).
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|(k, v)| (k.elem_count() + v.elem_count()) * 4)
            .sum()
    }
}

/// A run of new tokens in a forward and what it may attend to.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    /// Its tokens.
    pub tokens: Vec<u32>,
    /// Position of its first token.
    pub start_pos: usize,
    /// Columns of the past it sees (all of them: a whole prefix).
    pub sees_past: Range<usize>,
    /// Earlier segments of the same forward it sees in full.
    pub sees_segments: Vec<usize>,
}

fn md_u32(ct: &gguf_file::Content, key: &str) -> candle_core::Result<usize> {
    match ct.metadata.get(key) {
        Some(v) => Ok(v.to_u32()? as usize),
        None => candle_core::bail!("GGUF metadata `{key}` missing"),
    }
}

fn md_f32(ct: &gguf_file::Content, key: &str) -> Option<f32> {
    ct.metadata.get(key).and_then(|v| v.to_f32().ok())
}

impl Llama {
    /// Loads a `llama` or `qwen2` GGUF file on the CPU. Errors name the file.
    pub fn load(path: &Path, format: WeightFormat) -> candle_core::Result<Self> {
        let named =
            |e: candle_core::Error| candle_core::Error::Msg(format!("{}: {e}", path.display()));
        let device = Device::Cpu;
        let mut file = std::fs::File::open(path).map_err(|e| named(e.into()))?;
        let ct = gguf_file::Content::read(&mut file).map_err(named)?;
        let cfg = read_config(&ct).map_err(named)?;
        let rope_base =
            md_f32(&ct, &format!("{}.rope.freq_base", cfg.arch.name())).unwrap_or(10_000.0);
        let mut get = |name: &str| ct.tensor(&mut file, name, &device).map_err(named);
        let matmul = |q: QTensor| Linear::load(q, format);
        let embed_q = get("token_embd.weight")?;
        let embed = embed_q.dequantize(&device)?;
        let norm = get("output_norm.weight")?.dequantize(&device)?;
        let (output, tied) = match get("output.weight") {
            Ok(t) => (matmul(t)?, false),
            Err(_) => (matmul(embed_q)?, true),
        };
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let mut w = |n: &str| get(&format!("blk.{i}.{n}"));
            let bias = match cfg.arch {
                Arch::Llama => None,
                Arch::Qwen2 => Some([
                    w("attn_q.bias")?.dequantize(&device)?,
                    w("attn_k.bias")?.dequantize(&device)?,
                    w("attn_v.bias")?.dequantize(&device)?,
                ]),
            };
            layers.push(Layer {
                bias,
                wq: matmul(w("attn_q.weight")?)?,
                wk: matmul(w("attn_k.weight")?)?,
                wv: matmul(w("attn_v.weight")?)?,
                wo: matmul(w("attn_output.weight")?)?,
                gate: matmul(w("ffn_gate.weight")?)?,
                down: matmul(w("ffn_down.weight")?)?,
                up: matmul(w("ffn_up.weight")?)?,
                attn_norm: w("attn_norm.weight")?.dequantize(&device)?,
                ffn_norm: w("ffn_norm.weight")?.dequantize(&device)?,
            });
        }
        let (cos, sin) = rope_tables(cfg.head_dim, rope_base, cfg.max_positions, &device)?;
        Ok(Self {
            cfg,
            embed,
            layers,
            norm,
            output,
            tied,
            cos,
            sin,
            device,
        })
    }

    /// The shapes.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    /// Runs `segments` after `past` in one forward. Returns the final-norm hidden state of every new token
    /// (`[n_new, hidden]`, segments in order) and the new tokens' keys/values (one cache, segments in order).
    pub fn forward(
        &self,
        segments: &[Segment],
        past: Option<&KvCache>,
    ) -> candle_core::Result<(Tensor, KvCache)> {
        let past_len = past.map_or(0, |p| p.len);
        let tokens: Vec<u32> = segments.iter().flat_map(|s| s.tokens.clone()).collect();
        let n = tokens.len();
        if n == 0 {
            candle_core::bail!("nothing to run")
        }
        let positions: Vec<u32> = segments
            .iter()
            .flat_map(|s| (s.start_pos..s.start_pos + s.tokens.len()).map(|p| p as u32))
            .collect();
        if positions
            .iter()
            .any(|&p| p as usize >= self.cfg.max_positions)
        {
            candle_core::bail!("position beyond {}", self.cfg.max_positions)
        }
        let views = segment_views(segments, past_len, &self.device)?;
        let pos = Tensor::new(positions.as_slice(), &self.device)?;
        let cos = self.cos.index_select(&pos, 0)?.contiguous()?;
        let sin = self.sin.index_select(&pos, 0)?.contiguous()?;
        let ids = Tensor::new(tokens.as_slice(), &self.device)?;
        let mut x = self.embed.index_select(&ids, 0)?.unsqueeze(0)?;
        let mut kv = Vec::with_capacity(self.layers.len());
        for (i, layer) in self.layers.iter().enumerate() {
            let h = candle_nn::ops::rms_norm(&x, &layer.attn_norm, self.cfg.eps as f32)?;
            let layer_past = past.and_then(|p| p.layers.get(i));
            let (attn, k, v) = self.attention(layer, &h, layer_past, &views, &cos, &sin)?;
            kv.push((k, v));
            x = (x + attn)?;
            let h = candle_nn::ops::rms_norm(&x, &layer.ffn_norm, self.cfg.eps as f32)?;
            let g = candle_nn::ops::silu(&layer.gate.forward(&h)?)?;
            let mlp = layer.down.forward(&(g * layer.up.forward(&h)?)?)?;
            x = (x + mlp)?;
        }
        let x = candle_nn::ops::rms_norm(&x, &self.norm, self.cfg.eps as f32)?.squeeze(0)?;
        Ok((x, KvCache { layers: kv, len: n }))
    }

    /// Logits of a few tokens only for the given final hidden rows `[m, hidden]` → `[m, ids.len()]`: with
    /// tied weights a dot product with each token's embedding row, a fraction of the full projection
    /// (151,936 rows for Qwen2); otherwise the full projection, gathered.
    pub fn token_logits(&self, hidden_rows: &Tensor, ids: &[u32]) -> candle_core::Result<Tensor> {
        if ids.iter().any(|&t| t as usize >= self.cfg.vocab) {
            candle_core::bail!("token id beyond the vocabulary of {}", self.cfg.vocab)
        }
        let idx = Tensor::new(ids, &self.device)?;
        if self.tied {
            let rows = self.embed.index_select(&idx, 0)?;
            return hidden_rows.matmul(&rows.t()?);
        }
        let logits = self.output.forward(hidden_rows)?;
        logits.index_select(&idx, 1)
    }

    /// Log-probabilities over the vocabulary for the given final hidden rows `[m, hidden]` → `[m, vocab]`.
    pub fn log_probs(&self, hidden_rows: &Tensor) -> candle_core::Result<Tensor> {
        let logits = self.output.forward(hidden_rows)?;
        candle_nn::ops::log_softmax(&logits, D::Minus1)
    }

    fn attention(
        &self,
        layer: &Layer,
        x: &Tensor,
        past: Option<&(Tensor, Tensor)>,
        views: &[SegmentView],
        cos: &Tensor,
        sin: &Tensor,
    ) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
        let (_, n, _) = x.dims3()?;
        let (h, kvh, d) = (self.cfg.n_head, self.cfg.n_kv_head, self.cfg.head_dim);
        let (mut q, mut k, mut v) = (
            layer.wq.forward(x)?,
            layer.wk.forward(x)?,
            layer.wv.forward(x)?,
        );
        if let Some([bq, bk, bv]) = &layer.bias {
            q = q.broadcast_add(bq)?;
            k = k.broadcast_add(bk)?;
            v = v.broadcast_add(bv)?;
        }
        let q = q.reshape((1, n, h, d))?.transpose(1, 2)?.contiguous()?;
        let k = k.reshape((1, n, kvh, d))?.transpose(1, 2)?.contiguous()?;
        let v = v.reshape((1, n, kvh, d))?.transpose(1, 2)?.contiguous()?;
        let (q, k) = match self.cfg.arch {
            Arch::Llama => (
                candle_nn::rotary_emb::rope_i(&q, cos, sin)?,
                candle_nn::rotary_emb::rope_i(&k, cos, sin)?,
            ),
            Arch::Qwen2 => (
                candle_nn::rotary_emb::rope(&q, cos, sin)?,
                candle_nn::rotary_emb::rope(&k, cos, sin)?,
            ),
        };
        let (k_all, v_all) = match past {
            Some((pk, pv)) => (Tensor::cat(&[pk, &k], 2)?, Tensor::cat(&[pv, &v], 2)?),
            None => (k.clone(), v.clone()),
        };
        let rep = h / kvh;
        let k_all = candle_transformers::utils::repeat_kv(k_all, rep)?;
        let v_all = candle_transformers::utils::repeat_kv(v_all, rep)?.contiguous()?;
        // Each segment against the columns it sees only: the multiple-choice orders and the channel copies see
        // a shared prefix and themselves, so a dense n × n product would be mostly masked out.
        let mut ys = Vec::with_capacity(views.len());
        for view in views {
            let gather = |t: &Tensor| -> candle_core::Result<Tensor> {
                match view.cols.as_slice() {
                    [c] if c.start == 0 && c.end == t.dim(2)? => Ok(t.clone()),
                    [c] => t.narrow(2, c.start, c.len())?.contiguous(),
                    cols => {
                        let parts = cols
                            .iter()
                            .map(|c| t.narrow(2, c.start, c.len()))
                            .collect::<candle_core::Result<Vec<_>>>()?;
                        Tensor::cat(&parts, 2)
                    }
                }
            };
            let (ks, vs) = (gather(&k_all)?, gather(&v_all)?);
            let qs = if view.rows.len() == n {
                q.clone()
            } else {
                q.narrow(2, view.rows.start, view.rows.len())?
                    .contiguous()?
            };
            let att = (qs.matmul(&ks.t()?)? / (d as f64).sqrt())?;
            let att = att.broadcast_add(&view.mask)?;
            let att = candle_nn::ops::softmax_last_dim(&att)?;
            ys.push(att.matmul(&vs)?);
        }
        let y = match ys.len() {
            1 => ys.remove(0),
            _ => Tensor::cat(&ys, 2)?,
        };
        let y = y.transpose(1, 2)?.reshape((1, n, h * d))?;
        Ok((layer.wo.forward(&y)?, k, v))
    }
}

/// The shapes of a GGUF file; an architecture this forward does not run is an error naming it.
fn read_config(ct: &gguf_file::Content) -> candle_core::Result<LlamaConfig> {
    let name = ct
        .metadata
        .get("general.architecture")
        .and_then(|v| v.to_string().ok().cloned())
        .unwrap_or_default();
    let Some(arch) = Arch::parse(&name) else {
        candle_core::bail!(
            "architecture `{name}` is not supported by the scoring forward (llama, qwen2)"
        )
    };
    let key = |k: &str| format!("{}.{k}", arch.name());
    let n_head = md_u32(ct, &key("attention.head_count"))?;
    let hidden = md_u32(ct, &key("embedding_length"))?;
    let vocab = match ct.tensor_infos.get("token_embd.weight") {
        Some(info) => info.shape.dims().first().copied().unwrap_or(0),
        None => candle_core::bail!("no token_embd.weight"),
    };
    Ok(LlamaConfig {
        arch,
        vocab,
        n_layer: md_u32(ct, &key("block_count"))?,
        n_head,
        n_kv_head: md_u32(ct, &key("attention.head_count_kv"))?,
        head_dim: hidden / n_head.max(1),
        hidden,
        eps: f64::from(md_f32(ct, &key("attention.layer_norm_rms_epsilon")).unwrap_or(1e-5)),
        max_positions: md_u32(ct, &key("context_length")).unwrap_or(2048).min(8192),
    })
}

fn rope_tables(
    head_dim: usize,
    base: f32,
    max_positions: usize,
    device: &Device,
) -> candle_core::Result<(Tensor, Tensor)> {
    let inv: Vec<f32> = (0..head_dim)
        .step_by(2)
        .map(|i| 1f32 / base.powf(i as f32 / head_dim as f32))
        .collect();
    let inv = Tensor::new(inv.as_slice(), device)?;
    let t = Tensor::arange(0u32, max_positions as u32, device)?
        .to_dtype(DType::F32)?
        .reshape((max_positions, 1))?;
    let freqs = t.matmul(&inv.reshape((1, head_dim / 2))?)?;
    Ok((freqs.cos()?, freqs.sin()?))
}

/// One segment's attention: its rows among the new tokens, the key columns it sees (in the columns of
/// past ++ new: its past range, the segments it sees, then itself, adjacent ranges merged), and the additive
/// mask over those columns (its own part causal).
struct SegmentView {
    rows: Range<usize>,
    cols: Vec<Range<usize>>,
    mask: Tensor,
}

/// The segments' views for one forward (the same for every layer); the rules of [`block_mask`].
fn segment_views(
    segments: &[Segment],
    past_len: usize,
    device: &Device,
) -> candle_core::Result<Vec<SegmentView>> {
    let mut offsets = Vec::with_capacity(segments.len());
    let mut at = 0;
    for s in segments {
        offsets.push(at);
        at += s.tokens.len();
    }
    let mut views = Vec::with_capacity(segments.len());
    for (si, s) in segments.iter().enumerate() {
        if s.sees_past.end > past_len || s.sees_segments.iter().any(|&t| t >= si) {
            candle_core::bail!("segment {si} sees beyond its past or a later segment")
        }
        let own = past_len + offsets[si]..past_len + offsets[si] + s.tokens.len();
        let mut cols: Vec<Range<usize>> = Vec::new();
        let seen =
            std::iter::once(s.sees_past.clone())
                .chain(s.sees_segments.iter().map(|&t| {
                    past_len + offsets[t]..past_len + offsets[t] + segments[t].tokens.len()
                }))
                .chain(std::iter::once(own));
        for r in seen.filter(|r| !r.is_empty()) {
            match cols.last_mut() {
                Some(last) if last.end == r.start => last.end = r.end,
                _ => cols.push(r),
            }
        }
        let width: usize = cols.iter().map(|c| c.len()).sum();
        let (n_s, before) = (s.tokens.len(), width - s.tokens.len());
        let mut m = vec![0f32; n_s * width];
        for i in 0..n_s {
            m[i * width + before + i + 1..(i + 1) * width].fill(f32::NEG_INFINITY);
        }
        views.push(SegmentView {
            rows: offsets[si]..offsets[si] + n_s,
            cols,
            mask: Tensor::from_vec(m, (n_s, width), device)?,
        });
    }
    Ok(views)
}

/// The additive mask `[n_new, past_len + n_new]`: 0 where a token may look, −∞ elsewhere — the dense form of
/// [`segment_views`], kept as the reference its test checks against. A token sees its
/// segment's past range, the segments it names in full, and its own segment up to itself.
#[cfg(test)]
fn block_mask(
    segments: &[Segment],
    past_len: usize,
    device: &Device,
) -> candle_core::Result<Tensor> {
    let n: usize = segments.iter().map(|s| s.tokens.len()).sum();
    let cols = past_len + n;
    let mut offsets = Vec::with_capacity(segments.len());
    let mut at = 0;
    for s in segments {
        offsets.push(at);
        at += s.tokens.len();
    }
    let mut m = vec![f32::NEG_INFINITY; n * cols];
    for (si, s) in segments.iter().enumerate() {
        if s.sees_past.end > past_len || s.sees_segments.iter().any(|&t| t >= si) {
            candle_core::bail!("segment {si} sees beyond its past or a later segment")
        }
        for i in 0..s.tokens.len() {
            let row = &mut m[(offsets[si] + i) * cols..(offsets[si] + i + 1) * cols];
            row[s.sees_past.clone()].fill(0.0);
            for &t in &s.sees_segments {
                let o = past_len + offsets[t];
                row[o..o + segments[t].tokens.len()].fill(0.0);
            }
            let o = past_len + offsets[si];
            row[o..=o + i].fill(0.0);
        }
    }
    Tensor::from_vec(m, (n, cols), device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_blocks_other_prefixes_and_later_tokens() {
        // Past: two prefixes of 2 and 1 tokens. New: segment 0 (2 tokens) after prefix A, segment 1 (1 token)
        // after prefix B.
        let segs = vec![
            Segment {
                tokens: vec![5, 6],
                start_pos: 2,
                sees_past: 0..2,
                sees_segments: vec![],
            },
            Segment {
                tokens: vec![7],
                start_pos: 1,
                sees_past: 2..3,
                sees_segments: vec![],
            },
        ];
        let m = block_mask(&segs, 3, &Device::Cpu)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        let open = |r: &Vec<f32>| -> Vec<usize> {
            r.iter()
                .enumerate()
                .filter(|(_, v)| **v == 0.0)
                .map(|(i, _)| i)
                .collect()
        };
        assert_eq!(open(&m[0]), vec![0, 1, 3]);
        assert_eq!(open(&m[1]), vec![0, 1, 3, 4]);
        assert_eq!(open(&m[2]), vec![2, 5]);
        let bad = vec![Segment {
            tokens: vec![1],
            start_pos: 0,
            sees_past: 0..9,
            sees_segments: vec![],
        }];
        assert!(block_mask(&bad, 3, &Device::Cpu).is_err());
        assert!(segment_views(&bad, 3, &Device::Cpu).is_err());
    }

    /// Each segment's view (its columns and mask) opens exactly the columns of the dense block mask's rows.
    #[test]
    fn segment_views_open_what_the_dense_mask_opens() {
        let segs = vec![
            Segment {
                tokens: vec![1, 2, 3],
                start_pos: 0,
                sees_past: 0..0,
                sees_segments: vec![],
            },
            Segment {
                tokens: vec![4, 5],
                start_pos: 3,
                sees_past: 1..4,
                sees_segments: vec![0],
            },
            Segment {
                tokens: vec![6],
                start_pos: 3,
                sees_past: 0..2,
                sees_segments: vec![0, 1],
            },
        ];
        for past in [4usize, 6] {
            let dense = block_mask(&segs, past, &Device::Cpu)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap();
            let views = segment_views(&segs, past, &Device::Cpu).unwrap();
            for v in &views {
                let m = v.mask.to_vec2::<f32>().unwrap();
                let cols: Vec<usize> = v.cols.iter().flat_map(|c| c.clone()).collect();
                for (i, r) in v.rows.clone().enumerate() {
                    let open: Vec<usize> = (0..dense[r].len())
                        .filter(|&c| dense[r][c] == 0.0)
                        .collect();
                    let ours: Vec<usize> = cols
                        .iter()
                        .zip(&m[i])
                        .filter(|(_, x)| **x == 0.0)
                        .map(|(c, _)| *c)
                        .collect();
                    assert_eq!(ours, open, "past {past} row {r}");
                }
            }
        }
    }
}
