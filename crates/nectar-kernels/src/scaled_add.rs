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

/// Rows of [`scaled_add4`] at once.
pub const ROWS4: usize = 4;

/// `ys[r][i] += a[r][k] · x_k[i]` for every key `k` in order (`x_k` = `x[k · x_stride ..]`, as long
/// as the rows), four rows at once: for each `(r, i)` the multiply-then-add sequence of
/// `scaled_add(ys[r], a[r][k], x_k)` called for k = 0, 1, …, so the same bits. What differs is
/// that a 64-column slice of the four rows stays in registers across the keys, and each key's
/// slice is loaded once for the four rows (the attention's weighted sum of values: a tile of
/// keys folded into a group of query rows).
///
/// # Panics
/// If the rows' lengths differ, the weights' counts differ, or `x` is too short (caller bugs).
pub fn scaled_add4(ys: [&mut [f32]; ROWS4], a: [&[f32]; ROWS4], x: &[f32], x_stride: usize) {
    scaled_add4_with(isa_detect(), ys, a, x, x_stride)
}

pub(crate) fn scaled_add4_with(
    isa: Isa,
    ys: [&mut [f32]; ROWS4],
    a: [&[f32]; ROWS4],
    x: &[f32],
    x_stride: usize,
) {
    let (len, n) = (ys[0].len(), a[0].len());
    assert!(
        ys.iter().all(|y| y.len() == len) && a.iter().all(|w| w.len() == n),
        "scaled_add4: rows or weights of different lengths"
    );
    assert!(
        n == 0 || (n - 1) * x_stride + len <= x.len(),
        "scaled_add4: {n} keys of {len} with stride {x_stride} exceed {} values",
        x.len()
    );
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512` is only constructed after runtime detection of AVX-512F.
        Isa::Avx512 => unsafe { avx512_4(ys, a, x, x_stride) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only constructed after runtime detection of AVX2.
        Isa::Avx2 => unsafe { avx2_4(ys, a, x, x_stride) },
        _ => block4::<16>(ys, a, x, x_stride),
    }
}

/// [`scaled_add4`]'s body, `W` columns of the four rows held across the keys (a multiple of
/// the vector width: 64 floats × 4 rows = 16 AVX-512 registers).
#[inline(always)]
fn block4<const W: usize>(mut ys: [&mut [f32]; ROWS4], a: [&[f32]; ROWS4], x: &[f32], xs: usize) {
    let (len, n) = (ys[0].len(), a[0].len());
    let mut c = 0;
    while c + W <= len {
        let mut acc = [[0.0f32; W]; ROWS4];
        for (row, y) in acc.iter_mut().zip(&ys) {
            row.copy_from_slice(&y[c..c + W]);
        }
        for k in 0..n {
            let xk: &[f32; W] = x[k * xs + c..][..W].try_into().expect("W values");
            for (row, w) in acc.iter_mut().zip(&a) {
                let ar = w[k];
                for (o, &v) in row.iter_mut().zip(xk) {
                    *o += ar * v;
                }
            }
        }
        for (y, row) in ys.iter_mut().zip(&acc) {
            y[c..c + W].copy_from_slice(row);
        }
        c += W;
    }
    if c < len {
        for k in 0..n {
            for (y, w) in ys.iter_mut().zip(&a) {
                scalar(&mut y[c..], w[k], &x[k * xs + c..][..len - c]);
            }
        }
    }
}

/// # Safety
/// The CPU supports AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avx512_4(ys: [&mut [f32]; ROWS4], a: [&[f32]; ROWS4], x: &[f32], xs: usize) {
    block4::<64>(ys, a, x, xs)
}

/// # Safety
/// The CPU supports AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn avx2_4(ys: [&mut [f32]; ROWS4], a: [&[f32]; ROWS4], x: &[f32], xs: usize) {
    block4::<32>(ys, a, x, xs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` values in [-1, 1) with 24 random bits each (fine enough that a fused multiply-add
    /// rounds differently somewhere).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// Every path equals the scalar loop bit for bit, including products that round
    /// differently when fused (an FMA would keep `a · x` exact before the add).
    #[test]
    fn every_path_is_the_scalar_loop() {
        for n in [0usize, 1, 7, 16, 33, 256, 1000] {
            let (x, y0) = (values(n, 1), values(n, 2));
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

    /// Four rows at once equal four rows of `scaled_add` calls key by key, bit for bit, on every
    /// path: lengths with and without a tail, strided keys, no keys.
    #[test]
    fn four_rows_at_once_are_four_rows_of_scaled_add() {
        for (len, n, stride) in [
            (256, 7, 448),
            (64, 1, 64),
            (100, 5, 130),
            (7, 3, 9),
            (200, 0, 200),
        ] {
            let x = values(n * stride + len, 3);
            let w: Vec<Vec<f32>> = (0..ROWS4).map(|r| values(n, 10 + r as u64)).collect();
            let y0: Vec<Vec<f32>> = (0..ROWS4).map(|r| values(len, 20 + r as u64)).collect();
            let mut want = y0.clone();
            for k in 0..n {
                for (y, wr) in want.iter_mut().zip(&w) {
                    scalar(y, wr[k], &x[k * stride..][..len]);
                }
            }
            for isa in Isa::available() {
                let mut y = y0.clone();
                let [a, b, c, d] = &mut y[..] else {
                    unreachable!()
                };
                let ws = [&w[0][..], &w[1][..], &w[2][..], &w[3][..]];
                scaled_add4_with(isa, [a, b, c, d], ws, &x, stride);
                for (r, (got, want)) in y.iter().zip(&want).enumerate() {
                    let same = got
                        .iter()
                        .zip(want)
                        .all(|(p, q)| p.to_bits() == q.to_bits());
                    assert!(same, "{isa:?} len {len} keys {n}: row {r}");
                }
            }
        }
    }
}
