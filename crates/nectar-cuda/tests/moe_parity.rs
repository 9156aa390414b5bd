//! A whole MoE layer on the GPU (`Gpu::moe_batch`: rows gathered, experts chained and the
//! weighted combine done in VRAM) against the per-expert path it replaces: each expert's rows
//! gathered on the host and run by `Gpu::swiglu_batch` alone, the shared expert likewise, the
//! combine on the host in the model's order — bit for bit, at one row (decode: every expert one
//! row, one launch group) and at 80 rows (experts of many row counts, the GEMV and the
//! tensor-core GEMM both taken), with a row that uses fewer slots than k. Bad tables are errors.
//!
//! Also: experts over a layer input uploaded once (`Gpu::swiglu_rows`) against host-gathered
//! rows.
//!
//! Without a GPU the test prints why and passes, unless `NECTAR_REQUIRE_GPU=1`.
#![cfg(feature = "cuda")]
mod common;
use common::{gpu, values, weights};
use nectar_cuda::{use_gemm, Gpu, GpuMat, MoeCombine, NO_PAIR};
use nectar_kernels::{MatRef, WeightFormat};

const HIDDEN: usize = 256;
const INTER: usize = 128;
const EXPERTS: usize = 6;
const K: usize = 3;

fn upload(g: &Gpu, f: WeightFormat, rows: usize, cols: usize, seed: u64) -> GpuMat {
    let (d, s) = weights(f, rows, cols, seed);
    g.upload(&MatRef::new(f, rows, cols, &d, &s).unwrap())
        .unwrap()
}

fn mlp(g: &Gpu, f: WeightFormat, seed: u64) -> [GpuMat; 3] {
    [
        upload(g, f, INTER, HIDDEN, seed),
        upload(g, f, INTER, HIDDEN, seed + 1),
        upload(g, f, HIDDEN, INTER, seed + 2),
    ]
}

/// Experts in first-seen order, each with the (row, slot) pairs that chose it.
type Union = Vec<(usize, Vec<(usize, usize)>)>;

/// Routes as the model builds them: row i picks K distinct experts (row 1 only K - 1);
/// experts in first-seen order, each with its (row, slot) list.
fn routes(m: usize, seed: u64) -> (Union, Vec<f32>) {
    let mut state = seed;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as usize
    };
    let mut union: Union = Vec::new();
    for i in 0..m {
        let mut ids: Vec<usize> = Vec::new();
        // Skewed: expert 0 is picked by most rows, so row counts differ between experts.
        while ids.len() < if i == 1 { K - 1 } else { K } {
            let e = if next() % 3 == 0 { 0 } else { next() % EXPERTS };
            if !ids.contains(&e) {
                ids.push(e);
            }
        }
        for (slot, e) in ids.into_iter().enumerate() {
            match union.iter_mut().find(|(u, _)| *u == e) {
                Some((_, rows)) => rows.push((i, slot)),
                None => union.push((e, vec![(i, slot)])),
            }
        }
    }
    (union, values(m * K, seed ^ 77))
}

/// The per-expert path: each expert's rows gathered on the host and run by `swiglu_batch`
/// alone, the shared expert likewise, the combine on the host in the model's order.
fn per_expert(
    g: &Gpu,
    experts: &[[GpuMat; 3]],
    sh: [&GpuMat; 3],
    x: &[f32],
    m: usize,
    union: &Union,
    weights: &[f32],
) -> Vec<f32> {
    let gather = |rows: &[(usize, usize)]| -> Vec<f32> {
        rows.iter()
            .flat_map(|&(i, _)| x[i * HIDDEN..(i + 1) * HIDDEN].to_vec())
            .collect()
    };
    let mut ys = vec![f32::NAN; m * K * HIDDEN];
    for (e, rows) in union {
        let w = &experts[*e];
        let y = g
            .swiglu_batch(&[[&w[0], &w[1], &w[2]]], &[&gather(rows)], rows.len())
            .unwrap();
        for (j, &(i, slot)) in rows.iter().enumerate() {
            ys[(i * K + slot) * HIDDEN..][..HIDDEN]
                .copy_from_slice(&y[0][j * HIDDEN..(j + 1) * HIDDEN]);
        }
    }
    let shared_y = g.swiglu_batch(&[sh], &[x], m).unwrap().remove(0);
    let mut want = vec![0.0f32; m * HIDDEN];
    for i in 0..m {
        let slots = if i == 1 { K - 1 } else { K };
        let o = &mut want[i * HIDDEN..(i + 1) * HIDDEN];
        for slot in 0..slots {
            let w = weights[i * K + slot];
            for (a, &y) in o.iter_mut().zip(&ys[(i * K + slot) * HIDDEN..][..HIDDEN]) {
                *a += w * y;
            }
        }
        for (a, &s) in o.iter_mut().zip(&shared_y[i * HIDDEN..(i + 1) * HIDDEN]) {
            *a += s;
        }
    }
    want
}

