//! Row dequantisation: stored bytes → f32, exactly as the format defines it.
use crate::dot::isa_detect;
use crate::format::{MatRef, WeightFormat};

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

/// One code: low nibble first, stored with a +8 offset.
#[inline]
fn int4_code(b: u8, high: bool) -> f32 {
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
