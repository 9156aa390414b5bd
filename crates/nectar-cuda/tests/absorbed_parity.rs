//! The absorbed MLA form on the GPU (`Gpu::mla_absorbed`, decode rows over a KV cache mirrored
//! in VRAM) against an f64 reference of the model's absorbed form: kv_b in every stored format,
//! GLM-5 and fixture geometry, rows attending every key up to theirs or a DSA selection in any
//! order, the mirror grown, extended row by row, rolled back and refilled with other values,
//! and the mirrors' cap refusing a sync.
//!
//! Without a GPU the test prints why and passes, unless `NECTAR_REQUIRE_GPU=1`.
#![cfg(feature = "cuda")]
mod common;
use common::{gpu, values, weights, FORMATS};
use nectar_cuda::{AbsorbedKeys, AbsorbedRow, IndexRows, KvMirror, MlaShape};
use nectar_kernels::{decode_row, MatRef, WeightFormat};
use std::sync::Mutex;

/// The tests share the GPU's mirror ledger: one at a time, so the cap test's accounting holds.
static SERIAL: Mutex<()> = Mutex::new(());

/// A host cache: `rows × rank` latents and `rows × dr` rope keys.
struct Cache {
    latent: Vec<f32>,
    kpe: Vec<f32>,
}

/// The absorbed form in f64 for one row: `q` (`heads × (dn + dr)`), `keys` (cache rows),
/// kv_b decoded to the CPU's f32 values.
fn reference(
    s: MlaShape,
    rank: usize,
    kvb: &MatRef<'_>,
    q: &[f32],
    c: &Cache,
    keys: &[usize],
) -> Vec<f64> {
    let (dq, scale) = (s.dn + s.dr, ((s.dn + s.dr) as f64).powf(-0.5));
    let mut w = vec![0.0f32; rank];
    let mut out = vec![0.0f64; s.heads * s.dv];
    for h in 0..s.heads {
        let base = h * (s.dn + s.dv);
        let qh = &q[h * dq..][..dq];
        let mut q_lat = vec![0.0f64; rank];
        for (j, &qj) in qh[..s.dn].iter().enumerate() {
            decode_row(kvb, base + j, &mut w);
            for (a, &b) in q_lat.iter_mut().zip(&w) {
                *a += qj as f64 * b as f64;
            }
        }
        let sc: Vec<f64> = keys
            .iter()
            .map(|&t| {
                let a: f64 = (0..rank)
                    .map(|d| q_lat[d] * c.latent[t * rank + d] as f64)
                    .sum();
                let b: f64 = (0..s.dr)
                    .map(|d| qh[s.dn + d] as f64 * c.kpe[t * s.dr + d] as f64)
                    .sum();
                (a + b) * scale
            })
            .collect();
        let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = sc.iter().map(|x| (x - mx).exp()).collect();
        let l: f64 = e.iter().sum();
        let mut o_lat = vec![0.0f64; rank];
        for (&t, &et) in keys.iter().zip(&e) {
            for (d, o) in o_lat.iter_mut().enumerate() {
                *o += et / l * c.latent[t * rank + d] as f64;
            }
        }
        for v in 0..s.dv {
            decode_row(kvb, base + s.dn + v, &mut w);
            out[h * s.dv + v] = w.iter().zip(&o_lat).map(|(&a, &b)| a as f64 * b).sum();
        }
    }
    out
}

fn cache(rows: usize, rank: usize, dr: usize, seed: u64) -> Cache {
    Cache {
        latent: values(rows * rank, seed).iter().map(|v| v * 0.5).collect(),
        kpe: values(rows * dr, seed ^ 7)
            .iter()
            .map(|v| v * 0.5)
            .collect(),
    }
}

