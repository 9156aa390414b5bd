//! Row dequantisation: stored bytes → f32, exactly as the format defines it.
use crate::dot::{isa_detect, Isa};
use crate::format::{MatRef, WeightFormat};
use crate::scaled_add::scaled_add_with;

/// Decodes row `r` of `m` into `dst` (length `m.cols`): `code · scale` in f32 for quantised
/// formats, a widening conversion for float formats.
pub fn decode_row(m: &MatRef<'_>, r: usize, dst: &mut [f32]) {
    assert_eq!(dst.len(), m.cols, "decode_row: destination length");
    let src = m.row_data(r);
    let scales = m.row_scales(r);
    match m.format {
        WeightFormat::F32 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
        }
        WeightFormat::Bf16 => match isa_detect() {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: both paths are only chosen after runtime detection of AVX2 (the AVX-512
            // path requires it too); lengths match by MatRef's invariant.
            crate::dot::Isa::Avx2 | crate::dot::Isa::Avx512 => unsafe {
                crate::x86::avx2::decode_bf16_avx2(src, dst)
            },
            _ => {
                for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                    *d = f32::from_bits((u16::from_le_bytes([s[0], s[1]]) as u32) << 16);
                }
            }
        },
        WeightFormat::F16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = half::f16::from_bits(u16::from_le_bytes([s[0], s[1]])).to_f32();
            }
        }
        WeightFormat::Int8Row => {
            let s = scales[0];
            for (d, &q) in dst.iter_mut().zip(src) {
                *d = (q as i8) as f32 * s;
            }
        }
        WeightFormat::Int4Row => decode_int4_runs(src, dst, dst.len(), scales),
        WeightFormat::Int4Group { group } if group % 2 == 0 => {
            decode_int4_runs(src, dst, group, scales)
        }
        WeightFormat::Int4Group { group } => decode_int4(src, dst, |c| scales[c / group]),
    }
}

/// `y += a[j] · row r0 + j of m` for j = 0, 1, … in order: the bits of [`decode_row`] of each
/// row followed by [`crate::scaled_add`] (`y[c] += a[j] · w[c]`, a multiply then an add), without
/// materialising the rows. The absorbed attention folds W_UK into each head's query so
/// (`q_lat = Σ_j q_nope[j] · W_UK[j]`, 192 rows of 512 per head at GLM-5.2's shape); a row at a
/// time, decoding into a buffer and adding it back, that took about 2 ms of a 5 ms layer-step
/// on two cores (`benchmarks/RESULTS.md`).
///
/// # Panics
/// If `y` is not `m.cols` long or rows `r0..r0 + a.len()` do not exist (caller bugs).
pub fn scaled_add_rows(m: &MatRef<'_>, r0: usize, a: &[f32], y: &mut [f32]) {
    scaled_add_rows_with(isa_detect(), m, r0, a, y)
}

/// [`scaled_add_rows`] on an explicit path (tests compare every path with the definition).
pub(crate) fn scaled_add_rows_with(isa: Isa, m: &MatRef<'_>, r0: usize, a: &[f32], y: &mut [f32]) {
    assert_eq!(y.len(), m.cols, "scaled_add_rows: output length");
    assert!(
        r0 + a.len() <= m.rows,
        "scaled_add_rows: rows {r0}..{} of {}",
        r0 + a.len(),
        m.rows
    );
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        let seg = match m.format {
            WeightFormat::Int4Row => Some(usize::MAX),
            WeightFormat::Int4Group { group } if group % 64 == 0 => Some(group),
            _ => None,
        };
        if let Some(seg) = seg {
            // SAFETY: Isa::Avx512 is only constructed after runtime detection of AVX-512F;
            // the rows exist and `y` has `m.cols` elements (asserted above); int4 with scale
            // segments of whole 64-column groups (or one per row).
            unsafe { crate::x86::avx512::scaled_add_rows_int4(m, r0, a, y, seg) };
            return;
        }
    }
    let mut w = vec![0.0f32; m.cols];
    for (j, &aj) in a.iter().enumerate() {
        decode_row(m, r0 + j, &mut w);
        scaled_add_with(isa, y, aj, &w);
    }
}

/// One code: low nibble first, stored with a +8 offset.
#[inline]
pub(crate) fn int4_code(b: u8, high: bool) -> f32 {
    (if high { b >> 4 } else { b & 0x0f }) as i32 as f32 - 8.0
}

/// Element-wise int4 decoding for any group size (odd groups start mid-byte).
#[inline]
fn decode_int4(src: &[u8], dst: &mut [f32], scale: impl Fn(usize) -> f32) {
    for (c, d) in dst.iter_mut().enumerate() {
        *d = int4_code(src[c / 2], c % 2 == 1) * scale(c);
    }
}

