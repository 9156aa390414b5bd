//! The absorbed MLA form on the CPU (decode, MTP, verify): attention straight over the cached
//! latents, the K up-projection folded into the query (`q_lat = W_UK[h]ᵀ · q_nope`) and the V
//! up-projection into the output (`o = W_UV[h] · Σ p_t · latent_t`).
//!
//! Every head of a row reads the same selected latents (2,048 × 512 floats = 4 MB per layer at
//! GLM-5.2's shape once DSA selects). A task per (row, head) read them once per head, from L3 or
//! RAM, one dependent chain of FMAs per dot product, which made decode after a long prompt
//! several times slower than after a short one. Here each pass is split so that what it reads
//! repeatedly stays in the core's caches:
//! 1. `q_lat` per (row, head);
//! 2. the scores per (row, tile of [`TILE`] keys): [`HEAD_BLOCK`] heads' `q_lat` in L1 against
//!    each key of the tile, four heads per key load ([`dot4`]);
//! 3. each head's softmax per (row, head);
//! 4. the weighted sum of latents per (row, slice of [`COLS`] columns): each key's slice read
//!    once for every head, four heads at a time ([`scaled_add4`]);
//! 5. `W_UV` per (row, head).
//!
//! Rows with few keys ([`SHORT_KEYS`]: their latents stay in L2 anyway) run as one task per
//! (row, head) instead ([`one_head`]), one region of the compute team rather than five.
//!
//! The bits are the per-head form's: each score is the same `dot + dot` times the scale (`dot4`
//! keeps each product's own canonical chain), each head's softmax runs over its scores in key
//! order, and each output element sums its keys in ascending order with the same
//! multiply-then-add — only the loop nesting changed (the test keeps the per-head form as its
//! reference).
use super::recon::Heads;
use crate::cache::LayerCache;
use nectar_kernels::{
    dot, dot4, matmul_rows, scaled_add, scaled_add4, scaled_add_rows, softmax_in_place, team,
    MatRef, DOT4, ROWS4,
};

/// Keys scored per task: their latents (32 × 2 KB at rank 512) stay in L2 while every head of
/// the row scores them.
const TILE: usize = 32;
/// Largest block of scores and probabilities held at once (f32 bytes): rows are taken in
/// blocks below it.
const SCORES_MAX_BYTES: usize = 64 << 20;
/// Keys up to which a block runs as one (row, head) task each ([`one_head`]): their latents
/// (256 × 2 KB) stay in L2 for every head, and one region costs less than five.
const SHORT_KEYS: usize = 256;
/// Heads whose `q_lat` a score task keeps in L1 while it walks a tile's keys.
const HEAD_BLOCK: usize = 8;
/// Latent columns per task of the weighted sum: every head's slice of its output and the keys'
/// slices stay in L1/L2 (2,048 keys × 64 columns = 512 KB).
const COLS: usize = 64;

/// One row of the absorbed form.
#[derive(Debug, Clone, Copy)]
pub(in crate::arch::glm5) struct Row<'a> {
    /// The row's rotated queries, `heads × (dn + dr)`.
    pub q: &'a [f32],
    /// The row's position: it sees keys `0..=pos`.
    pub pos: usize,
    /// The sequence's cache of this layer.
    pub cache: &'a LayerCache,
    /// The DSA selection (ascending positions), or `None`: every key up to `pos`.
    pub keys: Option<&'a [u32]>,
}

impl Row<'_> {
    /// The keys the row attends to: the selection's positions up to `pos`, or all of `0..=pos`.
    fn visible(&self) -> Vec<usize> {
        match self.keys {
            Some(k) => k
                .iter()
                .map(|&t| t as usize)
                .filter(|&t| t <= self.pos)
                .collect(),
            None => (0..=self.pos).collect(),
        }
    }
}

