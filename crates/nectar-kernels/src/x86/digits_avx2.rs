//! AVX2 kernel of the opt-in int4 `digits` order (`digits.rs` defines the order and the
//! arithmetic; this reproduces it bit for bit) for x86 cores without AVX-512 VNNI: AMD's before
//! Zen 4, Intel's client cores.
//!
//! Why: there the exact order dequantises 8 weights with a broadcast, a variable shift, a mask,
//! a conversion, a subtraction and a multiply before their FMA, which bounds int4 at M = 1 near
//! a quarter of what one core reads (`benchmarks/RESULTS.md`, "CPU kernels on AVX2"). Here 64
//! codes meet a digit plane in two `vpmaddubsw` (u8 code × i8 digit, pairs summed in i16: at
//! most 2 · 15 · 128 per pair, so nothing saturates) and one `vpmaddwd` widens the sums to the
//! order's 8-column lanes in i32: about 22 operations per 64 weights against the exact order's
//! 56.
//!
//! Per 128-column chunk and weight row: two 32-byte loads, each half's even columns' codes by a
//! mask and the odd ones' by a shift and a mask (byte b of a half holds columns 2b and 2b + 1,
//! and the digit planes hold the chunk's even columns, then its odd ones, in the same byte
//! order), then per half `t_p = maddubs(lo, even_p) + maddubs(hi, odd_p)` for the three digits
//! p, `P = (madd(t₂, 256) + madd(t₁, 1))·2⁸ + madd(t₀, 1)` — exact: the true value fits i32 —
//! the offset subtracted, one conversion and the order's FMA.
//!
//! Where the CPU has AVX-VNNI (`vpdpbusd` on 256-bit registers: Intel's client cores since
//! Alder Lake, and Zen 5, which takes the AVX-512 kernel), [`rows_vnni`] does each plane's
//! products and lane sums in one instruction per 32 codes, as the AVX-512 kernel does per 64:
//! the same exact sums, the same bits.
use crate::digits::{block_exponent, pow2, DPack, CHUNK, OFF, POW, RECORD};
use crate::driver::{prefetch_scales, prefetch_start, Prefetch};
use crate::format::MatRef;
use crate::x86::avx2::fold;
use std::arch::x86_64::*;
use std::ops::Range;

/// Bytes of one chunk of a weight row (128 int4 columns).
const CHUNK_BYTES: usize = CHUNK / 2;

/// Computes rows `rows` for every activation row of `dp`, writing row `r`, activation `i` to
/// `*out.add(i * stride + r - rows.start)`.
///
/// # Safety
/// The CPU supports AVX2 and FMA; `w` is validated and int4 per row or in groups of a multiple
/// of 64; `dp` was built from activations of `w.cols` columns; the rows exist; `out` is valid
/// for those writes.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn rows(
    w: &MatRef<'_>,
    rows: Range<usize>,
    dp: &DPack,
    out: *mut f32,
    stride: usize,
) {
    // SAFETY: forwarded; AVX2 and FMA are enabled here, so the inlined body's instructions run.
    unsafe { rows_in::<false>(w, rows, dp, out, stride) }
}

/// [`rows`] with AVX-VNNI (`vpdpbusd` on 256-bit registers: Intel's client cores since Alder
/// Lake): a digit plane's products and their lane sums in one instruction per 32 codes
/// instead of two `vpmaddubsw`, an add and a `vpmaddwd` per 64 — the same exact sums, so the
/// same bits.
///
/// # Safety
/// As [`rows`], and the CPU supports AVX-VNNI.
#[target_feature(enable = "avx2,fma,avxvnni")]
pub(crate) unsafe fn rows_vnni(
    w: &MatRef<'_>,
    rows: Range<usize>,
    dp: &DPack,
    out: *mut f32,
    stride: usize,
) {
    // SAFETY: forwarded; AVX2, FMA and AVX-VNNI are enabled here.
    unsafe { rows_in::<true>(w, rows, dp, out, stride) }
}

