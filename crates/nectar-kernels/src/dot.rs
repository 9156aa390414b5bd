//! The canonical f32 dot product.
//!
//! Order (the contract every implementation reproduces bit for bit):
//! 1. 16 accumulator lanes start at +0. Element `c` goes to lane `c % 16`; each step is one
//!    fused multiply-add `acc = fma(a[c], b[c], acc)`, walking `c` upward. A ragged tail is
//!    treated as if padded with zeros (so the padded lanes see `fma(0, 0, acc)`).
//! 2. The lanes are folded by halves: `l[j] += l[j + 8]` (j < 8), then `l[j] += l[j + 4]`
//!    (j < 4), `l[j] += l[j + 2]` (j < 2), and finally `l[0] + l[1]`.
//!
//! This is the natural order of a 16-wide (AVX-512) or 2×8-wide (AVX2) register loop, so the
//! SIMD paths pay nothing for it, and the scalar path below is a readable specification.
use std::sync::OnceLock;

/// Accumulator lanes of the canonical order.
pub const LANES: usize = 16;

/// An instruction-set path. Every path reproduces the scalar reference bit for bit; the choice
/// only changes speed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Isa {
    Scalar,
    /// AVX2 + FMA + F16C, 2 × 8-lane registers per accumulator.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX-512F, one 16-lane register per accumulator.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// NEON, 4 × 4-lane registers per accumulator.
    #[cfg(target_arch = "aarch64")]
    Neon,
}

impl Isa {
    /// Every path this CPU can run, slowest (the scalar reference) first.
    pub(crate) fn available() -> Vec<Isa> {
        #[allow(unused_mut)]
        let mut v = vec![Isa::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c");
            if avx2 {
                v.push(Isa::Avx2);
            }
            // The AVX-512 path also uses AVX2 helpers (the fold, bf16 row decode).
            if avx2 && std::arch::is_x86_feature_detected!("avx512f") {
                v.push(Isa::Avx512);
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            if std::arch::is_aarch64_feature_detected!("neon") {
                v.push(Isa::Neon);
            }
        }
        v
    }

    /// A short stable name ("scalar", "avx2+fma", "avx512f", "neon").
    pub(crate) fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => "avx2+fma",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => "avx512f",
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => "neon",
        }
    }
}

static ISA: OnceLock<Isa> = OnceLock::new();

/// The path the public entry points use: the fastest available one, unless [`set_isa`] chose
/// another before the first product. The override exists so a slower path can be measured or
/// bisected in place; since every path produces the same bits it can never change results.
pub(crate) fn isa_detect() -> Isa {
    *ISA.get_or_init(|| *Isa::available().last().unwrap_or(&Isa::Scalar))
}

/// Forces the kernel path by name (`scalar`, `avx2`, `avx512`, `neon`; a prefix of the names
/// [`crate::isa`] reports). Must be called before the first product; fails for an unknown or
/// unsupported path, or when another path is already in use.
pub fn set_isa(name: &str) -> crate::Result<&'static str> {
    let want = name.trim();
    let avail = Isa::available();
    let isa = avail
        .iter()
        .copied()
        .find(|i| !want.is_empty() && i.name().starts_with(want))
        .ok_or_else(|| {
            let names: Vec<&str> = avail.iter().map(|i| i.name()).collect();
            crate::Error::Isa(format!(
                "kernel path `{want}` is not available here (available: {})",
                names.join(", ")
            ))
        })?;
    let chosen = *ISA.get_or_init(|| isa);
    if chosen != isa {
        return Err(crate::Error::Isa(format!(
            "kernel path already fixed to `{}` before `{want}` was requested",
            chosen.name()
        )));
    }
    Ok(isa.name())
}

pub(crate) fn isa_name() -> &'static str {
    isa_detect().name()
}

/// Folds 16 lanes in the canonical order.
#[inline]
pub(crate) fn fold16(mut l: [f32; LANES]) -> f32 {
    for w in [8, 4, 2] {
        for j in 0..w {
            l[j] += l[j + w];
        }
    }
    l[0] + l[1]
}

/// The scalar reference of the canonical dot product (see the module docs for the order).
pub fn dot_scalar(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot: length mismatch");
    let mut acc = [0.0f32; LANES];
    let full = a.len() / LANES * LANES;
    for (ca, cb) in a[..full]
        .chunks_exact(LANES)
        .zip(b[..full].chunks_exact(LANES))
    {
        for j in 0..LANES {
            acc[j] = ca[j].mul_add(cb[j], acc[j]);
        }
    }
    let tail = a.len() - full;
    if tail > 0 {
        for j in 0..LANES {
            let (x, y) = if j < tail {
                (a[full + j], b[full + j])
            } else {
                (0.0, 0.0)
            };
            acc[j] = x.mul_add(y, acc[j]);
        }
    }
    fold16(acc)
}

/// The canonical dot product of two equal-length f32 slices, on the fastest available path.
///
/// # Panics
/// If the lengths differ (a caller bug, never a data error).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot_with(isa_detect(), a, b)
}

