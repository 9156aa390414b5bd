//! y = W·x for M activation rows, parallel over output rows.
//!
//! Each output element is `dot(decode_row(W, r), x_i)` in the canonical order (or, for int4
//! under the opt-in [`crate::set_int4_order`]`("digits")`, that order's, `digits.rs`), so it does not
//! depend on M, on how rows are split across threads, on which other rows share the batch, or on
//! the instruction set. The SIMD paths never materialise `decode_row`: they dequantise in
//! registers and reuse each decoded weight step for up to 8 activation rows (see `driver.rs`).
use crate::digits;
use crate::dot::{isa_detect, Isa};
use crate::driver::{layout_for, par_tile};
use crate::error::{Error, Result};
use crate::format::MatRef;
use crate::xpack::XPack;

/// Largest column count the kernels accept (lane column indices are 32-bit).
const MAX_COLS: usize = i32::MAX as usize;

/// Checks a weight view for use by a kernel entry point named `what`.
pub(crate) fn check_weights(what: &str, w: &MatRef<'_>) -> Result<()> {
    w.validate()?;
    if w.cols > MAX_COLS {
        return Err(Error::Shape(format!(
            "{what}: {} columns exceed the kernel limit {MAX_COLS}",
            w.cols
        )));
    }
    Ok(())
}

/// Computes `y[i] = W · x[i]` for `m` activation rows.
///
/// `x` is `m × w.cols` and `y` is `m × w.rows`, both row-major.
pub fn matmul(w: &MatRef<'_>, x: &[f32], m: usize, y: &mut [f32]) -> Result<()> {
    matmul_with(isa_detect(), w, x, m, y)
}

/// [`matmul`] on an explicit instruction set (tests run every available one).
pub(crate) fn matmul_with(
    isa: Isa,
    w: &MatRef<'_>,
    x: &[f32],
    m: usize,
    y: &mut [f32],
) -> Result<()> {
    check_weights("matmul", w)?;
    if Some(x.len()) != m.checked_mul(w.cols) || Some(y.len()) != m.checked_mul(w.rows) {
        return Err(Error::Shape(format!(
            "matmul: W is {}x{}, m = {m}: x has {} (want {}), y has {} (want {})",
            w.rows,
            w.cols,
            x.len(),
            m.saturating_mul(w.cols),
            y.len(),
            m.saturating_mul(w.rows)
        )));
    }
    if w.rows == 0 || m == 0 {
        return Ok(());
    }
    if digits::int4_order_covers(w.format) {
        digits::matmul_digits(w, 0..w.rows, x, m, y);
        return Ok(());
    }
    let xp = XPack::new(x, m, w.cols, layout_for(isa, w.format));
    // SAFETY: `w` is validated, `x` is packed for (isa, format) with w.cols columns, `isa`
    // comes from detection, and y holds m × rows elements with row stride w.rows.
    unsafe { par_tile(isa, w, 0..w.rows, &xp, y, w.rows) };
    Ok(())
}

/// Computes only the output rows `rows` of W·x for one activation row (used for row tiles of
/// very tall matrices such as the LM head, and for gathered embedding rows).
pub fn matmul_rows(
    w: &MatRef<'_>,
    rows: std::ops::Range<usize>,
    x: &[f32],
    y: &mut [f32],
) -> Result<()> {
    matmul_rows_with(isa_detect(), w, rows, x, y)
}

