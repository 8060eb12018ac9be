//! Int8 dense layers for inference on AVX-512 VNNI (`vpdpbusd`: 64 u8×i8 multiply-adds per instruction, four
//! times f32 FMA's rate), for the prefilter's encoder and the reranker's scoring forward. Weights are quantised
//! once per output channel (symmetric i8), activations per row at each call (symmetric, stored as u8 with a
//! +128 offset that the precomputed weight sums take back out).
//!
//! One call is three passes: the activations are quantised (a vectorised pass over `x`), the register-tiled
//! kernel multiplies, and each tile's integers are turned into `f32` (offset, scales, bias) in registers and
//! stored straight into the output — no `i32` buffer. A CPU without VNNI runs portable loops that compute
//! the same bits.

use std::ops::Range;

/// Output channels per packed block (one zmm of i32 accumulators).
const NB: usize = 16;
/// Blocks per panel: a tile reads one panel's weights as one contiguous stream.
const PANEL: usize = 4;
/// Rows per full tile: 6 rows × 4 blocks = 24 accumulators, 4 weight registers, 1–2 broadcasts (32 zmm).
const ROWS: usize = 6;
/// With a helper thread lent ([`with_helper`]), a layer of at least this many rows splits them in two …
const SPLIT_ROWS: usize = 4 * ROWS;
/// … and a smaller one of at least this many multiply-adds splits its outputs (panels) in two.
const SPLIT_MACS: usize = 1 << 21;

/// A helper thread lent to this thread's int8 layers, while `busy` (the workers running a forward, this one
/// included) stays at one.
#[derive(Clone)]
struct Lent {
    pool: std::sync::Arc<rayon::ThreadPool>,
    busy: Option<std::sync::Arc<std::sync::atomic::AtomicUsize>>,
}

