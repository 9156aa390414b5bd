//! AVX2 + FMA implementations of the canonical kernels (see `dot.rs` for the order they keep).
use std::arch::x86_64::*;

/// Canonical dot product with two 8-lane accumulators (lanes 0..8 and 8..16).
///
/// # Safety
/// The CPU must support AVX2 and FMA; `a.len() == b.len()`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len();
    let full = n / 16 * 16;
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut lo = _mm256_setzero_ps();
    let mut hi = _mm256_setzero_ps();
    let mut c = 0;
    while c < full {
        // SAFETY: c + 16 <= full <= n, so both 8-wide loads are in bounds.
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(c)), _mm256_loadu_ps(pb.add(c)), lo);
        hi = _mm256_fmadd_ps(
            _mm256_loadu_ps(pa.add(c + 8)),
            _mm256_loadu_ps(pb.add(c + 8)),
            hi,
        );
        c += 16;
    }
    if full < n {
        let mut ta = [0.0f32; 16];
        let mut tb = [0.0f32; 16];
        ta[..n - full].copy_from_slice(&a[full..]);
        tb[..n - full].copy_from_slice(&b[full..]);
        lo = _mm256_fmadd_ps(
            _mm256_loadu_ps(ta.as_ptr()),
            _mm256_loadu_ps(tb.as_ptr()),
            lo,
        );
        hi = _mm256_fmadd_ps(
            _mm256_loadu_ps(ta.as_ptr().add(8)),
            _mm256_loadu_ps(tb.as_ptr().add(8)),
            hi,
        );
    }
    fold_avx2(lo, hi)
}

/// Folds (lo, hi) = lanes 0..16 in the canonical order.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn fold_avx2(lo: __m256, hi: __m256) -> f32 {
    let s8 = _mm256_add_ps(lo, hi); // l[j] + l[j+8]
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1)); // + l[j+4]
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4)); // + l[j+2]
    let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)); // l0 + l1
    _mm_cvtss_f32(s1)
}

/// Widens 8 bf16 values (as u16) to f32.
///
/// # Safety
/// AVX2 must be available; `p` must point at 8 readable u16.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn load_bf16x8(p: *const u8) -> __m256 {
    let h = _mm_loadu_si128(p as *const __m128i);
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
}

/// Decodes a bf16 row (little-endian bytes) to f32.
///
/// # Safety
/// AVX2 must be available; `src.len() == 2 * dst.len()`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn decode_bf16_avx2(src: &[u8], dst: &mut [f32]) {
    let n = dst.len();
    let full = n / 8 * 8;
    let mut c = 0;
    while c < full {
        // SAFETY: c + 8 <= n, so 16 source bytes and 8 destination floats are in bounds.
        _mm256_storeu_ps(
            dst.as_mut_ptr().add(c),
            load_bf16x8(src.as_ptr().add(2 * c)),
        );
        c += 8;
    }
    for i in full..n {
        dst[i] = f32::from_bits((u16::from_le_bytes([src[2 * i], src[2 * i + 1]]) as u32) << 16);
    }
}
