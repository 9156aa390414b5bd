//! GPU kernels against the CPU kernels (nectar-kernels), by tolerance, on random inputs.
//!
//! Without a GPU every test prints why and passes, unless `NECTAR_REQUIRE_GPU=1` is set
//! (`common`).
#![cfg(feature = "cuda")]
mod common;
use common::{compare, gpu, random_bytes, weights, FORMATS};
use nectar_cuda::{Error, Gpu, GpuMat, Order, MAX_M};
use nectar_kernels::{MatRef, WeightFormat};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

fn activations(n: usize, seed: u64) -> Vec<f32> {
    random_bytes(n * 2, seed)
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]) as f32 / 32768.0 - 1.0)
        .collect()
}

/// GPU vs CPU for one (format, shape, m, order); returns the GPU output.
fn check(
    gpu: &Gpu,
    format: WeightFormat,
    rows: usize,
    cols: usize,
    m: usize,
    order: Order,
    seed: u64,
) -> Vec<f32> {
    let x = activations(m * cols, seed ^ 0xacc);
    let what = format!("{order:?}");
    compare(gpu, format, rows, cols, m, &x, seed, &what, |dev, y| {
        gpu.matmul(dev, &x, m, y, order).unwrap()
    })
    .0
}

#[test]
fn every_format_and_m_matches_the_cpu_on_the_vector_path() {
    let Some(gpu) = gpu() else { return };
    for (fi, f) in FORMATS.into_iter().enumerate() {
        for m in 1..=MAX_M {
            for order in [Order::Exact, Order::Word, Order::Tensor] {
                // 96 rows: not a multiple of the rows a block covers; 768 columns: whole chunks.
                check(gpu, f, 96, 768, m, order, (fi * 100 + m) as u64);
            }
        }
    }
}

#[test]
fn odd_widths_and_groups_take_the_scalar_path_and_still_match() {
    let Some(gpu) = gpu() else { return };
    let odd = [
        (WeightFormat::Int4Row, 37, 101),
        (WeightFormat::Int4Group { group: 16 }, 5, 200),
        (WeightFormat::Int4Group { group: 5 }, 9, 63),
        (WeightFormat::Int8Row, 33, 70),
        (WeightFormat::Bf16, 3, 7),
        (WeightFormat::F32, 1, 1),
    ];
    for (i, (f, rows, cols)) in odd.into_iter().enumerate() {
        for m in [1, 3, 8, 11] {
            check(gpu, f, rows, cols, m, Order::Exact, 7 + i as u64);
            check(gpu, f, rows, cols, m, Order::Word, 9 + i as u64);
            check(gpu, f, rows, cols, m, Order::Tensor, 11 + i as u64);
        }
    }
}

#[test]
fn glm_expert_and_attention_shapes_match() {
    let Some(gpu) = gpu() else { return };
    let g64 = WeightFormat::Int4Group { group: 64 };
    for (f, rows, cols) in [
        (g64, 2048, 6144),
        (g64, 6144, 2048),
        (WeightFormat::Int8Row, 2048, 6144),
        (WeightFormat::Bf16, 576, 6144),
        (g64, 28672, 512),
    ] {
        for m in [1, 8] {
            check(gpu, f, rows, cols, m, Order::Exact, rows as u64);
            check(gpu, f, rows, cols, m, Order::Word, cols as u64);
            check(gpu, f, rows, cols, m, Order::Tensor, (rows + cols) as u64);
        }
    }
}

#[test]
fn a_rows_result_does_not_depend_on_m_or_the_batch() {
    let Some(gpu) = gpu() else { return };
    let mut runner = TestRunner::new(Config {
        cases: 24,
        ..Config::default()
    });
    let f_idx = 0..FORMATS.len();
    runner
        .run(
            &(f_idx, 1usize..70, 1usize..9, 1usize..4, any::<u64>()),
            |(fi, rows, cw, m, seed)| {
                let f = FORMATS[fi];
                let cols = cw * 64;
                let (data, scales) = weights(f, rows, cols, seed);
                let w = MatRef::new(f, rows, cols, &data, &scales).unwrap();
                let dev = gpu.upload(&w).unwrap();
                let x = activations(MAX_M * cols, seed ^ 1);
                for order in [Order::Exact, Order::Word, Order::Tensor] {
                    let mut all = vec![0.0; MAX_M * rows];
                    gpu.matmul(&dev, &x, MAX_M, &mut all, order).unwrap();
                    for i in 0..MAX_M {
                        let mut one = vec![0.0; rows];
                        gpu.matmul(&dev, &x[i * cols..(i + 1) * cols], 1, &mut one, order)
                            .unwrap();
                        prop_assert_eq!(
                            one.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            all[i * rows..(i + 1) * rows]
                                .iter()
                                .map(|v| v.to_bits())
                                .collect::<Vec<_>>()
                        );
                    }
                    // The same matrix three times in one launch, with different activations.
                    let xs: Vec<Vec<f32>> = (0..3)
                        .map(|j| activations(m * cols, seed ^ (j + 7)))
                        .collect();
                    let items: Vec<_> = xs.iter().map(|x| (&dev, x.as_slice())).collect();
                    let batch = gpu.matmul_batch(&items, m, order).unwrap();
                    for (x, got) in xs.iter().zip(&batch) {
                        let mut one = vec![0.0; m * rows];
                        gpu.matmul(&dev, x, m, &mut one, order).unwrap();
                        prop_assert_eq!(
                            one.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                        );
                    }
                }
                Ok(())
            },
        )
        .unwrap();
}

