//! The read-bandwidth reference: one read of every byte of a buffer, as fast as this CPU reads.
//!
//! `nectar bench kernels` judges each matrix product as a ratio to this (weight bytes per second
//! ÷ read bytes per second), so it must not read *low*: a slow reference inflates every ratio.
//! Hence wide vector loads (64 bytes per AVX-512 load, 32 per AVX2, 4 × 16 per NEON step) into
//! eight independent accumulators, so that neither the add chains nor the loop bound the rate;
//! the only work per load is one integer add. [`ReadMode::Prefetch`] and
//! [`ReadMode::PrefetchL2`] add software prefetches a few KiB ahead, which helps on some memory
//! systems and costs nothing measurable where it does not; the benchmark takes the fastest mode.
//!
//! The result is defined (so the paths can be tested against each other and the reads cannot
//! be optimised away): the wrapping sum of the little-endian, address-aligned 64-bit words of
//! memory the buffer covers, bytes outside it counting as zero. Integer addition is
//! associative, so every path returns the same value.
use crate::dot::{isa_detect, Isa};

/// How [`read_sum`] reads.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ReadMode {
    /// Vector loads only (the hardware prefetchers see one sequential stream).
    Plain,
    /// Vector loads plus a software prefetch of every line [`PREFETCH_DISTANCE`] bytes ahead
    /// (non-temporal hint on x86).
    Prefetch,
    /// As [`ReadMode::Prefetch`], into L2: the kernels prefetch wide matrices so
    /// (`driver::Prefetch`), and once they did, int8 products at two threads streamed 1–4 %
    /// faster than the best of the other two modes on an AMD EPYC guest, where this mode read
    /// 5–10 % faster than `Plain` at one and two threads (`benchmarks/RESULTS.md`).
    PrefetchL2,
}

impl ReadMode {
    /// Every mode, in the order the benchmarks alternate them.
    pub const ALL: [ReadMode; 3] = [ReadMode::Plain, ReadMode::Prefetch, ReadMode::PrefetchL2];
}

/// How far ahead [`ReadMode::Prefetch`] prefetches, in bytes.
pub const PREFETCH_DISTANCE: usize = 4096;

/// Reads every byte of `buf` once and returns the wrapping sum of the little-endian,
/// address-aligned 64-bit words it covers (bytes outside `buf` count as zero): the
/// read-bandwidth reference of `nectar bench kernels`.
/// Single-threaded; a caller measuring several threads gives each its own contiguous part.
pub fn read_sum(buf: &[u8], mode: ReadMode) -> u64 {
    read_sum_with(isa_detect(), buf, mode)
}

