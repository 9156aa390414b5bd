//! The tensor-core GEMM (prefill, batched verify) against the CPU kernels, on random inputs.
//! With activations in three bf16 parts (what the model uses) the bound is the GEMV kernels'
//! own, `nectar_cuda::within_tolerance` (64 ε of Σ|w·x|); with two parts
//! `within_gemm_tolerance` (2⁻¹⁴), with one bf16 2⁻⁸. Covered: every stored format, shapes that leave partial tiles, odd widths and groups
//! (element-wise loads, dequantised int4 groups), GLM shapes, and a token's result independent
//! of M and of the batch.
//!
//! Without a GPU every test prints why and passes, unless `NECTAR_REQUIRE_GPU=1` is set.
#![cfg(feature = "cuda")]
mod common;
use common::{abs_sums, compare, gpu, random_bytes, unit, weights, FORMATS};
use nectar_cuda::{within_gemm_tolerance, within_tolerance, Gpu, Precision};
use nectar_kernels::{matmul, MatRef, WeightFormat};

/// Activations with a spread of magnitudes (as hidden states have), in ±[2⁻⁸, 8).
fn activations(n: usize, seed: u64) -> Vec<f32> {
    random_bytes(n * 3, seed)
        .chunks_exact(3)
        .map(|c| unit(c) * (1u32 << (c[2] % 12)) as f32 / 256.0)
        .collect()
}

/// GPU GEMM vs the CPU for one (format, shape, m); returns the largest |Δ| / Σ|w·x|.
fn check(gpu: &Gpu, format: WeightFormat, rows: usize, cols: usize, m: usize, seed: u64) -> f64 {
    let x = activations(m * cols, seed ^ 0xacc);
    compare(gpu, format, rows, cols, m, &x, seed, "gemm", |dev, y| {
        gpu.gemm(dev, &x, m, y, Precision::Split3).unwrap()
    })
    .1
}

#[test]
fn every_format_matches_the_cpu_with_partial_tiles() {
    let Some(gpu) = gpu() else { return };
    for (fi, f) in FORMATS.into_iter().enumerate() {
        let mut worst = 0.0f64;
        // 200 rows: one full 128-row tile and a partial one; m across 1, 2 tiles and a tail.
        for m in [1, 9, 24, 64, 65, 130] {
            worst = worst.max(check(gpu, f, 200, 768, m, (fi * 100 + m) as u64));
        }
        eprintln!("{}: max |Δ| / Σ|w·x| = {worst:.2e}", f.name());
    }
}

#[test]
fn odd_widths_and_groups_match() {
    let Some(gpu) = gpu() else { return };
    let odd = [
        (WeightFormat::Int4Row, 37, 101),
        (WeightFormat::Int4Group { group: 16 }, 5, 200),
        (WeightFormat::Int4Group { group: 5 }, 9, 63),
        (WeightFormat::Int4Group { group: 40 }, 130, 200),
        (WeightFormat::Int8Row, 33, 70),
        (WeightFormat::Bf16, 3, 7),
        (WeightFormat::F16, 17, 45),
        (WeightFormat::F32, 1, 1),
    ];
    for (i, (f, rows, cols)) in odd.into_iter().enumerate() {
        for m in [1, 9, 70] {
            check(gpu, f, rows, cols, m, 7 + i as u64);
        }
    }
}

#[test]
fn glm_expert_and_attention_shapes_match() {
    let Some(gpu) = gpu() else { return };
    let g64 = WeightFormat::Int4Group { group: 64 };
    for (f, rows, cols, m) in [
        (g64, 2048, 6144, 64),
        (g64, 6144, 2048, 16),
        (WeightFormat::Int8Row, 2048, 6144, 33),
        (WeightFormat::Bf16, 576, 6144, 24),
        (g64, 28672, 512, 9),
    ] {
        let worst = check(gpu, f, rows, cols, m, rows as u64);
        eprintln!(
            "{} {rows}x{cols} m={m}: max |Δ| / Σ|w·x| = {worst:.2e}",
            f.name()
        );
    }
}

