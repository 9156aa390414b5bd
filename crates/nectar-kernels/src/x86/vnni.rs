//! AVX-512 VNNI kernel of the opt-in int8-activation product (`int8_act.rs` defines the order
//! and the arithmetic; this reproduces it bit for bit).
//!
//! int4 weights: the stored nibbles (`code + 8`, 0..15) are the unsigned operand of `vpdpbusd`
//! and the activation codes the signed one; the `+8` is removed exactly by starting each lane
//! at `-8 · Σ q` (one more `vpdpbusd` per chunk and activation row, shared by the block's rows). int8 weights are signed, so the activations
//! are stored as `q + 128` (unsigned) and `128 · Σ w` is subtracted, computed once per weight
//! chunk with a second `vpdpbusd` and shared by all activation rows.
use crate::driver::Prefetch;
use crate::format::{MatRef, WeightFormat};
use crate::int8_act::{QPack, CHUNK, RECORD};
use crate::x86::avx512::fold;
use std::arch::x86_64::*;
use std::ops::Range;

/// Computes rows `rows` for every activation row of `qp`, writing row `r`, activation `i` to
/// `*out.add(i * stride + r)`.
///
/// # Safety
/// The CPU supports AVX-512F/BW/VL/VNNI; `w` is validated and int8/int4; `qp` was built for it;
/// the rows exist; `out` is valid for those writes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn rows(
    w: &MatRef<'_>,
    rows: Range<usize>,
    qp: &QPack,
    out: *mut f32,
    stride: usize,
) {
    let mut r = rows.start;
    while r < rows.end {
        let nr = (rows.end - r).min(4);
        let mut i = 0;
        while i < qp.m {
            // Register blocks of R weight rows × MB activation rows (at most 8 accumulators, and
            // at least 4 independent FMA chains when there are 4 rows).
            // SAFETY (all calls): rows r..r + nr and activations i..i + mb exist; forwarded.
            i += unsafe {
                match (nr, qp.m - i) {
                    (4, 4..) => {
                        tile::<2, 4>(w, r, qp, i, out, stride);
                        tile::<2, 4>(w, r + 2, qp, i, out, stride)
                    }
                    (4, 2..) => tile::<4, 2>(w, r, qp, i, out, stride),
                    (4, _) => tile::<4, 1>(w, r, qp, i, out, stride),
                    (_, left) => {
                        let mut mb = 1;
                        for k in 0..nr {
                            mb = match left {
                                4.. => tile::<1, 4>(w, r + k, qp, i, out, stride),
                                2.. => tile::<1, 2>(w, r + k, qp, i, out, stride),
                                _ => tile::<1, 1>(w, r + k, qp, i, out, stride),
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

/// Lane l takes the scale of its 16-column group l / 4.
static SX_IDX: [i32; 16] = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3];
static LANE_COL: [i32; 16] = [0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60];

/// Weight rows `r0..r0 + R` against activation rows `i0..i0 + MB`; returns MB.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile<const R: usize, const MB: usize>(
    w: &MatRef<'_>,
    r0: usize,
    qp: &QPack,
    i0: usize,
    out: *mut f32,
    stride: usize,
) -> usize {
    let acc = if matches!(w.format, WeightFormat::Int8Row) {
        // SAFETY: forwarded.
        unsafe { tile_acc::<R, MB, true>(w, r0, qp, i0) }
    } else {
        // SAFETY: forwarded.
        unsafe { tile_acc::<R, MB, false>(w, r0, qp, i0) }
    };
    for (k, row) in acc.iter().enumerate() {
        for (i, &a) in row.iter().enumerate() {
            // SAFETY: the caller's output region.
            unsafe { *out.add((i0 + i) * stride + r0 + k) = fold(a) };
        }
    }
    MB
}

/// The accumulator lanes of rows `r0..r0 + R` for activation rows `i0..i0 + MB`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile_acc<const R: usize, const MB: usize, const INT8: bool>(
    w: &MatRef<'_>,
    r0: usize,
    qp: &QPack,
    i0: usize,
) -> [[__m512; MB]; R] {
    let rb = w.format.row_bytes(w.cols);
    let ng = w.format.row_scales(w.cols);
    let group = match w.format {
        WeightFormat::Int4Group { group } => group,
        _ => 0,
    };
    let cb = if INT8 { CHUNK } else { CHUNK / 2 };
    let chunks = qp.stride / CHUNK;
    let mut rp = [w.data.as_ptr(); R];
    let mut sc = [&w.scales[..0]; R];
    for k in 0..R {
        // SAFETY: row r0 + k exists (caller).
        rp[k] = unsafe { rp[k].add((r0 + k) * rb) };
        sc[k] = &w.scales[(r0 + k) * ng..(r0 + k + 1) * ng];
    }
    let mut acc = [[_mm512_setzero_ps(); MB]; R];
    // The next block of rows, one block ahead (see `Prefetch` for why).
    let mut pf = Prefetch::new(w, r0 + R, R);
    // SAFETY: SX_IDX holds 16 dwords.
    let sx_idx = unsafe { _mm512_loadu_si512(SX_IDX.as_ptr().cast()) };
    let zero = _mm512_setzero_si512();
    for c in 0..chunks {
        pf.steps(CHUNK / 16);
        // SAFETY: the records of chunk c, activations i0..i0 + MB, lie in the pack.
        let recs = unsafe { qp.packed.as_ptr().add((c * qp.m + i0) * RECORD) };
        // Per activation row: codes, per-lane activation scales, and (int4) the lane start
        // `-8 · Σ q` that removes the nibble offset.
        let mut qv = [zero; MB];
        let mut sxv = [_mm512_setzero_ps(); MB];
        let mut start = [zero; MB];
        for i in 0..MB {
            // SAFETY: record i of this chunk (see QPack::packed for the layout).
            unsafe {
                let p = recs.add(i * RECORD);
                qv[i] = _mm512_loadu_si512(p.cast());
                let s4 = _mm512_castps128_ps512(_mm_loadu_ps(p.add(CHUNK).cast()));
                sxv[i] = _mm512_permutexvar_ps(sx_idx, s4);
            }
            if !INT8 {
                start[i] =
                    _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(8), qv[i]));
            }
        }
        // Bytes of this chunk inside the row: cb, or fewer for the ragged last chunk, which is
        // loaded with a byte mask (masked bytes read as 0 and are never accessed; the padded
        // activations are code 0 as well). No call in the loop, so the accumulators stay in
        // registers.
        let n = (rb - c * cb).min(cb);
        let mask = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
        for k in 0..R {
            // SAFETY: only the chunk's n bytes inside row r0 + k are accessed.
            let wv = unsafe { weights::<INT8>(rp[k].add(c * cb), mask) };
            let swv = if group == 0 {
                _mm512_set1_ps(sc[k][0])
            } else {
                lane_scales(sc[k], group, c * CHUNK, qp.groups[c])
            };
            let wsum = if INT8 {
                _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(-128), wv)
            } else {
                zero
            };
            for (i, a) in acc[k].iter_mut().enumerate() {
                let isum = if INT8 {
                    _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, qv[i], wv), wsum)
                } else {
                    _mm512_dpbusd_epi32(start[i], wv, qv[i])
                };
                *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(swv, sxv[i]), *a);
            }
        }
    }
    acc
}

