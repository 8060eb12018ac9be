//! Int8 dense layers for inference on AVX-512 VNNI (`vpdpbusd`: 64 u8×i8 multiply-adds per instruction, four
//! times f32 FMA's rate), for the prefilter's encoder and the reranker's scoring forward. Weights are quantised once per output channel (symmetric i8), activations per row
//! at each call (symmetric, stored as u8 with a +128 offset that the precomputed weight sums take back out).

/// Output channels per packed block (one zmm of i32 accumulators).
const NB: usize = 16;

/// A dense layer `y = x·Wᵀ + b` with i8 weights.
pub struct QDense {
    out: usize,
    k: usize,
    /// `k` rounded up to 4 (one i32 of u8 activations per `vpdpbusd` lane).
    k4: usize,
    /// Packed `[out/16][k4/4][16][4]`: one 64-byte load holds 4 inputs of 16 output channels, so the kernel
    /// accumulates 16 outputs per register and never reduces horizontally. Zero-padded.
    w: Vec<i8>,
    /// Per output channel: weight scale.
    sw: Vec<f32>,
    /// Per output channel: Σ w (for the +128 activation offset).
    wsum: Vec<i32>,
    b: Vec<f32>,
    /// The CPU runs the AVX-512 VNNI kernel (checked once at construction); otherwise a portable loop
    /// computes the same integers, so `forward` is sound on any CPU.
    vnni: bool,
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
        let k4 = k.div_ceil(4) * 4;
        let blocks = out.div_ceil(NB);
        let groups = k4 / 4;
        let mut packed = vec![0i8; blocks * NB * k4];
        let mut sw = vec![0f32; out];
        let mut wsum = vec![0i32; out];
        for n in 0..out {
            let row = &w[n * k..(n + 1) * k];
            let s = scale_of(row);
            sw[n] = s;
            let (nb, o) = (n / NB, n % NB);
            for (i, &x) in row.iter().enumerate() {
                let v = (x / s).round().clamp(-127.0, 127.0) as i8;
                let (g, t) = (i / 4, i % 4);
                packed[((nb * groups + g) * NB + o) * 4 + t] = v;
                wsum[n] += i32::from(v);
            }
        }
        Self {
            out,
            k,
            k4,
            w: packed,
            sw,
            wsum,
            b: b.to_vec(),
            vnni: available(),
        }
    }

    pub fn out_features(&self) -> usize {
        self.out
    }

    /// `x` is `[m, k]` row-major; returns `[m, out]`. Panics when `x` is shorter than `m · k`. Runs the
    /// VNNI kernel where the CPU has it, the portable loop elsewhere (same result, much slower).
    pub fn forward(&self, x: &[f32], m: usize) -> Vec<f32> {
        let (k, k4) = (self.k, self.k4);
        assert!(
            x.len() >= m * k,
            "QDense::forward: {} inputs for {m} rows of {k}",
            x.len()
        );
        let mut xq = vec![128u8; m * k4];
        let mut sx = vec![0f32; m];
        for r in 0..m {
            let row = &x[r * k..(r + 1) * k];
            let s = scale_of(row);
            sx[r] = s;
            let inv = 1.0 / s;
            for (d, &v) in xq[r * k4..r * k4 + k].iter_mut().zip(row) {
                *d = ((v * inv).round().clamp(-127.0, 127.0) as i32 + 128) as u8;
            }
        }
        let outp = self.out.div_ceil(NB) * NB;
        let mut acc = vec![0i32; m * outp];
        self.gemm(&xq, &mut acc, m, outp);
        let mut y = vec![0f32; m * self.out];
        for r in 0..m {
            for n in 0..self.out {
                let a = acc[r * outp + n] - 128 * self.wsum[n];
                y[r * self.out + n] = a as f32 * sx[r] * self.sw[n] + self.b[n];
            }
        }
        y
    }
}

impl QDense {
    /// `acc = xq · wᵀ` over the packed weights, by the kernel this CPU runs.
    fn gemm(&self, xq: &[u8], acc: &mut [i32], m: usize, outp: usize) {
        #[cfg(target_arch = "x86_64")]
        if self.vnni {
            // SAFETY: `vnni` is `available()` (the CPU has the target features); `xq` is `[m, k4]`, `w` is
            // `[outp/16][k4/4][16][4]` and `acc` is `[m, outp]`, the sizes the kernel indexes.
            unsafe { gemm_u8i8(xq, &self.w, acc, m, outp, self.k4) };
            return;
        }
        gemm_portable(xq, &self.w, acc, m, outp, self.k4);
    }
}

/// The kernel's integers with plain loops (CPUs without AVX-512 VNNI, and the reference in tests).
fn gemm_portable(x: &[u8], w: &[i8], acc: &mut [i32], m: usize, outp: usize, k4: usize) {
    let groups = k4 / 4;
    for r in 0..m {
        let xr = &x[r * k4..(r + 1) * k4];
        for n in 0..outp {
            let (nb, o) = (n / NB, n % NB);
            let mut sum = 0i32;
            for g in 0..groups {
                let base = ((nb * groups + g) * NB + o) * 4;
                for t in 0..4 {
                    sum += i32::from(xr[g * 4 + t]) * i32::from(w[base + t]);
                }
            }
            acc[r * outp + n] = sum;
        }
    }
}

