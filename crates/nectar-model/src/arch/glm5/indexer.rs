//! The DSA lightning indexer (`specs/glm5-architecture.md` §5.8).
//!
//! Full layers compute indexer keys for every token (cached from token 0, even while nothing is
//! pruned) and, once a query sees more than `index_topk` keys, score all visible keys and keep
//! the top k. Tie rule (deterministic, identical in prefill, decode and verify): higher score
//! first, then the lower position; NaN scores rank last.
use super::layout::Layout;
use super::phases::{Lap, Phase};
use crate::blocks::{Linear, Loader};
use crate::cache::LayerCache;
use crate::error::Result;
use nectar_kernels::{index_score, layer_norm, team, RopeTable};
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};

/// Rows whose scores (`rows × visible keys` f32) are held at once: 512 rows of a 10k-token
/// prompt are 20 MB.
const SCORE_BLOCK: usize = 512;
/// Keys scored per task on the CPU (128 at GLM-5.2's 128-dim keys: 64 KB of keys per task).
const KEY_CHUNK: usize = 128;

/// Rows of a block up to which its scores read the keys from the cache's VRAM mirror (decode,
/// MTP, verify) rather than uploading them.
#[cfg(feature = "cuda")]
const GPU_MIN_ROWS: usize = 4;

/// ε of the indexer key LayerNorm.
const K_NORM_EPS: f32 = 1e-6;

/// One full layer's indexer weights.
#[derive(Debug)]
pub struct Indexer {
    wq_b: Linear,
    wk: Linear,
    k_norm_w: Vec<f32>,
    k_norm_b: Vec<f32>,
    weights_proj: Linear,
    heads: usize,
    dim: usize,
    topk: usize,
    /// Rows whose scores ran on the GPU, since load.
    gpu_rows: AtomicU64,
}

impl Indexer {
    /// Every matrix (the placement order of `--gpu-memory`).
    pub(super) fn linears_mut(&mut self) -> Vec<&mut Linear> {
        vec![&mut self.wk, &mut self.wq_b, &mut self.weights_proj]
    }

    /// Loads `{prefix}self_attn.indexer.*`.
    pub fn load(ld: &Loader<'_>, prefix: &str, cfg: &super::Config) -> Result<Self> {
        let r = &cfg.raw;
        let p = |s: &str| format!("{prefix}self_attn.indexer.{s}");
        Ok(Indexer {
            wq_b: ld.linear(
                &p("wq_b.weight"),
                r.index_n_heads * r.index_head_dim,
                r.q_lora_rank,
            )?,
            wk: ld.linear(&p("wk.weight"), r.index_head_dim, r.hidden_size)?,
            k_norm_w: ld.vector(&p("k_norm.weight"), r.index_head_dim)?,
            k_norm_b: ld.vector(&p("k_norm.bias"), r.index_head_dim)?,
            weights_proj: ld.linear(&p("weights_proj.weight"), r.index_n_heads, r.hidden_size)?,
            heads: r.index_n_heads,
            dim: r.index_head_dim,
            topk: r.index_topk,
            gpu_rows: AtomicU64::new(0),
        })
    }

    /// Rows whose scores ran on the GPU since load.
    pub fn gpu_rows(&self) -> u64 {
        self.gpu_rows.load(AtomicOrdering::Relaxed)
    }

    /// Bytes of weights.
    pub fn bytes(&self) -> usize {
        self.wq_b.bytes() + self.wk.bytes() + self.weights_proj.bytes() + (self.k_norm_w.len() * 8)
    }