/// The unsigned operand of one chunk: int8 weights as stored (64 bytes), or int4 nibbles
/// widened to one byte per column, in column order (32 bytes in).
///
/// Only the bytes selected by `mask` are read; the others are 0.
///
/// # Safety
/// The selected bytes at `p` are readable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn weights<const INT8: bool>(p: *const u8, mask: u64) -> __m512i {
    if INT8 {
        // SAFETY: masked bytes are not accessed (caller guarantees the selected ones).
        unsafe { _mm512_maskz_loadu_epi8(mask, p.cast()) }
    } else {
        // Word j = byte j; (word | word << 4) & 0x0F0F puts the low nibble in the low byte
        // (column 2j) and the high nibble in the high byte (column 2j + 1).
        // SAFETY: as above (32 bytes at most).
        let b = _mm512_cvtepu8_epi16(unsafe { _mm256_maskz_loadu_epi8(mask as u32, p.cast()) });
        _mm512_and_si512(
            _mm512_or_si512(b, _mm512_slli_epi16::<4>(b)),
            _mm512_set1_epi16(0x0F0F),
        )
    }
}

/// Per-lane weight scales of the chunk starting at column `c0`, which touches groups
/// `first..=last` (groups are multiples of 16 here, so at most 5; lanes past the end take the
/// last group).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
fn lane_scales(sc: &[f32], group: usize, c0: usize, [first, last]: [u32; 2]) -> __m512 {
    let (first, last) = (first as usize, last as usize);
    let mut v = _mm512_set1_ps(sc[first]);
    if last > first {
        // SAFETY: LANE_COL holds 16 dwords.
        let lane_col = unsafe { _mm512_loadu_si512(LANE_COL.as_ptr().cast()) };
        let col = _mm512_add_epi32(_mm512_set1_epi32(c0 as i32), lane_col);
        for (g, &s) in sc.iter().enumerate().take(last + 1).skip(first + 1) {
            let m = _mm512_cmpge_epu32_mask(col, _mm512_set1_epi32((g * group) as i32));
            v = _mm512_mask_mov_ps(v, m, _mm512_set1_ps(s));
        }
    }
    v
}