/// `acc[r, n] = Σ_k x[r, k] · w[n, k]` over u8 `x` `[m, k4]` and packed i8 `w` (see [`QDense`]), `outp` a
/// multiple of 16. Outer loop over tiles of 4 output blocks (their weights stay in cache), inner over rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn gemm_u8i8(x: &[u8], w: &[i8], acc: &mut [i32], m: usize, outp: usize, k4: usize) {
    let blocks = outp / NB;
    let mut nb = 0;
    while nb < blocks {
        let j = (blocks - nb).min(4);
        let mut r = 0;
        while r < m {
            let rows = (m - r).min(4);
            // SAFETY: same target features as this function; the tile lies inside x, w and acc.
            unsafe {
                match (rows, j) {
                    (4, 4) => tile::<4, 4>(x, w, acc, r, nb, outp, k4),
                    (4, _) => tile::<4, 1>(x, w, acc, r, nb, outp, k4),
                    (_, 4) => tile::<1, 4>(x, w, acc, r, nb, outp, k4),
                    _ => tile::<1, 1>(x, w, acc, r, nb, outp, k4),
                }
            }
            r += if rows == 4 { 4 } else { 1 };
        }
        nb += if j == 4 { 4 } else { 1 };
    }
}

/// Rows `r0..r0+R` against output blocks `nb0..nb0+J` (16 outputs each): R×J zmm accumulators.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
#[allow(clippy::needless_range_loop)] // index loops read as the register tile they are
unsafe fn tile<const R: usize, const J: usize>(
    x: &[u8],
    w: &[i8],
    acc: &mut [i32],
    r0: usize,
    nb0: usize,
    outp: usize,
    k4: usize,
) {
    use std::arch::x86_64::*;
    let groups = k4 / 4;
    let xp = x.as_ptr();
    let wp = w.as_ptr();
    // Row and weight-block cursors, advanced by constant strides (no index arithmetic in the loop).
    // SAFETY (all pointer offsets below): rows r0..r0+R < m hold k4 bytes each; blocks nb0..nb0+J hold
    // `groups` × 64 bytes each; the loop reads exactly those.
    let mut xr: [*const u8; R] = std::array::from_fn(|i| unsafe { xp.add((r0 + i) * k4) });
    let mut wj: [*const i8; J] =
        std::array::from_fn(|jj| unsafe { wp.add((nb0 + jj) * groups * NB * 4) });
    let mut s = [[_mm512_setzero_si512(); J]; R];
    for _ in 0..groups {
        let mut xb = [_mm512_setzero_si512(); R];
        for i in 0..R {
            // SAFETY: see above; 4 bytes of row i.
            unsafe {
                xb[i] = _mm512_set1_epi32(std::ptr::read_unaligned(xr[i] as *const i32));
                xr[i] = xr[i].add(4);
            }
        }
        for jj in 0..J {
            // SAFETY: see above; 64 bytes of block jj.
            let wv = unsafe { _mm512_loadu_si512(wj[jj] as *const _) };
            wj[jj] = unsafe { wj[jj].add(NB * 4) };
            for i in 0..R {
                s[i][jj] = _mm512_dpbusd_epi32(s[i][jj], xb[i], wv);
            }
        }
    }
    for i in 0..R {
        for jj in 0..J {
            // SAFETY: 16 i32 of row r0+i starting at output (nb0+jj)*16 < outp.
            unsafe {
                _mm512_storeu_si512(
                    acc.as_mut_ptr().add((r0 + i) * outp + (nb0 + jj) * NB) as *mut _,
                    s[i][jj],
                )
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The VNNI kernel and the portable loop compute the same integers (the portable path is what a CPU
    /// without AVX-512 runs, so `forward` is sound everywhere).
    #[test]
    fn portable_loop_equals_the_kernel() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        for &(m, k, out) in &[(1, 64, 4), (5, 100, 7), (7, 577, 33), (13, 64, 48)] {
            let w: Vec<f32> = (0..out * k).map(|_| rng.gen_range(-0.2..0.2)).collect();
            let x: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let mut q = QDense::new(&w, &vec![0.0; out], out, k);
            let fast = q.forward(&x, m);
            q.vnni = false;
            let portable = q.forward(&x, m);
            assert_eq!(fast, portable, "m {m} k {k} out {out}");
        }
    }

    #[test]
    #[should_panic(expected = "QDense::forward")]
    fn short_input_panics_instead_of_reading_out_of_bounds() {
        let q = QDense::new(&[0.1; 8], &[0.0; 2], 2, 4);
        q.forward(&[1.0; 7], 2);
    }

    #[test]
    fn matches_f32_within_quantisation_error() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for &(m, k, out) in &[
            (1, 64, 4),
            (5, 100, 7),
            (18, 384, 384),
            (9, 1536, 384),
            (4, 384, 1536),
            (7, 577, 33),
            (13, 576, 1536),
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

#[cfg(test)]
mod probe {
    use super::*;

    #[test]
    #[ignore = "timing probe: cargo test --workspace --lib int8 -- --ignored --nocapture"]
    fn probe_int8_gmacs() {
        if !available() {
            return;
        }
        for &(m, k, out) in &[
            (150usize, 576usize, 1536usize),
            (150, 576, 49152),
            (150, 1536, 576),
        ] {
            let w = vec![0.01f32; out * k];
            let x = vec![0.5f32; m * k];
            let q = QDense::new(&w, &vec![0.0; out], out, k);
            q.forward(&x, m);
            let t = std::time::Instant::now();
            for _ in 0..5 {
                q.forward(&x, m);
            }
            let s = t.elapsed().as_secs_f64() / 5.0;
            println!(
                "m {m} k {k} out {out}: {:.2} ms, {:.1} GMAC/s",
                s * 1e3,
                (m * k * out) as f64 / s / 1e9
            );
        }
    }
}