/// The absorbed form for `rows`: `out` is `[row][head][dv]`. `kvb` is kv_b (per head `dn`
/// rows of W_UK, then `dv` rows of W_UV); `rank` the latent width.
pub(in crate::arch::glm5) fn attend(
    g: &Heads,
    rank: usize,
    kvb: &MatRef<'_>,
    rows: &[Row<'_>],
    out: &mut [f32],
) {
    let (hd, dv) = (g.heads, g.dv);
    assert_eq!(out.len(), rows.len() * hd * dv, "absorbed: output size");
    let keys: Vec<Vec<usize>> = rows.iter().map(Row::visible).collect();
    let mut first = 0;
    while first < rows.len() {
        // Rows of the block: at least one, and scores + probabilities within SCORES_MAX_BYTES.
        let mut end = first + 1;
        let mut tiles = keys[first].len().div_ceil(TILE);
        while end < rows.len() {
            let t = tiles.max(keys[end].len().div_ceil(TILE));
            if (end + 1 - first) * t * TILE * hd * 2 * 4 > SCORES_MAX_BYTES {
                break;
            }
            (end, tiles) = (end + 1, t);
        }
        let o = &mut out[first * hd * dv..end * hd * dv];
        let (rows, keys) = (&rows[first..end], &keys[first..end]);
        match tiles * TILE <= SHORT_KEYS {
            // Few keys: one region of (row, head) tasks costs less than the passes' five.
            true => team::for_each_chunk_mut(o, dv, |idx, oh| {
                let (i, head) = (idx / hd, idx % hd);
                one_head(g, rank, kvb, &rows[i], &keys[i], head, oh);
            }),
            false => block(g, rank, kvb, rows, keys, tiles, o),
        }
        first = end;
    }
}

/// One (row, head) of the absorbed form over the row's `keys`, all in one task: what the
/// passes of [`block`] compute, operation for operation, for rows with few keys.
fn one_head(
    g: &Heads,
    rank: usize,
    kvb: &MatRef<'_>,
    row: &Row<'_>,
    keys: &[usize],
    head: usize,
    out: &mut [f32],
) {
    let (dn, dr, dv, dq) = (g.dn, g.dr, g.dv, g.dn + g.dr);
    let base = head * (dn + dv);
    let qh = &row.q[head * dq..][..dq];
    let mut q_lat = vec![0.0f32; rank];
    scaled_add_rows(kvb, base, &qh[..dn], &mut q_lat);
    let c = row.cache;
    let lat = |t: usize| &c.latent[t * rank..][..rank];
    let kpe = |t: usize| &c.k_pe[t * dr..][..dr];
    // Four keys at a time against the head's query (`dot4`, roles swapped: the same bits).
    let mut p = Vec::with_capacity(keys.len());
    let mut quads = keys.chunks_exact(DOT4);
    for q in &mut quads {
        let a = dot4([lat(q[0]), lat(q[1]), lat(q[2]), lat(q[3])], &q_lat);
        let b = dot4([kpe(q[0]), kpe(q[1]), kpe(q[2]), kpe(q[3])], &qh[dn..]);
        p.extend((0..DOT4).map(|j| (a[j] + b[j]) * g.scale));
    }
    for &t in quads.remainder() {
        p.push((dot(&q_lat, lat(t)) + dot(&qh[dn..], kpe(t))) * g.scale);
    }
    softmax_in_place(&mut p);
    let mut o_lat = vec![0.0f32; rank];
    for (&t, &pt) in keys.iter().zip(&p) {
        scaled_add(&mut o_lat, pt, &c.latent[t * rank..][..rank]);
    }
    matmul_rows(kvb, base + dn..base + dn + dv, &o_lat, out)
        .expect("W_UV rows lie inside kv_b (checked at load)");
}

/// [`attend`] for one block of rows, `tiles` tiles of keys per row at most.
fn block(
    g: &Heads,
    rank: usize,
    kvb: &MatRef<'_>,
    rows: &[Row<'_>],
    keys: &[Vec<usize>],
    tiles: usize,
    out: &mut [f32],
) {
    let (hd, dn, dr, dv, dq) = (g.heads, g.dn, g.dr, g.dv, g.dn + g.dr);
    // 1. q_lat = W_UK[h]ᵀ · q_nope, accumulated over the nope dims in order.
    let mut q_lat = vec![0.0f32; rows.len() * hd * rank];
    team::for_each_chunk_mut(&mut q_lat, rank, |idx, ql| {
        let (row, head) = (&rows[idx / hd], idx % hd);
        scaled_add_rows(kvb, head * (dn + dv), &row.q[head * dq..][..dn], ql);
    });
    // 2. Scores, `[row][tile][head][key of the tile]`, per (row, tile): a block of heads at a
    //    time (their q_lat stays in L1) against every key of the tile (in L2), four heads per
    //    key load.
    let mut scores = vec![0.0f32; rows.len() * tiles * hd * TILE];
    team::for_each_chunk_mut(&mut scores, hd * TILE, |idx, s| {
        let (i, tile) = (idx / tiles, idx % tiles);
        let (row, c) = (&rows[i], rows[i].cache);
        let ql = |h: usize| &q_lat[(i * hd + h) * rank..][..rank];
        let qpe = |h: usize| &row.q[h * dq + dn..][..dr];
        let ks = keys[i].get(tile * TILE..).unwrap_or_default();
        let ks = &ks[..ks.len().min(TILE)];
        for h0 in (0..hd).step_by(HEAD_BLOCK) {
            let h1 = (h0 + HEAD_BLOCK).min(hd);
            for (k, &t) in ks.iter().enumerate() {
                let (l, p) = (&c.latent[t * rank..][..rank], &c.k_pe[t * dr..][..dr]);
                let mut h = h0;
                while h + DOT4 <= h1 {
                    let a = dot4([ql(h), ql(h + 1), ql(h + 2), ql(h + 3)], l);
                    let b = dot4([qpe(h), qpe(h + 1), qpe(h + 2), qpe(h + 3)], p);
                    for j in 0..DOT4 {
                        s[(h + j) * TILE + k] = (a[j] + b[j]) * g.scale;
                    }
                    h += DOT4;
                }
                for h in h..h1 {
                    s[h * TILE + k] = (dot(ql(h), l) + dot(qpe(h), p)) * g.scale;
                }
            }
        }
    });
    // 3. Each head's softmax over its keys, `[row][head][key]`.
    let cap = tiles * TILE;
    let mut probs = vec![0.0f32; rows.len() * hd * cap];
    team::for_each_chunk_mut(&mut probs, cap.max(1), |idx, p| {
        let (i, head) = (idx / hd, idx % hd);
        let p = &mut p[..keys[i].len()];
        for (k, v) in p.iter_mut().enumerate() {
            *v = scores[((i * tiles + k / TILE) * hd + head) * TILE + k % TILE];
        }
        softmax_in_place(p);
    });
    drop(scores);
    // 4. Σ p_t · latent_t per (row, slice of COLS latent columns), every head: each key's
    //    slice is read once (from the cache, or gathered from a selection's keys) and added
    //    into four heads at a time, `[row][slice][head][COLS]`.
    let slices = rank.div_ceil(COLS);
    let mut o_lat = vec![0.0f32; rows.len() * slices * hd * COLS];
    team::for_each_chunk_mut(&mut o_lat, hd * COLS, |idx, ol| {
        let (i, c0) = (idx / slices, (idx % slices) * COLS);
        let (ks, c) = (&keys[i], rows[i].cache);
        let (n, w) = (ks.len(), COLS.min(rank - c0));
        if n == 0 {
            return;
        }
        let gathered: Vec<f32>;
        let (x, stride) = match rows[i].keys {
            None => (&c.latent[ks[0] * rank + c0..], rank),
            Some(_) => {
                let mut v = Vec::with_capacity(n * w);
                for &t in ks {
                    v.extend_from_slice(&c.latent[t * rank + c0..][..w]);
                }
                gathered = v;
                (&gathered[..], w)
            }
        };
        let p = |h: usize| &probs[(i * hd + h) * cap..][..n];
        let mut parts = ol.chunks_exact_mut(COLS).map(|y| &mut y[..w]);
        let mut h = 0;
        while h + ROWS4 <= hd {
            let ys = [(); ROWS4].map(|_| parts.next().expect("heads × COLS values"));
            scaled_add4(ys, [p(h), p(h + 1), p(h + 2), p(h + 3)], x, stride);
            h += ROWS4;
        }
        for (y, h) in parts.zip(h..) {
            for (k, &pk) in p(h).iter().enumerate() {
                scaled_add(y, pk, &x[k * stride..][..w]);
            }
        }
    });
    drop(probs);
    // 5. o = W_UV[h] · o_lat per (row, head): the fused kernel computes each element as the
    //    canonical `dot(decode_row(W, r), o_lat)` without materialising the rows.
    team::for_each_chunk_mut(out, dv, |idx, o| {
        let (i, head) = (idx / hd, idx % hd);
        let mut ol = Vec::with_capacity(rank);
        for sl in 0..slices {
            let w = COLS.min(rank - sl * COLS);
            ol.extend_from_slice(&o_lat[((i * slices + sl) * hd + head) * COLS..][..w]);
        }
        let base = head * (dn + dv) + dn;
        matmul_rows(kvb, base..base + dv, &ol, o)
            .expect("W_UV rows lie inside kv_b (checked at load)");
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use nectar_format::quant::quantize_int4_row;
    use nectar_kernels::WeightFormat;

    fn noise(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect()
    }

    #[test]
    fn passes_equal_the_per_head_form_bit_for_bit() {
        let g = Heads {
            heads: 6,
            dn: 8,
            dr: 4,
            dv: 5,
            scale: 0.3,
        };
        let (rank, len) = (24, 600);
        let wrows = g.heads * (g.dn + g.dv);
        let (mut data, mut scales) = (Vec::new(), Vec::new());
        for row in noise(wrows * rank, 1).chunks_exact(rank) {
            quantize_int4_row(row, 8, &mut data, &mut scales);
        }
        let format = WeightFormat::Int4Group { group: 8 };
        let kvb = MatRef::new(format, wrows, rank, &data, &scales).unwrap();
        let mut cache = LayerCache::default();
        for t in 0..len {
            cache.push(
                &noise(rank, 100 + t as u64),
                &noise(g.dr, 900 + t as u64),
                None,
            );
        }
        let qs: Vec<Vec<f32>> = (0..5)
            .map(|i| noise(g.heads * (g.dn + g.dr), 50 + i))
            .map(|q| q.iter().map(|v| v * 8.0).collect())
            .collect();
        // A selection with keys past the row (ignored), one of a single key, one that spans
        // several tiles unevenly, all keys, and none visible.
        let sel: Vec<u32> = (0..len as u32).filter(|t| t % 3 != 1).collect();
        let rows = [
            Row {
                q: &qs[0],
                pos: 99,
                cache: &cache,
                keys: Some(&sel),
            },
            Row {
                q: &qs[1],
                pos: 0,
                cache: &cache,
                keys: None,
            },
            Row {
                q: &qs[2],
                pos: len - 1,
                cache: &cache,
                keys: None,
            },
            Row {
                q: &qs[3],
                pos: 70,
                cache: &cache,
                keys: Some(&[3]),
            },
            Row {
                q: &qs[4],
                pos: 2,
                cache: &cache,
                keys: Some(&[140, 149]),
            },
        ];
        let mut out = vec![f32::NAN; rows.len() * g.heads * g.dv];
        attend(&g, rank, &kvb, &rows, &mut out);
        for (i, row) in rows.iter().enumerate() {
            for head in 0..g.heads {
                let mut want = vec![0.0; g.dv];
                one_head(&g, rank, &kvb, row, &row.visible(), head, &mut want);
                let got = &out[(i * g.heads + head) * g.dv..][..g.dv];
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(got), bits(&want), "row {i} head {head}");
            }
        }
        // Rows alone give the same bits as in the batch (short rows alone take `one_head`).
        for (i, row) in rows.iter().enumerate() {
            let mut one = vec![0.0; g.heads * g.dv];
            attend(&g, rank, &kvb, std::slice::from_ref(row), &mut one);
            assert_eq!(
                one,
                out[i * g.heads * g.dv..][..g.heads * g.dv],
                "row {i} alone"
            );
        }
    }
}
