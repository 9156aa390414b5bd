//! What a prompt's attention costs on the CPU: its floating-point work per prompt length, from
//! the model's dimensions, and this machine's rate for it, timed on the reconstructed form's
//! own per-(row, head) core ([`super::attention::reconstructed`]).
//!
//! Prefill's matrix products are linear in the prompt; attention is not: a query at position
//! `i` attends to `min(i + 1, index_topk)` keys (every visible key until the DSA indexer
//! selects, then its top k), and each full-indexer layer scores all `i + 1` keys once the
//! indexer selects. `nectar fit --project` adds this term to its prefill projection (validated
//! against `nectar bench replay --prompt-rows`: benchmarks/RESULTS.md).
use super::attention::recon::{self, Heads, Row};
use super::attention::RECON_MAX_BYTES;
use super::Config;
use nectar_kernels::team;
use std::time::Instant;

/// The attention dimensions of a GLM-5.x model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnShape {
    /// Main layers (every one has MLA attention).
    pub layers: usize,
    /// Main layers with a full DSA indexer (the others reuse a selection).
    pub index_layers: usize,
    /// Attention heads.
    pub heads: usize,
    /// `qk_nope_head_dim`.
    pub dn: usize,
    /// `qk_rope_head_dim`.
    pub dr: usize,
    /// `v_head_dim`.
    pub dv: usize,
    /// `kv_lora_rank` (the latent).
    pub rank: usize,
    /// Keys a query attends to once the indexer selects.
    pub topk: usize,
    /// Indexer heads.
    pub index_heads: usize,
    /// Indexer key width.
    pub index_dim: usize,
}

impl AttnShape {
    /// From a model's configuration (the MTP layer is left out: prefill does not run it).
    pub fn from_config(cfg: &Config) -> AttnShape {
        let r = &cfg.raw;
        AttnShape {
            layers: r.num_hidden_layers,
            index_layers: cfg
                .indexer_full
                .iter()
                .take(r.num_hidden_layers)
                .filter(|&&f| f)
                .count(),
            heads: r.num_attention_heads,
            dn: r.qk_nope_head_dim,
            dr: r.qk_rope_head_dim,
            dv: r.v_head_dim,
            rank: r.kv_lora_rank,
            topk: r.index_topk,
            index_heads: r.index_n_heads,
            index_dim: r.index_head_dim,
        }
    }

    /// GLM-5.2: 78 layers, 21 of them with a full indexer, 64 heads of 192 + 64 / 256,
    /// latent 512, top 2048, indexer 32 heads of 128 (`specs/glm5-architecture.md`).
    pub fn glm52() -> AttnShape {
        AttnShape {
            layers: 78,
            index_layers: 21,
            heads: 64,
            dn: 192,
            dr: 64,
            dv: 256,
            rank: 512,
            topk: 2048,
            index_heads: 32,
            index_dim: 128,
        }
    }

    /// The per-head geometry of the attention cores, with the model's softmax scale.
    pub(super) fn heads(&self) -> Heads {
        Heads {
            heads: self.heads,
            dn: self.dn,
            dr: self.dr,
            dv: self.dv,
            scale: ((self.dn + self.dr) as f32).powf(-0.5),
        }
    }

    /// Blocks of keys a `p`-token span from position 0 rebuilds K/V in (each at most the
    /// buffer the model allows). A fresh span always runs the reconstructed form
    /// (`recon::reconstruction_pays`: its rebuild costs what the absorbed form's projections
    /// would, and each (row, key) costs less).
    pub fn kv_blocks(&self, p: usize) -> usize {
        p.div_ceil((RECON_MAX_BYTES / (self.heads * (self.dn + self.dv) * 4)).max(1))
    }

    /// Floating-point operations of attention (scores and softmax weights × V; the rebuild of
    /// K/V is kv_b's product, counted with the products) and of the indexer's scoring,
    /// over every layer, for one `p`-token prompt span from position 0.
    pub fn prefill_flops(&self, p: usize) -> f64 {
        let (pf, k) = (p as f64, self.topk as f64);
        // Σ_i min(i + 1, topk): the keys every query attends to.
        let attended = if p <= self.topk {
            pf * (pf + 1.0) / 2.0
        } else {
            k * (k + 1.0) / 2.0 + (pf - k) * k
        };
        self.flops(attended, p)
    }

    /// [`Self::prefill_flops`] as the GPU's prompt attention does it: every causal key tile a
    /// selection touches is computed whole, and past `topk` the selections of a tile's rows
    /// still touch almost every tile (benchmarks/RESULTS.md, "GPU prefill attention on the
    /// tensor cores"), so each query's work is that of all the keys before it.
    pub fn gpu_prefill_flops(&self, p: usize) -> f64 {
        let pf = p as f64;
        self.flops(pf * (pf + 1.0) / 2.0, p)
    }

