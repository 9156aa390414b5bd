//! y = W·x for M activation rows, parallel over output rows.
//!
//! Each output element is `dot(decode_row(W, r), x_i)` in the canonical order, so it does not
//! depend on M, on how rows are split across threads, or on which other rows share the batch.
use crate::decode::decode_row;
use crate::dot::dot;
use crate::error::{Error, Result};
use crate::format::MatRef;
use rayon::prelude::*;
use std::cell::RefCell;

thread_local! {
    static ROW: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Weight bytes each parallel task covers at least (keeps scheduling overhead small for the
/// narrow matrices of small models without starving wide ones of parallelism).
const TASK_BYTES: usize = 64 * 1024;

/// Computes `y[i] = W · x[i]` for `m` activation rows.
///
/// `x` is `m × w.cols` and `y` is `m × w.rows`, both row-major.
pub fn matmul(w: &MatRef<'_>, x: &[f32], m: usize, y: &mut [f32]) -> Result<()> {
    if x.len() != m * w.cols || y.len() != m * w.rows {
        return Err(Error::Shape(format!(
            "matmul: W is {}x{}, x has {} (want {}), y has {} (want {})",
            w.rows,
            w.cols,
            x.len(),
            m * w.cols,
            y.len(),
            m * w.rows
        )));
    }
    if w.rows == 0 || m == 0 {
        return Ok(());
    }
    let row_bytes = w.format.row_bytes(w.cols).max(1);
    let per_task = (TASK_BYTES / row_bytes).max(1);
    if m == 1 {
        y.par_chunks_mut(per_task).enumerate().for_each(|(t, out)| {
            with_row(w.cols, |buf| {
                for (k, o) in out.iter_mut().enumerate() {
                    decode_row(w, t * per_task + k, buf);
                    *o = dot(buf, x);
                }
            })
        });
        return Ok(());
    }
    // Transposed staging (rows × m) keeps each task's writes contiguous.
    let mut yt = vec![0.0f32; w.rows * m];
    yt.par_chunks_mut(per_task * m)
        .enumerate()
        .for_each(|(t, out)| {
            with_row(w.cols, |buf| {
                for (k, orow) in out.chunks_exact_mut(m).enumerate() {
                    decode_row(w, t * per_task + k, buf);
                    for (i, o) in orow.iter_mut().enumerate() {
                        *o = dot(buf, &x[i * w.cols..(i + 1) * w.cols]);
                    }
                }
            })
        });
    for (r, col) in yt.chunks_exact(m).enumerate() {
        for (i, v) in col.iter().enumerate() {
            y[i * w.rows + r] = *v;
        }
    }
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
    if x.len() != w.cols || y.len() != rows.len() || rows.end > w.rows {
        return Err(Error::Shape(format!(
            "matmul_rows: W is {}x{}, rows {:?}, x {}, y {}",
            w.rows,
            w.cols,
            rows,
            x.len(),
            y.len()
        )));
    }
    let per_task = (TASK_BYTES / w.format.row_bytes(w.cols).max(1)).max(1);
    y.par_chunks_mut(per_task).enumerate().for_each(|(t, out)| {
        with_row(w.cols, |buf| {
            for (k, o) in out.iter_mut().enumerate() {
                decode_row(w, rows.start + t * per_task + k, buf);
                *o = dot(buf, x);
            }
        })
    });
    Ok(())
}

fn with_row<R>(cols: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    ROW.with(|cell| {
        let mut v = cell.borrow_mut();
        if v.len() < cols {
            v.resize(cols, 0.0);
        }
        f(&mut v[..cols])
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dot::dot_scalar;
    use crate::format::WeightFormat;
    use proptest::prelude::*;

    fn reference(w: &MatRef<'_>, x: &[f32], m: usize) -> Vec<f32> {
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

    fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
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

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn every_format_matches_reference_and_is_m_independent(
            rows in 1usize..40, cols in 1usize..150, m in 1usize..6, fsel in 0usize..6, seed in any::<u64>()
        ) {
            let format = [WeightFormat::F32, WeightFormat::Bf16, WeightFormat::F16, WeightFormat::Int8Row,
                          WeightFormat::Int4Row, WeightFormat::Int4Group { group: 32 }][fsel];
            let nb = rows * format.row_bytes(cols);
            let data = match format {
                WeightFormat::F32 => finite_f32_bytes(nb, seed),
                WeightFormat::Bf16 => bf16_bytes(nb, seed),
                WeightFormat::F16 => random_bytes(nb / 2, seed).iter()
                    .flat_map(|b| half::f16::from_f32(*b as f32 / 50.0 - 2.0).to_le_bytes()).collect(),
                _ => random_bytes(nb, seed),
            };
            let scales: Vec<f32> = (0..rows * format.row_scales(cols)).map(|i| 0.01 + i as f32 * 1e-3).collect();
            let w = MatRef::new(format, rows, cols, &data, &scales).unwrap();
            let x: Vec<f32> = (0..m * cols).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 250.0).collect();
            let mut y = vec![0.0; m * rows];
            matmul(&w, &x, m, &mut y).unwrap();
            let want = reference(&w, &x, m);
            for (a, b) in y.iter().zip(&want) {
                prop_assert_eq!(a.to_bits(), b.to_bits());
            }
            // Row i of a batch equals the same row computed alone.
            for i in 0..m {
                let mut y1 = vec![0.0; rows];
                matmul(&w, &x[i * cols..(i + 1) * cols], 1, &mut y1).unwrap();
                prop_assert_eq!(&y1[..], &y[i * rows..(i + 1) * rows]);
            }
        }
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
        let (rows, cols) = (300, 257);
        let data = bf16_bytes(rows * cols * 2, 9);
        let w = MatRef::new(WeightFormat::Bf16, rows, cols, &data, &[]).unwrap();
        let x: Vec<f32> = (0..cols).map(|i| (i as f32).sin()).collect();
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut y = vec![0.0; rows];
            pool.install(|| matmul(&w, &x, 1, &mut y).unwrap());
            y
        };
        assert_eq!(run(1), run(3));
    }
}
