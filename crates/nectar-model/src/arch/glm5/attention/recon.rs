//! The reconstructed MLA form on the CPU, over blocks of keys.
//!
//! K/V are rebuilt by kv_b's product for at most [`RECON_MAX_BYTES`] of keys at a time, and
//! every (row, head) folds each block into a running softmax (`m`, `l` and the unnormalised
//! output), so any cache length keeps the form's work — `dn + dr + dv` per (row, key, head),
//! against the absorbed form's `2·rank + dr` — in bounded memory. Within a block the keys are
//! taken in ascending position; the blocks in order, so a row's result depends only on its
//! query, its selected keys and the block size, never on the batch or the chunking.
//!
//! [`RECON_MAX_BYTES`]: super::RECON_MAX_BYTES
use nectar_kernels::{dot, dot4, scaled_add, scaled_add4, DOT4, ROWS4};

/// Per-head geometry of the attention cores.
#[derive(Debug, Clone, Copy)]
pub(in crate::arch::glm5) struct Heads {
    /// Heads (the per-key stride of the rebuilt K/V is `heads × (dn + dv)`).
    pub heads: usize,
    /// `qk_nope_head_dim`.
    pub dn: usize,
    /// `qk_rope_head_dim`.
    pub dr: usize,
    /// `v_head_dim`.
    pub dv: usize,
    /// Softmax scale, 1/√(dn + dr).
    pub scale: f32,
}

impl Heads {
    /// Floats of one (row, head)'s running state: the unnormalised output, then `m` and `l`.
    pub fn state_len(&self) -> usize {
        self.dv + 2
    }
}

/// The keys one (row, head) takes from a block: a span of positions (no DSA selection yet) or
/// the selected positions inside the block, ascending.
#[derive(Debug, Clone)]
pub(in crate::arch::glm5) enum Keys<'a> {
    Span(std::ops::Range<usize>),
    Listed(&'a [u32]),
}

impl Keys<'_> {
    fn for_each(&self, mut f: impl FnMut(usize)) {
        match self {
            Keys::Span(r) => r.clone().for_each(f),
            Keys::Listed(k) => k.iter().for_each(|&t| f(t as usize)),
        }
    }

    fn len(&self) -> usize {
        match self {
            Keys::Span(r) => r.len(),
            Keys::Listed(k) => k.len(),
        }
    }
}

/// A fresh running state (`m` = −∞, nothing accumulated).
pub(in crate::arch::glm5) fn init(g: &Heads, st: &mut [f32]) {
    st.fill(0.0);
    st[g.dv] = f32::NEG_INFINITY;
}

/// Folds one block of keys into (row, head)'s running state `st`: `kvf` holds the block's
/// rebuilt `[k_nope ; v]` per head (`heads × (dn + dv)` per key, key `first` first), `k_pe`
/// every key's rope part from position 0. The scores are the same sums as the absorbed form's
/// (`q_nope · k_nope + q_pe · k_pe`, times the scale); the running maximum rescales what came
/// before, as in FlashAttention.
#[allow(clippy::too_many_arguments)]
pub(in crate::arch::glm5) fn absorb_block(
    g: &Heads,
    qh: &[f32],
    head: usize,
    first: usize,
    k_pe: &[f32],
    kvf: &[f32],
    keys: Keys<'_>,
    st: &mut [f32],
) {
    let Some(p) = weigh(g, qh, head, first, k_pe, kvf, &keys, st) else {
        return;
    };
    let (stride, base) = (g.heads * (g.dn + g.dv), head * (g.dn + g.dv) + g.dn);
    let acc = &mut st[..g.dv];
    let mut i = 0;
    keys.for_each(|t| {
        scaled_add(acc, p[i], &kvf[(t - first) * stride + base..][..g.dv]);
        i += 1;
    });
}