thread_local! {
    /// The helper this thread's layers may borrow (see [`with_helper`]).
    static HELPER: std::cell::RefCell<Option<Lent>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` with `helper`'s thread lent to the int8 layers this thread runs meanwhile (both cores on one
/// forward when the other core would be idle): a layer with many rows computes half of them there, a smaller
/// one half of its outputs. Each layer checks `busy` first — the number of forwards running, this one
/// included — and keeps to its own thread once another has started. Rows and outputs are independent, so the
/// result is the same bits as on one thread.
pub fn with_helper<T>(
    helper: &std::sync::Arc<rayon::ThreadPool>,
    busy: Option<std::sync::Arc<std::sync::atomic::AtomicUsize>>,
    f: impl FnOnce() -> T,
) -> T {
    struct Restore(Option<Lent>);
    impl Drop for Restore {
        fn drop(&mut self) {
            HELPER.with(|h| *h.borrow_mut() = self.0.take());
        }
    }
    let lent = Lent {
        pool: helper.clone(),
        busy,
    };
    let _restore = Restore(HELPER.with(|h| h.borrow_mut().replace(lent)));
    f()
}

/// The helper pool, when one is lent and no other forward runs.
fn lent_now() -> Option<std::sync::Arc<rayon::ThreadPool>> {
    HELPER.with(|h| {
        let h = h.borrow();
        let l = h.as_ref()?;
        let alone = l
            .busy
            .as_ref()
            .is_none_or(|b| b.load(std::sync::atomic::Ordering::Acquire) <= 1);
        alone.then(|| l.pool.clone())
    })
}

/// The output pointer two threads write disjoint columns through.
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: the two halves of a split layer write disjoint outputs (see `QDense::forward`).
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

/// A dense layer `y = x·Wᵀ + b` with i8 weights.
pub struct QDense {
    out: usize,
    k: usize,
    /// `k` rounded up to 4 (one i32 of u8 activations per `vpdpbusd` lane).
    k4: usize,
    /// Packed in panels of up to [`PANEL`] blocks of 16 output channels: `[panel][k4/4][blocks][16][4]`, so one
    /// 64-byte load holds 4 inputs of 16 outputs (16 outputs per register, no horizontal reduction) and a
    /// tile's loads walk one panel front to back. Zero-padded.
    w: Vec<i8>,
    /// Per output channel (padded to the blocks with 0): weight scale.
    sw: Vec<f32>,
    /// Per output channel (padded): −128 · Σ w, which takes the +128 activation offset back out.
    corr: Vec<i32>,
    /// Per output channel (padded): bias.
    b: Vec<f32>,
    /// The CPU runs the AVX-512 VNNI kernel (checked once at construction); otherwise a portable loop
    /// computes the same bits, so `forward` is sound on any CPU.
    vnni: bool,
}

/// Whether this CPU runs the int8 kernel.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn scale_of(v: &[f32]) -> f32 {
    let m = v.iter().fold(0f32, |a, x| a.max(x.abs()));
    scale_from_max(m)
}

/// The symmetric scale for a largest magnitude `m` (1 for an all-zero row).
fn scale_from_max(m: f32) -> f32 {
    if m > 0.0 {
        m / 127.0
    } else {
        1.0
    }
}

/// Where block `nb`'s group `g` lies in the packed weights (bytes), for `blocks` blocks and `groups` groups.
fn packed_at(nb: usize, g: usize, blocks: usize, groups: usize) -> usize {
    let (panel, j) = (nb / PANEL, nb % PANEL);
    let width = PANEL.min(blocks - panel * PANEL);
    (panel * PANEL * groups + g * width + j) * NB * 4
}

impl QDense {
    /// `w` is `[out, k]` row-major (the checkpoint layout), `b` is `[out]`.
    pub fn new(w: &[f32], b: &[f32], out: usize, k: usize) -> Self {
        let k4 = k.div_ceil(4) * 4;
        let blocks = out.div_ceil(NB);
        let groups = k4 / 4;
        let outp = blocks * NB;
        let mut packed = vec![0i8; outp * k4];
        let mut sw = vec![0f32; outp];
        let mut corr = vec![0i32; outp];
        let mut bias = vec![0f32; outp];
        bias[..out].copy_from_slice(&b[..out]);
        for n in 0..out {
            let row = &w[n * k..(n + 1) * k];
            let s = scale_of(row);
            sw[n] = s;
            let (nb, o) = (n / NB, n % NB);
            let mut sum = 0i32;
            for (i, &x) in row.iter().enumerate() {
                let v = (x / s).round().clamp(-127.0, 127.0) as i8;
                packed[packed_at(nb, i / 4, blocks, groups) + o * 4 + i % 4] = v;
                sum += i32::from(v);
            }
            corr[n] = -128 * sum;
        }
        Self {
            out,
            k,
            k4,
            w: packed,
            sw,
            corr,
            b: bias,
            vnni: available(),
        }
    }

    pub fn out_features(&self) -> usize {
        self.out
    }

    /// `x` is `[m, k]` row-major; returns `[m, out]`. Panics when `x` is shorter than `m · k`. Runs the
    /// VNNI kernel where the CPU has it, portable loops elsewhere (the same bits, much slower).
    pub fn forward(&self, x: &[f32], m: usize) -> Vec<f32> {
        let k = self.k;
        assert!(
            x.len() >= m * k,
            "QDense::forward: {} inputs for {m} rows of {k}",
            x.len()
        );
        let mut y = vec![0f32; m * self.out];
        let blocks = self.out.div_ceil(NB);
        match lent_now() {
            Some(pool) if m >= SPLIT_ROWS || (!self.vnni && m >= 2) => {
                let half = m / 2;
                let (xa, xb) = x[..m * k].split_at(half * k);
                let (ya, yb) = y.split_at_mut(half * self.out);
                pool.in_place_scope(|s| {
                    s.spawn(|_| self.forward_into(xb, m - half, yb));
                    self.forward_into(xa, half, ya);
                });
            }
            #[cfg(target_arch = "x86_64")]
            Some(pool) if self.vnni && m * k * self.out >= SPLIT_MACS && blocks > PANEL => {
                // Few rows: both threads take every row, each half of the panels (disjoint output columns).
                let mid = blocks.div_ceil(PANEL) / 2 * PANEL;
                // SAFETY: `vnni` is `available()`; `x` holds `m · k` values; `y` holds `m · out`, of which
                // each call writes only the columns of its blocks (`mid` is a panel boundary).
                unsafe {
                    let (xq, sx) = quantize_avx512(x, m, k, self.k4);
                    let out = Out(y.as_mut_ptr());
                    let (xq, sx) = (&xq, &sx);
                    pool.in_place_scope(|s| {
                        s.spawn(move |_| {
                            let out = out;
                            gemm_avx512(self, xq, sx, out.0, m, mid..blocks)
                        });
                        gemm_avx512(self, xq, sx, out.0, m, 0..mid);
                    });
                }
            }
            _ => self.forward_into(x, m, &mut y),
        }
        y
    }

    /// [`Self::forward`] on this thread, into `y` (`[m, out]`).
    fn forward_into(&self, x: &[f32], m: usize, y: &mut [f32]) {
        if m == 0 {
            return;
        }
        let k = self.k;
        #[cfg(target_arch = "x86_64")]
        if self.vnni {
            // SAFETY: `vnni` is `available()` (the CPU has the target features); `x` holds `m · k` values (checked
            // by `forward`), `y` `m · out`, and the kernels allocate the rest with the sizes they index.
            unsafe {
                let (xq, sx) = quantize_avx512(x, m, k, self.k4);
                gemm_avx512(self, &xq, &sx, y.as_mut_ptr(), m, 0..self.out.div_ceil(NB));
            }
            return;
        }
        let (xq, sx) = quantize_portable(x, m, k, self.k4);
        self.gemm_portable(&xq, &sx, y, m);
    }

    /// The output channel's `f32` from its integer dot product (the kernel's epilogue does the same two
    /// roundings: a multiply, then an add).
    fn dequant(&self, dot: i32, sx: f32, n: usize) -> f32 {
        (dot + self.corr[n]) as f32 * (sx * self.sw[n]) + self.b[n]
    }

    /// The kernel's result with plain loops (CPUs without AVX-512 VNNI, and the reference in tests).
    fn gemm_portable(&self, xq: &[u8], sx: &[f32], y: &mut [f32], m: usize) {
        let (k4, groups, blocks) = (self.k4, self.k4 / 4, self.out.div_ceil(NB));
        for r in 0..m {
            let xr = &xq[r * k4..(r + 1) * k4];
            for n in 0..self.out {
                let (nb, o) = (n / NB, n % NB);
                let mut dot = 0i32;
                for g in 0..groups {
                    let base = packed_at(nb, g, blocks, groups) + o * 4;
                    for t in 0..4 {
                        dot += i32::from(xr[g * 4 + t]) * i32::from(self.w[base + t]);
                    }
                }
                y[r * self.out + n] = self.dequant(dot, sx[r], n);
            }
        }
    }
}

/// Rows quantised to u8 (`[m, k4]`, value + 128, padding 128 = zero) and their scales: round half to even.
fn quantize_portable(x: &[f32], m: usize, k: usize, k4: usize) -> (Vec<u8>, Vec<f32>) {
    let mut xq = vec![128u8; m * k4];
    let mut sx = vec![0f32; m];
    for r in 0..m {
        let row = &x[r * k..(r + 1) * k];
        let s = scale_of(row);
        sx[r] = s;
        let inv = 1.0 / s;
        for (d, &v) in xq[r * k4..r * k4 + k].iter_mut().zip(row) {
            *d = ((v * inv).round_ties_even().clamp(-127.0, 127.0) as i32 + 128) as u8;
        }
    }
    (xq, sx)
}

/// [`quantize_portable`] with AVX-512: 16 values per step (the conversion rounds half to even, as there).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn quantize_avx512(x: &[f32], m: usize, k: usize, k4: usize) -> (Vec<u8>, Vec<f32>) {
    use std::arch::x86_64::*;
    let mut xq = vec![128u8; m * k4];
    let mut sx = vec![0f32; m];
    let full = k / 16 * 16;
    let tail: __mmask16 = ((1u32 << (k - full)) - 1) as u16;
    for r in 0..m {
        let row = &x[r * k..(r + 1) * k];
        let p = row.as_ptr();
        // SAFETY: every load reads inside `row` (the tail with a mask); every store writes inside row r of xq.
        unsafe {
            let mut mx = _mm512_setzero_ps();
            let mut i = 0;
            while i < full {
                mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_loadu_ps(p.add(i))));
                i += 16;
            }
            if full < k {
                mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_maskz_loadu_ps(tail, p.add(full))));
            }
            let s = scale_from_max(_mm512_reduce_max_ps(mx));
            sx[r] = s;
            let inv = _mm512_set1_ps(1.0 / s);
            let (lo, hi, off) = (
                _mm512_set1_epi32(-127),
                _mm512_set1_epi32(127),
                _mm512_set1_epi32(128),
            );
            let q = xq.as_mut_ptr().add(r * k4);
            let conv = |v: __m512| {
                let n = _mm512_cvtps_epi32(_mm512_mul_ps(v, inv));
                _mm512_cvtepi32_epi8(_mm512_add_epi32(
                    _mm512_min_epi32(_mm512_max_epi32(n, lo), hi),
                    off,
                ))
            };
            let mut i = 0;
            while i < full {
                _mm_storeu_si128(q.add(i) as *mut _, conv(_mm512_loadu_ps(p.add(i))));
                i += 16;
            }
            if full < k {
                let v = conv(_mm512_maskz_loadu_ps(tail, p.add(full)));
                _mm_mask_storeu_epi8(q.add(full) as *mut _, tail, v);
            }
        }
    }
    (xq, sx)
}

/// `y = dequant(xq · wᵀ)` for the output blocks in `blocks` (whole panels), into `y` (`[m, out]`, only those
/// blocks' columns written): panels of 4 blocks outside, tiles of 6 rows inside (the panel's weights stay in
/// cache while the rows stream by); remainders take smaller tiles.
///
/// # Safety
/// The CPU has the target features; `xq` is `[m, k4]`, `sx` `[m]`, `y` points at `m · out` writable floats
/// that nothing else reads or writes in these columns meanwhile; `blocks.start` is a panel boundary.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn gemm_avx512(
    q: &QDense,
    xq: &[u8],
    sx: &[f32],
    y: *mut f32,
    m: usize,
    blocks: Range<usize>,
) {
    let (mut nb, blocks) = (blocks.start, blocks.end);
    while nb < blocks {
        let j = (blocks - nb).min(PANEL);
        let mut r = 0;
        while r < m {
            let rows = (m - r).min(ROWS);
            let t = Tile {
                q,
                xq,
                sx,
                r0: r,
                nb0: nb,
            };
            // SAFETY: same target features as this function; rows r..r+rows < m and blocks nb..nb+j < blocks.
            let took = unsafe {
                match (rows, j) {
                    (6, 4) => t.run::<6, 4, 1>(y),
                    (6, 3) => t.run::<6, 3, 1>(y),
                    (6, 2) => t.run::<6, 2, 1>(y),
                    (6, _) => t.run::<6, 1, 1>(y),
                    (4 | 5, 4) => t.run::<4, 4, 1>(y),
                    (4 | 5, 3) => t.run::<4, 3, 1>(y),
                    (4 | 5, 2) => t.run::<4, 2, 1>(y),
                    (4 | 5, _) => t.run::<4, 1, 1>(y),
                    (2 | 3, 4) => t.run::<2, 4, 2>(y),
                    (2 | 3, 3) => t.run::<2, 3, 2>(y),
                    (2 | 3, 2) => t.run::<2, 2, 2>(y),
                    (2 | 3, _) => t.run::<2, 1, 2>(y),
                    (_, 4) => t.run::<1, 4, 2>(y),
                    (_, 3) => t.run::<1, 3, 2>(y),
                    (_, 2) => t.run::<1, 2, 2>(y),
                    (_, _) => t.run::<1, 1, 2>(y),
                }
            };
            r += took;
        }
        nb += j;
    }
}

/// One register tile's place: rows from `r0`, blocks from `nb0` (the first block of a panel).
#[cfg(target_arch = "x86_64")]
struct Tile<'a> {
    q: &'a QDense,
    xq: &'a [u8],
    sx: &'a [f32],
    r0: usize,
    nb0: usize,
}

#[cfg(target_arch = "x86_64")]
impl Tile<'_> {
    /// Rows `r0..r0+R` against the `J` blocks of the panel at `nb0`: R×J zmm accumulators, `U` of them per
    /// output (`U` = 2 splits the K loop over two independent chains, for tiles too small to hide
    /// `vpdpbusd`'s latency; integer sums, so the split is exact). Returns R.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    #[allow(clippy::needless_range_loop)] // index loops read as the register tile they are
    unsafe fn run<const R: usize, const J: usize, const U: usize>(&self, y: *mut f32) -> usize {
        use std::arch::x86_64::*;
        let q = self.q;
        let (k4, groups) = (q.k4, q.k4 / 4);
        let blocks = q.out.div_ceil(NB);
        // SAFETY (all pointer offsets below): rows r0..r0+R < m hold k4 bytes each; the panel at nb0 holds
        // `groups` × J × 64 bytes from `packed_at(nb0, 0)`; the loop reads exactly those.
        let xp = self.xq.as_ptr();
        let mut xr: [*const u8; R] = std::array::from_fn(|i| unsafe { xp.add((self.r0 + i) * k4) });
        let mut wp = unsafe { q.w.as_ptr().add(packed_at(self.nb0, 0, blocks, groups)) };
        let mut s = [[[_mm512_setzero_si512(); J]; R]; U];
        let mut g = 0;
        // The panel's 4 inputs × 16 outputs per block first (J registers), then one broadcast row at a time:
        // R×J accumulators + J + 1 registers (30 of 32 for the full tile, no spills).
        while g + U <= groups {
            for u in 0..U {
                // SAFETY: see above; 64 bytes of each block's group g + u, then 4 bytes of each row.
                let wv: [__m512i; J] = std::array::from_fn(|jj| unsafe {
                    _mm512_loadu_si512(wp.add(jj * NB * 4) as *const _)
                });
                wp = unsafe { wp.add(J * NB * 4) };
                for i in 0..R {
                    let xb =
                        unsafe { _mm512_set1_epi32(std::ptr::read_unaligned(xr[i] as *const i32)) };
                    xr[i] = unsafe { xr[i].add(4) };
                    for jj in 0..J {
                        s[u][i][jj] = _mm512_dpbusd_epi32(s[u][i][jj], xb, wv[jj]);
                    }
                }
            }
            g += U;
        }
        if g < groups {
            // SAFETY: as above (the last group when U = 2 and the group count is odd).
            let wv: [__m512i; J] = std::array::from_fn(|jj| unsafe {
                _mm512_loadu_si512(wp.add(jj * NB * 4) as *const _)
            });
            for i in 0..R {
                let xb =
                    unsafe { _mm512_set1_epi32(std::ptr::read_unaligned(xr[i] as *const i32)) };
                for jj in 0..J {
                    s[0][i][jj] = _mm512_dpbusd_epi32(s[0][i][jj], xb, wv[jj]);
                }
            }
        }
        for i in 0..R {
            let r = self.r0 + i;
            let sxr = _mm512_set1_ps(self.sx[r]);
            for jj in 0..J {
                let n0 = (self.nb0 + jj) * NB;
                let mut dot = s[0][i][jj];
                for u in 1..U {
                    dot = _mm512_add_epi32(dot, s[u][i][jj]);
                }
                // SAFETY: corr, sw and b are padded to whole blocks; the store is masked to row r's outputs.
                unsafe {
                    let a = _mm512_add_epi32(
                        dot,
                        _mm512_loadu_si512(q.corr.as_ptr().add(n0) as *const _),
                    );
                    let scale = _mm512_mul_ps(sxr, _mm512_loadu_ps(q.sw.as_ptr().add(n0)));
                    let v = _mm512_add_ps(
                        _mm512_mul_ps(_mm512_cvtepi32_ps(a), scale),
                        _mm512_loadu_ps(q.b.as_ptr().add(n0)),
                    );
                    let live = (q.out - n0).min(NB);
                    let mask: __mmask16 = ((1u32 << live) - 1) as u16;
                    _mm512_mask_storeu_ps(y.add(r * q.out + n0), mask, v);
                }
            }
        }
        R
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// `n` values drawn uniformly from `lo..hi`.
    fn uniform(rng: &mut rand::rngs::StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| rng.gen_range(lo..hi)).collect()
    }

    /// The VNNI kernel and the portable loop compute the same integers (the portable path is what a CPU
    /// without AVX-512 runs, so `forward` is sound everywhere).
    #[test]
    fn portable_loop_equals_the_kernel() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        // K not a multiple of 64 (nor of 16 or 4), rows not a multiple of the tiles, 1 row, 65 rows, outputs
        // leaving a partial block and a partial panel.
        for &(m, k, out) in &[
            (1, 64, 4),
            (5, 100, 7),
            (7, 577, 33),
            (13, 64, 48),
            (1, 1536, 576),
            (2, 83, 80),
            (3, 385, 97),
            (65, 577, 100),
            (65, 64, 1),
            (16, 384, 1536),
            (11, 3, 130),
        ] {
            let w = uniform(&mut rng, out * k, -0.2, 0.2);
            let b = uniform(&mut rng, out, -0.1, 0.1);
            let mut x = uniform(&mut rng, m * k, -2.0, 2.0);
            // An all-zero row (scale 1) and exact halves (rounding ties) are quantised alike too.
            x[..k].iter_mut().for_each(|v| *v = 0.0);
            if m > 1 {
                x[k] = 127.0;
                x[k + 1] = 0.5;
                if k > 2 {
                    x[k + 2] = -1.5;
                }
            }
            let mut q = QDense::new(&w, &b, out, k);
            let fast = q.forward(&x, m);
            q.vnni = false;
            let portable = q.forward(&x, m);
            assert_eq!(fast, portable, "m {m} k {k} out {out}");
        }
    }

    /// With a helper thread lent, layers split their rows or outputs over two threads: the same bits as one.
    #[test]
    fn two_threads_give_the_same_bits_as_one() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let pool = std::sync::Arc::new(
            rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .unwrap(),
        );
        // Rows split (24 rows and more), outputs split (fewer rows, 2M multiply-adds and more, more than
        // one panel), and layers too small to split.
        for &(m, k, out) in &[
            (7, 64, 16),
            (8, 100, 33),
            (1, 1536, 2048),
            (3, 577, 1300),
            (16, 384, 1536),
            (24, 384, 1152),
            (65, 577, 100),
        ] {
            let w = uniform(&mut rng, out * k, -0.2, 0.2);
            let x = uniform(&mut rng, m * k, -2.0, 2.0);
            let q = QDense::new(&w, &vec![0.1; out], out, k);
            let one = q.forward(&x, m);
            let lent = with_helper(&pool, None, || q.forward(&x, m));
            assert_eq!(one, lent, "m {m} k {k} out {out}");
        }
        assert!(
            HELPER.with(|h| h.borrow().is_none()),
            "the helper is returned"
        );
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
            let w = uniform(&mut rng, out * k, -0.2, 0.2);
            let b = uniform(&mut rng, out, -0.1, 0.1);
            let x = uniform(&mut rng, m * k, -2.0, 2.0);
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