    /// Appends the indexer keys of all rows to their caches, then returns each row's selection
    /// (`None` = every visible key, the exact dense fallback while `pos + 1 <= index_topk`).
    /// The scores run on the GPU when the indexer's matrices are in VRAM (bit for bit the CPU's,
    /// so the selection is the same; `NECTAR_GPU_INDEXER=off` keeps them on the CPU); decode
    /// rows read the keys from the caches' VRAM mirrors where the layer's attention keeps them
    /// (`mirrored`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run(
        &self,
        h: &[f32],
        cq: &[f32],
        layout: &Layout,
        caches: &mut [&mut LayerCache],
        rope: &RopeTable,
        mirrored: bool,
        lap: &mut Lap<'_>,
    ) -> Result<Vec<Option<Vec<u32>>>> {
        let m = layout.rows.len();
        let mut k = self.wk.forward(h, m)?;
        let mut normed = vec![0.0; self.dim];
        for (row, kr) in layout.rows.iter().zip(k.chunks_exact_mut(self.dim)) {
            layer_norm(kr, &self.k_norm_w, &self.k_norm_b, K_NORM_EPS, &mut normed);
            kr.copy_from_slice(&normed);
            rope.apply(&mut kr[..rope.dim()], row.rope);
            caches[row.seq].index_k.extend_from_slice(kr);
        }
        lap.mark(Phase::IndexerKeys);
        let need: Vec<usize> = (0..m)
            .filter(|&i| layout.rows[i].pos + 1 > self.topk)
            .collect();
        let mut out: Vec<Option<Vec<u32>>> = vec![None; m];
        if need.is_empty() {
            return Ok(out);
        }
        let hd = h.len() / m;
        let qd = cq.len() / m;
        let mut q = self.wq_b.forward(&rows_of(cq, qd, &need), need.len())?;
        let mut w = self
            .weights_proj
            .forward(&rows_of(h, hd, &need), need.len())?;
        let head_scale = (self.heads as f32).powf(-0.5);
        w.iter_mut().for_each(|x| *x *= head_scale);
        let hq = self.heads * self.dim;
        // Row by row on the compute team, the angles once per row for all its heads.
        team::for_each_row_mut(&mut q, hq, |j, qr| {
            let sc = rope.sin_cos(layout.rows[need[j]].rope);
            for qh in qr.chunks_exact_mut(self.dim) {
                RopeTable::rotate(&mut qh[..rope.dim()], &sc);
            }
        });
        lap.mark(Phase::IndexerProj);
        let qk_scale = (self.dim as f32).powf(-0.5);
        // Blocks of rows of one sequence (rows of a sequence are contiguous in the layout), so
        // that at most SCORE_BLOCK rows' scores exist at once.
        let mut j0 = 0;
        while j0 < need.len() {
            let seq = layout.rows[need[j0]].seq;
            let mut j1 = j0 + 1;
            while j1 < need.len() && j1 - j0 < SCORE_BLOCK && layout.rows[need[j1]].seq == seq {
                j1 += 1;
            }
            let pos: Vec<usize> = need[j0..j1].iter().map(|&i| layout.rows[i].pos).collect();
            let t = pos.iter().max().map_or(0, |p| p + 1);
            let (qb, wb) = (&q[j0 * hq..j1 * hq], &w[j0 * self.heads..j1 * self.heads]);
            let gpu = self.gpu_scores(&mut *caches[seq], t, (qb, wb), &pos, qk_scale, mirrored)?;
            let keys = &caches[seq].index_k[..t * self.dim];
            // Scores `[row][stride]`; a row's keys past its position are never read.
            let (scores, stride) = match gpu {
                Some(s) => s,
                None => cpu_scores((qb, wb), self.heads, keys, self.dim, &pos, qk_scale),
            };
            lap.mark(Phase::IndexerScores);
            let sels = team::map(j1 - j0, |r| {
                top_k_positions(&scores[r * stride..][..pos[r] + 1], self.topk)
            });
            for (&i, s) in need[j0..j1].iter().zip(sels) {
                out[i] = Some(s);
            }
            lap.mark(Phase::IndexerTopk);
            j0 = j1;
        }
        Ok(out)
    }

    /// The scores of one block of rows of one sequence on the GPU, with their row stride, or
    /// `None` (the CPU scores them): blocks of more than [`GPU_MIN_ROWS`] rows upload the
    /// sequence's keys (`t` of them); smaller ones (decode, MTP, verify) read them from the
    /// cache's VRAM mirror, synced here (one key per step), when the layer's attention mirrors
    /// its caches (`mirrored`) and a row sees at least `gpu_decode_min_keys` keys.
    #[cfg(feature = "cuda")]
    fn gpu_scores(
        &self,
        cache: &mut LayerCache,
        t: usize,
        (q, w): (&[f32], &[f32]),
        pos: &[usize],
        qk_scale: f32,
        mirrored: bool,
    ) -> Result<Option<(Vec<f32>, usize)>> {
        let Some(gpu) = self.wq_b.gpu().filter(|_| gpu_enabled()) else {
            return Ok(None);
        };
        if self.dim > nectar_cuda::INDEX_MAX_DIM {
            return Ok(None);
        }
        let gpu_err = |e: nectar_cuda::Error| crate::error::Error::Gpu(e.to_string());
        let pos32: Vec<u32> = pos.iter().map(|&p| p as u32).collect();
        let scored = if pos.len() > GPU_MIN_ROWS {
            let keys = &cache.index_k[..t * self.dim];
            let s = gpu.index_scores(keys, self.dim, self.heads, q, w, &pos32, qk_scale);
            (s.map_err(gpu_err)?, t)
        } else {
            let min = super::attention::gpu_decode_min_keys();
            if !mirrored || pos.iter().all(|&p| p + 1 < min) || !cache.sync_device(gpu)? {
                return Ok(None);
            }
            let m = cache.device().expect("synced above");
            let rows = nectar_cuda::IndexRows {
                heads: self.heads,
                q,
                w,
                pos: &pos32,
                qk_scale,
            };
            let s = gpu.index_scores_mirrored(m, rows);
            (s.map_err(gpu_err)?, m.synced())
        };
        self.gpu_rows
            .fetch_add(pos.len() as u64, AtomicOrdering::Relaxed);
        Ok(Some(scored))
    }

    #[cfg(not(feature = "cuda"))]
    fn gpu_scores(
        &self,
        _cache: &mut LayerCache,
        _t: usize,
        _qw: (&[f32], &[f32]),
        _pos: &[usize],
        _qk_scale: f32,
        _mirrored: bool,
    ) -> Result<Option<(Vec<f32>, usize)>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
