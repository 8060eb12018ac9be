//! The inference forward of [`crate::bert::PackedBert`] with int8 dense layers, on plain slices.
//!
//! With the dense layers on the int8 kernel, most of a candle-tensor forward's time went around them (perf at
//! batch 16: strided copies 9–10%, memmove/memset 8%, the padded attention's gather/scatter and mask, libm's
//! `expf`): every op allocates, and attention needs the padded `[batch, heads, longest, head_dim]` layout.
//! Here one layer is four int8 products and three fused passes over the packed `[tokens, hidden]` rows:
//! attention reads Q, K and V where the QKV product left them (per sequence and head, no padding, no mask),
//! the residual add is fused into layer norm, GELU runs in place. All passes are plain loops the compiler
//! vectorises; the exponential is a polynomial, not a libm call.

use tiergate_kernels::int8::QDense;

/// Layer norm's parameters (`y = (x − mean) / √(var + eps) · w + b`, per row).
pub(crate) struct Norm {
    pub w: Vec<f32>,
    pub b: Vec<f32>,
    pub eps: f32,
}

impl Norm {
    /// Each row of `x` ← LN(x + residual's row) (without a residual: LN(x)).
    fn apply(&self, x: &mut [f32], residual: Option<&[f32]>) {
        let h = self.w.len();
        for (r, row) in x.chunks_exact_mut(h).enumerate() {
            if let Some(res) = residual {
                for (v, &a) in row.iter_mut().zip(&res[r * h..(r + 1) * h]) {
                    *v += a;
                }
            }
            let mean = sum(row) / h as f32;
            let mut var = 0f32;
            for v in row.iter_mut() {
                *v -= mean;
                var += *v * *v;
            }
            let inv = 1.0 / (var / h as f32 + self.eps).sqrt();
            for ((v, &w), &b) in row.iter_mut().zip(&self.w).zip(&self.b) {
                *v = *v * inv * w + b;
            }
        }
    }
}

