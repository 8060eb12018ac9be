//! BERT (and MiniLM) forward over *packed* batches, for speed on CPU.
//!
//! candle-transformers' `BertModel` pads every input to the longest one in the batch, so a batch of mixed
//! lengths spends most of its matmul FLOPs on padding. Here the token-wise layers (embeddings, Q/K/V, output
//! projections, feed-forward: >90% of the FLOPs) run on all real tokens concatenated as one `[tokens, hidden]`
//! matrix; only attention is scattered to a padded `[batch, heads, longest, head_dim]` layout with a mask.
//! Q, K and V are fused into one matmul. With int8 dense layers ([`PackedBert::to_int8`]) the whole forward
//! leaves candle for plain slices ([`crate::bert_int8`]: attention on the packed rows, no padding at all).
//! Weight names follow Hugging Face (`vb.pp(...)` mirrors them), so any
//! `BertModel` checkpoint loads; numeric parity with candle-transformers is tested.

use candle_core::{Device, Module, Tensor, D};
use candle_nn::{embedding, linear, Embedding, LayerNorm, Linear, VarBuilder};
use candle_transformers::models::bert::{Config, HiddenAct};

use crate::error::Result;

/// A batch laid out for [`PackedBert`].
pub struct Packed {
    /// All real token ids, concatenated: `[tokens]`, u32.
    pub ids: Tensor,
    /// Their segment ids: `[tokens]`, u32.
    pub type_ids: Tensor,
    /// Their position within their own sequence: `[tokens]`, u32.
    pub positions: Tensor,
    /// For every slot of the padded `[batch * longest]` layout, the packed row it reads (`tokens` = a zero row).
    pub gather: Tensor,
    /// For every packed row, its slot in the padded layout.
    pub scatter: Tensor,
    /// Additive attention mask `[batch, 1, 1, longest]`: 0 for real keys, a large negative for padding.
    pub mask: Tensor,
    /// `[batch, tokens]`: row i holds 1/len_i over sequence i's tokens, so `mean = weights · states`.
    pub mean_weights: Tensor,
    /// The same tokens on the host, for the int8 forward.
    pub tokens: Vec<crate::bert_int8::TokenRef>,
    /// Sequence lengths.
    pub lens: Vec<usize>,
    /// The longest sequence.
    pub longest: usize,
}

impl Packed {
    /// Packs sequences given as `(ids, type_ids)` slices.
    pub fn new(seqs: &[(&[u32], &[u32])], device: &Device) -> Result<Self> {
        let lens: Vec<usize> = seqs.iter().map(|(ids, _)| ids.len()).collect();
        let longest = lens.iter().copied().max().unwrap_or(0).max(1);
        let total: usize = lens.iter().sum();
        let b = seqs.len();
        let mut ids = Vec::with_capacity(total);
        let mut type_ids = Vec::with_capacity(total);
        let mut positions = Vec::with_capacity(total);
        let mut gather = vec![total as u32; b * longest];
        let mut scatter = Vec::with_capacity(total);
        // −∞, not f32::MIN: exp(f32::MIN − max) takes libm's underflow path (perf: `xflowf`, ~3% of a batch-16
        // forward); exp(−∞) is an early exact 0. Every query row sees its own token, so no row is all −∞.
        let mut mask = vec![f32::NEG_INFINITY; b * longest];
        let mut mean_weights = vec![0f32; b * total];
        let mut tokens = Vec::with_capacity(total);
        for (row, (sid, stype)) in seqs.iter().enumerate() {
            for (pos, (&id, &ty)) in sid.iter().zip(stype.iter()).enumerate() {
                let packed = ids.len();
                ids.push(id);
                type_ids.push(ty);
                positions.push(pos as u32);
                let slot = row * longest + pos;
                gather[slot] = packed as u32;
                scatter.push(slot as u32);
                mask[slot] = 0.0;
                mean_weights[row * total + packed] = 1.0 / sid.len() as f32;
                tokens.push(crate::bert_int8::TokenRef {
                    id: id as usize,
                    type_id: ty as usize,
                    position: pos,
                });
            }
        }
        Ok(Self {
            ids: Tensor::from_vec(ids, total, device)?,
            type_ids: Tensor::from_vec(type_ids, total, device)?,
            positions: Tensor::from_vec(positions, total, device)?,
            gather: Tensor::from_vec(gather, b * longest, device)?,
            scatter: Tensor::from_vec(scatter, total, device)?,
            mask: Tensor::from_vec(mask, (b, 1, 1, longest), device)?,
            mean_weights: Tensor::from_vec(mean_weights, (b, total), device)?,
            tokens,
            lens,
            longest,
        })
    }
}