fn gpu_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        !matches!(
            std::env::var("NECTAR_GPU_INDEXER").as_deref(),
            Ok("off" | "0")
        )
    })
}

/// Rows `need` (ascending) of `src` (`d` wide): read in place when they are consecutive (a
/// prompt's rows past index_topk: a sequence's rows are contiguous, positions ascending),
/// gathered otherwise.
fn rows_of<'a>(src: &'a [f32], d: usize, need: &[usize]) -> std::borrow::Cow<'a, [f32]> {
    match need.first() {
        Some(&first) if need.windows(2).all(|p| p[1] == p[0] + 1) => {
            std::borrow::Cow::Borrowed(&src[first * d..(first + need.len()) * d])
        }
        _ => need
            .iter()
            .flat_map(|&i| src[i * d..(i + 1) * d].iter().copied())
            .collect(),
    }
}

/// The scores of `pos.len()` rows (queries `q`: `heads × dim` each, head weights `w`:
/// `heads` each) against `keys` (`dim` each; row `r` sees keys `0..=pos[r]`), as `[row][stride]`
/// with their stride: one task per (row, chunk of [`KEY_CHUNK`] keys) on the compute team, so
/// that a decode row's scores use every core; each score is computed alone (the same bits in
/// any split). Keys past a row's position are left at 0 and never read.
pub(super) fn cpu_scores(
    (q, w): (&[f32], &[f32]),
    heads: usize,
    keys: &[f32],
    dim: usize,
    pos: &[usize],
    qk_scale: f32,
) -> (Vec<f32>, usize) {
    let hq = heads * dim;
    let t = pos.iter().max().map_or(0, |p| p + 1);
    let chunks = t.div_ceil(KEY_CHUNK);
    let stride = chunks * KEY_CHUNK;
    let mut s = vec![0.0f32; pos.len() * stride];
    team::for_each_chunk_mut(&mut s, KEY_CHUNK, |k, out| {
        let (r, first) = (k / chunks, (k % chunks) * KEY_CHUNK);
        let (qr, wr) = (&q[r * hq..][..hq], &w[r * heads..][..heads]);
        let visible = (pos[r] + 1).saturating_sub(first).min(KEY_CHUNK);
        let ks = &keys[first * dim..(first + visible) * dim];
        for (st, kt) in out.iter_mut().zip(ks.chunks_exact(dim)) {
            *st = index_score(qr, wr, kt, qk_scale);
        }
    });
    (s, stride)
}

