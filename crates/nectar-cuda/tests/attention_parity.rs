//! MLA attention of a prefill chunk on the GPU (`Gpu::mla_prefill`) against an f64 reference of
//! the model's reconstructed form: causal rows, DSA-selected rows (with selected positions
//! beyond the row, which must be ignored), partial tiles of rows and keys, keys written in
//! several blocks, GLM-5 and fixture geometry.
//!
//! Without a GPU the test prints why and passes, unless `NECTAR_REQUIRE_GPU=1`.
#![cfg(feature = "cuda")]
mod common;
use common::{gpu, values, weights};
use nectar_cuda::{use_gemm, MlaShape, Order, Precision};
use nectar_kernels::{MatRef, WeightFormat};

/// The reconstructed form in f64: per row and head, softmax over the visible keys of
/// (q_nope·k_nope + q_pe·k_pe)·scale, times V.
#[allow(clippy::too_many_arguments)]
fn reference(
    s: MlaShape,
    scale: f32,
    q: &[f32],
    kv: &[f32],
    kpe: &[f32],
    pos: &[u32],
    sel: &[Option<Vec<u32>>],
) -> Vec<f64> {
    let (dq, w) = (s.dn + s.dr, s.kv_width());
    let mut out = vec![0.0f64; pos.len() * s.heads * s.dv];
    for (i, &p) in pos.iter().enumerate() {
        let ts: Vec<usize> = match &sel[i] {
            Some(k) => k
                .iter()
                .map(|&t| t as usize)
                .filter(|&t| t <= p as usize)
                .collect(),
            None => (0..=p as usize).collect(),
        };
        for h in 0..s.heads {
            let qh = &q[(i * s.heads + h) * dq..][..dq];
            let base = h * (s.dn + s.dv);
            let sc: Vec<f64> = ts
                .iter()
                .map(|&t| {
                    let k = &kv[t * w + base..][..s.dn];
                    let a: f64 = (0..s.dn).map(|d| qh[d] as f64 * k[d] as f64).sum::<f64>()
                        + (0..s.dr)
                            .map(|d| qh[s.dn + d] as f64 * kpe[t * s.dr + d] as f64)
                            .sum::<f64>();
                    a * scale as f64
                })
                .collect();
            let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = sc.iter().map(|x| (x - mx).exp()).collect();
            let l: f64 = e.iter().sum();
            let o = &mut out[(i * s.heads + h) * s.dv..][..s.dv];
            for (&t, &et) in ts.iter().zip(&e) {
                for (c, oc) in o.iter_mut().enumerate() {
                    *oc += et / l * kv[t * w + base + s.dn + c] as f64;
                }
            }
        }
    }
    out
}

/// One case: `keys` keys, the last `m` of them the chunk's rows; rows with `i % 3 == 1` get a
/// DSA selection of about a third of their keys plus two positions beyond them.
fn check(s: MlaShape, keys: usize, m: usize, block: usize, seed: u64) -> f64 {
    let g = gpu().unwrap();
    let dq = s.dn + s.dr;
    let scale = (dq as f32).powf(-0.5);
    let q = values(m * s.heads * dq, seed);
    let kv = values(keys * s.kv_width(), seed ^ 1);
    let kpe = values(keys * s.dr, seed ^ 2);
    let pos: Vec<u32> = (keys - m..keys).map(|p| p as u32).collect();
    let sel: Vec<Option<Vec<u32>>> = pos
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            (i % 3 == 1).then(|| {
                let mut v: Vec<u32> = (0..=p)
                    .filter(|t| (t * 7 + i as u32).is_multiple_of(3))
                    .collect();
                v.extend([p + 1, p + 5]);
                v
            })
        })
        .collect();
    let mut dev = g.mla_keys(s, keys, &kpe).unwrap();
    let w = s.kv_width();
    for first in (0..keys).step_by(block) {
        let end = (first + block).min(keys);
        g.mla_write_kv(&mut dev, first, &kv[first * w..end * w])
            .unwrap();
    }
    let sel_ref: Vec<Option<&[u32]>> = sel.iter().map(Option::as_deref).collect();
    let got = g.mla_prefill(&dev, scale, &q, &pos, &sel_ref).unwrap();
    let want = reference(s, scale, &q, &kv, &kpe, &pos, &sel);
    let vmax = kv.iter().fold(0.0f32, |a, &b| a.max(b.abs())) as f64;
    let mut worst = 0.0f64;
    for (j, (&g, &w)) in got.iter().zip(&want).enumerate() {
        let d = (g as f64 - w).abs();
        assert!(
            d <= 1e-5 * vmax,
            "{s:?} keys {keys} m {m}: element {j} (row {}): {g} vs {w}",
            j / (s.heads * s.dv)
        );
        worst = worst.max(d / vmax);
    }
    worst
}

