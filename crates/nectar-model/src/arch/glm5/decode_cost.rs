//! What a decode row's context costs on the CPU: the attention work that grows with the keys a
//! row sees, timed on the model's own code at its dimensions.
//!
//! A decode row's projections and experts cost the same at any position; its attention does
//! not. On every layer the absorbed form ([`super::attention::absorbed`]) attends to
//! `min(context, index_topk)` keys, and on each full-indexer layer, once the context passes
//! `index_topk`, the indexer scores every key ([`super::indexer::cpu_scores`]) and selects the
//! top k ([`super::indexer::top_k_positions`]). `nectar fit --project --context N` adds what
//! this costs beyond the short context its calibration decoded at (benchmarks/RESULTS.md
//! checks it against decode after long prompts).
use super::attention::absorbed::{self, Row};
use super::indexer::{cpu_scores, top_k_positions};
use super::prefill_cost::{fill, AttnShape};
use crate::cache::LayerCache;
use nectar_kernels::{MatRef, WeightFormat};
use std::time::Instant;

/// Seconds one decode row's context-dependent attention takes on this machine's compute team,
/// per layer: `attend_s` on every layer, `index_s` more on each full-indexer layer.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ContextCost {
    /// The absorbed form over the row's keys, less the same at a context of [`BASE_KEYS`]
    /// (its projections through kv_b cost the same at any context, and are in the
    /// calibration's per-layer compute already).
    pub attend_s: f64,
    /// The indexer's scores of every key and the top-k over them (0 up to `index_topk` keys,
    /// where the indexer does not select).
    pub index_s: f64,
}

impl ContextCost {
    /// Seconds per decode row over a model's layers.
    pub fn per_row_s(&self, shape: &AttnShape) -> f64 {
        shape.layers as f64 * self.attend_s + shape.index_layers as f64 * self.index_s
    }
}

/// The context a short calibration decode runs at: what [`ContextCost`] is measured beyond.
pub const BASE_KEYS: usize = 32;

/// Times the context-dependent attention of one decode row at `context` keys on `shape`, best
/// of `passes` (each pass times the row at `context` and at [`BASE_KEYS`] back to back). kv_b is
/// int4 with groups of 64, as the model's containers store it; the values are random (the
/// work does not depend on them). Before each timed call `evict_bytes` of other memory are
/// read (give at least twice the last-level cache): in a real decode step the layer's weights
/// stream through the caches between two uses of its KV cache, so the latents and indexer keys
/// come from RAM — timed hot, the probe read 0.69 of the growth a decode measured from 4k to
/// 8k tokens on 16 cores (RESULTS, "Decode after a long prompt, projected").
pub fn measure(
    shape: &AttnShape,
    context: usize,
    passes: usize,
    evict_bytes: usize,
) -> ContextCost {
    let evict = vec![1u8; evict_bytes];
    // One byte per 64-byte line: every line of the buffer passes through the caches.
    let flush =
        || std::hint::black_box(evict.iter().step_by(64).map(|&b| u64::from(b)).sum::<u64>());
    let g = shape.heads();
    let context = context.max(BASE_KEYS);
    let (rank, dq) = (shape.rank, g.dn + g.dr);
    let kv_rows = g.heads * (g.dn + g.dv);
    let format = WeightFormat::Int4Group { group: 64 };
    let data: Vec<u8> = (0..kv_rows * format.row_bytes(rank))
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8)
        .collect();
    let scales = vec![1e-2f32; kv_rows * format.row_scales(rank)];
    let kvb = MatRef::new(format, kv_rows, rank, &data, &scales).expect("a valid int4 kv_b view");
    let mut cache = LayerCache::default();
    let (latent, k_pe) = (fill(rank, 1), fill(g.dr, 2));
    for _ in 0..context {
        cache.push(&latent, &k_pe, None);
    }
    let q = fill(g.heads * dq, 3);
    // The indexer's selection: `topk` keys spread over the context, ascending.
    let selected: Vec<u32> = (0..shape.topk.min(context))
        .map(|i| (i * context / shape.topk.min(context)) as u32)
        .collect();
    let selects = context > shape.topk;
    let mut out = vec![0.0f32; g.heads * g.dv];
    let mut attend = |keys: usize| {
        flush();
        let row = Row {
            q: &q,
            pos: keys - 1,
            cache: &cache,
            keys: (keys == context && selects).then_some(&selected[..]),
        };
        let t0 = Instant::now();
        absorbed::attend(&g, rank, &kvb, &[row], &mut out);
        t0.elapsed().as_secs_f64()
    };
    // The indexer's side: one row's queries and head weights against every key.
    let (ih, id) = (shape.index_heads, shape.index_dim);
    let (iq, iw, ikeys) = (fill(ih * id, 4), fill(ih, 5), fill(context * id, 6));
    let index = || {
        flush();
        let t0 = Instant::now();
        let (s, _) = cpu_scores((&iq, &iw), ih, &ikeys, id, &[context - 1], 0.1);
        std::hint::black_box(top_k_positions(&s[..context], shape.topk));
        t0.elapsed().as_secs_f64()
    };
    let (mut at, mut base, mut ix) = (f64::INFINITY, f64::INFINITY, f64::INFINITY);
    for _ in 0..passes.max(1) {
        at = at.min(attend(context));
        base = base.min(attend(BASE_KEYS));
        if selects {
            ix = ix.min(index());
        }
    }
    ContextCost {
        attend_s: (at - base).max(0.0),
        index_s: if selects { ix } else { 0.0 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small shape: the indexer's share is there only past the top k, and the per-row sum
    /// weighs the shares by the layers that pay them.
    #[test]
    fn the_index_share_starts_at_the_top_k() {
        let shape = AttnShape {
            layers: 3,
            index_layers: 1,
            heads: 4,
            dn: 16,
            dr: 8,
            dv: 16,
            rank: 64,
            topk: 256,
            index_heads: 4,
            index_dim: 32,
        };
        let below = measure(&shape, 200, 3, 1 << 20);
        assert_eq!(below.index_s, 0.0, "{below:?}");
        let above = measure(&shape, 4096, 3, 1 << 20);
        assert!(above.index_s > 0.0, "{above:?}");
        assert_eq!(
            above.per_row_s(&shape),
            3.0 * above.attend_s + above.index_s
        );
    }
}