/// Integer launches of few rows take kernels with more words per row in flight (`_u4`), and the
/// tensor-core GEMV one row tile per warp instead of four; which one runs must not change a
/// single bit: 96 rows alone (the few-rows kernels) and the same matrix 300 times in one launch
/// (28,800 rows: the others) give identical results.
#[test]
fn few_rows_and_many_rows_launches_agree_bit_for_bit() {
    let Some(gpu) = gpu() else { return };
    let (rows, cols) = (96, 768);
    for (fi, f) in FORMATS.into_iter().enumerate().skip(1) {
        let (data, scales) = weights(f, rows, cols, 40 + fi as u64);
        let w = MatRef::new(f, rows, cols, &data, &scales).unwrap();
        let dev = gpu.upload(&w).unwrap();
        for m in [1, 3, 8] {
            let x = activations(m * cols, 50 + m as u64);
            for order in [Order::Exact, Order::Word, Order::Tensor] {
                let mut one = vec![0.0; m * rows];
                gpu.matmul(&dev, &x, m, &mut one, order).unwrap();
                let items: Vec<_> = (0..300).map(|_| (&dev, x.as_slice())).collect();
                for got in gpu.matmul_batch(&items, m, order).unwrap() {
                    assert_eq!(
                        one.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{f:?} m={m} {order:?}"
                    );
                }
            }
        }
    }
}

