//! AVX-512 VNNI kernel of the opt-in int4 `digits` order (`digits.rs` defines the order and
//! the arithmetic; this reproduces it bit for bit).
//!
//! Per 128-column chunk and weight row: one 64-byte load, the even columns' codes by a mask and
//! the odd ones' by a shift and a mask (one byte each, so `vpdpbusd` lane l sums columns
//! 8l..8l+8 of the chunk, as the order wants), then per activation row six `vpdpbusd` over the
//! three digit planes with two shifts between them (`P = (S₂·2⁸ + S₁)·2⁸ + S₀`, exact modulo
//! 2³² and the true value fits), the offset subtracted, and one conversion and FMA.
use crate::digits::{block_exponent, pow2, DPack, CHUNK, OFF, POW, RECORD};
use crate::driver::{prefetch_scales, prefetch_start, Prefetch};
use crate::format::MatRef;
use crate::x86::avx512::fold;
use std::arch::x86_64::*;
use std::ops::Range;

// The kernel reads a record as 8 vectors: 6 digit planes, then the offsets, then the powers.
const _: () = assert!(OFF == 6 * 64 && POW == 7 * 64 && RECORD == 8 * 64);

/// Computes rows `rows` for every activation row of `dp`, writing row `r`, activation `i` to
/// `*out.add(i * stride + r - rows.start)`.
///
/// # Safety
/// The CPU supports AVX-512F/BW/VL/VNNI; `w` is validated and int4 per row or in groups of a
/// multiple of 64; `dp` was built from activations of `w.cols` columns; the rows exist; `out`
/// is valid for those writes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn rows(
    w: &MatRef<'_>,
    rows: Range<usize>,
    dp: &DPack,
    out: *mut f32,
    stride: usize,
) {
    prefetch_start(w, rows.clone());
    let mut r = rows.start;
    while r < rows.end {
        let nr = (rows.end - r).min(8);
        let mut i = 0;
        while i < dp.m {
            // Register blocks of 4 rows × 1 or 2 activation rows: a record's 8 vectors per
            // activation row stay in registers for the block's rows, and 4 × 3 or more spill
            // (measured hot in L2, `int4_compute digits`: M = 4 6.3 GB/s as 4 × 2 against 5.0 as
            // 4 × 4, 5.8 as 2 × 2; M = 1 21.8 as 4 × 1 against 19.6 as 8 × 1).
            // SAFETY (all calls): rows r..r + nr and activations i..i + mb exist; the element
            // (i', r') of the block goes to out + i'·stride + r' − rows.start, inside the
            // caller's region.
            let o = unsafe { out.add(i * stride + r - rows.start) };
            i += unsafe {
                match (nr, dp.m - i) {
                    (8, 1) => {
                        tile::<4, 1>(w, r, dp, i, o, stride);
                        tile::<4, 1>(w, r + 4, dp, i, o.add(4), stride)
                    }
                    (8, _) => {
                        tile::<4, 2>(w, r, dp, i, o, stride);
                        tile::<4, 2>(w, r + 4, dp, i, o.add(4), stride)
                    }
                    (_, left) => {
                        let mut mb = 1;
                        for k in 0..nr {
                            mb = match left {
                                2.. => tile::<1, 2>(w, r + k, dp, i, o.add(k), stride),
                                _ => tile::<1, 1>(w, r + k, dp, i, o.add(k), stride),
                            };
                        }
                        mb
                    }
                }
            };
        }
        r += nr;
    }
}

