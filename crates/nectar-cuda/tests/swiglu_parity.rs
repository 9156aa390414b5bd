//! Whole SwiGLU MLPs on the GPU (`Gpu::swiglu_batch`, activations kept in VRAM) against the same
//! products run one by one on the GPU with the combine on the CPU (the model's former path):
//! every output within the GEMV tolerance (the combine's `expf` may differ from the CPU's by an
//! ulp or two), for each weight format the model stores, row counts that take the GEMV (1, 5)
//! and the tensor-core GEMM (64); MLPs batched together give the bits each gives alone; bad
//! shapes are errors, not launches.
//!
//! Without a GPU the test prints why and passes, unless `NECTAR_REQUIRE_GPU=1`.
#![cfg(feature = "cuda")]
mod common;
use common::{gpu, values, weights};
use nectar_cuda::{use_gemm, within_tolerance, Gpu, GpuMat, Order, Precision};
use nectar_kernels::{swiglu_in_place, MatRef, WeightFormat};

const HIDDEN: usize = 256;
const INTER: usize = 128;

fn upload(g: &Gpu, f: WeightFormat, rows: usize, cols: usize, seed: u64) -> GpuMat {
    let (d, s) = weights(f, rows, cols, seed);
    g.upload(&MatRef::new(f, rows, cols, &d, &s).unwrap())
        .unwrap()
}

/// One product as the model ran it before: the model's kernel for the shape, downloaded.
fn product(g: &Gpu, w: &GpuMat, x: &[f32], m: usize) -> Vec<f32> {
    let mut y = vec![0.0; m * w.rows];
    match use_gemm(w.format, w.rows, w.cols, m) {
        true => g.gemm(w, x, m, &mut y, Precision::Split3),
        false => g.matmul(w, x, m, &mut y, Order::MODEL),
    }
    .unwrap();
    y
}

#[test]
fn chained_mlps_match_the_products_one_by_one() {
    let Some(g) = gpu() else {
        return;
    };
    assert!(use_gemm(
        WeightFormat::Int4Group { group: 64 },
        INTER,
        HIDDEN,
        64
    ));
    for f in [
        WeightFormat::Int4Group { group: 64 },
        WeightFormat::Int4Row,
        WeightFormat::Int8Row,
        WeightFormat::Bf16,
    ] {
        let mlps: Vec<[GpuMat; 3]> = (0..3)
            .map(|j| {
                [
                    upload(g, f, INTER, HIDDEN, 10 * j),
                    upload(g, f, INTER, HIDDEN, 10 * j + 1),
                    upload(g, f, HIDDEN, INTER, 10 * j + 2),
                ]
            })
            .collect();
        let refs: Vec<[&GpuMat; 3]> = mlps.iter().map(|[a, b, c]| [a, b, c]).collect();
        for m in [1, 5, 64] {
            let xs: Vec<Vec<f32>> = (0..3).map(|j| values(m * HIDDEN, 100 + j)).collect();
            let xr: Vec<&[f32]> = xs.iter().map(Vec::as_slice).collect();
            let batch = g.swiglu_batch(&refs, &xr, m).unwrap();
            for (j, ([gate, up, down], x)) in refs.iter().zip(&xs).enumerate() {
                let alone = g.swiglu_batch(&[[gate, up, down]], &[x], m).unwrap();
                assert!(
                    batch[j]
                        .iter()
                        .zip(&alone[0])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{} m={m}: MLP {j} batched differs from alone",
                    f.name()
                );
                let mut a = product(g, gate, x, m);
                swiglu_in_place(&mut a, &product(g, up, x, m));
                let want = product(g, down, &a, m);
                // Σ|w·a| per output, with the down matrix decoded on the CPU.
                let (d, s) = weights(f, HIDDEN, INTER, 10 * j as u64 + 2);
                let w = MatRef::new(f, HIDDEN, INTER, &d, &s).unwrap();
                let abs = common::abs_sums(&w, &a, m);
                for (k, ((&got, &w), &s)) in batch[j].iter().zip(&want).zip(&abs).enumerate() {
                    assert!(
                        within_tolerance(got, w, s),
                        "{} m={m} MLP {j} element {k}: chained {got}, one by one {w} (Σ|w·a| {s})",
                        f.name()
                    );
                }
            }
        }
    }
}

#[test]
fn bad_shapes_are_errors_not_launches() {
    let Some(g) = gpu() else {
        return;
    };
    let f = WeightFormat::Int8Row;
    let (gate, up, down) = (
        upload(g, f, INTER, HIDDEN, 1),
        upload(g, f, INTER, HIDDEN, 2),
        upload(g, f, HIDDEN, INTER, 3),
    );
    let wide = upload(g, f, HIDDEN, INTER + 16, 4);
    let x = vec![0.5; 2 * HIDDEN];
    // Down does not chain; x is not whole rows; inputs and MLPs disagree in number.
    assert!(g.swiglu_batch(&[[&gate, &up, &wide]], &[&x], 2).is_err());
    assert!(g
        .swiglu_batch(&[[&gate, &up, &down]], &[&x[1..]], 2)
        .is_err());
    assert!(g
        .swiglu_batch(&[[&gate, &up, &down]], &[&x, &x], 2)
        .is_err());
    // MLPs of different shapes in one batch.
    assert!(g
        .swiglu_batch(&[[&gate, &up, &down], [&gate, &up, &wide]], &[&x, &x], 2)
        .is_err());
    let y = g.swiglu_batch(&[[&gate, &up, &down]], &[&x], 2).unwrap();
    assert_eq!(y[0].len(), 2 * HIDDEN);
    assert!(y[0].iter().all(|v| v.is_finite()));
    assert_eq!(
        g.swiglu_batch(&[[&gate, &up, &down]], &[&[]], 0).unwrap(),
        [Vec::<f32>::new()]
    );
}
