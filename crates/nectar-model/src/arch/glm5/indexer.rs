//! The DSA lightning indexer (`specs/glm5-architecture.md` §5.8).
//!
//! Full layers compute indexer keys for every token (cached from token 0, even while nothing is
//! pruned) and, once a query sees more than `index_topk` keys, score all visible keys and keep
//! the top k. Tie rule (deterministic, identical in prefill, decode and verify): higher score
//! first, then the lower position; NaN scores rank last.
use super::layout::Layout;
use crate::blocks::{Linear, Loader};
use crate::cache::LayerCache;
use crate::error::Result;
use nectar_kernels::{dot, layer_norm, team, RopeTable};
use std::cmp::Ordering;

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
        })
    }

    /// Bytes of weights.
    pub fn bytes(&self) -> usize {
        self.wq_b.bytes() + self.wk.bytes() + self.weights_proj.bytes() + (self.k_norm_w.len() * 8)
    }

    /// Appends the indexer keys of all rows to their caches, then returns each row's selection
    /// (`None` = every visible key, the exact dense fallback while `pos + 1 <= index_topk`).
    pub fn run(
        &self,
        h: &[f32],
        cq: &[f32],
        layout: &Layout,
        caches: &mut [&mut LayerCache],
        rope: &RopeTable,
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
        let need: Vec<usize> = (0..m)
            .filter(|&i| layout.rows[i].pos + 1 > self.topk)
            .collect();
        let mut out: Vec<Option<Vec<u32>>> = vec![None; m];
        if need.is_empty() {
            return Ok(out);
        }
        let hd = h.len() / m;
        let qd = cq.len() / m;
        let gather = |src: &[f32], d: usize| {
            need.iter()
                .flat_map(|&i| src[i * d..(i + 1) * d].iter().copied())
                .collect::<Vec<_>>()
        };
        let mut q = self.wq_b.forward(&gather(cq, qd), need.len())?;
        let w = self.weights_proj.forward(&gather(h, hd), need.len())?;
        let head_scale = (self.heads as f32).powf(-0.5);
        let qk_scale = (self.dim as f32).powf(-0.5);
        for (j, &i) in need.iter().enumerate() {
            for hq in q[j * self.heads * self.dim..(j + 1) * self.heads * self.dim]
                .chunks_exact_mut(self.dim)
            {
                rope.apply(&mut hq[..rope.dim()], layout.rows[i].rope);
            }
        }
        // One task per row, on the compute team.
        let sels: Vec<Vec<u32>> = team::map(need.len(), |j| {
            let i = need[j];
            let pos = layout.rows[i].pos;
            let keys = &caches[layout.rows[i].seq].index_k[..(pos + 1) * self.dim];
            let qj = &q[j * self.heads * self.dim..(j + 1) * self.heads * self.dim];
            let wj: Vec<f32> = w[j * self.heads..(j + 1) * self.heads]
                .iter()
                .map(|x| x * head_scale)
                .collect();
            let scores: Vec<f32> = keys
                .chunks_exact(self.dim)
                .map(|kt| {
                    let mut s = 0.0f32;
                    for (hq, &wh) in qj.chunks_exact(self.dim).zip(&wj) {
                        s += wh * (dot(hq, kt) * qk_scale).max(0.0);
                    }
                    s
                })
                .collect();
            top_k_positions(&scores, self.topk)
        });
        for (&i, s) in need.iter().zip(sels) {
            out[i] = Some(s);
        }
        Ok(out)
    }
}

/// Positions of the `k` best scores (higher score first, then lower position; NaN last),
/// returned in ascending position order.
pub fn top_k_positions(scores: &[f32], k: usize) -> Vec<u32> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_prefer_lower_positions_and_nan_ranks_last() {
        let s = [1.0, 3.0, 2.0, 3.0, f32::NAN, 2.0, 0.5];
        assert_eq!(top_k_positions(&s, 3), [1, 2, 3]);
        assert_eq!(top_k_positions(&s, 4), [1, 2, 3, 5]);
        assert_eq!(top_k_positions(&s, 7), [0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(top_k_positions(&[f32::NAN, 0.0], 1), [1]);
    }
}