    /// Attention over `attended` (query, key) pairs on every layer, and the indexer's scoring
    /// of a `p`-token span on its full layers.
    fn flops(&self, attended: f64, p: usize) -> f64 {
        let (pf, k) = (p as f64, self.topk as f64);
        let h = self.heads as f64;
        let per_layer = attended * h * 2.0 * (self.dn + self.dr + self.dv) as f64;
        // Σ over the queries that select (i + 1 > topk) of the i + 1 keys they score.
        let scored = if p > self.topk {
            (pf * (pf + 1.0) - k * (k + 1.0)) / 2.0
        } else {
            0.0
        };
        let index = scored * (self.index_heads * self.index_dim) as f64 * 2.0;
        self.layers as f64 * per_layer + self.index_layers as f64 * index
    }
}

/// `n` deterministic probe values in [-0.25, 0.25) (the work timed does not depend on them).
pub(super) fn fill(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i.wrapping_mul(2_654_435_761).wrapping_add(seed) % 1999) as f32 - 999.0) / 4000.0
        })
        .collect()
}

/// Heads the rate probe computes (each head is the same work; the keys keep the model's full
/// per-key stride, so their cache behaviour is the model's).
const PROBE_HEADS: usize = 8;

/// GFLOP/s of the reconstructed form's core on this machine's compute team: `rows` causal
/// queries over as many keys, head-major as the model runs it, best of `passes`.
pub fn measure_gflops(shape: &AttnShape, rows: usize, passes: usize) -> f64 {
    let g = shape.heads();
    let dq = g.dn + g.dr;
    let q = fill(rows * g.heads * dq, 1);
    let kvf = fill(rows * g.heads * (g.dn + g.dv), 2);
    let k_pe = fill(rows * g.dr, 3);
    let heads = PROBE_HEADS.min(g.heads);
    let (gr, sl) = (recon::GROUP_ROWS, g.state_len());
    let groups = rows.div_ceil(gr);
    let mut st = vec![0.0f32; heads * groups * gr * sl];
    let mut best = f64::INFINITY;
    for _ in 0..passes.max(1) {
        let t0 = Instant::now();
        team::for_each_chunk_mut(&mut st, gr * sl, |idx, s| {
            let (head, grp) = (idx / groups, idx % groups);
            let group: Vec<Row<'_>> = (grp * gr..((grp + 1) * gr).min(rows))
                .map(|i| Row {
                    qh: &q[(i * g.heads + head) * dq..][..dq],
                    pos: i,
                    listed: None,
                })
                .collect();
            s.chunks_exact_mut(sl).for_each(|s| recon::init(&g, s));
            recon::fold_group(&g, head, 0, recon::TILE_KEYS, &k_pe, &kvf, &group, s);
            let mut out = vec![0.0; g.dv];
            s.chunks_exact(sl)
                .for_each(|s| recon::finish(&g, s, &mut out));
        });
        best = best.min(t0.elapsed().as_secs_f64());
    }
    let r = rows as f64;
    let flops = r * (r + 1.0) / 2.0 * heads as f64 * 2.0 * (dq + g.dv) as f64;
    flops / best / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The work counted follows the model: GLM-5.2 rebuilds K/V in blocks of 2,340 keys
    /// (256 MiB), attends to every visible key up to the top k and to k keys after it, and
    /// only then scores with the indexer.
    #[test]
    fn prefill_work_follows_the_blocks_and_the_selection() {
        let s = AttnShape::glm52();
        assert_eq!(
            (s.kv_blocks(2340), s.kv_blocks(2341), s.kv_blocks(8192)),
            (1, 2, 4)
        );
        // Below the top k: quadratic, no indexer scoring.
        let per_key = 64.0 * 2.0 * (192.0 + 64.0 + 256.0) * 78.0;
        assert_eq!(s.prefill_flops(1), per_key);
        assert_eq!(s.prefill_flops(2048), 2048.0 * 2049.0 / 2.0 * per_key);
        // Past the top k the indexer scores every visible key: quadratic.
        let (a, b) = (s.prefill_flops(4096), s.prefill_flops(8192));
        assert!(
            b > 2.0 * a,
            "the indexer's scoring stays quadratic: {a} {b}"
        );
        let no_index = AttnShape {
            index_layers: 0,
            ..s
        };
        let linear = no_index.prefill_flops(8192) - no_index.prefill_flops(4096);
        let next = no_index.prefill_flops(12288) - no_index.prefill_flops(8192);
        assert!(
            (linear - next).abs() < 1e-6 * next,
            "attention alone is linear past the top k"
        );
        // The GPU computes every causal tile: the same below the top k, quadratic past it,
        // with the same indexer scoring.
        assert_eq!(s.gpu_prefill_flops(2048), s.prefill_flops(2048));
        let dense = |p: f64| p * (p + 1.0) / 2.0 * per_key;
        let index = |p: usize| s.prefill_flops(p) - no_index.prefill_flops(p);
        let gpu = s.gpu_prefill_flops(8192);
        assert!((gpu - (dense(8192.0) + index(8192))).abs() < 1e-9 * gpu);
        assert!(gpu > s.prefill_flops(8192));
    }

    /// The probe runs the model's core and reports a positive, finite rate.
    #[test]
    fn the_probe_measures_a_rate() {
        let s = AttnShape {
            heads: 4,
            ..AttnShape::glm52()
        };
        let g = measure_gflops(&s, 64, 1);
        assert!(g.is_finite() && g > 0.0, "{g}");
    }
}