/// [`read_sum`] on an explicit path (tests run every available one).
pub(crate) fn read_sum_with(isa: Isa, buf: &[u8], mode: ReadMode) -> u64 {
    // Scalar up to a 64-byte boundary, so that every vector load is aligned and never splits
    // a cache line; the vector body covers whole 512-byte blocks; the rest is scalar again.
    let head = buf.as_ptr().align_offset(64).min(buf.len());
    let body = (buf.len() - head) & !511;
    let (a, rest) = buf.split_at(head);
    let (b, c) = rest.split_at(body);
    let mid = match isa {
        Isa::Scalar => sum_scalar(b),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only constructed after runtime detection of AVX2; `b` is a
        // whole number of 512-byte blocks.
        Isa::Avx2 => unsafe { x86::sum_avx2(b, mode) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512` is only constructed after runtime detection of AVX-512F; `b`
        // is a whole number of 512-byte blocks.
        Isa::Avx512 => unsafe { x86::sum_avx512(b, mode) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: `Isa::Neon` is only constructed after runtime detection of NEON; `b` is a
        // whole number of 512-byte blocks.
        Isa::Neon => unsafe { arm::sum_neon(b, mode) },
    };
    sum_bytes(a).wrapping_add(mid).wrapping_add(sum_bytes(c))
}

/// The head or tail: each byte added at its place in its address-aligned little-endian word.
fn sum_bytes(bytes: &[u8]) -> u64 {
    let p = bytes.as_ptr() as usize;
    bytes.iter().enumerate().fold(0u64, |s, (i, &b)| {
        s.wrapping_add((b as u64) << (8 * ((p + i) % 8)))
    })
}

/// Wrapping sum of the 8-byte words of `b` (a whole number of words): the scalar path, eight
/// independent accumulators as in the vector paths.
fn sum_scalar(b: &[u8]) -> u64 {
    let mut acc = [0u64; 8];
    for line in b.chunks_exact(64) {
        for (k, a) in acc.iter_mut().enumerate() {
            let w = u64::from_le_bytes(line[8 * k..8 * k + 8].try_into().expect("8 bytes"));
            *a = a.wrapping_add(w);
        }
    }
    acc.iter().fold(0, |x, y| x.wrapping_add(*y))
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{ReadMode, PREFETCH_DISTANCE};
    use std::arch::x86_64::*;

    /// Hints the line at `p` into the cache as `mode` says; never faults.
    #[inline(always)]
    fn pf(p: *const u8, mode: ReadMode) {
        match mode {
            ReadMode::Plain => {}
            // SAFETY: a prefetch only hints the cache and never dereferences architecturally.
            ReadMode::Prefetch => unsafe { _mm_prefetch::<_MM_HINT_NTA>(p.cast()) },
            ReadMode::PrefetchL2 => crate::driver::prefetch_l2(p),
        }
    }

    /// # Safety
    /// The CPU supports AVX-512F; `b.len()` is a multiple of 512 and `b` is 64-byte aligned.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn sum_avx512(b: &[u8], mode: ReadMode) -> u64 {
        let p = b.as_ptr();
        let mut a = [_mm512_setzero_si512(); 8];
        let mut o = 0;
        while o < b.len() {
            if mode != ReadMode::Plain {
                for l in 0..8 {
                    pf(p.wrapping_add(o + PREFETCH_DISTANCE + 64 * l), mode);
                }
            }
            for (k, acc) in a.iter_mut().enumerate() {
                // SAFETY: o + 512 <= len, so bytes o + 64k .. o + 64k + 64 lie in `b`, and the
                // address is 64-byte aligned (caller).
                let v = unsafe { _mm512_load_si512(p.add(o + 64 * k).cast()) };
                *acc = _mm512_add_epi64(*acc, v);
            }
            o += 512;
        }
        let mut s = a[0];
        for v in &a[1..] {
            s = _mm512_add_epi64(s, *v);
        }
        _mm512_reduce_add_epi64(s) as u64
    }

    /// # Safety
    /// The CPU supports AVX2; `b.len()` is a multiple of 512 and `b` is 64-byte aligned.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn sum_avx2(b: &[u8], mode: ReadMode) -> u64 {
        let p = b.as_ptr();
        let mut a = [_mm256_setzero_si256(); 8];
        let mut o = 0;
        while o < b.len() {
            if mode != ReadMode::Plain {
                for l in 0..8 {
                    pf(p.wrapping_add(o + PREFETCH_DISTANCE + 64 * l), mode);
                }
            }
            for half in [0, 256] {
                for (k, acc) in a.iter_mut().enumerate() {
                    // SAFETY: o + 512 <= len, so these 32 bytes lie in `b`; 32-byte aligned.
                    let v = unsafe { _mm256_load_si256(p.add(o + half + 32 * k).cast()) };
                    *acc = _mm256_add_epi64(*acc, v);
                }
            }
            o += 512;
        }
        let mut s = a[0];
        for v in &a[1..] {
            s = _mm256_add_epi64(s, *v);
        }
        let mut t = [0u64; 4];
        // SAFETY: `t` holds exactly 32 bytes.
        unsafe { _mm256_storeu_si256(t.as_mut_ptr().cast(), s) };
        t.iter().fold(0, |x, y| x.wrapping_add(*y))
    }
}

#[cfg(target_arch = "aarch64")]
mod arm {
    use super::{ReadMode, PREFETCH_DISTANCE};
    use std::arch::aarch64::*;

    /// # Safety
    /// The CPU supports NEON; `b.len()` is a multiple of 512.
    #[target_feature(enable = "neon")]
    pub(super) unsafe fn sum_neon(b: &[u8], mode: ReadMode) -> u64 {
        let p = b.as_ptr();
        let mut a = [vdupq_n_u64(0); 8];
        let mut o = 0;
        while o < b.len() {
            for l in 0..8 {
                let q = p.wrapping_add(o + PREFETCH_DISTANCE + 64 * l);
                match mode {
                    ReadMode::Plain => {}
                    ReadMode::Prefetch => crate::driver::prefetch(q),
                    ReadMode::PrefetchL2 => crate::driver::prefetch_l2(q),
                }
            }
            for q in 0..4 {
                // SAFETY: o + 512 <= len: 128 bytes at o + 128q lie in `b`.
                let v = unsafe { vld1q_u8_x4(p.add(o + 128 * q)) };
                for (j, w) in [v.0, v.1, v.2, v.3].into_iter().enumerate() {
                    let k = (2 * q + j / 2) % 8;
                    a[k] = vaddq_u64(a[k], vreinterpretq_u64_u8(w));
                }
            }
            o += 512;
        }
        let mut s = a[0];
        for v in &a[1..] {
            s = vaddq_u64(s, *v);
        }
        vgetq_lane_u64::<0>(s).wrapping_add(vgetq_lane_u64::<1>(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, byte by byte: byte at address `a` is byte `a % 8` of its word.
    fn want(b: &[u8]) -> u64 {
        let mut s = 0u64;
        for (i, &x) in b.iter().enumerate() {
            let a = b.as_ptr() as usize + i;
            s = s.wrapping_add((x as u64) << (8 * (a % 8)));
        }
        s
    }

    #[test]
    fn every_path_and_mode_sums_every_byte_once() {
        let data = crate::matmul::tests::random_bytes(3 * 4096 + 777, 5);
        // Every start offset within a line (so every head length, aligned or not) and lengths
        // below, at and above one 512-byte block.
        for start in [0usize, 1, 7, 8, 9, 63, 64, 100] {
            for len in [0usize, 1, 9, 511, 512, 513, 1500, 4096, 9000] {
                let b = &data[start..start + len];
                for isa in Isa::available() {
                    for mode in ReadMode::ALL {
                        assert_eq!(
                            read_sum_with(isa, b, mode),
                            want(b),
                            "{isa:?} {mode:?} start {start} len {len}"
                        );
                    }
                }
            }
        }
    }
}
