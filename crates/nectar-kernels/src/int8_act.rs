//! **Opt-in, quality-changing**: products with activations quantised to int8.
//!
//! Nothing in Nectar calls this by default. It exists because an integer dot product
//! (`vpdpbusd`, 64 multiply-adds per instruction) is several times cheaper than the exact
//! dequantise-to-f32 path, and because users migrating from Colibri know it as `IDOT`. It
//! changes results: each activation block of `block` columns is rounded to 8 bits
//! (`colibri-format.md` §14.13, `lessons.md` item 10). Measured error: `benchmarks/RESULTS.md`.
//!
//! Quantisation, per activation row and block of `block` columns (16, 32 or 64):
//! `s = max(amax / 127, 1e-12)`, `q = clamp(round_half_even(x / s), -127, 127)`.
//!
//! Its own fixed order (so the scalar and VNNI paths agree bit for bit, and a row's result does
//! not depend on M or the thread count): per row, columns in 64-column chunks (zero-padded),
//! 16 f32 lanes per chunk, lane l covering columns `4l..4l+4` of the chunk. The lane's exact
//! integer sum `Σ code·q` is converted to f32 and accumulated with one fused multiply-add by
//! `s_w · s_x` (the f32 product of the weight scale of the lane's columns and the activation
//! scale of the block holding the lane's 16-column group, 0 for groups past the end); the
//! lanes are then folded as in `dot.rs`.
use crate::dot::{fold16, isa_detect, LANES};
use crate::driver::{par_rows, SharedOut};
use crate::error::{Error, Result};
use crate::format::{MatRef, WeightFormat};
use crate::matmul::check_weights;

/// The default activation block (columns per activation scale).
pub const INT8_ACT_BLOCK: usize = 32;

/// Columns per chunk of the int8-activation order.
pub(crate) const CHUNK: usize = 64;

/// **Quality-changing, opt-in.** `y[i] ≈ W · x[i]` with each activation row quantised to int8
/// per `block` columns (16, 32 or 64; [`INT8_ACT_BLOCK`] is the usual choice), for int8 and
/// int4 weights. For grouped int4 the group size must be a multiple of `block`.
///
/// Uses AVX-512 VNNI where the CPU has it and a scalar path otherwise; both give the same bits.
pub fn matmul_int8_act(
    w: &MatRef<'_>,
    x: &[f32],
    m: usize,
    y: &mut [f32],
    block: usize,
) -> Result<()> {
    matmul_int8_act_with(vnni_available(), w, x, m, y, block)
}

/// Whether the VNNI kernel can run here.
pub(crate) fn vnni_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        isa_detect() == crate::dot::Isa::Avx512
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa_detect();
        false
    }
}

/// Bytes of one (chunk, activation row) record of [`QPack::packed`].
pub(crate) const RECORD: usize = CHUNK + 16;

/// Activation rows quantised for one weight format.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the VNNI kernel reads `packed`
pub(crate) struct QPack {
    /// Activation rows.
    pub m: usize,
    /// Columns padded to whole chunks.
    pub stride: usize,
    /// Signed codes, `m × stride`, zero-padded (the scalar definition reads these).
    pub q: Vec<i8>,
    /// Per 16-column group (`m × stride / 16`): the activation scale of the block holding the
    /// group (blocks are 16, 32 or 64 columns, so a group never straddles two); 0 past the end.
    pub sx: Vec<f32>,
    /// The kernels' copy, one [`RECORD`] per (chunk k, activation row i) at `(k·m + i)·RECORD`,
    /// so one running pointer reaches every operand with constant offsets, and small enough
    /// (80 bytes per 64 columns) that a few activation rows stay in L1:
    /// - bytes 0..64: the codes, as i8 for int4 weights, as `q + 128` (u8, the unsigned operand
    ///   of `vpdpbusd`) for int8 weights;
    /// - bytes 64..80: 4 × f32, the scales of the chunk's four 16-column groups.
    pub packed: Vec<u8>,
    /// Grouped int4: per chunk, the first and last weight-scale group its 64 columns touch
    /// (clamped to the row's last group), so kernels need no division per chunk.
    pub groups: Vec<[u32; 2]>,
}

/// Columns per activation-scale entry of [`QPack::sx`].
pub(crate) const SX_COLS: usize = 16;