/// Runs `rows` (query, keys) over `mirror` and checks each against the reference; returns the
/// largest |Δ| / max|out|.
#[allow(clippy::too_many_arguments)]
fn check(
    s: MlaShape,
    kvb: (&MatRef<'_>, &nectar_cuda::GpuMat),
    c: &Cache,
    mirror: &KvMirror,
    rows: &[(Vec<f32>, AbsorbedKeys<'_>)],
    what: &str,
) -> f64 {
    let g = gpu().unwrap();
    let rank = kvb.0.cols;
    let scale = ((s.dn + s.dr) as f32).powf(-0.5);
    let arows: Vec<AbsorbedRow<'_>> = rows
        .iter()
        .map(|(q, keys)| AbsorbedRow {
            q,
            mirror,
            keys: *keys,
        })
        .collect();
    let out = g.mla_absorbed(s, scale, kvb.1, &arows).unwrap();
    let got = g.mla_download(&out).unwrap();
    assert_eq!(
        got.len(),
        rows.len() * s.heads * s.dv,
        "{what}: output size"
    );
    let mut worst = 0.0f64;
    for (i, (q, keys)) in rows.iter().enumerate() {
        let ks: Vec<usize> = match keys {
            AbsorbedKeys::Upto(n) => (0..*n).collect(),
            AbsorbedKeys::List(l) => l.iter().map(|&t| t as usize).collect(),
        };
        let want = reference(s, rank, kvb.0, q, c, &ks);
        let mx = want.iter().fold(0.0f64, |a, b| a.max(b.abs())).max(1e-30);
        let g = &got[i * s.heads * s.dv..][..s.heads * s.dv];
        for (k, (&a, &b)) in g.iter().zip(&want).enumerate() {
            let d = (a as f64 - b).abs() / mx;
            assert!(
                d <= 1e-5,
                "{what}: row {i} element {k}: gpu {a}, reference {b} (|Δ|/max {d:e})"
            );
            worst = worst.max(d);
        }
    }
    worst
}

fn run(s: MlaShape, rank: usize, format: WeightFormat, seed: u64) {
    let Some(g) = gpu() else { return };
    let (data, scales) = weights(format, s.heads * (s.dn + s.dv), rank, seed);
    let kvb = MatRef::new(format, s.heads * (s.dn + s.dv), rank, &data, &scales).unwrap();
    let dev = g.upload_stored(&kvb).unwrap();
    let what = format!("{} {s:?} rank {rank}", format.name());
    let dq = s.dn + s.dr;
    let q = |i: u64| values(s.heads * dq, seed ^ (100 + i));
    // 590 rows synced at once (past the first 64 the buffer grows; past 256 keys the weighted
    // sum stages more than one chunk and the softmax gives a thread several keys), then 10
    // more one by one.
    let mut c = cache(600, rank, s.dr, seed ^ 3);
    let mut mirror: Option<KvMirror> = None;
    assert!(g
        .kv_mirror_sync(
            &mut mirror,
            [rank, s.dr, 0],
            [&c.latent[..590 * rank], &c.kpe[..590 * s.dr], &[]]
        )
        .unwrap());
    for n in 591..=600 {
        assert!(g
            .kv_mirror_sync(
                &mut mirror,
                [rank, s.dr, 0],
                [&c.latent[..n * rank], &c.kpe[..n * s.dr], &[]]
            )
            .unwrap());
    }
    let m = mirror.as_ref().unwrap();
    assert_eq!(m.synced(), 600);
    let sel: Vec<u32> = (0..600u32).filter(|t| t % 3 != 1).rev().collect();
    let mut worst = check(
        s,
        (&kvb, &dev),
        &c,
        m,
        &[
            (q(0), AbsorbedKeys::Upto(600)),
            (q(1), AbsorbedKeys::List(&sel)),
            (q(2), AbsorbedKeys::Upto(1)),
            (q(3), AbsorbedKeys::Upto(257)),
        ],
        &what,
    );
    // Roll back to 520 rows and refill 520.. with other values: the mirror must read the new
    // ones, not what it held.
    mirror.as_mut().unwrap().truncate(520);
    let other = cache(600, rank, s.dr, seed ^ 9);
    c.latent[520 * rank..].copy_from_slice(&other.latent[520 * rank..]);
    c.kpe[520 * s.dr..].copy_from_slice(&other.kpe[520 * s.dr..]);
    assert!(g
        .kv_mirror_sync(&mut mirror, [rank, s.dr, 0], [&c.latent, &c.kpe, &[]])
        .unwrap());
    worst = worst.max(check(
        s,
        (&kvb, &dev),
        &c,
        mirror.as_ref().unwrap(),
        &[(q(4), AbsorbedKeys::Upto(600))],
        &format!("{what}, after a rollback"),
    ));
    // kv_b in the int4 GEMV's packed layout is refused, not read as stored.
    if nectar_cuda::packs(format, kvb.rows, kvb.cols) {
        let packed = g.upload(&kvb).unwrap();
        let q5 = q(5);
        let row = [AbsorbedRow {
            q: &q5,
            mirror: mirror.as_ref().unwrap(),
            keys: AbsorbedKeys::Upto(600),
        }];
        let err = g.mla_absorbed(s, 1.0, &packed, &row).unwrap_err();
        assert!(err.to_string().contains("stored layout"), "{what}: {err}");
    }
    eprintln!("{what}: max |Δ| / max|out| = {worst:.2e}");
}

#[test]
fn the_absorbed_form_matches_the_reference_in_every_format() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let fixture = MlaShape {
        heads: 4,
        dn: 16,
        dr: 16,
        dv: 24,
    };
    for (i, f) in FORMATS.iter().enumerate() {
        run(fixture, 64, *f, 40 + i as u64);
    }
    let glm = MlaShape {
        heads: 64,
        dn: 192,
        dr: 64,
        dv: 256,
    };
    run(glm, 512, WeightFormat::Int4Group { group: 64 }, 7);
    run(glm, 512, WeightFormat::Bf16, 8);
}

#[test]
fn the_mirrors_cap_refuses_a_sync_and_frees_what_it_held() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(g) = gpu() else { return };
    let (rank, dr) = (32, 8);
    let c = cache(100, rank, dr, 1);
    let before = g.kv_mirror_bytes();
    let mut mirror = None;
    assert!(g
        .kv_mirror_sync(
            &mut mirror,
            [rank, dr, 0],
            [&c.latent[..10 * rank], &c.kpe[..10 * dr], &[]]
        )
        .unwrap());
    let held = mirror.as_ref().unwrap().bytes();
    assert_eq!(g.kv_mirror_bytes(), before + held);
    // Growing past 64 rows needs a buffer the cap no longer allows: refused, mirror dropped.
    g.set_kv_mirror_cap(before + held);
    let grown = g
        .kv_mirror_sync(&mut mirror, [rank, dr, 0], [&c.latent, &c.kpe, &[]])
        .unwrap();
    g.set_kv_mirror_cap(u64::MAX);
    assert!(!grown, "the cap refuses the larger buffer");
    assert!(mirror.is_none());
    assert_eq!(
        g.kv_mirror_bytes(),
        before,
        "the dropped mirror gave its bytes back"
    );
    // Near the cap a mirror that cannot double grows by an eighth: 64 rows, then 100 rows
    // with room for 112 but not 128.
    let row_bytes = ((rank + dr + 1) * 4) as u64;
    let parts = |n: usize| -> [&[f32]; 3] { [&c.latent[..n * rank], &c.kpe[..n * dr], &[]] };
    assert!(g
        .kv_mirror_sync(&mut mirror, [rank, dr, 0], parts(10))
        .unwrap());
    assert_eq!(mirror.as_ref().unwrap().bytes(), 64 * row_bytes);
    g.set_kv_mirror_cap(before + 120 * row_bytes);
    let grown = g.kv_mirror_sync(&mut mirror, [rank, dr, 0], parts(100));
    g.set_kv_mirror_cap(u64::MAX);
    assert!(grown.unwrap(), "an eighth more than needed fits");
    assert_eq!(mirror.as_ref().unwrap().bytes(), 112 * row_bytes);
    assert_eq!(g.kv_mirror_bytes(), before + 112 * row_bytes);
    mirror = None;
    assert_eq!(g.kv_mirror_bytes(), before);
    // Shapes that do not describe a cache are errors, not launches.
    assert!(g
        .kv_mirror_sync(
            &mut mirror,
            [rank, dr, 0],
            [&c.latent[..rank + 1], &c.kpe[..dr], &[]]
        )
        .is_err());
}

#[test]
fn indexer_scores_over_a_mirror_equal_the_uploaded_keys_bit_for_bit() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(g) = gpu() else { return };
    // GLM-5.2's indexer: 32 heads of 128 dims; 300 keys, rows at the last positions (decode
    // and a verify block) and one in the middle.
    let (heads, dim, t) = (32, 128, 300);
    let c = cache(t, 16, 4, 11);
    let index_k = values(t * dim, 12);
    let mut mirror = None;
    let parts: [&[f32]; 3] = [&c.latent, &c.kpe, &index_k];
    assert!(g.kv_mirror_sync(&mut mirror, [16, 4, dim], parts).unwrap());
    let m = mirror.as_ref().unwrap();
    let pos = [299u32, 298, 150, 297];
    let q = values(pos.len() * heads * dim, 13);
    let w = values(pos.len() * heads, 14);
    let scale = (dim as f32).powf(-0.5);
    let rows = IndexRows {
        heads,
        q: &q,
        w: &w,
        pos: &pos,
        qk_scale: scale,
    };
    let got = g.index_scores_mirrored(m, rows).unwrap();
    let want = g
        .index_scores(&index_k, dim, heads, &q, &w, &pos, scale)
        .unwrap();
    assert_eq!(got.len(), pos.len() * t);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&got),
        bits(&want),
        "the same kernel over the same keys"
    );
    // A position the mirror does not hold is an error, not a launch.
    let beyond = IndexRows {
        q: &q[..heads * dim],
        w: &w[..heads],
        pos: &[300],
        ..rows
    };
    assert!(g.index_scores_mirrored(m, beyond).is_err());
}