/// Weight rows `r0..r0 + R` against activation rows `i0..i0 + MB`, writing row `r0 + k`,
/// activation `i0 + i` to `*out.add(i * stride + k)`; returns MB.
///
/// # Safety
/// As [`rows`] for these rows and activation rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile<const R: usize, const MB: usize>(
    w: &MatRef<'_>,
    r0: usize,
    dp: &DPack,
    i0: usize,
    out: *mut f32,
    stride: usize,
) -> usize {
    let rb = w.format.row_bytes(w.cols);
    let ng = w.format.row_scales(w.cols);
    let mut rp = [w.data.as_ptr(); R];
    let mut sp = [w.scales.as_ptr(); R];
    for k in 0..R {
        // SAFETY: row r0 + k exists (caller), so its bytes and scales start inside the views.
        unsafe {
            rp[k] = rp[k].add((r0 + k) * rb);
            sp[k] = sp[k].add((r0 + k) * ng);
        }
    }
    let mut acc = [[_mm512_setzero_ps(); MB]; R];
    // The next block of rows, one block ahead (see `Prefetch` for why).
    let mut pf = Prefetch::new(w, r0 + R, R).beside(dp.chunks * RECORD);
    prefetch_scales(w, r0 + R, R);
    let nib = _mm512_set1_epi8(0x0F);
    let zero = _mm512_setzero_si512();
    for c in 0..dp.chunks {
        pf.steps(CHUNK / 16);
        // SAFETY: one entry per chunk.
        let [ga, gb] = unsafe { *dp.groups.get_unchecked(c) }.map(|g| g as usize);
        // SAFETY: the records of chunk c, activations i0..i0 + MB, lie in the pack.
        let recs = unsafe { dp.packed.as_ptr().add((c * dp.m + i0) * RECORD) };
        // Bytes of this chunk inside the row: 64, or fewer for the ragged last chunk, loaded
        // with a byte mask (masked bytes read as 0 and are never accessed; the padded columns'
        // digits are 0 as well).
        let n = (rb - c * (CHUNK / 2)).min(CHUNK / 2);
        let full = n == 64;
        let mask = if full { u64::MAX } else { (1u64 << n) - 1 };
        // The chunk's records in registers once for all R rows: loads, not operations, bound
        // this loop when each row re-reads them (a 512-bit load per cycle on Zen 4).
        let mut xd = [[zero; 8]; MB];
        for (i, d) in xd.iter_mut().enumerate() {
            for (j, v) in d.iter_mut().enumerate() {
                // SAFETY: record i of this chunk holds 8 vectors (the layout in `digits.rs`).
                *v = unsafe { _mm512_loadu_si512(recs.add(i * RECORD + 64 * j).cast()) };
            }
        }
        for k in 0..R {
            // SAFETY: only the chunk's n bytes inside row r0 + k are read; groups ga, gb are
            // clamped to the row's scales (`chunk_groups`).
            let (v, sv) = unsafe {
                let at = rp[k].add(c * (CHUNK / 2));
                let v = match full {
                    true => _mm512_loadu_si512(at.cast()),
                    false => _mm512_maskz_loadu_epi8(mask, at.cast()),
                };
                let sa = _mm512_set1_ps(*sp[k].add(ga));
                (
                    v,
                    _mm512_mask_broadcastss_ps(sa, 0xFF00, _mm_load_ss(sp[k].add(gb))),
                )
            };
            let lo = _mm512_and_si512(v, nib);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib);
            for (a, d) in acc[k].iter_mut().zip(&xd) {
                let mut s = _mm512_dpbusd_epi32(zero, lo, d[0]);
                s = _mm512_dpbusd_epi32(s, hi, d[1]);
                s = _mm512_slli_epi32::<8>(s);
                s = _mm512_dpbusd_epi32(s, lo, d[2]);
                s = _mm512_dpbusd_epi32(s, hi, d[3]);
                s = _mm512_slli_epi32::<8>(s);
                s = _mm512_dpbusd_epi32(s, lo, d[4]);
                s = _mm512_dpbusd_epi32(s, hi, d[5]);
                s = _mm512_sub_epi32(s, d[6]);
                let scale = _mm512_mul_ps(sv, _mm512_castsi512_ps(d[7]));
                *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, *a);
            }
        }
    }
    for (k, row) in acc.iter().enumerate() {
        for (i, &a) in row.iter().enumerate() {
            // SAFETY: the caller's output region.
            unsafe { *out.add(i * stride + k) = fold(a) };
        }
    }
    MB
}