/// Int4 decoding in runs of `run` codes that share one scale and start on a byte boundary
/// (`run` even, or the whole row): one scale load per run and a byte-at-a-time inner loop the
/// compiler vectorises. Each element is the same `code · scale` product as [`decode_int4`].
#[inline]
fn decode_int4_runs(src: &[u8], dst: &mut [f32], run: usize, scales: &[f32]) {
    for ((d, b), &s) in dst
        .chunks_mut(run.max(1))
        .zip(src.chunks(run.div_ceil(2).max(1)))
        .zip(scales)
    {
        let pairs = d.len() / 2;
        for (p, &byte) in d.chunks_exact_mut(2).zip(&b[..pairs]) {
            p[0] = int4_code(byte, false) * s;
            p[1] = int4_code(byte, true) * s;
        }
        if d.len() % 2 == 1 {
            d[d.len() - 1] = int4_code(b[pairs], false) * s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int4_nibble_order_and_offset() {
        // codes [-8, 7, 0, -1, 3] → bytes: (0 | 15<<4), (8 | 7<<4), (11 | 0)
        let data = [0xF0u8, 0x78, 0x0B];
        let m = MatRef::new(WeightFormat::Int4Row, 1, 5, &data, &[0.5]).unwrap();
        let mut out = [0.0; 5];
        decode_row(&m, 0, &mut out);
        assert_eq!(out, [-4.0, 3.5, 0.0, -0.5, 1.5]);
    }

    #[test]
    fn int4_group_scales_and_short_last_group() {
        let data = [0x99u8, 0x99, 0x09]; // five codes of +1
        let m = MatRef::new(
            WeightFormat::Int4Group { group: 2 },
            1,
            5,
            &data,
            &[1.0, 2.0, 3.0],
        )
        .unwrap();
        let mut out = [0.0; 5];
        decode_row(&m, 0, &mut out);
        assert_eq!(out, [1.0, 1.0, 2.0, 2.0, 3.0]);
    }

    /// The run-wise fast path and the element-wise definition give the same bits for every
    /// int4 layout: per-row and grouped scales, odd column counts, short last groups.
    #[test]
    fn int4_runs_match_elementwise_decoding() {
        for cols in [1usize, 2, 3, 7, 16, 63, 64, 65, 130, 384] {
            for format in [
                WeightFormat::Int4Row,
                WeightFormat::Int4Group { group: 2 },
                WeightFormat::Int4Group { group: 16 },
                WeightFormat::Int4Group { group: 64 },
            ] {
                let rows = 3;
                let data: Vec<u8> = (0..rows * format.row_bytes(cols))
                    .map(|i| (i * 37 + 11) as u8)
                    .collect();
                let scales: Vec<f32> = (0..rows * format.row_scales(cols))
                    .map(|i| 0.01 + i as f32 * 0.37)
                    .collect();
                let m = MatRef::new(format, rows, cols, &data, &scales).unwrap();
                let mut got = vec![0.0; cols];
                for r in 0..rows {
                    decode_row(&m, r, &mut got);
                    let sc = m.row_scales(r);
                    let g = match format {
                        WeightFormat::Int4Group { group } => group,
                        _ => cols,
                    };
                    let mut want = vec![0.0; cols];
                    decode_int4(m.row_data(r), &mut want, |c| sc[c / g]);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{} cols {cols} row {r}",
                        format.name()
                    );
                }
            }
        }
    }

    /// The fused sum gives the bits of decoding each row and adding it with `scaled_add`, on
    /// every path: int4 per row and in groups of 64 and 128 (the fast path), groups of 32 and
    /// int8 (the definition itself), whole groups with a ragged tail, chunks of four, two and
    /// one group, a starting row past 0, weights of every sign and zero.
    #[test]
    fn scaled_add_rows_equals_decode_then_scaled_add() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for cols in [1usize, 15, 64, 65, 130, 192, 320, 448, 512, 700] {
            for format in [
                WeightFormat::Int4Row,
                WeightFormat::Int4Group { group: 64 },
                WeightFormat::Int4Group { group: 128 },
                WeightFormat::Int4Group { group: 32 },
                WeightFormat::Int8Row,
            ] {
                let rows = 7;
                let data = crate::matmul::tests::random_bytes(rows * format.row_bytes(cols), 3);
                let scales: Vec<f32> = (0..rows * format.row_scales(cols))
                    .map(|i| 0.013 + (i % 29) as f32 * 0.0371)
                    .collect();
                let m = MatRef::new(format, rows, cols, &data, &scales).unwrap();
                let a = [0.75f32, -1.3, 0.0, 2.5e-3, -17.0];
                let y0: Vec<f32> = (0..cols).map(|c| (c as f32 * 0.61).sin()).collect();
                let mut want = y0.clone();
                let mut w = vec![0.0; cols];
                for (j, &aj) in a.iter().enumerate() {
                    decode_row(&m, 2 + j, &mut w);
                    crate::scaled_add::scaled_add_with(Isa::Scalar, &mut want, aj, &w);
                }
                for isa in Isa::available() {
                    let mut got = y0.clone();
                    scaled_add_rows_with(isa, &m, 2, &a, &mut got);
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{isa:?} {} cols {cols}",
                        format.name()
                    );
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "scaled_add_rows: rows 5..8 of 7")]
    fn scaled_add_rows_past_the_last_row_is_a_caller_bug() {
        let format = WeightFormat::Int4Group { group: 64 };
        let data = vec![0u8; 7 * format.row_bytes(64)];
        let m = MatRef::new(format, 7, 64, &data, &[1.0; 7]).unwrap();
        scaled_add_rows(&m, 5, &[1.0; 3], &mut [0.0; 64]);
    }

    #[test]
    fn bf16_and_f16_widen_exactly() {
        let v = [1.5f32, -2.25, 3.0e-3, 65504.0, 0.0, -0.0, 7.0, 1e-5, 100.0];
        let bf: Vec<u8> = v
            .iter()
            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
            .collect();
        let hf: Vec<u8> = v
            .iter()
            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
            .collect();
        let mut out = vec![0.0; v.len()];
        decode_row(
            &MatRef::new(WeightFormat::Bf16, 1, v.len(), &bf, &[]).unwrap(),
            0,
            &mut out,
        );
        for (o, x) in out.iter().zip(&v) {
            assert_eq!(o.to_bits(), half::bf16::from_f32(*x).to_f32().to_bits());
        }
        decode_row(
            &MatRef::new(WeightFormat::F16, 1, v.len(), &hf, &[]).unwrap(),
            0,
            &mut out,
        );
        for (o, x) in out.iter().zip(&v) {
            assert_eq!(o.to_bits(), half::f16::from_f32(*x).to_f32().to_bits());
        }
    }
}
