//! Int8 dense layers for inference on AVX-512 VNNI (`vpdpbusd`: 64 u8×i8 multiply-adds per instruction, four
//! times f32 FMA's rate). Weights are quantised once per output channel (symmetric i8), activations per row
//! at each call (symmetric, stored as u8 with a +128 offset that the precomputed weight sums take back out).

/// A dense layer `y = x·Wᵀ + b` with i8 weights.
pub struct QDense {
    out: usize,
    k: usize,
    /// `k` rounded up to 64 (one zmm of u8).
    kp: usize,
    /// `[out, kp]`, zero-padded.
    w: Vec<i8>,
    /// Per output channel: weight scale.
    sw: Vec<f32>,
    /// Per output channel: Σ w (for the +128 activation offset).
    wsum: Vec<i32>,
    b: Vec<f32>,
}

/// Whether this CPU runs the int8 kernel.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn scale_of(v: &[f32]) -> f32 {
    let m = v.iter().fold(0f32, |a, x| a.max(x.abs()));
    if m > 0.0 {
        m / 127.0
    } else {
        1.0
    }
}

impl QDense {
    /// `w` is `[out, k]` row-major (the checkpoint layout), `b` is `[out]`.
    pub fn new(w: &[f32], b: &[f32], out: usize, k: usize) -> Self {
        let kp = k.div_ceil(64) * 64;
        let mut q = vec![0i8; out * kp];
        let mut sw = vec![0f32; out];
        let mut wsum = vec![0i32; out];
        for n in 0..out {
            let row = &w[n * k..(n + 1) * k];
            let s = scale_of(row);
            sw[n] = s;
            for (i, &x) in row.iter().enumerate() {
                let v = (x / s).round().clamp(-127.0, 127.0) as i8;
                q[n * kp + i] = v;
                wsum[n] += i32::from(v);
            }
        }
        Self {
            out,
            k,
            kp,
            w: q,
            sw,
            wsum,
            b: b.to_vec(),
        }
    }

    pub fn out_features(&self) -> usize {
        self.out
    }

    /// `x` is `[m, k]` row-major; returns `[m, out]`. Call only where [`available`] is true.
    pub fn forward(&self, x: &[f32], m: usize) -> Vec<f32> {
        let (k, kp) = (self.k, self.kp);
        let mut xq = vec![128u8; m * kp];
        let mut sx = vec![0f32; m];
        for r in 0..m {
            let row = &x[r * k..(r + 1) * k];
            let s = scale_of(row);
            sx[r] = s;
            let inv = 1.0 / s;
            for (d, &v) in xq[r * kp..r * kp + k].iter_mut().zip(row) {
                *d = ((v * inv).round().clamp(-127.0, 127.0) as i32 + 128) as u8;
            }
        }
        let mut acc = vec![0i32; m * self.out];
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller checked `available()`; all slices have the sizes the kernel indexes.
        unsafe {
            gemm_u8i8(&xq, &self.w, &mut acc, m, self.out, kp)
        };
        let mut y = vec![0f32; m * self.out];
        for r in 0..m {
            for n in 0..self.out {
                let a = acc[r * self.out + n] - 128 * self.wsum[n];
                y[r * self.out + n] = a as f32 * sx[r] * self.sw[n] + self.b[n];
            }
        }
        y
    }
}

/// `acc[r, n] = Σ_k x[r, k] · w[n, k]` over u8 `x` `[m, kp]` and i8 `w` `[out, kp]`, `kp` a multiple of 64.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn gemm_u8i8(x: &[u8], w: &[i8], acc: &mut [i32], m: usize, out: usize, kp: usize) {
    let mut r = 0;
    while r + 4 <= m {
        // SAFETY: same target features as this function; rows r..r+4 exist.
        unsafe { block::<4>(x, w, acc, r, out, kp) };
        r += 4;
    }
    while r < m {
        // SAFETY: as above, row r exists.
        unsafe { block::<1>(x, w, acc, r, out, kp) };
        r += 1;
    }
}