/// Even (`EVEN`) or odd dword lanes of two vectors, in order: columns 2j or 2j + 1 of 32.
static EVEN: [i32; 16] = [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30];
static ODD: [i32; 16] = [1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31];

/// [`crate::digits::pack_chunk`] for a whole chunk of finite values, the same bytes; `false`
/// (nothing written) for a partial chunk or one holding a NaN or an infinity, which the scalar
/// definition packs.
///
/// # Safety
/// The CPU supports AVX-512F/BW; `rec` holds [`RECORD`] bytes.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn pack_chunk(xc: &[f32], rec: &mut [u8]) -> bool {
    if xc.len() != CHUNK || rec.len() < RECORD {
        return false;
    }
    let mut x = [_mm512_setzero_ps(); 8];
    let mut finite = true;
    let big = _mm512_set1_ps(f32::MAX);
    let mut mx = [0.0f32; 2];
    for (j, v) in x.iter_mut().enumerate() {
        // SAFETY: 128 floats in xc.
        *v = unsafe { _mm512_loadu_ps(xc.as_ptr().add(16 * j)) };
        finite &= _mm512_cmp_ps_mask::<_CMP_LE_OQ>(_mm512_abs_ps(*v), big) == 0xFFFF;
    }
    if !finite {
        return false;
    }
    let mut vals = [0i32; CHUNK];
    let mut pw = [0.0f32; 2];
    let (even, odd) = (
        // SAFETY: 16 dwords each.
        unsafe { _mm512_loadu_si512(EVEN.as_ptr().cast()) },
        // SAFETY: as above.
        unsafe { _mm512_loadu_si512(ODD.as_ptr().cast()) },
    );
    for b in 0..2 {
        let q = &x[4 * b..4 * b + 4];
        let m = _mm512_max_ps(
            _mm512_max_ps(_mm512_abs_ps(q[0]), _mm512_abs_ps(q[1])),
            _mm512_max_ps(_mm512_abs_ps(q[2]), _mm512_abs_ps(q[3])),
        );
        mx[b] = _mm512_reduce_max_ps(m);
        let e = block_exponent(mx[b]);
        pw[b] = pow2(e - 22);
        let up = _mm512_set1_ps(pow2(22 - e));
        // Round to nearest, ties to even (the default MXCSR mode): `round_ties_even`.
        let v: [__m512i; 4] = std::array::from_fn(|j| _mm512_cvtps_epi32(_mm512_mul_ps(q[j], up)));
        for (j, &vj) in v.iter().enumerate() {
            // SAFETY: 16 dwords at 64·b + 16·j < 128.
            unsafe { _mm512_storeu_si512(vals.as_mut_ptr().add(64 * b + 16 * j).cast(), vj) };
        }
        for h in 0..2 {
            for (plane, idx) in [(0, even), (64, odd)] {
                let t = _mm512_permutex2var_epi32(v[2 * h], idx, v[2 * h + 1]);
                let d0 = _mm512_srai_epi32::<24>(_mm512_slli_epi32::<24>(t));
                let r1 = _mm512_srai_epi32::<8>(_mm512_sub_epi32(t, d0));
                let d1 = _mm512_srai_epi32::<24>(_mm512_slli_epi32::<24>(r1));
                let d2 = _mm512_srai_epi32::<8>(_mm512_sub_epi32(r1, d1));
                let at = plane + 32 * b + 16 * h;
                for (base, d) in [(0, d2), (128, d1), (256, d0)] {
                    // SAFETY: 16 bytes at base + at + 16 <= 384 < RECORD.
                    unsafe {
                        _mm_storeu_si128(
                            rec.as_mut_ptr().add(base + at).cast(),
                            _mm512_cvtepi32_epi8(d),
                        )
                    };
                }
            }
        }
    }
    for l in 0..16 {
        let s: i32 = vals[8 * l..8 * l + 8].iter().sum();
        rec[OFF + 4 * l..OFF + 4 * l + 4].copy_from_slice(&(8 * s).to_le_bytes());
        rec[POW + 4 * l..POW + 4 * l + 4].copy_from_slice(&pw[l / 8].to_le_bytes());
    }
    true
}