/// The first half of [`absorb_block`]: the keys' scores, the running maximum (rescaling what
/// came before) and the weights' sum; returns each key's weight `exp(s − m)` for the values
/// (`None`: no key, or none with a finite score, so nothing changes).
#[allow(clippy::too_many_arguments)]
fn weigh(
    g: &Heads,
    qh: &[f32],
    head: usize,
    first: usize,
    k_pe: &[f32],
    kvf: &[f32],
    keys: &Keys<'_>,
    st: &mut [f32],
) -> Option<Vec<f32>> {
    if keys.len() == 0 {
        return None;
    }
    let (dn, dv, dr) = (g.dn, g.dv, g.dr);
    let stride = g.heads * (dn + dv);
    let base = head * (dn + dv);
    // Four keys at a time against the row's query (`dot4` with the roles swapped: a product
    // commutes exactly, so each score is the canonical `dot(q, k)`), four chains side by side.
    let nope = |t: usize| &kvf[(t - first) * stride + base..][..dn];
    let rope = |t: usize| &k_pe[t * dr..(t + 1) * dr];
    let mut s = Vec::with_capacity(keys.len());
    let (mut quad, mut n) = ([0usize; DOT4], 0);
    keys.for_each(|t| {
        quad[n] = t;
        n += 1;
        if n == DOT4 {
            let a = dot4(quad.map(nope), &qh[..dn]);
            let b = dot4(quad.map(rope), &qh[dn..]);
            s.extend((0..DOT4).map(|j| (a[j] + b[j]) * g.scale));
            n = 0;
        }
    });
    for &t in &quad[..n] {
        s.push((dot(&qh[..dn], nope(t)) + dot(&qh[dn..], rope(t))) * g.scale);
    }
    weigh_scores(g, s, st)
}

/// [`weigh`] from the keys' scores `s` (in key order).
fn weigh_scores(g: &Heads, mut s: Vec<f32>, st: &mut [f32]) -> Option<Vec<f32>> {
    if s.is_empty() {
        return None;
    }
    let (acc, ml) = st.split_at_mut(g.dv);
    let bmax = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let m = ml[0].max(bmax);
    if m == f32::NEG_INFINITY {
        return None;
    }
    if ml[0] != m {
        // exp(−∞) = 0 clears the empty start; otherwise what came before shrinks.
        let c = (ml[0] - m).exp();
        acc.iter_mut().for_each(|a| *a *= c);
        ml[1] *= c;
        ml[0] = m;
    }
    for v in &mut s {
        *v = (*v - m).exp();
        ml[1] += *v;
    }
    Some(s)
}

/// The (row, head)'s output from its running state: the output divided by the weights' sum
/// (zero when no key was visible, as the softmax of nothing).
pub(in crate::arch::glm5) fn finish(g: &Heads, st: &[f32], out: &mut [f32]) {
    let l = st[g.dv + 1];
    if l == 0.0 {
        out.fill(0.0);
        return;
    }
    let inv = 1.0 / l;
    for (o, &a) in out.iter_mut().zip(&st[..g.dv]) {
        *o = a * inv;
    }
}

/// Keys per tile: one head's slice of a tile (`dn + dv` rebuilt plus `dr` rope floats per key,
/// 256 KiB at GLM-5.2's 192 + 256 + 64) stays in L2 while a group of rows reads it.
pub(in crate::arch::glm5) const TILE_KEYS: usize = 128;
/// Query rows of one head that share each tile: every tile is read from L3 once per group
/// instead of once per row (attention at 4k tokens was bound by those reads, not by its
/// arithmetic).
pub(in crate::arch::glm5) const GROUP_ROWS: usize = 16;

/// One query row as a task sees it: its head's query, its position, and its selected keys
/// (ascending, only those it can see) once the DSA indexer selects.
#[derive(Debug, Clone, Copy)]
pub(in crate::arch::glm5) struct Row<'a> {
    pub qh: &'a [f32],
    pub pos: usize,
    pub listed: Option<&'a [u32]>,
}