/// The tensor-core GEMV on shapes that end inside a 64-column step or a 16-row tile, and on
/// layouts it does not take (which fall back to the exact kernels): still the CPU's results.
#[test]
fn tensor_core_gemv_matches_with_partial_steps_and_tiles() {
    let Some(gpu) = gpu() else { return };
    let g64 = WeightFormat::Int4Group { group: 64 };
    let g128 = WeightFormat::Int4Group { group: 128 };
    let shapes = [
        (WeightFormat::Int8Row, 40, 80, true),
        (WeightFormat::Bf16, 24, 48, true),
        (WeightFormat::Int4Row, 20, 96, true),
        (g64, 17, 192, true),
        (g128, 33, 384, true),
        (WeightFormat::Int4Row, 3, 32, true),
        // Not taken: groups that split a step, widths of no whole 16 columns, f32 / f16.
        (WeightFormat::Int4Group { group: 32 }, 9, 128, false),
        (WeightFormat::Int8Row, 5, 24, false),
        (WeightFormat::F16, 16, 64, false),
    ];
    for (i, (f, rows, cols, tensor)) in shapes.into_iter().enumerate() {
        assert_eq!(
            gpu.gemv_plan(f, rows, cols, 1, Order::Tensor)
                .unwrap()
                .tensor(),
            tensor,
            "{f:?} {rows}x{cols}"
        );
        for m in 1..=MAX_M {
            check(
                gpu,
                f,
                rows,
                cols,
                m,
                Order::Tensor,
                300 + (i * 10 + m) as u64,
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
    let mut y = vec![0.0; 4];
    assert!(gpu
        .matmul(&dev, &[0.0; 31], 1, &mut y, Order::Exact)
        .is_err());
    let bad = MatRef {
        scales: &scales[..3],
        ..w
    };
    assert!(gpu.upload(&bad).is_err());
    assert!(gpu
        .gemv_plan(WeightFormat::Int8Row, 4, 32, 9, Order::Exact)
        .is_err());
}

#[test]
fn opening_never_panics() {
    // On a machine without a GPU this is the CPU fallback's contract: an error that says why.
    match Gpu::open(0) {
        Ok(g) => assert!(!g.info().name.is_empty()),
        Err(Error::Unavailable(why)) => assert!(!why.is_empty()),
        Err(e) => panic!("a missing GPU must be Unavailable, got {e}"),
    }
    assert!(matches!(Gpu::open(1 << 20), Err(Error::Unavailable(_))));
}

/// A product of one uploaded matrix into its output.
type Product<'a> = dyn Fn(&GpuMat, &mut [f32]) + 'a;

/// int4 in the packed layout (`Gpu::upload`, `gemv_q.cu`) and as stored (`Gpu::upload_stored`,
/// what a copied expert is) give the same bits through the int4 GEMV and the GEMM, and within
/// tolerance of the CPU; activations of wide range (a step's largest |x| sets its digits'
/// exponent, so small values beside outliers and all-zero steps are exercised).
#[test]
fn packed_and_stored_int4_give_identical_bits() {
    let Some(gpu) = gpu() else { return };
    let g = |group| WeightFormat::Int4Group { group };
    for (k, &(format, rows, cols)) in [
        (g(64), 48, 6144),
        (g(128), 16, 256),
        (WeightFormat::Int4Row, 80, 192),
        (g(64), 2048, 512),
    ]
    .iter()
    .enumerate()
    {
        assert!(nectar_cuda::packs(format, rows, cols));
        let seed = 40 + k as u64;
        let (data, scales) = weights(format, rows, cols, seed);
        let w = MatRef::new(format, rows, cols, &data, &scales).unwrap();
        let stored = gpu.upload_stored(&w).unwrap();
        assert!(gpu.upload(&w).unwrap().packed() && !stored.packed());
        for m in (1..=MAX_M).chain([9, 33]) {
            let mut x = activations(m * cols, 77 + m as u64);
            for (i, v) in x.iter_mut().enumerate() {
                match i % 211 {
                    0 => *v *= 1e3,
                    1..=5 => *v *= 1e-6,
                    _ => {}
                }
            }
            // One all-zero 64-column step per token.
            for t in 0..m {
                x[t * cols + 64..t * cols + 128].fill(0.0);
            }
            let what = format!("{} {rows}x{cols} m={m}", format.name());
            let split3 = nectar_cuda::Precision::Split3;
            let gemv = |d: &GpuMat, y: &mut [f32]| gpu.matmul(d, &x, m, y, Order::MODEL).unwrap();
            let gemm = |d: &GpuMat, y: &mut [f32]| gpu.gemm(d, &x, m, y, split3).unwrap();
            let products: [(&str, &Product); 2] = [("gemv", &gemv), ("gemm", &gemm)];
            for (kernel, product) in products {
                let (y_p, _) = compare(gpu, format, rows, cols, m, &x, seed, kernel, |d, y| {
                    assert!(d.packed());
                    product(d, y)
                });
                let mut y_s = vec![f32::NAN; m * rows];
                product(&stored, &mut y_s);
                assert!(
                    y_p.iter()
                        .zip(&y_s)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{kernel} packed != stored: {what}"
                );
            }
        }
    }
}

/// A NaN or infinite activation gives its token NaN outputs through the int4 GEMV (the CPU's
/// sums are not finite either), and leaves the launch's other token alone.
#[test]
fn a_non_finite_activation_poisons_only_its_own_token() {
    let Some(gpu) = gpu() else { return };
    let (format, rows, cols) = (WeightFormat::Int4Group { group: 64 }, 32, 256);
    let (data, scales) = weights(format, rows, cols, 5);
    let w = MatRef::new(format, rows, cols, &data, &scales).unwrap();
    let dev = gpu.upload(&w).unwrap();
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut x = activations(2 * cols, 6);
        let clean = x.clone();
        x[cols + 100] = bad;
        let mut y = vec![0.0; 2 * rows];
        gpu.matmul(&dev, &x, 2, &mut y, Order::MODEL).unwrap();
        assert!(y[rows..].iter().all(|v| v.is_nan()), "{bad}: token 1");
        let mut want = vec![0.0; 2 * rows];
        gpu.matmul(&dev, &clean, 2, &mut want, Order::MODEL)
            .unwrap();
        assert_eq!(y[..rows], want[..rows], "{bad}: token 0");
    }
}

/// Projections of one hidden state in one round trip (`matmul_each`: q_a and kv_a) give each
/// product the bits it gets alone, whatever the shapes and formats beside it.
#[test]
fn products_sharing_an_input_give_their_own_bits_in_one_round_trip() {
    let Some(gpu) = gpu() else { return };
    let g64 = WeightFormat::Int4Group { group: 64 };
    let cols = 512;
    let shapes = [
        (g64, 256),
        (WeightFormat::Bf16, 80),
        (WeightFormat::Int8Row, 48),
        (g64, 2048),
        (WeightFormat::Int4Row, 40),
    ];
    let mats: Vec<GpuMat> = shapes
        .iter()
        .enumerate()
        .map(|(k, &(f, rows))| {
            let (data, scales) = weights(f, rows, cols, 90 + k as u64);
            gpu.upload(&MatRef::new(f, rows, cols, &data, &scales).unwrap())
                .unwrap()
        })
        .collect();
    let refs: Vec<&GpuMat> = mats.iter().collect();
    for m in [1, 2, 3, 8, 9] {
        let x = activations(m * cols, 300 + m as u64);
        let together = gpu.matmul_each(&refs, &x, m, Order::MODEL).unwrap();
        for ((w, y), &(f, rows)) in mats.iter().zip(&together).zip(&shapes) {
            let mut alone = vec![0.0; m * rows];
            gpu.matmul(w, &x, m, &mut alone, Order::MODEL).unwrap();
            assert!(y.iter().all(|v| v.is_finite()), "{} m={m}", f.name());
            assert_eq!(*y, alone, "{} {rows}x{cols} m={m}", f.name());
        }
    }
    // A matrix of other width than x: an error naming the shapes, as a lone product's is.
    let (data, scales) = weights(g64, 16, 256, 7);
    let narrow = gpu
        .upload(&MatRef::new(g64, 16, 256, &data, &scales).unwrap())
        .unwrap();
    let x = activations(cols, 1);
    assert!(gpu
        .matmul_each(&[&mats[0], &narrow], &x, 1, Order::MODEL)
        .is_err());
}