impl QPack {
    pub(crate) fn new(x: &[f32], m: usize, w: &MatRef<'_>, block: usize) -> QPack {
        let cols = w.cols;
        let int8_weights = w.format == WeightFormat::Int8Row;
        let stride = cols.div_ceil(CHUNK) * CHUNK;
        let per_row = stride / SX_COLS;
        let mut q = vec![0i8; m * stride];
        let mut sx = vec![0.0f32; m * per_row];
        for i in 0..m {
            let xr = &x[i * cols..(i + 1) * cols];
            for (b, xb) in xr.chunks(block).enumerate() {
                let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                let s = (amax / 127.0).max(1e-12);
                for (j, &v) in xb.iter().enumerate() {
                    q[i * stride + b * block + j] =
                        (v / s).round_ties_even().clamp(-127.0, 127.0) as i8;
                }
                let g0 = b * block / SX_COLS;
                let g1 = (b * block + xb.len()).div_ceil(SX_COLS);
                sx[i * per_row + g0..i * per_row + g1].fill(s);
            }
        }
        let chunks = stride / CHUNK;
        let mut packed = vec![0u8; chunks * m * RECORD];
        for k in 0..chunks {
            for i in 0..m {
                let rec = &mut packed[(k * m + i) * RECORD..(k * m + i + 1) * RECORD];
                let qs = &q[i * stride + k * CHUNK..i * stride + (k + 1) * CHUNK];
                for (d, &v) in rec[..CHUNK].iter_mut().zip(qs) {
                    *d = if int8_weights {
                        (v as i16 + 128) as u8
                    } else {
                        v as u8
                    };
                }
                for g in 0..CHUNK / SX_COLS {
                    let v = sx[i * per_row + k * (CHUNK / SX_COLS) + g];
                    rec[CHUNK + 4 * g..CHUNK + 4 * g + 4].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        let groups = match w.format {
            WeightFormat::Int4Group { group } => {
                let last = w.format.row_scales(cols).max(1) - 1;
                (0..chunks)
                    .map(|k| {
                        let g = |c: usize| (c / group).min(last) as u32;
                        [g(k * CHUNK), g(k * CHUNK + CHUNK - 1)]
                    })
                    .collect()
            }
            _ => Vec::new(),
        };
        QPack {
            m,
            stride,
            q,
            sx,
            packed,
            groups,
        }
    }
}

/// The weight scale of column `c` of row `r` (clamped to the last group past the end).
#[inline]
pub(crate) fn weight_scale(w: &MatRef<'_>, r: usize, c: usize) -> f32 {
    match w.format {
        WeightFormat::Int4Group { group } => {
            let ng = w.format.row_scales(w.cols);
            w.scales[r * ng + (c / group).min(ng - 1)]
        }
        _ => w.scales[r],
    }
}

/// The integer code of column `c` of row `r` (int8 or int4 weights).
#[inline]
fn code(w: &MatRef<'_>, r: usize, c: usize) -> i32 {
    let d = w.row_data(r);
    match w.format {
        WeightFormat::Int8Row => d[c] as i8 as i32,
        _ => {
            let b = d[c / 2];
            (if c.is_multiple_of(2) { b & 15 } else { b >> 4 }) as i32 - 8
        }
    }
}

/// The scalar definition of the order in the module docs.
pub(crate) fn row_scalar(w: &MatRef<'_>, r: usize, qp: &QPack, i: usize) -> f32 {
    let per_row = qp.stride / SX_COLS;
    let mut acc = [0.0f32; LANES];
    for k in 0..qp.stride / CHUNK {
        for (l, a) in acc.iter_mut().enumerate() {
            let c0 = k * CHUNK + 4 * l;
            let mut isum = 0i32;
            for c in c0..(c0 + 4).min(w.cols) {
                isum += code(w, r, c) * qp.q[i * qp.stride + c] as i32;
            }
            let sc = weight_scale(w, r, c0) * qp.sx[i * per_row + c0 / SX_COLS];
            *a = (isum as f32).mul_add(sc, *a);
        }
    }
    fold16(acc)
}

pub(crate) fn matmul_int8_act_with(
    vnni: bool,
    w: &MatRef<'_>,
    x: &[f32],
    m: usize,
    y: &mut [f32],
    block: usize,
) -> Result<()> {
    check_weights("matmul_int8_act", w)?;
    match w.format {
        WeightFormat::Int8Row | WeightFormat::Int4Row => {}
        WeightFormat::Int4Group { group } if group % block.max(1) == 0 => {}
        f => {
            return Err(Error::Shape(format!(
                "matmul_int8_act: needs int8 or int4 weights whose groups are a multiple of the \
                 {block}-column activation block, got {}",
                f.name()
            )))
        }
    }
    if ![16, 32, 64].contains(&block) {
        return Err(Error::Shape(format!(
            "matmul_int8_act: activation block {block} (want 16, 32 or 64)"
        )));
    }
    if Some(x.len()) != m.checked_mul(w.cols) || Some(y.len()) != m.checked_mul(w.rows) {
        return Err(Error::Shape(format!(
            "matmul_int8_act: W is {}x{}, m = {m}: x has {}, y has {}",
            w.rows,
            w.cols,
            x.len(),
            y.len()
        )));
    }
    if w.rows == 0 || m == 0 {
        return Ok(());
    }
    let qp = QPack::new(x, m, w, block);
    let out = SharedOut(y.as_mut_ptr());
    let rows = w.rows;
    par_rows(0..rows, w.format.row_bytes(w.cols), m, |t| {
        #[cfg(target_arch = "x86_64")]
        if vnni {
            // SAFETY: VNNI was detected; `w` is validated; rows t exist; the task owns the
            // output elements (i, r) for r in t.
            unsafe { crate::x86::vnni::rows(w, t, &qp, out.get(), rows) };
            return;
        }
        let _ = vnni;
        for r in t {
            for i in 0..m {
                // SAFETY: this task owns output elements (i, r) for r in its rows.
                unsafe { *out.get().add(i * rows + r) = row_scalar(w, r, &qp, i) };
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matmul::matmul;
    use crate::matmul::tests::{activations, random_matrix};
    use proptest::prelude::*;

    fn formats() -> [WeightFormat; 7] {
        [
            WeightFormat::Int8Row,
            WeightFormat::Int4Row,
            WeightFormat::Int4Group { group: 64 },
            WeightFormat::Int4Group { group: 32 },
            WeightFormat::Int4Group { group: 128 },
            WeightFormat::Int4Group { group: 16 },
            WeightFormat::Int4Group { group: 48 },
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn vnni_matches_the_scalar_definition_bitwise(
            rows in 1usize..20, cols in 1usize..300, m in 1usize..11, f in 0usize..7,
            b in 0usize..3, seed in any::<u64>()
        ) {
            let format = formats()[f];
            let block = [16, 32, 64][b];
            if let WeightFormat::Int4Group { group } = format {
                prop_assume!(group % block == 0);
            }
            let (data, scales) = random_matrix(format, rows, cols, seed);
            let w = MatRef::new(format, rows, cols, &data, &scales).unwrap();
            let x = activations(m, cols, seed);
            let mut scalar = vec![0.0; m * rows];
            matmul_int8_act_with(false, &w, &x, m, &mut scalar, block).unwrap();
            let mut fast = vec![0.0; m * rows];
            matmul_int8_act_with(vnni_available(), &w, &x, m, &mut fast, block).unwrap();
            for (a, b) in fast.iter().zip(&scalar) {
                prop_assert_eq!(a.to_bits(), b.to_bits());
            }
        }
    }

    #[test]
    fn error_against_the_exact_path_is_small() {
        let (rows, cols, m) = (64, 2048, 2);
        for format in &formats()[..5] {
            let format = *format;
            let (data, scales) = random_matrix(format, rows, cols, 5);
            let w = MatRef::new(format, rows, cols, &data, &scales).unwrap();
            let x = activations(m, cols, 6);
            let mut exact = vec![0.0; m * rows];
            matmul(&w, &x, m, &mut exact).unwrap();
            let mut approx = vec![0.0; m * rows];
            matmul_int8_act(&w, &x, m, &mut approx, INT8_ACT_BLOCK).unwrap();
            let num: f64 = exact
                .iter()
                .zip(&approx)
                .map(|(a, b)| ((a - b) as f64).powi(2))
                .sum();
            let den: f64 = exact.iter().map(|a| (*a as f64).powi(2)).sum();
            let rel = (num / den).sqrt();
            assert!(rel < 0.02, "{}: relative RMS error {rel}", format.name());
        }
    }

    #[test]
    fn unsupported_inputs_are_errors() {
        let d = vec![0u8; 8];
        let w = MatRef::new(WeightFormat::Bf16, 1, 4, &d, &[]).unwrap();
        let mut y = [0.0];
        assert!(matmul_int8_act(&w, &[0.0; 4], 1, &mut y, 32).is_err());
        let s = [1.0; 1];
        let w = MatRef::new(WeightFormat::Int4Group { group: 48 }, 1, 16, &d, &s).unwrap();
        assert!(matmul_int8_act(&w, &[0.0; 16], 1, &mut y, 32).is_err());
        let w = MatRef::new(WeightFormat::Int8Row, 1, 8, &d, &s).unwrap();
        assert!(matmul_int8_act(&w, &[0.0; 8], 1, &mut y, 24).is_err());
        assert!(matmul_int8_act(&w, &[0.0; 7], 1, &mut y, 32).is_err());
    }
}