/// Positions of the `k` best scores (higher score first, then lower position; NaN last),
/// returned in ascending position order.
///
/// The scores are mapped to integers in the same order (−0.0 equal to +0.0, NaN equal to
/// −∞, as the comparison by `partial_cmp` treats them), the k-th best key is selected among
/// those integers, and one pass in position order keeps every key above it and the first of
/// those equal to it — so the positions come out sorted with no sort and no indirection (at
/// 8,192 keys and k = 2,048: 22–31 µs against 39–62 µs for the select-then-sort over positions
/// it replaces, on a Zen 5 core; the same result: `matches_select_then_sort` below).
pub fn top_k_positions(scores: &[f32], k: usize) -> Vec<u32> {
    let n = scores.len();
    if k >= n {
        return (0..n as u32).collect();
    }
    if k == 0 {
        return Vec::new();
    }
    let keys: Vec<u32> = scores.iter().map(|&s| order_key(s)).collect();
    let mut tmp = keys.clone();
    let th = *tmp.select_nth_unstable(n - k).1;
    // tmp[n - k + 1..] holds the keys at or above th past the k-th: those above it are kept.
    let above = tmp[n - k + 1..].iter().filter(|&&x| x > th).count();
    let mut ties = k - above;
    let mut out = Vec::with_capacity(k);
    for (i, &x) in keys.iter().enumerate() {
        if x > th || (x == th && ties > 0) {
            ties -= usize::from(x == th);
            out.push(i as u32);
        }
    }
    out
}

/// An integer that orders as the score does in [`top_k_positions`]: ascending with the f32
/// value, −0.0 equal to +0.0, NaN equal to −∞.
fn order_key(s: f32) -> u32 {
    let s = if s.is_nan() {
        f32::NEG_INFINITY
    } else if s == 0.0 {
        0.0 // −0.0 too
    } else {
        s
    };
    let b = s.to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Ordering;

    #[test]
    fn rows_are_read_in_place_when_consecutive_and_gathered_otherwise() {
        let src: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let run = rows_of(&src, 3, &[1, 2]);
        assert!(matches!(run, std::borrow::Cow::Borrowed(_)));
        assert_eq!(&*run, &[3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        let gathered = rows_of(&src, 3, &[0, 3]);
        assert!(matches!(gathered, std::borrow::Cow::Owned(_)));
        assert_eq!(&*gathered, &[0.0, 1.0, 2.0, 9.0, 10.0, 11.0]);
        assert!(rows_of(&src, 3, &[]).is_empty());
    }

    #[test]
    fn ties_prefer_lower_positions_and_nan_ranks_last() {
        let s = [1.0, 3.0, 2.0, 3.0, f32::NAN, 2.0, 0.5];
        assert_eq!(top_k_positions(&s, 3), [1, 2, 3]);
        assert_eq!(top_k_positions(&s, 4), [1, 2, 3, 5]);
        assert_eq!(top_k_positions(&s, 7), [0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(top_k_positions(&[f32::NAN, 0.0], 1), [1]);
        assert_eq!(
            top_k_positions(&[-0.0, 0.0, f32::NEG_INFINITY, f32::NAN], 3),
            [0, 1, 2]
        );
        assert!(top_k_positions(&s, 0).is_empty());
    }

    /// The select-then-sort over positions that [`top_k_positions`] replaced, as it was.
    /// (It underflowed at k = 0, which the model never asks for.)
    fn select_then_sort(scores: &[f32], k: usize) -> Vec<u32> {
        if k == 0 {
            return Vec::new();
        }
        let mut idx: Vec<u32> = (0..scores.len() as u32).collect();
        if k < idx.len() {
            let key = |i: &u32| {
                let s = scores[*i as usize];
                if s.is_nan() {
                    f32::NEG_INFINITY
                } else {
                    s
                }
            };
            let cmp = |a: &u32, b: &u32| {
                key(b)
                    .partial_cmp(&key(a))
                    .unwrap_or(Ordering::Equal)
                    .then(a.cmp(b))
            };
            idx.select_nth_unstable_by(k - 1, cmp);
            idx.truncate(k);
        }
        idx.sort_unstable();
        idx
    }

    proptest::proptest! {
        #[test]
        fn matches_select_then_sort(
            // Few distinct values (ties), signed zeros, infinities, NaN, and plain floats.
            raw in proptest::collection::vec((0u8..12, proptest::num::f32::NORMAL), 0..300),
            k in 0usize..320,
        ) {
            let scores: Vec<f32> = raw
                .iter()
                .map(|&(c, f)| match c {
                    0 => 0.0,
                    1 => -0.0,
                    2 => f32::NAN,
                    3 => f32::INFINITY,
                    4 => f32::NEG_INFINITY,
                    5 => 1.5,
                    6 => -1.5,
                    _ => f,
                })
                .collect();
            proptest::prop_assert_eq!(top_k_positions(&scores, k), select_then_sort(&scores, k));
        }
    }
}