#[test]
fn prefill_attention_matches_the_reconstructed_form() {
    if gpu().is_none() {
        return;
    }
    let glm = MlaShape {
        heads: 4,
        dn: 192,
        dr: 64,
        dv: 256,
    };
    let tiny = MlaShape {
        heads: 4,
        dn: 16,
        dr: 16,
        dv: 24,
    };
    let mut worst = 0.0f64;
    // (shape, keys, rows, key block): a chunk continuing a cache, a whole prompt, one row past
    // a tile, tiles of keys left partial.
    for (s, keys, m, block) in [
        (glm, 300, 37, 64),
        (glm, 40, 40, 40),
        (tiny, 24, 24, 7),
        (tiny, 17, 17, 17),
        (tiny, 1000, 5, 333),
    ] {
        worst = worst.max(check(s, keys, m, block, keys as u64 * 31 + m as u64));
    }
    eprintln!("MLA prefill attention: max |Δ| / max|v| = {worst:.3e} (bound 1e-5)");
}

#[test]
fn bad_shapes_are_errors_not_launches() {
    let Some(g) = gpu() else {
        return;
    };
    let s = MlaShape {
        heads: 2,
        dn: 4,
        dr: 4,
        dv: 4,
    };
    assert!(g.mla_keys(s, 3, &[0.0; 11]).is_err());
    assert!(g
        .mla_keys(MlaShape { dv: 300, ..s }, 3, &[0.0; 12])
        .is_err());
    let mut k = g.mla_keys(s, 3, &[0.0; 12]).unwrap();
    assert!(g.mla_write_kv(&mut k, 2, &[0.0; 32]).is_err());
    // kv_b of the wrong height, latents that are not whole rows or run past the keys.
    let (f, rank) = (WeightFormat::Int8Row, 16);
    let up = |rows| {
        let (d, sc) = weights(f, rows, rank, 1);
        g.upload(&MatRef::new(f, rows, rank, &d, &sc).unwrap())
            .unwrap()
    };
    let (kvb, tall) = (up(s.kv_width()), up(s.kv_width() + 1));
    assert!(g.mla_rebuild_kv(&mut k, 0, &tall, &[0.0; 16]).is_err());
    assert!(g.mla_rebuild_kv(&mut k, 0, &kvb, &[0.0; 17]).is_err());
    assert!(g.mla_rebuild_kv(&mut k, 2, &kvb, &[0.0; 32]).is_err());
    g.mla_rebuild_kv(&mut k, 1, &kvb, &[0.5; 32]).unwrap();
    // A row at a position beyond the keys.
    assert!(g.mla_prefill(&k, 1.0, &[0.0; 16], &[3], &[None]).is_err());
    assert!(g.mla_prefill(&k, 1.0, &[0.0; 15], &[2], &[None]).is_err());
    assert_eq!(
        g.mla_prefill(&k, 1.0, &[0.0; 16], &[2], &[None])
            .unwrap()
            .len(),
        8
    );
}