/// Rows `r0..r0+R` against every output, four outputs at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
#[allow(clippy::needless_range_loop)] // index loops read as the register tile they are
unsafe fn block<const R: usize>(
    x: &[u8],
    w: &[i8],
    acc: &mut [i32],
    r0: usize,
    out: usize,
    kp: usize,
) {
    use std::arch::x86_64::*;
    let xp = x.as_ptr();
    let wp = w.as_ptr();
    let mut n = 0;
    while n < out {
        let c = (out - n).min(4);
        let mut s = [[_mm512_setzero_si512(); 4]; R];
        let mut kk = 0;
        while kk < kp {
            let mut xv = [_mm512_setzero_si512(); R];
            for (i, v) in xv.iter_mut().enumerate() {
                // SAFETY: row r0+i < m and kk + 64 <= kp.
                *v = unsafe { _mm512_loadu_si512(xp.add((r0 + i) * kp + kk) as *const _) };
            }
            for j in 0..c {
                // SAFETY: n + j < out and kk + 64 <= kp.
                let wv = unsafe { _mm512_loadu_si512(wp.add((n + j) * kp + kk) as *const _) };
                for i in 0..R {
                    s[i][j] = _mm512_dpbusd_epi32(s[i][j], xv[i], wv);
                }
            }
            kk += 64;
        }
        for i in 0..R {
            for j in 0..c {
                acc[(r0 + i) * out + n + j] = _mm512_reduce_add_epi32(s[i][j]);
            }
        }
        n += 4;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn matches_f32_within_quantisation_error() {
        if !available() {
            eprintln!("no AVX-512 VNNI here: int8 kernel not tested");
            return;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for &(m, k, out) in &[
            (1, 64, 4),
            (5, 100, 7),
            (18, 384, 384),
            (9, 1536, 384),
            (4, 384, 1536),
        ] {
            let w: Vec<f32> = (0..out * k).map(|_| rng.gen_range(-0.2..0.2)).collect();
            let b: Vec<f32> = (0..out).map(|_| rng.gen_range(-0.1..0.1)).collect();
            let x: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let q = QDense::new(&w, &b, out, k);
            let y = q.forward(&x, m);
            let mut worst = 0f32;
            let mut norm = 0f32;
            for r in 0..m {
                for n in 0..out {
                    let exact: f32 =
                        (0..k).map(|i| x[r * k + i] * w[n * k + i]).sum::<f32>() + b[n];
                    worst = worst.max((y[r * out + n] - exact).abs());
                    norm = norm.max(exact.abs());
                }
            }
            // Two 8-bit roundings: relative error of a dot product around 1%.
            assert!(
                worst <= 0.02 * norm.max(1.0),
                "m {m} k {k} out {out}: {worst} vs {norm}"
            );
        }
    }

    #[test]
    fn exact_on_integer_inputs() {
        if !available() {
            return;
        }
        // Values that quantise without rounding: the kernel itself must be exact.
        let (m, k, out) = (6, 130, 5);
        let mut w: Vec<f32> = (0..out * k).map(|i| (i % 255) as f32 - 127.0).collect();
        let mut x: Vec<f32> = (0..m * k).map(|i| (i * 7 % 255) as f32 - 127.0).collect();
        // Every row reaches ±127, so its scale is exactly 1.
        for n in 0..out {
            w[n * k] = -127.0;
        }
        for r in 0..m {
            x[r * k] = 127.0;
        }
        let b = vec![0.5; out];
        let q = QDense::new(&w, &b, out, k);
        let y = q.forward(&x, m);
        for r in 0..m {
            for n in 0..out {
                let exact: f32 = (0..k).map(|i| x[r * k + i] * w[n * k + i]).sum::<f32>() + 0.5;
                assert_eq!(y[r * out + n], exact);
            }
        }
    }
}