/// [`dot`] on an explicit path (tests compare every available path with the reference).
pub(crate) fn dot_with(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot: length mismatch");
    match isa {
        Isa::Scalar => dot_scalar(a, b),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only constructed after runtime detection of AVX2 and FMA.
        Isa::Avx2 => unsafe { crate::x86::avx2::dot(a, b) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512` is only constructed after runtime detection of AVX-512F.
        Isa::Avx512 => unsafe { crate::x86::avx512::dot(a, b) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: `Isa::Neon` is only constructed after runtime detection of NEON.
        Isa::Neon => unsafe { crate::aarch64::neon::dot(a, b) },
    }
}

/// Dot products in groups of [`DOT4`].
pub const DOT4: usize = 4;

/// `[dot(a[0], b), …, dot(a[3], b)]`, the same bits as four [`dot`] calls: each product keeps
/// its own canonical accumulator, in the same order. What differs is that the four chains run
/// side by side — one `dot` is a single dependent chain of FMAs (its latency, not the FMA
/// units, sets its speed) — and each slice of `b` is loaded once for the four (the attention's
/// scores: every head of a row against one key's latent).
///
/// # Panics
/// If a length differs from `b`'s (a caller bug, never a data error).
#[inline]
pub fn dot4(a: [&[f32]; DOT4], b: &[f32]) -> [f32; DOT4] {
    dot4_with(isa_detect(), a, b)
}

/// [`dot4`] on an explicit path.
pub(crate) fn dot4_with(isa: Isa, a: [&[f32]; DOT4], b: &[f32]) -> [f32; DOT4] {
    assert!(
        a.iter().all(|x| x.len() == b.len()),
        "dot4: length mismatch"
    );
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only constructed after runtime detection of AVX2 and FMA.
        Isa::Avx2 => unsafe { crate::x86::avx2::dot4(a, b) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512` is only constructed after runtime detection of AVX-512F.
        Isa::Avx512 => unsafe { crate::x86::avx512::dot4(a, b) },
        _ => a.map(|x| dot_with(isa, x, b)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn signed_zero_of_the_padded_tail_is_kept() {
        // Products that underflow to -0 leave -0 in a lane; the zero-padded tail turns the padded
        // lanes into +0 (fma(0, 0, -0) = +0). Every path must reproduce that sign.
        for n in [1usize, 15, 17, 31, 33] {
            let a = vec![-1e-30f32; n];
            let b = vec![1e-30f32; n];
            let want = dot_scalar(&a, &b).to_bits();
            for isa in Isa::available() {
                assert_eq!(dot_with(isa, &a, &b).to_bits(), want, "{isa:?} n={n}");
            }
        }
    }

    #[test]
    fn small_known_values() {
        assert_eq!(dot_scalar(&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]), 32.0);
        assert_eq!(dot(&[], &[]), 0.0);
    }

    #[test]
    fn dot4_equals_four_dots_bitwise() {
        let v = |n: usize, k: u32| -> Vec<f32> {
            (0..n)
                .map(|i| (((i as u32).wrapping_mul(2654435761) ^ k) % 2001) as f32 / 997.0 - 1.0)
                .collect()
        };
        for n in [0usize, 1, 15, 16, 17, 64, 100, 512, 577] {
            let (a, b) = ([v(n, 1), v(n, 2), v(n, 3), v(n, 4)], v(n, 5));
            let a = [&a[0][..], &a[1][..], &a[2][..], &a[3][..]];
            for isa in Isa::available() {
                let got = dot4_with(isa, a, &b).map(f32::to_bits);
                let want = a.map(|x| dot_scalar(x, &b).to_bits());
                assert_eq!(got, want, "{isa:?} n={n}");
                // The roles swapped (one query against four keys): a product commutes exactly.
                let swapped = a.map(|x| dot_with(isa, &b, x).to_bits());
                assert_eq!(got, swapped, "{isa:?} n={n} swapped");
            }
        }
        // The padded tail's signed zero, as `dot` keeps it.
        let (a, b) = (vec![-1e-30f32; 17], vec![1e-30f32; 17]);
        for isa in Isa::available() {
            let got = dot4_with(isa, [&a, &a, &a, &a], &b).map(f32::to_bits);
            assert_eq!(got, [dot_scalar(&a, &b).to_bits(); 4], "{isa:?}");
        }
    }

    proptest! {
        #[test]
        fn simd_matches_scalar_bitwise(v in prop::collection::vec((-1e3f32..1e3, -1e3f32..1e3), 0..300)) {
            let (a, b): (Vec<f32>, Vec<f32>) = v.into_iter().unzip();
            prop_assert_eq!(dot(&a, &b).to_bits(), dot_scalar(&a, &b).to_bits());
            for isa in Isa::available() {
                prop_assert_eq!(dot_with(isa, &a, &b).to_bits(), dot_scalar(&a, &b).to_bits(), "{:?}", isa);
            }
        }
    }
}