/// K/V rebuilt in VRAM by kv_b (`mla_rebuild_kv`, what the model's prefill does) hold the bits
/// of kv_b's product downloaded and written back (`mla_write_kv`, its former path), in blocks
/// that take either kernel (GEMV up to 8 rows, the tensor-core GEMM where `use_gemm` picks it):
/// the attention over the two is bit-identical.
#[test]
fn keys_rebuilt_in_vram_equal_the_host_round_trip() {
    let Some(g) = gpu() else {
        return;
    };
    let s = MlaShape {
        heads: 4,
        dn: 192,
        dr: 64,
        dv: 256,
    };
    let (f, rank, keys, m) = (WeightFormat::Int4Group { group: 64 }, 512, 300, 37);
    let (data, scales) = weights(f, s.kv_width(), rank, 7);
    let dev = g
        .upload(&MatRef::new(f, s.kv_width(), rank, &data, &scales).unwrap())
        .unwrap();
    let latent = values(keys * rank, 11);
    let kpe = values(keys * s.dr, 12);
    let q = values(m * s.heads * (s.dn + s.dr), 13);
    let pos: Vec<u32> = (keys - m..keys).map(|p| p as u32).collect();
    let sel = vec![None; m];
    let mut kernels = (false, false);
    for block in [5, 64, 300] {
        let mut host = g.mla_keys(s, keys, &kpe).unwrap();
        let mut vram = g.mla_keys(s, keys, &kpe).unwrap();
        for first in (0..keys).step_by(block) {
            let n = block.min(keys - first);
            let x = &latent[first * rank..(first + n) * rank];
            let mut y = vec![0.0; n * s.kv_width()];
            if use_gemm(f, s.kv_width(), rank, n) {
                kernels.1 = true;
                g.gemm(&dev, x, n, &mut y, Precision::Split3)
            } else {
                kernels.0 = true;
                g.matmul(&dev, x, n, &mut y, Order::MODEL)
            }
            .unwrap();
            g.mla_write_kv(&mut host, first, &y).unwrap();
            g.mla_rebuild_kv(&mut vram, first, &dev, x).unwrap();
        }
        let a = g.mla_prefill(&host, 0.06, &q, &pos, &sel).unwrap();
        let b = g.mla_prefill(&vram, 0.06, &q, &pos, &sel).unwrap();
        let differ = a
            .iter()
            .zip(&b)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count();
        assert_eq!(differ, 0, "blocks of {block}: {differ} outputs differ");
    }
    assert_eq!(kernels, (true, true), "both kernels ran");
}

/// o_proj run on the attention output in VRAM (`Gpu::mla_attention` + `Gpu::mla_project`) gives the bits of
/// downloading that output and multiplying it by o_proj with the kernel the model picks for the
/// row count, at row counts that take the GEMV and the tensor-core GEMM; an o_proj of the wrong
/// width is an error, not a launch.
#[test]
fn o_proj_in_vram_equals_the_host_round_trip() {
    let Some(g) = gpu() else {
        return;
    };
    let s = MlaShape {
        heads: 4,
        dn: 128,
        dr: 64,
        dv: 128,
    };
    let (f, hidden, keys) = (WeightFormat::Int4Group { group: 64 }, 192, 320);
    let (data, scales) = weights(f, hidden, s.heads * s.dv, 21);
    let o = g
        .upload(&MatRef::new(f, hidden, s.heads * s.dv, &data, &scales).unwrap())
        .unwrap();
    let mut dev = g.mla_keys(s, keys, &values(keys * s.dr, 22)).unwrap();
    g.mla_write_kv(&mut dev, 0, &values(keys * s.kv_width(), 23))
        .unwrap();
    let mut kernels = (false, false);
    for m in [5, 300] {
        let q = values(m * s.heads * (s.dn + s.dr), 24 + m as u64);
        let pos: Vec<u32> = (keys - m..keys).map(|p| p as u32).collect();
        let sel = vec![None; m];
        let a = g.mla_prefill(&dev, 0.07, &q, &pos, &sel).unwrap();
        let mut want = vec![0.0; m * hidden];
        if use_gemm(f, hidden, s.heads * s.dv, m) {
            kernels.1 = true;
            g.gemm(&o, &a, m, &mut want, Precision::Split3)
        } else {
            kernels.0 = true;
            g.matmul(&o, &a, m, &mut want, Order::MODEL)
        }
        .unwrap();
        let attn = g.mla_attention(&dev, 0.07, &q, &pos, &sel).unwrap();
        let got = g.mla_project(&attn, &o).unwrap();
        assert_eq!(got.len(), want.len());
        let differ = got
            .iter()
            .zip(&want)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count();
        assert_eq!(differ, 0, "m = {m}: {differ} outputs differ");
    }
    assert_eq!(kernels, (true, true), "both kernels ran");
    let (data, scales) = weights(f, hidden, s.heads * s.dv + 64, 25);
    let wide = g
        .upload(&MatRef::new(f, hidden, s.heads * s.dv + 64, &data, &scales).unwrap())
        .unwrap();
    let q = values(s.heads * (s.dn + s.dr), 26);
    let attn = g.mla_attention(&dev, 0.07, &q, &[3], &[None]).unwrap();
    assert!(g.mla_project(&attn, &wide).is_err());
}