#[test]
fn a_moe_layer_on_the_gpu_equals_the_per_expert_path() {
    let Some(g) = gpu() else {
        return;
    };
    for f in [
        WeightFormat::Int4Group { group: 64 },
        WeightFormat::Int8Row,
        WeightFormat::Bf16,
    ] {
        let experts: Vec<[GpuMat; 3]> = (0..EXPERTS).map(|e| mlp(g, f, 10 * e as u64)).collect();
        let shared = mlp(g, f, 1000);
        let sh = [&shared[0], &shared[1], &shared[2]];
        for m in [1, 80] {
            let x = values(m * HIDDEN, 5 + m as u64);
            let (union, weights) = routes(m, m as u64);
            if m == 80 {
                let most = union.iter().map(|(_, r)| r.len()).max().unwrap();
                assert!(use_gemm(f, INTER, HIDDEN, most), "no expert takes the GEMM");
            }
            let want = per_expert(g, &experts, sh, &x, m, &union, &weights);
            // The layer on the GPU.
            let rows: Vec<Vec<u32>> = union
                .iter()
                .map(|(_, r)| r.iter().map(|&(i, _)| i as u32).collect())
                .collect();
            let mut pairs = vec![NO_PAIR; m * K];
            let mut next = 0u32;
            for (_, r) in &union {
                for &(i, slot) in r {
                    pairs[i * K + slot] = next;
                    next += 1;
                }
            }
            let items: Vec<([&GpuMat; 3], &[u32])> = union
                .iter()
                .zip(&rows)
                .map(|((e, _), r)| {
                    let w = &experts[*e];
                    ([&w[0], &w[1], &w[2]], r.as_slice())
                })
                .collect();
            let combine = MoeCombine {
                k: K,
                pairs: &pairs,
                weights: &weights,
            };
            let got = g.moe_batch(&x, m, &items, sh, combine).unwrap();
            assert_eq!(got.len(), want.len());
            for (j, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    a.to_bits() == b.to_bits(),
                    "{} m={m}: element {j} (row {}): layer {a}, per expert {b}",
                    f.name(),
                    j / HIDDEN
                );
            }
            // Bad tables: a pair past the experts' rows, a row past m, tables of the wrong size.
            let mut bad = pairs.clone();
            bad[0] = next;
            let c = MoeCombine {
                pairs: &bad,
                ..combine
            };
            assert!(g.moe_batch(&x, m, &items, sh, c).is_err());
            let far = [m as u32];
            let mut wrong = items.clone();
            wrong[0].1 = &far;
            assert!(g.moe_batch(&x, m, &wrong, sh, combine).is_err());
            let c = MoeCombine {
                pairs: &pairs[1..],
                ..combine
            };
            assert!(g.moe_batch(&x, m, &items, sh, c).is_err());
            assert!(g.moe_batch(&x[1..], m, &items, sh, combine).is_err());
        }
    }
}

/// Experts that each gather their rows of a layer input uploaded once (`Gpu::swiglu_rows`, the
/// VRAM tier's and the copied experts' path under a RAM budget) give, bit for bit, what
/// `swiglu_batch` gives over the same rows gathered on the host; experts of different row
/// counts (GEMV and GEMM) in one call, rows in any order and repeated, an expert with no rows.
#[test]
fn experts_over_rows_uploaded_once_equal_host_gathered_rows() {
    let Some(g) = gpu() else {
        return;
    };
    let f = WeightFormat::Int4Group { group: 64 };
    let experts: Vec<[GpuMat; 3]> = (0..4).map(|e| mlp(g, f, 40 + 3 * e as u64)).collect();
    let mats: Vec<[&GpuMat; 3]> = experts.iter().map(|w| [&w[0], &w[1], &w[2]]).collect();
    let m = 90;
    let x = values(m * HIDDEN, 77);
    let input = g.upload_rows(&x, HIDDEN).unwrap();
    let lists: [Vec<u32>; 4] = [
        (0..m as u32).rev().collect(),
        vec![5, 5, 3],
        Vec::new(),
        (0..m as u32).step_by(2).collect(),
    ];
    let rows: Vec<&[u32]> = lists.iter().map(Vec::as_slice).collect();
    assert!(use_gemm(f, INTER, HIDDEN, m), "no expert takes the GEMM");
    let got = g.swiglu_rows_mats(&mats, &input, &rows).unwrap();
    for (j, r) in rows.iter().enumerate() {
        if r.is_empty() {
            assert!(got[j].is_empty());
            continue;
        }
        let xs: Vec<f32> = r
            .iter()
            .flat_map(|&i| x[i as usize * HIDDEN..][..HIDDEN].to_vec())
            .collect();
        let want = g
            .swiglu_batch(&[mats[j]], &[&xs], r.len())
            .unwrap()
            .remove(0);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got[j]), bits(&want), "expert {j}");
    }
    // A row past the input, a list per MLP missing, an input of the wrong width: errors.
    assert!(g
        .swiglu_rows_mats(&mats[..1], &input, &[&[m as u32]])
        .is_err());
    assert!(g.swiglu_rows_mats(&mats[..2], &input, &rows[..1]).is_err());
    let narrow = g.upload_rows(&x[..m * 8], 8).unwrap();
    assert!(g
        .swiglu_rows_mats(&mats[..1], &narrow, &rows[1..2])
        .is_err());
    assert!(g.upload_rows(&x[..7], 8).is_err());
}