/// Sum in 8 lanes (vectorises; the order is fixed, so every thread gets the same bits).
fn sum(x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// One encoder layer.
pub(crate) struct Layer {
    pub qkv: QDense,
    pub attn_out: QDense,
    pub attn_norm: Norm,
    pub up: QDense,
    pub down: QDense,
    pub out_norm: Norm,
}

/// The embedding tables and layers of a BERT encoder, int8 where it multiplies.
pub(crate) struct Int8Bert {
    /// `[vocab, hidden]`, `[positions, hidden]`, `[types, hidden]`.
    pub word: Vec<f32>,
    pub position: Vec<f32>,
    pub token_type: Vec<f32>,
    pub emb_norm: Norm,
    pub layers: Vec<Layer>,
    pub heads: usize,
    pub head_dim: usize,
    /// GELU (erf) after the up projection; otherwise ReLU.
    pub gelu: bool,
}

/// Where a token's embedding rows are: its id, segment and position.
pub struct TokenRef {
    pub id: usize,
    pub type_id: usize,
    pub position: usize,
}

impl Int8Bert {
    fn hidden(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Token states `[tokens, hidden]` of sequences of `lens` tokens packed back to back. A token outside
    /// the embedding tables is an error (as candle's embedding lookup makes it).
    pub fn forward(&self, tokens: &[TokenRef], lens: &[usize]) -> crate::Result<Vec<f32>> {
        let h = self.hidden();
        let n = tokens.len();
        let rows = |t: &[f32]| t.len() / h;
        if let Some(t) = tokens.iter().find(|t| {
            t.id >= rows(&self.word)
                || t.position >= rows(&self.position)
                || t.type_id >= rows(&self.token_type)
        }) {
            return Err(candle_core::Error::Msg(format!(
                "token id {} / position {} / segment {} is outside the embedding tables",
                t.id, t.position, t.type_id
            ))
            .into());
        }
        let mut x = vec![0f32; n * h];
        for (row, t) in x.chunks_exact_mut(h).zip(tokens) {
            let w = &self.word[t.id * h..(t.id + 1) * h];
            let p = &self.position[t.position * h..(t.position + 1) * h];
            let s = &self.token_type[t.type_id * h..(t.type_id + 1) * h];
            for (i, v) in row.iter_mut().enumerate() {
                *v = w[i] + p[i] + s[i];
            }
        }
        self.emb_norm.apply(&mut x, None);
        for layer in &self.layers {
            x = self.layer(layer, &x, lens);
        }
        Ok(x)
    }

    fn layer(&self, l: &Layer, x: &[f32], lens: &[usize]) -> Vec<f32> {
        let n = x.len() / self.hidden();
        let qkv = l.qkv.forward(x, n);
        let ctx = attention(&qkv, lens, self.heads, self.head_dim);
        let mut x1 = l.attn_out.forward(&ctx, n);
        l.attn_norm.apply(&mut x1, Some(x));
        let mut up = l.up.forward(&x1, n);
        if self.gelu {
            up.iter_mut()
                .for_each(|v| *v = tiergate_kernels::fastops::gelu(*v));
        } else {
            up.iter_mut().for_each(|v| *v = v.max(0.0));
        }
        let mut out = l.down.forward(&up, n);
        l.out_norm.apply(&mut out, Some(&x1));
        out
    }
}

/// Self-attention of packed sequences: `qkv` is `[tokens, 3·hidden]` (Q, K, V side by side, heads inside
/// each), the result `[tokens, hidden]`. Each sequence attends only to itself.
pub(crate) fn attention(qkv: &[f32], lens: &[usize], heads: usize, dh: usize) -> Vec<f32> {
    let h = heads * dh;
    let n = qkv.len() / (3 * h);
    let mut ctx = vec![0f32; n * h];
    let longest = lens.iter().copied().max().unwrap_or(0);
    let mut scratch = Scratch::new(longest, dh);
    let mut off = 0;
    for &len in lens {
        let rows = &qkv[off * 3 * h..(off + len) * 3 * h];
        let out = &mut ctx[off * h..(off + len) * h];
        for head in 0..heads {
            attend_head(rows, len, head, dh, h, &mut scratch, out);
        }
        off += len;
    }
    ctx
}

/// Per-head buffers: Kᵀ (`[dh, len]`) and one row of scores.
struct Scratch {
    kt: Vec<f32>,
    s: Vec<f32>,
}

impl Scratch {
    fn new(longest: usize, dh: usize) -> Self {
        Self {
            kt: vec![0f32; longest * dh],
            s: vec![0f32; longest],
        }
    }
}

/// One head of one sequence: `softmax(q·Kᵀ/√dh)·V` for each of its `len` query rows.
fn attend_head(
    rows: &[f32],
    len: usize,
    head: usize,
    dh: usize,
    h: usize,
    sc: &mut Scratch,
    out: &mut [f32],
) {
    let w = 3 * h;
    let scale = 1.0 / (dh as f32).sqrt();
    let kt = &mut sc.kt[..dh * len];
    for j in 0..len {
        let k = &rows[j * w + h + head * dh..][..dh];
        for (d, &v) in k.iter().enumerate() {
            kt[d * len + j] = v;
        }
    }
    for i in 0..len {
        let q = &rows[i * w + head * dh..][..dh];
        let s = &mut sc.s[..len];
        s.fill(0.0);
        // Scores over the keys, one input dimension at a time (vectorises over keys).
        for (d, &qd) in q.iter().enumerate() {
            let qd = qd * scale;
            for (sj, &k) in s.iter_mut().zip(&kt[d * len..(d + 1) * len]) {
                *sj += qd * k;
            }
        }
        softmax(s);
        let c = &mut out[i * h + head * dh..][..dh];
        c.fill(0.0);
        for (j, &p) in s.iter().enumerate() {
            let v = &rows[j * w + 2 * h + head * dh..][..dh];
            for (cd, &vd) in c.iter_mut().zip(v) {
                *cd += p * vd;
            }
        }
    }
}

/// In place, numerically stable.
fn softmax(s: &mut [f32]) {
    let max = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    for v in s.iter_mut() {
        *v = exp(*v - max);
    }
    let inv = 1.0 / sum(s);
    for v in s.iter_mut() {
        *v *= inv;
    }
}

/// eˣ for x ≤ 0 in f32 (softmax's range; larger x is taken as 0), branch-free so loops over it vectorise: 2ⁿ · p(r) with
/// x = n·ln2 + r, |r| ≤ ln2/2, p a degree-6 polynomial (relative error ≈ 2e-7). Below −87 it returns 0.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // `max` also maps NaN to −87, so `n` below is always in [−126, 0].
    #[allow(clippy::manual_clamp)]
    // `clamp` keeps NaN, which the unchecked conversion below must not see.
    let x = x.max(-87.0).min(0.0);
    // Ties to even: one `vroundps` (`round` is a libm call).
    let n = (x * LOG2E).round_ties_even();
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.0 / 720.0;
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = p * r + c;
    }
    // 2ⁿ by building the exponent bits. SAFETY: n is an integer in [−126, 0] (see above).
    let bits = ((unsafe { n.to_int_unchecked::<i32>() } + 127) as u32) << 23;
    p * f32::from_bits(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_close_to_libm_over_softmax_range() {
        let mut worst = 0f32;
        for i in 0..=87_000 {
            let x = -(i as f32) * 0.001;
            let (a, b) = (exp(x), x.exp());
            if x > -86.0 {
                worst = worst.max(((a - b) / b).abs());
            } else {
                // Near the bottom of f32's normal range the result goes subnormal (absolute error only).
                assert!((a - b).abs() < 1e-42, "exp({x}) {a} vs {b}");
            }
        }
        assert!(worst < 1e-6, "worst relative error {worst}");
        assert_eq!(exp(f32::NEG_INFINITY), exp(-87.0));
        assert_eq!(exp(f32::NAN), exp(-87.0));
        assert!(exp(-200.0) < 2e-38);
    }

    /// The straightforward per-sequence attention (dense scores, libm exp) as the reference.
    fn reference(qkv: &[f32], lens: &[usize], heads: usize, dh: usize) -> Vec<f32> {
        let h = heads * dh;
        let n = qkv.len() / (3 * h);
        let mut out = vec![0f32; n * h];
        let mut off = 0;
        for &len in lens {
            for head in 0..heads {
                for i in 0..len {
                    let q = |d: usize| qkv[(off + i) * 3 * h + head * dh + d];
                    let k = |j: usize, d: usize| qkv[(off + j) * 3 * h + h + head * dh + d];
                    let v = |j: usize, d: usize| qkv[(off + j) * 3 * h + 2 * h + head * dh + d];
                    let s: Vec<f64> = (0..len)
                        .map(|j| {
                            (0..dh).map(|d| q(d) as f64 * k(j, d) as f64).sum::<f64>()
                                / (dh as f64).sqrt()
                        })
                        .collect();
                    let m = s.iter().cloned().fold(f64::MIN, f64::max);
                    let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for d in 0..dh {
                        out[(off + i) * h + head * dh + d] =
                            ((0..len).map(|j| e[j] * v(j, d) as f64).sum::<f64>() / z) as f32;
                    }
                }
            }
            off += len;
        }
        out
    }

    #[test]
    fn packed_attention_matches_the_per_sequence_reference() {
        let (heads, dh) = (3, 8);
        let lens = [5, 1, 17, 2];
        let n: usize = lens.iter().sum();
        let mut seed = 7u64;
        let qkv: Vec<f32> = (0..n * 3 * heads * dh)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 6.0
            })
            .collect();
        let ours = attention(&qkv, &lens, heads, dh);
        let want = reference(&qkv, &lens, heads, dh);
        for (i, (a, b)) in ours.iter().zip(&want).enumerate() {
            assert!((a - b).abs() < 1e-5 * (1.0 + b.abs()), "{i}: {a} vs {b}");
        }
    }

    #[test]
    fn norm_with_residual_matches_the_formula() {
        let norm = Norm {
            w: vec![1.0, 2.0, 0.5, -1.0],
            b: vec![0.0, 0.1, 0.2, 0.3],
            eps: 1e-12,
        };
        let mut x = vec![1.0, 2.0, 3.0, 4.0, -1.0, 0.0, 1.0, 5.0];
        let res = vec![0.5, 0.5, 0.5, 0.5, 1.0, 1.0, 1.0, 1.0];
        let want: Vec<f32> = x
            .chunks(4)
            .zip(res.chunks(4))
            .flat_map(|(r, s)| {
                let v: Vec<f64> = r.iter().zip(s).map(|(a, b)| (a + b) as f64).collect();
                let m = v.iter().sum::<f64>() / 4.0;
                let var = v.iter().map(|a| (a - m) * (a - m)).sum::<f64>() / 4.0;
                v.iter()
                    .enumerate()
                    .map(|(i, a)| {
                        ((a - m) / (var + 1e-12).sqrt() * norm.w[i] as f64 + norm.b[i] as f64)
                            as f32
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        norm.apply(&mut x, Some(&res));
        for (a, b) in x.iter().zip(&want) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }
}