/// Up to this many rows, dense layers use the transposed product (see [`Dense::forward`]).
const SMALL_M: usize = 64;

/// A dense layer in one of two layouts.
enum Dense {
    /// Inference: `Wᵀ` stored contiguous `[in, out]`. With `W` as stored (`[out, in]`), gemm repacks the
    /// whole weight on every call with a scalar strided copy, which at a few dozen rows cost more than the
    /// multiply itself (perf: 56% of batch-1 time).
    Frozen { wt: Tensor, b: Tensor },
    /// Training: the variables themselves (several are concatenated along the output on each call, so the
    /// optimiser's in-place updates are seen).
    Live(Vec<Linear>),
}

impl Dense {
    fn new(parts: Vec<Linear>, trainable: bool) -> Result<Self> {
        if trainable {
            return Ok(Dense::Live(parts));
        }
        let (w, b) = cat_parts(&parts)?;
        Ok(Dense::Frozen {
            wt: w.t()?.contiguous()?,
            b,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Dense::Frozen { wt, b } if x.dim(0)? <= SMALL_M => {
                // Few rows: compute (W·xᵀ)ᵀ. Wᵀ stored [in, out] read as W [out, in] is column-major, which is
                // the layout gemm's micro-kernel streams without packing; the row-major product instead walks
                // the weight column-wise with a cache line per element.
                wt.t()?.matmul(&x.t()?)?.t()?.broadcast_add(b)?
            }
            Dense::Frozen { wt, b } => x.matmul(wt)?.broadcast_add(b)?,
            Dense::Live(parts) if parts.len() == 1 => parts[0].forward(x)?,
            Dense::Live(parts) => {
                let (w, b) = cat_parts(parts)?;
                x.matmul(&w.t()?)?.broadcast_add(&b)?
            }
        })
    }
}

impl Dense {
    /// The int8 form of a frozen layer (a live, trainable one has none).
    fn to_int8(&self) -> Result<tiergate_kernels::int8::QDense> {
        let Dense::Frozen { wt, b } = self else {
            return Err(candle_core::Error::Msg("int8: a trainable layer".into()).into());
        };
        let w = wt.t()?.contiguous()?;
        let (out, k) = w.dims2()?;
        let wv = w.flatten_all()?.to_vec1::<f32>()?;
        let bv = b.to_vec1::<f32>()?;
        Ok(tiergate_kernels::int8::QDense::new(&wv, &bv, out, k))
    }
}