/// A prompt's queries kept in VRAM (`Gpu::matmul_keep`, `Gpu::rope_heads`) are, bit for bit,
/// the host's (the model kernel's product downloaded, RoPE by `RopeTable::rotate`), and the
/// attention over them (`Gpu::mla_attention_rows`) gives the uploaded queries' bits, at row
/// counts that take the GEMV and the GEMM; angles that do not fit the heads are errors.
#[test]
fn queries_kept_in_vram_equal_the_host_queries() {
    let Some(g) = gpu() else {
        return;
    };
    let s = MlaShape {
        heads: 4,
        dn: 128,
        dr: 64,
        dv: 128,
    };
    let dq = s.dn + s.dr;
    let (f, rank, keys) = (WeightFormat::Int8Row, 96, 320);
    let (data, scales) = weights(f, s.heads * dq, rank, 31);
    let w = g
        .upload(&MatRef::new(f, s.heads * dq, rank, &data, &scales).unwrap())
        .unwrap();
    let rope = nectar_kernels::RopeTable::new(s.dr, 10000.0);
    let mut dev = g.mla_keys(s, keys, &values(keys * s.dr, 32)).unwrap();
    g.mla_write_kv(&mut dev, 0, &values(keys * s.kv_width(), 33))
        .unwrap();
    let bits = |a: &[f32], b: &[f32]| {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    };
    let mut kernels = (false, false);
    for m in [5, 300] {
        let x = values(m * rank, 34 + m as u64);
        let pos: Vec<u32> = (keys - m..keys).map(|p| p as u32).collect();
        let mut q = vec![0.0; m * s.heads * dq];
        if use_gemm(f, s.heads * dq, rank, m) {
            kernels.1 = true;
            g.gemm(&w, &x, m, &mut q, Precision::Split3)
        } else {
            kernels.0 = true;
            g.matmul(&w, &x, m, &mut q, Order::MODEL)
        }
        .unwrap();
        let mut sc = Vec::new();
        for (i, row) in q.chunks_exact_mut(s.heads * dq).enumerate() {
            let a = rope.sin_cos(pos[i] as usize);
            for head in row.chunks_exact_mut(dq) {
                nectar_kernels::RopeTable::rotate(&mut head[s.dn..], &a);
            }
            sc.extend(a);
        }
        let mut qd = g.matmul_keep(&w, &x, m).unwrap();
        g.rope_heads(&mut qd, s.heads, s.dn, &sc).unwrap();
        assert!(
            bits(&g.download_rows(&qd).unwrap(), &q),
            "m = {m}: queries differ"
        );
        let sel = vec![None; m];
        let want = g.mla_prefill(&dev, 0.07, &q, &pos, &sel).unwrap();
        let got = g.mla_attention_rows(&dev, 0.07, &qd, &pos, &sel).unwrap();
        assert!(
            bits(&g.mla_download(&got).unwrap(), &want),
            "m = {m}: attention differs"
        );
        // Angles for another width, or an offset past the head: errors.
        assert!(g.rope_heads(&mut qd, s.heads, s.dn, &sc[1..]).is_err());
        assert!(g.rope_heads(&mut qd, s.heads, s.dn + 8, &sc).is_err());
    }
    assert_eq!(kernels, (true, true), "both kernels ran");
}
