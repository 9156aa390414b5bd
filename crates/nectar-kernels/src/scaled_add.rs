//! `y += a · x`, element by element: a multiply, then an add (two roundings, never fused), the
//! order of the scalar loop `*y += a * x` the attention's weighted sum of values was written as.
//!
//! Why a kernel: that loop, compiled for the baseline x86-64 target, runs on 4-wide SSE; inside
//! a function built for AVX-512 (or AVX2) the same source runs 16 (8) lanes wide. Rust never
//! contracts a multiply and an add into an FMA, so every path computes the same bits.
use crate::dot::{isa_detect, Isa};

/// `y[i] += a * x[i]` for every `i`, on the fastest available path.
///
/// # Panics
/// If the lengths differ (a caller bug, never a data error).
#[inline]
pub fn scaled_add(y: &mut [f32], a: f32, x: &[f32]) {
    scaled_add_with(isa_detect(), y, a, x)
}

/// [`scaled_add`] on an explicit path (tests compare every path with the scalar loop).
pub(crate) fn scaled_add_with(isa: Isa, y: &mut [f32], a: f32, x: &[f32]) {
    assert_eq!(y.len(), x.len(), "scaled_add: length mismatch");
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512` is only constructed after runtime detection of AVX-512F.
        Isa::Avx512 => unsafe { avx512(y, a, x) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only constructed after runtime detection of AVX2.
        Isa::Avx2 => unsafe { avx2(y, a, x) },
        _ => scalar(y, a, x),
    }
}

#[inline(always)]
fn scalar(y: &mut [f32], a: f32, x: &[f32]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o += a * v;
    }
}

/// # Safety
/// The CPU supports AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avx512(y: &mut [f32], a: f32, x: &[f32]) {
    scalar(y, a, x)
}

/// # Safety
/// The CPU supports AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn avx2(y: &mut [f32], a: f32, x: &[f32]) {
    scalar(y, a, x)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every path equals the scalar loop bit for bit, including products that round
    /// differently when fused (an FMA would keep `a · x` exact before the add).
    #[test]
    fn every_path_is_the_scalar_loop() {
        for n in [0usize, 1, 7, 16, 33, 256, 1000] {
            let mut s = 0x9e37_79b9_7f4a_7c15u64;
            let mut next = || {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            };
            let x: Vec<f32> = (0..n).map(|_| next()).collect();
            let y0: Vec<f32> = (0..n).map(|_| next()).collect();
            let a = 0.713_267_4;
            let mut want = y0.clone();
            scalar(&mut want, a, &x);
            for isa in Isa::available() {
                let mut y = y0.clone();
                scaled_add_with(isa, &mut y, a, &x);
                let same = y.iter().zip(&want).all(|(p, q)| p.to_bits() == q.to_bits());
                assert!(same, "{isa:?} n = {n}");
            }
            // The fused result differs somewhere, so the test would see a contraction.
            if n >= 16 {
                let fused: Vec<f32> = y0.iter().zip(&x).map(|(&o, &v)| a.mul_add(v, o)).collect();
                assert!(fused
                    .iter()
                    .zip(&want)
                    .any(|(p, q)| p.to_bits() != q.to_bits()));
            }
        }
    }
}