/// Folds the rebuilt block of keys `first..first + kvf.len() / stride` into the running states
/// of a group of rows of one head (`st`: one [`Heads::state_len`] slice per row), tile by tile
/// of `tile` keys, so each tile is read once for the whole group. A row's result depends only
/// on the tiles (their size and the blocks' starts), never on the group it ran in.
#[allow(clippy::too_many_arguments)]
pub(in crate::arch::glm5) fn fold_group(
    g: &Heads,
    head: usize,
    first: usize,
    tile: usize,
    k_pe: &[f32],
    kvf: &[f32],
    rows: &[Row<'_>],
    st: &mut [f32],
) {
    let end = first + kvf.len() / (g.heads * (g.dn + g.dv));
    let last = rows.iter().map(|r| r.pos).max().unwrap_or(0);
    let (stride, base) = (g.heads * (g.dn + g.dv), head * (g.dn + g.dv) + g.dn);
    for t0 in (first..end.min(last + 1)).step_by(tile.max(1)) {
        let t1 = (t0 + tile.max(1)).min(end);
        // Rows that see the whole tile take its values four at a time (`scaled_add4`: each
        // key's values read once for four rows, the same bits); the others key by key.
        let mut whole: Vec<(&mut [f32], Vec<f32>)> = Vec::new();
        // Rows that see the whole tile, scored four at a time against each key (`dot4`: each
        // key's slice loaded once for four rows, every score the same canonical chain).
        let mut spans: Vec<(&Row<'_>, &mut [f32])> = Vec::new();
        for (r, s) in rows.iter().zip(st.chunks_exact_mut(g.state_len())) {
            let keys = match r.listed {
                Some(k) => {
                    let lo = k.partition_point(|&x| (x as usize) < t0);
                    let hi = k.partition_point(|&x| (x as usize) < t1);
                    Keys::Listed(&k[lo..hi])
                }
                None => Keys::Span(t0..t1.min(r.pos + 1).max(t0)),
            };
            match keys {
                Keys::Span(ref span) if span.end == t1 && span.start == t0 => spans.push((r, s)),
                _ => absorb_block(g, r.qh, head, first, k_pe, kvf, keys, s),
            }
        }
        let scores = span_scores(g, head, (first, t0..t1), k_pe, kvf, &spans);
        for ((_, s), sc) in spans.into_iter().zip(scores) {
            if let Some(p) = weigh_scores(g, sc, s) {
                whole.push((s, p));
            }
        }
        let values = &kvf[(t0 - first) * stride + base..];
        let mut quads = whole.chunks_exact_mut(ROWS4);
        for q in &mut quads {
            let [a, b, c, d] = q else {
                unreachable!("chunks of four")
            };
            scaled_add4(
                [
                    &mut a.0[..g.dv],
                    &mut b.0[..g.dv],
                    &mut c.0[..g.dv],
                    &mut d.0[..g.dv],
                ],
                [&a.1, &b.1, &c.1, &d.1],
                values,
                stride,
            );
        }
        for (s, p) in quads.into_remainder() {
            for (k, &w) in p.iter().enumerate() {
                scaled_add(&mut s[..g.dv], w, &values[k * stride..][..g.dv]);
            }
        }
    }
}

/// The scores of the keys `t0..t1` (all of them) for each of `rows`, four rows per key load
/// ([`dot4`]; the rest one by one): the same values as [`weigh`]'s, key order.
fn span_scores(
    g: &Heads,
    head: usize,
    (first, span): (usize, std::ops::Range<usize>),
    k_pe: &[f32],
    kvf: &[f32],
    rows: &[(&Row<'_>, &mut [f32])],
) -> Vec<Vec<f32>> {
    let (dn, dr) = (g.dn, g.dr);
    let (stride, base) = (g.heads * (dn + g.dv), head * (dn + g.dv));
    let mut out: Vec<Vec<f32>> = vec![Vec::with_capacity(span.len()); rows.len()];
    let q = |i: usize| rows[i].0.qh;
    let mut i = 0;
    while i + DOT4 <= rows.len() {
        let (nope, rope) = (
            [0, 1, 2, 3].map(|j| &q(i + j)[..dn]),
            [0, 1, 2, 3].map(|j| &q(i + j)[dn..]),
        );
        for t in span.clone() {
            let kv = &kvf[(t - first) * stride + base..][..dn];
            let (a, b) = (dot4(nope, kv), dot4(rope, &k_pe[t * dr..(t + 1) * dr]));
            for j in 0..DOT4 {
                out[i + j].push((a[j] + b[j]) * g.scale);
            }
        }
        i += DOT4;
    }
    for (i, o) in out.iter_mut().enumerate().skip(i) {
        for t in span.clone() {
            let kv = &kvf[(t - first) * stride + base..][..dn];
            o.push(
                (dot(&q(i)[..dn], kv) + dot(&q(i)[dn..], &k_pe[t * dr..(t + 1) * dr])) * g.scale,
            );
        }
    }
    out
}

/// Whether rebuilding K/V for all `keys` of a sequence costs less arithmetic than the absorbed
/// form for its `rows` queries, which attend to `attended` (row, key) pairs in all. Both forms
/// project with kv_b's weights once per item — the rebuild once per key, the absorbed form
/// once per query (`W_UK` into the query, `W_UV` out of the latent) — then pay per (row, key,
/// head) `dn + dr + dv` against `2·rank + dr`. So a fresh prompt (rows = keys) always
/// reconstructs, and a short continuation of a long cache (a new turn, an MTP catch-up)
/// stays absorbed. Multiply-adds; the kernels' rates differ by less than the forms do.
pub(in crate::arch::glm5) fn reconstruction_pays(
    g: &Heads,
    rank: usize,
    rows: usize,
    keys: usize,
    attended: usize,
) -> bool {
    let project = (g.heads * rank * (g.dn + g.dv)) as f64;
    let per_pair = |w: usize| (attended * g.heads * w) as f64;
    let rebuilt = keys as f64 * project + per_pair(g.dn + g.dr + g.dv);
    let absorbed = rows as f64 * project + per_pair(2 * rank + g.dr);
    rebuilt <= absorbed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g() -> Heads {
        Heads {
            heads: 2,
            dn: 3,
            dr: 2,
            dv: 4,
            scale: 0.5,
        }
    }

    fn fill(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + seed * 104_729) % 211) as f32 / 53.0 - 2.0)
            .collect()
    }

    /// The plain softmax-then-sum in f64: the reference the blocked form must match.
    fn reference(
        g: &Heads,
        qh: &[f32],
        head: usize,
        k_pe: &[f32],
        kvf: &[f32],
        keys: &[usize],
    ) -> Vec<f64> {
        let stride = g.heads * (g.dn + g.dv);
        let base = head * (g.dn + g.dv);
        let s: Vec<f64> = keys
            .iter()
            .map(|&t| {
                let kv = &kvf[t * stride + base..];
                let a: f64 = (0..g.dn).map(|d| qh[d] as f64 * kv[d] as f64).sum();
                let b: f64 = (0..g.dr)
                    .map(|d| qh[g.dn + d] as f64 * k_pe[t * g.dr + d] as f64)
                    .sum();
                (a + b) * g.scale as f64
            })
            .collect();
        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|&x| (x - m).exp()).collect();
        let l: f64 = e.iter().sum();
        let mut out = vec![0.0; g.dv];
        for (&t, &p) in keys.iter().zip(&e) {
            for (d, o) in out.iter_mut().enumerate() {
                *o += p / l * kvf[t * stride + base + g.dn + d] as f64;
            }
        }
        out
    }

    fn assert_close(out: &[f32], want: &[f64], what: &str) {
        for (a, b) in out.iter().zip(want) {
            assert!((*a as f64 - b).abs() < 1e-5, "{what}: {a} vs {b}");
        }
    }

    /// Folds `rows` (each head in turn, tiles of `tile` keys over the block of `kvf` that starts
    /// at key `first`) as one group and each row alone: every row's running state has the same
    /// bits both ways, and its output is the softmax over its keys (f64 reference).
    fn check_group(
        g: &Heads,
        first: usize,
        tile: usize,
        k_pe: &[f32],
        kvf: &[f32],
        rows: &[Row<'_>],
    ) {
        let (sl, stride) = (g.state_len(), g.heads * (g.dn + g.dv));
        let fresh = |n: usize| {
            let mut st = vec![0.0; n * sl];
            st.chunks_exact_mut(sl).for_each(|s| init(g, s));
            st
        };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for head in 0..g.heads {
            let fold = |rows: &[Row<'_>], st: &mut [f32]| {
                fold_group(g, head, first, tile, k_pe, &kvf[first * stride..], rows, st)
            };
            let mut together = fresh(rows.len());
            fold(rows, &mut together);
            for (j, r) in rows.iter().enumerate() {
                let mut alone = fresh(1);
                fold(&[*r], &mut alone);
                let in_group = &together[j * sl..(j + 1) * sl];
                assert_eq!(bits(&alone), bits(in_group), "row {j} head {head}");
                let mut out = vec![0.0; g.dv];
                finish(g, &alone, &mut out);
                let keys: Vec<usize> = match r.listed {
                    Some(k) => k.iter().map(|&x| x as usize).collect(),
                    None => (first..=r.pos).collect(),
                };
                let want = reference(g, r.qh, head, k_pe, kvf, &keys);
                assert_close(&out, &want, &format!("row {j} head {head}"));
            }
        }
    }

    /// Any split of the keys into blocks (one block, several, blocks a row sees nothing of)
    /// gives the softmax-weighted sum within f32 rounding, for listed and spanned keys.
    #[test]
    fn blocks_of_keys_fold_into_the_softmax() {
        let g = g();
        let t = 11;
        let q = fill(g.dn + g.dr, 1);
        let k_pe = fill(t * g.dr, 2);
        let kvf = fill(t * g.heads * (g.dn + g.dv), 3);
        let stride = g.heads * (g.dn + g.dv);
        let listed: Vec<u32> = vec![0, 2, 3, 7, 8, 10];
        for head in 0..g.heads {
            for block in [1, 2, 3, 5, 11, 20] {
                for sel in [None, Some(&listed)] {
                    let mut st = vec![0.0; g.state_len()];
                    init(&g, &mut st);
                    for first in (0..t).step_by(block) {
                        let end = (first + block).min(t);
                        let keys = match sel {
                            None => Keys::Span(first..end),
                            Some(k) => {
                                let lo = k.partition_point(|&x| (x as usize) < first);
                                let hi = k.partition_point(|&x| (x as usize) < end);
                                Keys::Listed(&k[lo..hi])
                            }
                        };
                        absorb_block(
                            &g,
                            &q,
                            head,
                            first,
                            &k_pe,
                            &kvf[first * stride..end * stride],
                            keys,
                            &mut st,
                        );
                    }
                    let mut out = vec![0.0; g.dv];
                    finish(&g, &st, &mut out);
                    let keys: Vec<usize> = match sel {
                        None => (0..t).collect(),
                        Some(k) => k.iter().map(|&x| x as usize).collect(),
                    };
                    let want = reference(&g, &q, head, &k_pe, &kvf, &keys);
                    assert_close(&out, &want, &format!("block {block} head {head}"));
                }
            }
        }
    }

    /// A group of rows folds tile by tile: each row's bits equal folding it alone, and its
    /// value the softmax over the keys it can see (causal rows and listed rows, a block that
    /// starts past 0, a tile that does not divide the block).
    #[test]
    fn groups_of_rows_share_tiles_without_changing_a_row() {
        let g = g();
        let (t, first, dq) = (13, 4, g.dn + g.dr);
        let stride = g.heads * (g.dn + g.dv);
        let k_pe = fill(t * g.dr, 5);
        let kvf = fill(t * stride, 6);
        let qs = fill(5 * dq, 7);
        let listed: Vec<u32> = vec![4, 6, 9, 12];
        let rows: Vec<Row<'_>> = (0..5)
            .map(|j| Row {
                qh: &qs[j * dq..(j + 1) * dq],
                pos: 6 + j,
                listed: (j % 2 == 1)
                    .then_some(&listed[..listed.partition_point(|&x| x as usize <= 6 + j)]),
            })
            .collect();
        // Tiles of 3 keys over the block that starts at `first`.
        check_group(&g, first, 3, &k_pe, &kvf, &rows);
    }

    /// Rows that see a whole tile take its values four at a time (`scaled_add4`, 64 columns in
    /// registers plus a tail here: dv = 80); the others key by key. Every row keeps the bits it
    /// has alone (where no quad forms) and the softmax's value.
    #[test]
    fn whole_tile_rows_four_at_a_time_keep_their_bits() {
        let g = Heads {
            heads: 2,
            dn: 8,
            dr: 4,
            dv: 80,
            scale: 0.25,
        };
        let (t, first, dq) = (40, 3, g.dn + g.dr);
        let stride = g.heads * (g.dn + g.dv);
        let k_pe = fill(t * g.dr, 11);
        let kvf = fill(t * stride, 12);
        let qs = fill(11 * dq, 13);
        let listed: Vec<u32> = (3..40).filter(|x| x % 3 != 0).collect();
        // Eleven rows at positions 20..40 by twos; every third one with a DSA selection.
        let rows: Vec<Row<'_>> = (0..11)
            .map(|j| Row {
                qh: &qs[j * dq..(j + 1) * dq],
                pos: 19 + 2 * j,
                listed: (j % 3 == 1)
                    .then_some(&listed[..listed.partition_point(|&x| x as usize <= 19 + 2 * j)]),
            })
            .collect();
        check_group(&g, first, 8, &k_pe, &kvf, &rows);
    }

    /// A row's scores four keys at a time are the canonical `dot(q, k)` per key, bit for bit
    /// (quads and a remainder; selected keys out of order of their blocks' rows).
    #[test]
    fn keys_scored_four_at_a_time_keep_their_bits() {
        let g = Heads {
            heads: 2,
            dn: 24,
            dr: 8,
            dv: 16,
            scale: 0.3,
        };
        let (t, first, dq) = (30, 2, g.dn + g.dr);
        let stride = g.heads * (g.dn + g.dv);
        let (k_pe, kvf, qh) = (fill(t * g.dr, 21), fill(t * stride, 22), fill(dq, 23));
        let listed: Vec<u32> = vec![2, 3, 5, 8, 13, 21, 29];
        for head in 0..g.heads {
            let mut got = vec![0.0; g.state_len()];
            init(&g, &mut got);
            absorb_block(
                &g,
                &qh,
                head,
                first,
                &k_pe,
                &kvf,
                Keys::Listed(&listed),
                &mut got,
            );
            let base = head * (g.dn + g.dv);
            let s: Vec<f32> = listed
                .iter()
                .map(|&t| {
                    let t = t as usize;
                    let kv = &kvf[(t - first) * stride + base..];
                    (dot(&qh[..g.dn], &kv[..g.dn]) + dot(&qh[g.dn..], &k_pe[t * g.dr..][..g.dr]))
                        * g.scale
                })
                .collect();
            let mut want = vec![0.0; g.state_len()];
            init(&g, &mut want);
            let p = weigh_scores(&g, s, &mut want).unwrap();
            for (k, &t) in listed.iter().enumerate() {
                let v = &kvf[(t as usize - first) * stride + base + g.dn..][..g.dv];
                scaled_add(&mut want[..g.dv], p[k], v);
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "head {head}");
        }
    }

    /// A row with no visible key gets zeros, not NaN.
    #[test]
    fn no_keys_give_zeros() {
        let g = g();
        let mut st = vec![0.0; g.state_len()];
        init(&g, &mut st);
        absorb_block(&g, &[0.0; 5], 0, 4, &[], &[], Keys::Span(4..4), &mut st);
        let mut out = vec![1.0; g.dv];
        finish(&g, &st, &mut out);
        assert_eq!(out, vec![0.0; g.dv]);
    }

    /// GLM-5.2's geometry: a fresh prompt of any length reconstructs; a 64-token turn after
    /// 10,000 cached tokens, or 5 MTP catch-up rows after 2,000, stays absorbed.
    #[test]
    fn the_cheaper_form_is_chosen() {
        let g = Heads {
            heads: 64,
            dn: 192,
            dr: 64,
            dv: 256,
            scale: 1.0,
        };
        let attended = |rows: usize, start: usize| -> usize {
            (start..start + rows).map(|p| (p + 1).min(2048)).sum()
        };
        for p in [5, 100, 2048, 2341, 8192, 20000] {
            assert!(reconstruction_pays(&g, 512, p, p, attended(p, 0)), "{p}");
        }
        assert!(!reconstruction_pays(
            &g,
            512,
            64,
            10_064,
            attended(64, 10_000)
        ));
        assert!(!reconstruction_pays(&g, 512, 5, 2_005, attended(5, 2_000)));
        // A long continuation amortises the rebuild again.
        assert!(reconstruction_pays(
            &g,
            512,
            4096,
            14_096,
            attended(4096, 10_000)
        ));
    }
}