fn cat_parts(parts: &[Linear]) -> Result<(Tensor, Tensor)> {
    let ws: Vec<&Tensor> = parts.iter().map(|p| p.weight()).collect();
    let bs = parts
        .iter()
        .map(|p| {
            p.bias()
                .cloned()
                .ok_or_else(|| candle_core::Error::Msg("dense layer without bias".into()))
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok((Tensor::cat(&ws, 0)?, Tensor::cat(&bs, 0)?))
}

struct Layer {
    qkv: Dense,
    attn_out: Dense,
    attn_norm: LayerNorm,
    up: Dense,
    down: Dense,
    out_norm: LayerNorm,
}

/// A BERT encoder that runs packed batches.
pub struct PackedBert {
    body: Body,
    heads: usize,
    head_dim: usize,
    act: HiddenAct,
    trainable: bool,
}

/// The weights, as candle tensors (f32, training or inference) or for the int8 forward.
enum Body {
    Candle(CandleBody),
    Int8(crate::bert_int8::Int8Bert),
}

struct CandleBody {
    word: Embedding,
    position: Embedding,
    token_type: Embedding,
    emb_norm: LayerNorm,
    layers: Vec<Layer>,
}

fn norm(size: usize, eps: f64, vb: VarBuilder) -> Result<LayerNorm> {
    Ok(candle_nn::layer_norm(size, eps, vb)?)
}

impl PackedBert {
    /// Loads from `vb` (the model root or its `bert.` prefix is detected). With `trainable`, every op used
    /// has a backward pass (candle's fused layer-norm and softmax kernels do not).
    pub fn load(vb: VarBuilder, cfg: &Config, trainable: bool) -> Result<Self> {
        let vb = if !vb.contains_tensor("embeddings.word_embeddings.weight")
            && vb.contains_tensor("bert.embeddings.word_embeddings.weight")
        {
            vb.pp("bert")
        } else {
            vb
        };
        let h = cfg.hidden_size;
        let e = vb.pp("embeddings");
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let l = vb.pp(format!("encoder.layer.{i}"));
            let att = l.pp("attention");
            let dense = |parts: Vec<Linear>| Dense::new(parts, trainable);
            let qkv = dense(vec![
                linear(h, h, att.pp("self.query"))?,
                linear(h, h, att.pp("self.key"))?,
                linear(h, h, att.pp("self.value"))?,
            ])?;
            layers.push(Layer {
                qkv,
                attn_out: dense(vec![linear(h, h, att.pp("output.dense"))?])?,
                attn_norm: norm(h, cfg.layer_norm_eps, att.pp("output.LayerNorm"))?,
                up: dense(vec![linear(
                    h,
                    cfg.intermediate_size,
                    l.pp("intermediate.dense"),
                )?])?,
                down: dense(vec![linear(
                    cfg.intermediate_size,
                    h,
                    l.pp("output.dense"),
                )?])?,
                out_norm: norm(h, cfg.layer_norm_eps, l.pp("output.LayerNorm"))?,
            });
        }
        Ok(Self {
            body: Body::Candle(CandleBody {
                word: embedding(cfg.vocab_size, h, e.pp("word_embeddings"))?,
                position: embedding(cfg.max_position_embeddings, h, e.pp("position_embeddings"))?,
                token_type: embedding(cfg.type_vocab_size, h, e.pp("token_type_embeddings"))?,
                emb_norm: norm(h, cfg.layer_norm_eps, e.pp("LayerNorm"))?,
                layers,
            }),
            heads: cfg.num_attention_heads,
            head_dim: h / cfg.num_attention_heads,
            act: cfg.hidden_act,
            trainable,
        })
    }

    /// Switches to the int8 forward ([`crate::bert_int8`]; AVX-512 VNNI, the caller checks
    /// [`tiergate_kernels::int8::available`]). Inference only: a trainable model keeps f32.
    pub fn to_int8(&mut self) -> Result<()> {
        let Body::Candle(c) = &self.body else {
            return Ok(());
        };
        if self.trainable {
            return Ok(());
        }
        let int8 =
            crate::bert_int8::Int8Bert {
                word: flat(c.word.embeddings())?,
                position: flat(c.position.embeddings())?,
                token_type: flat(c.token_type.embeddings())?,
                emb_norm: host_norm(&c.emb_norm)?,
                layers: c
                    .layers
                    .iter()
                    .map(|l| {
                        Ok(crate::bert_int8::Layer {
                            qkv: l.qkv.to_int8()?,
                            attn_out: l.attn_out.to_int8()?,
                            attn_norm: host_norm(&l.attn_norm)?,
                            up: l.up.to_int8()?,
                            down: l.down.to_int8()?,
                            out_norm: host_norm(&l.out_norm)?,
                        })
                    })
                    .collect::<Result<_>>()?,
                heads: self.heads,
                head_dim: self.head_dim,
                gelu: match self.act {
                    HiddenAct::Gelu => true,
                    HiddenAct::Relu => false,
                    HiddenAct::GeluApproximate => return Err(candle_core::Error::Msg(
                        "int8 forward: tanh-approximate GELU is not implemented; use precision f32"
                            .into(),
                    )
                    .into()),
                },
            };
        self.body = Body::Int8(int8);
        Ok(())
    }

    fn layer_norm(&self, ln: &LayerNorm, x: &Tensor) -> Result<Tensor> {
        if !self.trainable {
            return Ok(ln.forward(x)?);
        }
        // Composite form: differentiable.
        let h = x.dim(D::Minus1)? as f64;
        let mean = (x.sum_keepdim(D::Minus1)? / h)?;
        let xc = x.broadcast_sub(&mean)?;
        let var = (xc.sqr()?.sum_keepdim(D::Minus1)? / h)?;
        let xn = xc.broadcast_div(&(var + 1e-12)?.sqrt()?)?;
        let bias = ln.bias().cloned().unwrap_or(xn.zeros_like()?);
        Ok(xn.broadcast_mul(ln.weight())?.broadcast_add(&bias)?)
    }

    /// Token states of the packed batch: `[tokens, hidden]`, rows in packing order.
    pub fn forward(&self, p: &Packed) -> Result<Tensor> {
        let c = match &self.body {
            Body::Candle(c) => c,
            Body::Int8(m) => {
                let states = m.forward(&p.tokens, &p.lens)?;
                let n = p.tokens.len();
                return Ok(Tensor::from_vec(
                    states,
                    (n, self.heads * self.head_dim),
                    p.ids.device(),
                )?);
            }
        };
        let x = (c.word.forward(&p.ids)? + c.position.forward(&p.positions)?)?;
        let x = (x + c.token_type.forward(&p.type_ids)?)?;
        let mut x = self.layer_norm(&c.emb_norm, &x)?;
        for layer in &c.layers {
            let attn = self.attention(layer, &x, p)?;
            let x1 = self.layer_norm(&layer.attn_norm, &(layer.attn_out.forward(&attn)? + &x)?)?;
            let up = layer.up.forward(&x1)?;
            let up = match self.act {
                HiddenAct::Gelu if !self.trainable => tiergate_kernels::fastops::gelu_erf(&up)?,
                HiddenAct::Gelu => up.gelu_erf()?,
                HiddenAct::GeluApproximate => up.gelu()?,
                HiddenAct::Relu => up.relu()?,
            };
            x = self.layer_norm(&layer.out_norm, &(layer.down.forward(&up)? + x1)?)?;
        }
        Ok(x)
    }

    fn attention(&self, layer: &Layer, x: &Tensor, p: &Packed) -> Result<Tensor> {
        let (n, hidden) = x.dims2()?;
        let b = p.lens.len();
        let (hd, dh, l) = (self.heads, self.head_dim, p.longest);
        let qkv = layer.qkv.forward(x)?; // [n, 3h]
        let single = b == 1;
        // Padded layout [b, l, 3h]; a single sequence is already "padded".
        let padded = if single {
            qkv.unsqueeze(0)?
        } else {
            let zero = Tensor::zeros((1, 3 * hidden), qkv.dtype(), qkv.device())?;
            Tensor::cat(&[&qkv, &zero], 0)?
                .index_select(&p.gather, 0)?
                .reshape((b, l, 3 * hidden))?
        };
        let split = |i: usize| -> Result<Tensor> {
            Ok(padded
                .narrow(2, i * hidden, hidden)?
                .reshape((b, l, hd, dh))?
                .transpose(1, 2)?
                .contiguous()?)
        };
        let (q, k, v) = (split(0)?, split(1)?, split(2)?);
        let scores = (q.matmul(&k.t()?)? * (1.0 / (dh as f64).sqrt()))?;
        let scores = if single {
            scores
        } else {
            scores.broadcast_add(&p.mask)?
        };
        let probs = if self.trainable {
            candle_nn::ops::softmax(&scores, D::Minus1)?
        } else {
            candle_nn::ops::softmax_last_dim(&scores)?
        };
        let ctx = probs
            .matmul(&v)?
            .transpose(1, 2)?
            .reshape((b * l, hidden))?;
        Ok(if single {
            ctx
        } else {
            ctx.index_select(&p.scatter, 0)?
        }
        .reshape((n, hidden))?)
    }
}

/// A tensor's values, flattened (host copy).
fn flat(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.flatten_all()?.to_vec1::<f32>()?)
}

fn host_norm(ln: &LayerNorm) -> Result<crate::bert_int8::Norm> {
    let w = flat(ln.weight())?;
    let b = match ln.bias() {
        Some(b) => flat(b)?,
        None => vec![0.0; w.len()],
    };
    Ok(crate::bert_int8::Norm {
        w,
        b,
        eps: ln.eps() as f32,
    })
}

/// Masked mean of packed token states per sequence: `[batch, hidden]` (one matmul).
pub fn mean_pool(states: &Tensor, p: &Packed) -> Result<Tensor> {
    Ok(p.mean_weights.matmul(states)?)
}

/// The first token of each sequence: `[batch, hidden]`.
pub fn first_token(states: &Tensor, p: &Packed) -> Result<Tensor> {
    let mut idx = Vec::with_capacity(p.lens.len());
    let mut off = 0u32;
    for &len in &p.lens {
        idx.push(off);
        off += len as u32;
    }
    let idx = Tensor::new(idx, states.device())?;
    Ok(states.index_select(&idx, 0)?)
}