/// A streamed layer's outputs kept in VRAM and combined there (`Gpu::moe_out`: the VRAM tier's
/// and the copied experts' outputs written in place, the CPU's experts' outputs and a CPU
/// shared expert uploaded, `moe_out_combine`) equal the per-expert path bit for bit, pairs laid
/// out GPU experts first, in any order of the union; the shared expert on the GPU or uploaded.
/// Out-of-range pairs, rows and sizes are errors, and stream marks time the queued work.
#[test]
fn a_layer_combined_from_outputs_kept_in_vram_equals_the_per_expert_path() {
    let Some(g) = gpu() else {
        return;
    };
    let f = WeightFormat::Int4Group { group: 64 };
    let experts: Vec<[GpuMat; 3]> = (0..EXPERTS).map(|e| mlp(g, f, 10 * e as u64)).collect();
    let shared = mlp(g, f, 1000);
    let sh = [&shared[0], &shared[1], &shared[2]];
    for m in [1, 80] {
        let x = values(m * HIDDEN, 5 + m as u64);
        let (union, weights) = routes(m, m as u64);
        let want = per_expert(g, &experts, sh, &x, m, &union, &weights);
        let input = g.upload_rows(&x, HIDDEN).unwrap();
        for shared_on_gpu in [true, false] {
            // Every other union entry on the CPU; the GPU's pairs first.
            let on_gpu: Vec<bool> = (0..union.len()).map(|u| u % 2 == 0).collect();
            let mut first = vec![0; union.len()];
            let mut next = 0;
            for side in [true, false] {
                for (u, (_, rows)) in union.iter().enumerate() {
                    if on_gpu[u] == side {
                        first[u] = next;
                        next += rows.len();
                    }
                }
            }
            let out = g.moe_out(m, HIDDEN, next).unwrap();
            assert_eq!((out.rows(), out.pairs()), (m, next));
            let rows: Vec<Vec<u32>> = union
                .iter()
                .map(|(_, r)| r.iter().map(|&(i, _)| i as u32).collect())
                .collect();
            let t0 = g.mark().unwrap();
            let gpu_side: Vec<usize> = (0..union.len()).filter(|&u| on_gpu[u]).collect();
            let mats: Vec<[&GpuMat; 3]> = gpu_side
                .iter()
                .map(|&u| {
                    let w = &experts[union[u].0];
                    [&w[0], &w[1], &w[2]]
                })
                .collect();
            let lists: Vec<&[u32]> = gpu_side.iter().map(|&u| rows[u].as_slice()).collect();
            let firsts: Vec<usize> = gpu_side.iter().map(|&u| first[u]).collect();
            g.swiglu_rows_into_mats(&mats, &input, &lists, &out, &firsts)
                .unwrap();
            let t1 = g.mark().unwrap();
            assert!(t1.seconds_since(&t0).unwrap() >= 0.0);
            // The CPU side: host values (here the GPU's own per-expert outputs) sent up.
            for u in (0..union.len()).filter(|&u| !on_gpu[u]) {
                let w = &experts[union[u].0];
                let y = g
                    .swiglu_rows_mats(&[[&w[0], &w[1], &w[2]]], &input, &[&rows[u]])
                    .unwrap()
                    .remove(0);
                g.upload_pairs(&out, first[u], &y).unwrap();
            }
            if shared_on_gpu {
                g.shared_into_mats(sh, &input, &out).unwrap();
            } else {
                let s = g.swiglu_batch(&[sh], &[&x], m).unwrap().remove(0);
                g.upload_shared(&out, &s).unwrap();
            }
            let mut pairs = vec![NO_PAIR; m * K];
            for (u, (_, r)) in union.iter().enumerate() {
                for (j, &(i, slot)) in r.iter().enumerate() {
                    pairs[i * K + slot] = (first[u] + j) as u32;
                }
            }
            let combine = MoeCombine {
                k: K,
                pairs: &pairs,
                weights: &weights,
            };
            let got = g.moe_out_combine(&out, combine).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got),
                bits(&want),
                "m={m}, shared on the GPU: {shared_on_gpu}"
            );
            // Errors: a pair past the buffer, pairs past its end, a row past the input, a
            // CPU output of the wrong width, a shared output of the wrong size.
            let mut bad = pairs.clone();
            bad[0] = next as u32;
            let c = MoeCombine {
                pairs: &bad,
                ..combine
            };
            assert!(g.moe_out_combine(&out, c).is_err());
            assert!(g
                .swiglu_rows_into_mats(&mats[..1], &input, &lists[..1], &out, &[next])
                .is_err());
            let far = [m as u32];
            assert!(g
                .swiglu_rows_into_mats(&mats[..1], &input, &[&far], &out, &[0])
                .is_err());
            assert!(g.upload_pairs(&out, 0, &x[..HIDDEN - 1]).is_err());
            assert!(g.upload_pairs(&out, next, &x[..HIDDEN]).is_err());
            assert!(g.upload_shared(&out, &x[..HIDDEN - 1]).is_err());
        }
    }
}
