//! CPU kernels candle lacks in a fast form. candle's `gelu_erf` calls libm's scalar `erff` per element, about
//! 6% of a MiniLM forward; this GELU uses a rational approximation of erf (the one Eigen and XLA use for
//! f32: odd polynomial over even polynomial on [-4, 4], max error a few ulp) that the compiler vectorises.

use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor};

use candle_core::Result;

const A: [f32; 7] = [
    -2.726_142_3e-10,
    2.770_681_4e-8,
    -2.101_024e-6,
    -5.692_506_4e-5,
    -7.349_906_3e-4,
    -2.954_600_1e-3,
    -1.609_603_3e-2,
];
const B: [f32; 5] = [
    -1.456_607_2e-5,
    -2.133_740_6e-4,
    -1.682_827e-3,
    -7.373_329_2e-3,
    -1.426_474e-2,
];

/// erf(x) for f32, branch-free.
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = A[0];
    for a in &A[1..] {
        p = p.mul_add(x2, *a);
    }
    let mut q = B[0];
    for b in &B[1..] {
        q = q.mul_add(x2, *b);
    }
    x * p / q
}

/// Exact (erf) GELU: `x/2 · (1 + erf(x/√2))`.
#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

struct Gelu;

impl CustomOp1 for Gelu {
    fn name(&self) -> &'static str {
        "tiergate-gelu-erf"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let data = storage.as_slice::<f32>()?;
        let (start, end) = layout
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("gelu: input must be contiguous".into()))?;
        let out: Vec<f32> = data[start..end].iter().map(|&x| gelu(x)).collect();
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }
}

/// GELU of a contiguous f32 tensor on the CPU (no backward pass: inference only).
pub fn gelu_erf(x: &Tensor) -> Result<Tensor> {
    x.apply_op1_no_bwd(&Gelu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_candles_libm_gelu_closely() {
        let xs: Vec<f32> = (-1000..=1000).map(|i| i as f32 * 0.01).collect();
        let t = Tensor::new(xs.as_slice(), &candle_core::Device::Cpu).unwrap();
        let ours = gelu_erf(&t).unwrap().to_vec1::<f32>().unwrap();
        let reference = t.gelu_erf().unwrap().to_vec1::<f32>().unwrap();
        for ((x, a), b) in xs.iter().zip(&ours).zip(&reference) {
            assert!(
                (a - b).abs() <= 2e-6 * (1.0 + b.abs()),
                "gelu({x}): {a} vs {b}"
            );
        }
        assert_eq!(erf(0.0), 0.0);
        assert!((erf(10.0) - 1.0).abs() < 1e-6 && (erf(-10.0) + 1.0).abs() < 1e-6);
    }
}
