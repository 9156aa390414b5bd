//! The DSA indexer's scores on the GPU (`Gpu::index_scores`) against the CPU's
//! (`nectar_kernels::index_score`, what the model's indexer computes): the same bits for every
//! visible (row, key) pair — so a top-k taken from them is the CPU's selection — and zeros
//! beyond each row's position. GLM-5.2's geometry (32 heads × 128), the fixtures' (4 × 32), a
//! ragged dimension (20: the canonical dot's zero-padded tail), partial tiles of rows and keys,
//! subnormal inputs (a flush-to-zero build would differ) and NaN head weights.
//!
//! Without a GPU the test prints why and passes, unless `NECTAR_REQUIRE_GPU=1`.
#![cfg(feature = "cuda")]
mod common;
use common::{gpu, values};
use nectar_kernels::index_score;

/// One case: `keys` keys, the last `m` of them the rows; returns the pairs compared.
fn check(heads: usize, dim: usize, keys: usize, m: usize, seed: u64) -> usize {
    let g = gpu().unwrap();
    let mut q = values(m * heads * dim, seed);
    let mut w = values(m * heads, seed ^ 1);
    let mut k = values(keys * dim, seed ^ 2);
    // Subnormal products and sums in one row, a NaN head weight in another.
    for x in q.iter_mut().take(dim) {
        *x *= 1e-38;
    }
    k[..dim].iter_mut().for_each(|x| *x *= 1e-3);
    if m > 2 {
        w[heads + 1] = f32::NAN;
    }
    let qk_scale = (dim as f32).powf(-0.5);
    let pos: Vec<u32> = (keys - m..keys).map(|p| p as u32).collect();
    let got = g
        .index_scores(&k, dim, heads, &q, &w, &pos, qk_scale)
        .unwrap();
    assert_eq!(got.len(), m * keys);
    let mut n = 0;
    for (i, &p) in pos.iter().enumerate() {
        let (qi, wi) = (
            &q[i * heads * dim..][..heads * dim],
            &w[i * heads..][..heads],
        );
        for t in 0..keys {
            let gv = got[i * keys + t];
            if t > p as usize {
                assert_eq!(gv.to_bits(), 0, "row {i} key {t} beyond its position");
                continue;
            }
            let cv = index_score(qi, wi, &k[t * dim..][..dim], qk_scale);
            assert!(
                gv.to_bits() == cv.to_bits() || (gv.is_nan() && cv.is_nan()),
                "{heads}×{dim} keys {keys} m {m}: row {i} key {t}: GPU {gv:e} ({:#x}) vs CPU \
                 {cv:e} ({:#x})",
                gv.to_bits(),
                cv.to_bits()
            );
            n += 1;
        }
    }
    n
}

#[test]
fn indexer_scores_are_the_cpus_bits() {
    if gpu().is_none() {
        return;
    }
    let mut n = 0;
    // (heads, dim, keys, rows): GLM-5.2 continuing a cache, a whole prompt, the fixtures'
    // geometry, a ragged dim, one row; then the few-row kernel (≤ 4 rows: decode, MTP, verify)
    // at GLM-5.2's geometry after a long prompt, with more heads than one pass of 32 takes,
    // and a ragged dim.
    for (heads, dim, keys, m) in [
        (32, 128, 300, 37),
        (32, 128, 64, 64),
        (4, 32, 1000, 33),
        (3, 20, 45, 17),
        (4, 32, 5, 1),
        (32, 128, 8191, 1),
        (32, 128, 3001, 4),
        (40, 64, 203, 3),
        (3, 20, 45, 2),
    ] {
        n += check(heads, dim, keys, m, (keys * 131 + m) as u64);
    }
    eprintln!("DSA indexer scores: {n} (row, key) pairs, every one the CPU's bits");
}

#[test]
fn bad_shapes_are_errors_not_launches() {
    let Some(g) = gpu() else {
        return;
    };
    let k = [0.0f32; 12];
    // dim 0 or beyond the kernel's limit.
    assert!(g.index_scores(&k, 0, 1, &[], &[], &[], 1.0).is_err());
    assert!(g
        .index_scores(&[0.0; 257], 257, 1, &[0.0; 257], &[0.0], &[0], 1.0)
        .is_err());
    // A row at a position beyond the keys (3 keys of 4).
    assert!(g
        .index_scores(&k, 4, 1, &[0.0; 4], &[0.0], &[3], 1.0)
        .is_err());
    // Queries or weights of the wrong length.
    assert!(g
        .index_scores(&k, 4, 2, &[0.0; 4], &[0.0; 2], &[0], 1.0)
        .is_err());
    assert!(g
        .index_scores(&k, 4, 1, &[0.0; 4], &[0.0; 2], &[0], 1.0)
        .is_err());
    assert_eq!(
        g.index_scores(&k, 4, 1, &[1.0; 4], &[1.0], &[2], 1.0)
            .unwrap()
            .len(),
        3
    );
}