/// The body of [`rows`] (`VNNI` false) and [`rows_vnni`]: inlined into them, so it runs with
/// their instruction sets (a function with its own `target_feature` could not be generic over
/// which).
///
/// # Safety
/// As [`rows`] / [`rows_vnni`], from which alone it is called.
#[inline(always)]
unsafe fn rows_in<const VNNI: bool>(
    w: &MatRef<'_>,
    rows: Range<usize>,
    dp: &DPack,
    out: *mut f32,
    stride: usize,
) {
    prefetch_start(w, rows.clone());
    for r in rows.clone() {
        let mut i = 0;
        while i < dp.m {
            // One weight row against up to 4 activation rows: the row's codes are split once
            // for all of them, and 4 rows' 8 accumulators, the codes and the step's sums fit
            // AVX2's 16 registers (two weight rows × one activation row measured no faster
            // than one: the compiler kept the second row's accumulators on the stack). The
            // row stays in L1 for later activation rows: only the first block prefetches.
            // SAFETY (all calls): row r and activations i..i + mb exist; element (i', r) goes
            // to out + i'·stride + r − rows.start, inside the caller's region.
            i += unsafe {
                let o = out.add(i * stride + r - rows.start);
                match dp.m - i {
                    1 => tile::<1, VNNI>(w, r, dp, i, o, stride),
                    2 | 3 => tile::<2, VNNI>(w, r, dp, i, o, stride),
                    _ => tile::<4, VNNI>(w, r, dp, i, o, stride),
                }
            };
        }
    }
}

/// Weight row `r` against activation rows `i0..i0 + MB`, writing activation `i0 + j` to
/// `*out.add(j * stride)`; returns MB. The first activation block of a row prefetches the next
/// row.
///
/// # Safety
/// As [`rows_in`] for this row and these activation rows.
#[inline(always)]
unsafe fn tile<const MB: usize, const VNNI: bool>(
    w: &MatRef<'_>,
    r: usize,
    dp: &DPack,
    i0: usize,
    out: *mut f32,
    stride: usize,
) -> usize {
    let rb = w.format.row_bytes(w.cols);
    let ng = w.format.row_scales(w.cols);
    // SAFETY: row r exists (caller), so its bytes and scales start inside the views.
    let (rp, sp) = unsafe { (w.data.as_ptr().add(r * rb), w.scales.as_ptr().add(r * ng)) };
    // SAFETY: AVX2 (the callers' target features).
    let mut acc = unsafe { [[_mm256_setzero_ps(); 2]; MB] };
    let ahead = i0 == 0;
    // The next row, one block ahead (see `Prefetch` for why).
    let mut pf = Prefetch::new(w, r + 1, 1).beside(dp.chunks * RECORD);
    if ahead {
        prefetch_scales(w, r + 1, 1);
    }
    // Whole chunks are read in place; a ragged last one (fewer than 64 bytes: the row's end)
    // from a copy padded with zeros, whose columns' digits are 0 as well.
    let whole = rb / CHUNK_BYTES;
    // SAFETY: AVX2 (the callers' target features).
    let k = unsafe { consts() };
    for c in 0..whole {
        if ahead {
            pf.steps(CHUNK / 16);
        }
        // SAFETY: chunk c lies in the row (c < whole); the rest as `rows_in`.
        unsafe { chunk::<MB, VNNI>(rp.add(c * CHUNK_BYTES), sp, dp, c, i0, &mut acc, k) };
    }
    if whole < dp.chunks {
        let mut tail = [0u8; CHUNK_BYTES];
        // SAFETY: the row's bytes past its whole chunks.
        unsafe {
            std::ptr::copy_nonoverlapping(
                rp.add(whole * CHUNK_BYTES),
                tail.as_mut_ptr(),
                rb % CHUNK_BYTES,
            )
        };
        // SAFETY: 64 readable bytes in `tail`; the rest as `rows_in`.
        unsafe { chunk::<MB, VNNI>(tail.as_ptr(), sp, dp, whole, i0, &mut acc, k) };
    }
    for (j, a) in acc.iter().enumerate() {
        // SAFETY: the caller's output region; AVX2 and FMA (the callers' target features).
        unsafe { *out.add(j * stride) = fold(a[0], a[1]) };
    }
    MB
}