#[test]
fn a_tokens_result_does_not_depend_on_m_or_the_batch() {
    let Some(gpu) = gpu() else { return };
    for (fi, f) in FORMATS.into_iter().enumerate() {
        let (rows, cols) = (150, 320);
        let (data, scales) = weights(f, rows, cols, fi as u64);
        let w = MatRef::new(f, rows, cols, &data, &scales).unwrap();
        let dev = gpu.upload(&w).unwrap();
        let big = 100;
        let x = activations(big * cols, 3 + fi as u64);
        let mut all = vec![0.0; big * rows];
        gpu.gemm(&dev, &x, big, &mut all, Precision::Split3)
            .unwrap();
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        // The first 9 tokens alone, and token 70 alone (another tile of the big launch).
        let mut head = vec![0.0; 9 * rows];
        gpu.gemm(&dev, &x[..9 * cols], 9, &mut head, Precision::Split3)
            .unwrap();
        assert_eq!(bits(&head), bits(&all[..9 * rows]), "{}", f.name());
        let mut one = vec![0.0; rows];
        gpu.gemm(
            &dev,
            &x[70 * cols..71 * cols],
            1,
            &mut one,
            Precision::Split3,
        )
        .unwrap();
        assert_eq!(bits(&one), bits(&all[70 * rows..71 * rows]), "{}", f.name());
        // Three jobs of one launch against each alone.
        let xs: Vec<Vec<f32>> = (0..3)
            .map(|j| activations(12 * cols, 40 + j as u64))
            .collect();
        let items: Vec<_> = xs.iter().map(|x| (&dev, x.as_slice())).collect();
        let batch = gpu.gemm_batch(&items, 12, Precision::Split3).unwrap();
        for (x, got) in xs.iter().zip(&batch) {
            let mut alone = vec![0.0; 12 * rows];
            gpu.gemm(&dev, x, 12, &mut alone, Precision::Split3)
                .unwrap();
            assert_eq!(bits(&alone), bits(got), "{}", f.name());
        }
    }
}

/// Coarser activations, measured (not used by the model): two bf16 parts stay within
/// `within_gemm_tolerance` (2⁻¹⁴ of Σ|w·x|), one bf16 within 2⁻⁸ (its rounding); the largest
/// error and how many outputs miss the GEMV bound are printed.
#[test]
fn coarser_activations_stay_within_their_bounds() {
    let Some(gpu) = gpu() else { return };
    for f in [
        WeightFormat::Bf16,
        WeightFormat::Int8Row,
        WeightFormat::Int4Group { group: 64 },
    ] {
        let (rows, cols, m) = (256, 1024, 32);
        let (data, scales) = weights(f, rows, cols, 11);
        let w = MatRef::new(f, rows, cols, &data, &scales).unwrap();
        let x = activations(m * cols, 12);
        let mut cpu = vec![0.0; m * rows];
        matmul(&w, &x, m, &mut cpu).unwrap();
        let dev = gpu.upload(&w).unwrap();
        let abs = abs_sums(&w, &x, m);
        for precision in [Precision::Split2, Precision::Single] {
            let mut y = vec![f32::NAN; m * rows];
            gpu.gemm(&dev, &x, m, &mut y, precision).unwrap();
            let mut worst = 0.0f64;
            let mut outside = 0;
            for ((&g, &c), &a) in y.iter().zip(&cpu).zip(&abs) {
                let rel = ((g - c).abs() / a) as f64;
                match precision {
                    Precision::Split2 => {
                        assert!(within_gemm_tolerance(g, c, a), "{}: {rel:e}", f.name())
                    }
                    _ => assert!(rel <= 1.0 / 256.0 + 1e-5, "{}: {rel:e}", f.name()),
                }
                worst = worst.max(rel);
                outside += usize::from(!within_tolerance(g, c, a));
            }
            eprintln!(
                "{} activations {}: max |Δ| / Σ|w·x| = {worst:.2e}, {outside} of {} outside the GEMV bound",
                f.name(),
                precision.name(),
                y.len()
            );
        }
    }
}

#[test]
fn bad_shapes_are_errors_not_faults() {
    let Some(gpu) = gpu() else { return };
    let (data, scales) = weights(WeightFormat::Int8Row, 4, 32, 1);
    let w = MatRef::new(WeightFormat::Int8Row, 4, 32, &data, &scales).unwrap();
    let dev = gpu.upload(&w).unwrap();
    let mut y = vec![0.0; 4 * 10];
    assert!(gpu
        .gemm(&dev, &[0.0; 31 * 10], 10, &mut y, Precision::Split3)
        .is_err());
    assert!(gpu
        .gemm_plan(WeightFormat::Int8Row, 4, 32, 0, Precision::Split3)
        .is_err());
}