pub(crate) fn matmul_rows_with(
    isa: Isa,
    w: &MatRef<'_>,
    rows: std::ops::Range<usize>,
    x: &[f32],
    y: &mut [f32],
) -> Result<()> {
    check_weights("matmul_rows", w)?;
    if x.len() != w.cols || y.len() != rows.len() || rows.end > w.rows || rows.start > rows.end {
        return Err(Error::Shape(format!(
            "matmul_rows: W is {}x{}, rows {:?}, x {}, y {}",
            w.rows,
            w.cols,
            rows,
            x.len(),
            y.len()
        )));
    }
    if digits::int4_order_covers(w.format) {
        digits::matmul_digits(w, rows, x, 1, y);
        return Ok(());
    }
    let xp = XPack::new(x, 1, w.cols, layout_for(isa, w.format));
    let n = rows.len();
    // SAFETY: as in `matmul_with`; y holds exactly rows.len() elements (one activation row).
    unsafe { par_tile(isa, w, rows, &xp, y, n) };
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::decode::decode_row;
    use crate::dot::dot_scalar;
    use crate::format::WeightFormat;
    use proptest::prelude::*;

    pub(crate) fn reference(w: &MatRef<'_>, x: &[f32], m: usize) -> Vec<f32> {
        let mut y = vec![0.0; m * w.rows];
        let mut buf = vec![0.0; w.cols];
        for i in 0..m {
            for r in 0..w.rows {
                decode_row(w, r, &mut buf);
                y[i * w.rows + r] = dot_scalar(&buf, &x[i * w.cols..(i + 1) * w.cols]);
            }
        }
        y
    }

    pub(crate) fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (s >> 33) as u8
            })
            .collect()
    }

    fn finite_f32_bytes(n: usize, seed: u64) -> Vec<u8> {
        random_bytes(n, seed)
            .chunks(4)
            .flat_map(|c| (((c[0] as f32) - 128.0) / 64.0 + c[1] as f32 / 1e4).to_le_bytes())
            .collect()
    }

    fn bf16_bytes(n: usize, seed: u64) -> Vec<u8> {
        random_bytes(n, seed)
            .chunks(2)
            .flat_map(|c| half::bf16::from_f32((c[0] as f32 - 128.0) / 37.0).to_le_bytes())
            .collect()
    }

    /// Every format the kernels handle, including group sizes that straddle 16-column steps.
    pub(crate) fn format_of(sel: usize) -> WeightFormat {
        const GROUPS: [usize; 14] = [16, 32, 48, 64, 96, 128, 192, 256, 1, 3, 7, 20, 40, 100];
        match sel {
            0 => WeightFormat::F32,
            1 => WeightFormat::Bf16,
            2 => WeightFormat::F16,
            3 => WeightFormat::Int8Row,
            4 => WeightFormat::Int4Row,
            s => WeightFormat::Int4Group {
                group: GROUPS[(s - 5) % GROUPS.len()],
            },
        }
    }
    pub(crate) const FORMATS: usize = 5 + 14;

    /// Random weights of `format`: any bytes for integer codes, finite values for floats, and
    /// scales of both signs (a negative scale turns padded 0 codes into -0, which the kernels
    /// must not let into a lane).
    pub(crate) fn random_matrix(
        format: WeightFormat,
        rows: usize,
        cols: usize,
        seed: u64,
    ) -> (Vec<u8>, Vec<f32>) {
        let nb = rows * format.row_bytes(cols);
        let data = match format {
            WeightFormat::F32 => finite_f32_bytes(nb, seed),
            WeightFormat::Bf16 => bf16_bytes(nb, seed),
            WeightFormat::F16 => random_bytes(nb / 2, seed)
                .iter()
                .flat_map(|b| half::f16::from_f32(*b as f32 / 50.0 - 2.0).to_le_bytes())
                .collect(),
            _ => random_bytes(nb, seed),
        };
        let scales = random_bytes(rows * format.row_scales(cols), seed ^ 0x5ca1e)
            .iter()
            .map(|&b| (b as f32 - 100.0) * 1e-3)
            .collect();
        (data, scales)
    }

    pub(crate) fn activations(m: usize, cols: usize, seed: u64) -> Vec<f32> {
        random_bytes(m * cols, seed ^ 0xac7)
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                if i % 29 == 0 {
                    -0.0
                } else {
                    (b as f32 - 128.0) / 64.0
                }
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]
        #[test]
        fn every_isa_and_format_matches_the_scalar_reference_bitwise(
            rows in 1usize..23, cols in 1usize..300, m in 1usize..34,
            fsel in 0usize..FORMATS, seed in any::<u64>()
        ) {
            let format = format_of(fsel);
            let (data, scales) = random_matrix(format, rows, cols, seed);
            let w = MatRef::new(format, rows, cols, &data, &scales).unwrap();
            let x = activations(m, cols, seed);
            let want = reference(&w, &x, m);
            for isa in Isa::available() {
                let mut y = vec![f32::NAN; m * rows];
                matmul_with(isa, &w, &x, m, &mut y).unwrap();
                for (k, (a, b)) in y.iter().zip(&want).enumerate() {
                    prop_assert_eq!(a.to_bits(), b.to_bits(), "{:?} {} {}x{} m={} at {}", isa, format.name(), rows, cols, m, k);
                }
                // Row i of a batch equals the same row computed alone.
                for i in [0, m / 2, m - 1] {
                    let mut y1 = vec![0.0; rows];
                    matmul_with(isa, &w, &x[i * cols..(i + 1) * cols], 1, &mut y1).unwrap();
                    prop_assert_eq!(&y1[..], &y[i * rows..(i + 1) * rows]);
                }
                // A row sub-range equals the same rows of the full product.
                let r0 = rows / 3;
                let mut yr = vec![0.0; rows - r0];
                matmul_rows_with(isa, &w, r0..rows, &x[..cols], &mut yr).unwrap();
                prop_assert_eq!(&yr[..], &y[r0..rows]);
            }
        }
    }

    /// Real GLM-5.2 widths (lessons.md item 8): the expert and attention input widths at the
    /// production group sizes, a few rows each, every path against the reference.
    #[test]
    fn production_widths_match_the_reference() {
        for &(cols, format) in &[
            (6144, WeightFormat::Int4Group { group: 64 }),
            (2048, WeightFormat::Int4Group { group: 64 }),
            (6144, WeightFormat::Int4Group { group: 16 }),
            (2048, WeightFormat::Int4Group { group: 48 }),
            (6144, WeightFormat::Int4Group { group: 192 }),
            (6144, WeightFormat::Int4Row),
            (16384, WeightFormat::Int8Row),
            (6144, WeightFormat::Bf16),
            (512, WeightFormat::F16),
        ] {
            let rows = 9;
            let (data, scales) = random_matrix(format, rows, cols, cols as u64);
            let w = MatRef::new(format, rows, cols, &data, &scales).unwrap();
            for m in [1, 4, 9] {
                let x = activations(m, cols, 3);
                let want = reference(&w, &x, m);
                for isa in Isa::available() {
                    let mut y = vec![0.0; m * rows];
                    matmul_with(isa, &w, &x, m, &mut y).unwrap();
                    let same = y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{isa:?} {} cols={cols} m={m}", format.name());
                }
            }
        }
    }

    /// The decode kernel (AVX-512: 8 int4 rows × 1 activation row, `int4_rows8_m1`) on every
    /// int4 layout it takes — per-row scales and groups that are whole steps — with whole and
    /// partial last groups, a ragged last step, several row blocks plus a remainder, and as
    /// the last activation row of a batch (M = 3: an 8 × 2 block, then 8 × 1).
    #[test]
    fn int4_decode_blocks_match_the_reference() {
        for format in [
            WeightFormat::Int4Row,
            WeightFormat::Int4Group { group: 16 },
            WeightFormat::Int4Group { group: 64 },
            WeightFormat::Int4Group { group: 128 },
        ] {
            for cols in [16usize, 64, 100, 2048, 2055] {
                let rows = 27;
                let (data, scales) = random_matrix(format, rows, cols, cols as u64 ^ 0xd1);
                let w = MatRef::new(format, rows, cols, &data, &scales).unwrap();
                for m in [1, 3] {
                    let x = activations(m, cols, 5);
                    let want = reference(&w, &x, m);
                    for isa in Isa::available() {
                        let mut y = vec![f32::NAN; m * rows];
                        matmul_with(isa, &w, &x, m, &mut y).unwrap();
                        for (k, (a, b)) in y.iter().zip(&want).enumerate() {
                            assert_eq!(
                                a.to_bits(),
                                b.to_bits(),
                                "{isa:?} {} cols={cols} m={m} at {k}",
                                format.name()
                            );
                        }
                    }
                }
            }
        }
    }

    /// Many activation rows at a width with a ragged step and groups that straddle steps: every
    /// register-block shape (2 × 8, 4 × 4, 1 × 8, ...) and remainder meets the reference.
    #[test]
    fn many_activation_rows_match_the_reference() {
        for fsel in 0..FORMATS {
            let format = format_of(fsel);
            let (rows, cols) = (7, 1237);
            let (data, scales) = random_matrix(format, rows, cols, 77);
            let w = MatRef::new(format, rows, cols, &data, &scales).unwrap();
            for m in [8, 17, 33] {
                let x = activations(m, cols, m as u64);
                let want = reference(&w, &x, m);
                for isa in Isa::available() {
                    let mut y = vec![0.0; m * rows];
                    matmul_with(isa, &w, &x, m, &mut y).unwrap();
                    let same = y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{isa:?} {} m={m}", format.name());
                }
            }
        }
    }

    /// A width whose packed rows are so long that an activation tile holds one 8-row block:
    /// the rows cross tiles (8 + 8 + 5) and every tile meets every weight row, bit for bit.
    #[test]
    fn activation_tiles_match_the_reference() {
        let (rows, cols, m) = (11, 20_000, 21);
        assert!(
            crate::driver::act_tile(cols) < m,
            "the product must span several tiles"
        );
        for fsel in 0..FORMATS {
            let format = format_of(fsel);
            let (data, scales) = random_matrix(format, rows, cols, 91);
            let w = MatRef::new(format, rows, cols, &data, &scales).unwrap();
            let x = activations(m, cols, 5);
            let want = reference(&w, &x, m);
            for isa in Isa::available() {
                let mut y = vec![0.0; m * rows];
                matmul_with(isa, &w, &x, m, &mut y).unwrap();
                let same = y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{isa:?} {}", format.name());
            }
        }
    }

    #[test]
    fn padded_tail_keeps_the_sign_of_zero() {
        // Negative weights times the smallest subnormal activation underflow to -0, so every
        // lane holds -0 before the ragged step. The reference's zero padding turns the padded
        // lanes into +0 (fma(0, 0, -0) = +0); a path that lets a padded weight be -0 (0 times a
        // negative scale) or skips the padded FMA keeps -0 and flips the sign of the result.
        let x_tiny = f32::from_bits(1);
        for fsel in 0..FORMATS {
            let format = format_of(fsel);
            for cols in [1usize, 9, 17, 33, 47] {
                let rows = 5;
                let nb = rows * format.row_bytes(cols);
                let data: Vec<u8> = match format {
                    WeightFormat::F32 => {
                        (0..nb / 4).flat_map(|_| (-0.25f32).to_le_bytes()).collect()
                    }
                    WeightFormat::Bf16 => (0..nb / 2)
                        .flat_map(|_| half::bf16::from_f32(-0.25).to_le_bytes())
                        .collect(),
                    WeightFormat::F16 => (0..nb / 2)
                        .flat_map(|_| half::f16::from_f32(-0.25).to_le_bytes())
                        .collect(),
                    WeightFormat::Int8Row => vec![5u8; nb],
                    _ => vec![0x99u8; nb], // int4 code +1 in both nibbles
                };
                let scales = vec![-0.1f32; rows * format.row_scales(cols)];
                let w = MatRef::new(format, rows, cols, &data, &scales).unwrap();
                let x = vec![x_tiny; 2 * cols];
                let want = reference(&w, &x, 2);
                for isa in Isa::available() {
                    let mut y = vec![9.0; 2 * rows];
                    matmul_with(isa, &w, &x, 2, &mut y).unwrap();
                    for (a, b) in y.iter().zip(&want) {
                        assert_eq!(
                            a.to_bits(),
                            b.to_bits(),
                            "{isa:?} {} cols={cols}",
                            format.name()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn inconsistent_views_are_rejected_not_read() {
        let data = vec![0u8; 8];
        let mut w = MatRef::new(WeightFormat::F32, 2, 1, &data, &[]).unwrap();
        w.rows = 3; // built by hand: fields are public
        let mut y = vec![0.0; 3];
        assert!(matches!(
            matmul(&w, &[1.0], 1, &mut y),
            Err(Error::Size { .. })
        ));
        w.rows = 2;
        w.format = WeightFormat::Int4Group { group: 0 };
        assert!(matmul(&w, &[1.0], 1, &mut y[..2]).is_err());
        let w = MatRef::new(WeightFormat::F32, 2, 1, &data, &[]).unwrap();
        assert!(matmul_rows(&w, 1..3, &[1.0], &mut y[..2]).is_err());
    }

    #[test]
    fn shape_errors_are_reported() {
        let data = vec![0u8; 8];
        let w = MatRef::new(WeightFormat::F32, 2, 1, &data, &[]).unwrap();
        let mut y = vec![0.0; 2];
        assert!(matmul(&w, &[1.0, 2.0], 1, &mut y).is_err());
        assert!(MatRef::new(WeightFormat::F32, 3, 1, &data, &[]).is_err());
        assert!(MatRef::new(WeightFormat::Int8Row, 2, 4, &data, &[1.0]).is_err());
    }

    #[test]
    fn thread_count_does_not_change_bits() {
        for format in [WeightFormat::Bf16, WeightFormat::Int4Group { group: 64 }] {
            // Wide enough that the 64 KiB tasks split the rows several ways.
            let (rows, cols) = (700, 2049);
            let (data, scales) = random_matrix(format, rows, cols, 9);
            let w = MatRef::new(format, rows, cols, &data, &scales).unwrap();
            let x = activations(3, cols, 1);
            let run = |threads: usize| {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let mut y = vec![0.0; 3 * rows];
                pool.install(|| matmul(&w, &x, 3, &mut y).unwrap());
                y
            };
            let one = run(1);
            assert_eq!(one, run(3));
            assert_eq!(one, reference(&w, &x, 3));
        }
    }
}