/// Chunk `c` of a row (64 code bytes at `at`, scales at `sp`) against activation rows
/// `i0..i0 + MB`, into their accumulators.
///
/// `k`: the constants [`consts`] (made once per row, not per chunk).
///
/// # Safety
/// As [`rows_in`]; `at` holds 64 readable bytes; `sp` is the row's scales; chunk c and
/// activations i0..i0 + MB lie in `dp`.
#[inline(always)]
unsafe fn chunk<const MB: usize, const VNNI: bool>(
    at: *const u8,
    sp: *const f32,
    dp: &DPack,
    c: usize,
    i0: usize,
    acc: &mut [[__m256; 2]; MB],
    k: [__m256i; 3],
) {
    let [nib, one, b256] = k;
    // SAFETY: one entry per chunk.
    let groups = unsafe { *dp.groups.get_unchecked(c) };
    // SAFETY: the records of chunk c, activations i0..i0 + MB, lie in the pack.
    let recs = unsafe { dp.packed.as_ptr().add((c * dp.m + i0) * RECORD) };
    for h in 0..2 {
        // SAFETY (this block and the loop's): 32 bytes of half h (caller); the half's group is
        // clamped to the row's scales (`chunk_groups`); plane p's bytes of half h, and the
        // half's offsets and powers, lie in activation i0 + j's record (the layout in
        // `digits.rs`); AVX2, FMA and, for VNNI, AVX-VNNI are the callers' target features.
        unsafe {
            let v = _mm256_loadu_si256(at.add(32 * h).cast());
            let s = _mm256_set1_ps(*sp.add(groups[h] as usize));
            let lo = _mm256_and_si256(v, nib);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib);
            for (j, a) in acc.iter_mut().enumerate() {
                let ld = |o: usize| _mm256_loadu_si256(recs.add(j * RECORD + o + 32 * h).cast());
                // P = (S₂·2⁸ + S₁)·2⁸ + S₀, S_p = Σ n·d_p over each 8-column lane.
                let p = if VNNI {
                    let mut s = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), lo, ld(0));
                    s = _mm256_dpbusd_avx_epi32(s, hi, ld(64));
                    s = _mm256_slli_epi32::<8>(s);
                    s = _mm256_dpbusd_avx_epi32(s, lo, ld(128));
                    s = _mm256_dpbusd_avx_epi32(s, hi, ld(192));
                    s = _mm256_slli_epi32::<8>(s);
                    s = _mm256_dpbusd_avx_epi32(s, lo, ld(256));
                    _mm256_dpbusd_avx_epi32(s, hi, ld(320))
                } else {
                    let t = |p: usize| {
                        _mm256_add_epi16(
                            _mm256_maddubs_epi16(lo, ld(128 * p)),
                            _mm256_maddubs_epi16(hi, ld(128 * p + 64)),
                        )
                    };
                    let u = _mm256_add_epi32(
                        _mm256_madd_epi16(t(0), b256),
                        _mm256_madd_epi16(t(1), one),
                    );
                    _mm256_add_epi32(_mm256_slli_epi32::<8>(u), _mm256_madd_epi16(t(2), one))
                };
                let p = _mm256_sub_epi32(p, ld(OFF));
                let scale = _mm256_mul_ps(s, _mm256_castsi256_ps(ld(POW)));
                a[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, a[h]);
            }
        }
    }
}

/// The nibble mask, and the 16-bit multipliers 1 and 256 of the digits' sums.
#[inline]
#[target_feature(enable = "avx2")]
fn consts() -> [__m256i; 3] {
    [
        _mm256_set1_epi8(0x0F),
        _mm256_set1_epi16(1),
        _mm256_set1_epi16(256),
    ]
}

/// [`crate::digits::pack_chunk`] for AVX2, the same bytes: a whole chunk of finite values in
/// SIMD; a partial chunk, or one holding a NaN or an infinity, by the definition itself
/// (compiled here, so its rounding is an instruction rather than a library call).
///
/// # Safety
/// The CPU supports AVX2 and FMA; `rec` holds [`RECORD`] bytes.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn pack_chunk(xc: &[f32], rec: &mut [u8]) {
    // SAFETY: forwarded.
    if !unsafe { pack_whole(xc, rec) } {
        crate::digits::pack_chunk(xc, rec)
    }
}

/// The SIMD half of [`pack_chunk`]; `false` (nothing written) where the definition must run.
///
/// # Safety
/// As [`pack_chunk`].
#[target_feature(enable = "avx2,fma")]
unsafe fn pack_whole(xc: &[f32], rec: &mut [u8]) -> bool {
    if xc.len() != CHUNK || rec.len() < RECORD {
        return false;
    }
    // SAFETY: 128 floats in xc.
    let x: [__m256; 16] =
        std::array::from_fn(|j| unsafe { _mm256_loadu_ps(xc.as_ptr().add(8 * j)) });
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let big = _mm256_set1_ps(f32::MAX);
    let mut finite = true;
    for v in &x {
        // Ordered ≤ MAX: false for NaN and ±∞.
        finite &=
            _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(_mm256_and_ps(*v, abs), big)) == 0xFF;
    }
    if !finite {
        return false;
    }
    // SAFETY: the permutation tables hold 8 dwords / 32 bytes.
    let (order, split) = unsafe {
        (
            _mm256_loadu_si256(DWORD_ORDER.as_ptr().cast()),
            _mm256_loadu_si256(EVEN_ODD.as_ptr().cast()),
        )
    };
    let mut v = [_mm256_setzero_si256(); 16];
    let mut sums = [_mm256_setzero_si256(); 2];
    let mut pw = [0.0f32; 2];
    for b in 0..2 {
        let q = &x[8 * b..8 * b + 8];
        let mut m = _mm256_and_ps(q[0], abs);
        for a in &q[1..] {
            m = _mm256_max_ps(m, _mm256_and_ps(*a, abs));
        }
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let mx = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2)));
        let e = block_exponent(mx);
        pw[b] = pow2(e - 22);
        let up = _mm256_set1_ps(pow2(22 - e));
        for j in 0..8 {
            // Round to nearest, ties to even (the default MXCSR mode): `round_ties_even`.
            v[8 * b + j] = _mm256_cvtps_epi32(_mm256_mul_ps(q[j], up));
        }
        // The 8 lanes' sums of 8 columns (one register each), times 8.
        let h = |a: usize, c: usize| _mm256_hadd_epi32(v[8 * b + a], v[8 * b + c]);
        let h0 = _mm256_hadd_epi32(h(0, 1), h(2, 3));
        let h1 = _mm256_hadd_epi32(h(4, 5), h(6, 7));
        let lanes = _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(h0, h1),
            _mm256_permute2x128_si256::<0x31>(h0, h1),
        );
        sums[b] = _mm256_slli_epi32::<3>(lanes);
    }
    // Digits, 32 columns at a time: `v = d₂·2¹⁶ + d₁·2⁸ + d₀` (balanced), then bytes in column
    // order (two saturating packs, exact for digits, and a dword reorder), then the even
    // columns' bytes before the odd ones' (a byte shuffle and a qword reorder).
    for g in 0..4 {
        let mut planes = [[_mm256_setzero_si256(); 4]; 3];
        for j in 0..4 {
            let t = v[4 * g + j];
            let d0 = _mm256_srai_epi32::<24>(_mm256_slli_epi32::<24>(t));
            let r1 = _mm256_srai_epi32::<8>(_mm256_sub_epi32(t, d0));
            let d1 = _mm256_srai_epi32::<24>(_mm256_slli_epi32::<24>(r1));
            let d2 = _mm256_srai_epi32::<8>(_mm256_sub_epi32(r1, d1));
            planes[0][j] = d2;
            planes[1][j] = d1;
            planes[2][j] = d0;
        }
        for (p, d) in planes.iter().enumerate() {
            let bytes = _mm256_packs_epi16(
                _mm256_packs_epi32(d[0], d[1]),
                _mm256_packs_epi32(d[2], d[3]),
            );
            let cols = _mm256_permutevar8x32_epi32(bytes, order);
            let eo = _mm256_permute4x64_epi64::<0xD8>(_mm256_shuffle_epi8(cols, split));
            // SAFETY: plane p's even bytes 16g..16g + 16 and odd ones 64 + 16g.., inside the
            // record's first 384 bytes.
            unsafe {
                let at = rec.as_mut_ptr().add(128 * p + 16 * g);
                _mm_storeu_si128(at.cast(), _mm256_castsi256_si128(eo));
                _mm_storeu_si128(at.add(64).cast(), _mm256_extracti128_si256::<1>(eo));
            }
        }
    }
    // SAFETY: the offsets and powers of the 16 lanes, inside the record.
    unsafe {
        let at = rec.as_mut_ptr();
        _mm256_storeu_si256(at.add(OFF).cast(), sums[0]);
        _mm256_storeu_si256(at.add(OFF + 32).cast(), sums[1]);
        _mm256_storeu_ps(at.add(POW).cast(), _mm256_set1_ps(pw[0]));
        _mm256_storeu_ps(at.add(POW + 32).cast(), _mm256_set1_ps(pw[1]));
    }
    true
}

/// After two saturating packs of 4 registers (columns 0–31, 8 per register), 128-bit half 0
/// holds columns 0–3, 8–11, 16–19, 24–27 and half 1 columns 4–7, 12–15, …; these dwords put
/// them in column order.
static DWORD_ORDER: [i32; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// Per 128-bit half (16 columns): the even columns' bytes, then the odd ones'.
static EVEN_ODD: [i8; 32] = [
    0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9,
    11, 13, 15,
];
