//! GLM-5.2's spine bytes, counted matrix by matrix from its shapes (docs/glm5-architecture.md §2.4)
//! at the formats `nectar convert` writes (`ConvertParams::recommended`: attention, shared and
//! dense MLPs int4 with the experts' scale grouping, the indexer's `wq_b`/`wk` and the output
//! head int8 per row, routers and the rest as stored), for `fit --geometry`, which has no
//! container to read headers from. The embedding table is not here: a forward reads one row
//! of it per token, and under a budget it is read from the file, not held
//! (`nectar_model::blocks::Embedding`).

/// Hidden size.
pub const H: usize = 6144;
/// Vocabulary.
pub const VOCAB: usize = 154_880;
/// Main decoder layers.
pub const LAYERS: usize = 78;
/// MoE layers (the rest, the first three, are dense).
pub const MOE_LAYERS: usize = 75;
const DENSE_LAYERS: usize = 3;
/// Layers with their own DSA indexer (GLM-5.2 shares the others' selections).
pub const INDEXER_LAYERS: usize = 21;
const EXPERTS: usize = 256;

/// `[rows, cols]` weights of one layer's attention: q_a, q_b, kv_a (with the rope key), kv_b,
/// o_proj.
const ATTENTION: [(usize, usize); 5] = [
    (2048, H),
    (64 * 256, 2048),
    (512 + 64, H),
    (64 * (192 + 256), 512),
    (H, 64 * 256),
];

/// Products a forward makes on the spine: q_a, q_b, kv_a, kv_b, o_proj on every layer; the
/// indexer's wq_b, wk and weights_proj on its full-indexer layers; gate, up, down on the dense
/// layers; the router and the shared expert's gate, up, down on the MoE layers; the LM head.
pub const PRODUCTS: usize =
    LAYERS * ATTENTION.len() + INDEXER_LAYERS * 3 + DENSE_LAYERS * 3 + MOE_LAYERS * 4 + 1;

/// Bytes of every layer's `kv_b_proj` (the spine matrices that keep their host copy beside a
/// VRAM copy: `nectar_model::arch::glm5::keeps_host_copy`).
pub fn kv_b_bytes(group: Option<usize>) -> u64 {
    let (rows, cols) = ATTENTION[3];
    (LAYERS * int4(rows, cols, group)) as u64
}

/// Bytes of an int4 matrix: two codes a byte and one f32 scale per `group` columns of a row
/// (`None`: one per row).
fn int4(rows: usize, cols: usize, group: Option<usize>) -> usize {
    rows * (cols.div_ceil(2) + 4 * group.map_or(1, |g| cols.div_ceil(g)))
}

/// Bytes of an int8 matrix with one f32 scale per row.
fn int8(rows: usize, cols: usize) -> usize {
    rows * (cols + 4)
}

/// The SwiGLU MLP of intermediate size `i` at int4.
fn mlp(i: usize, group: Option<usize>) -> usize {
    2 * int4(i, H, group) + int4(H, i, group)
}

/// Bytes of everything a GLM-5.2 forward reads but the routed experts and the MTP layer: the
/// resident spine. `group`: columns per int4 scale (`Some(64)` for Nectar's default
/// conversion, `None` for a scale per row).
pub fn spine_bytes(group: Option<usize>) -> u64 {
    let attention: usize = ATTENTION.iter().map(|&(r, c)| int4(r, c, group)).sum();
    // Input, post-attention, q_a and kv_a RMSNorm weights, f32.
    let norms = 4 * (2 * H + 2048 + 512);
    // wq_b and wk int8; weights_proj and the key norm bf16.
    let indexer = int8(32 * 128, 2048) + int8(128, H) + 2 * (32 * H + 2 * 128);
    // Router weights bf16 and the f32 score-correction bias.
    let router = 2 * EXPERTS * H + 4 * EXPERTS;
    let total = LAYERS * (attention + norms)
        + INDEXER_LAYERS * indexer
        + DENSE_LAYERS * mlp(12_288, group)
        + MOE_LAYERS * (mlp(2048, group) + router)
        + int8(VOCAB, H)
        + 4 * H;
    total as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spine_adds_up_to_the_architecture_tables_parameters() {
        // docs/glm5-architecture.md §2.4: attention 165,019,648 parameters a layer.
        let params: usize = ATTENTION.iter().map(|&(r, c)| r * c).sum();
        assert_eq!(params, 165_019_648);
        // One layer's attention at int4 g64 is what `nectar synth --preset glm52` writes
        // (92.8 MB: half a byte a weight and a 4-byte scale per 64).
        let a64: usize = ATTENTION.iter().map(|&(r, c)| int4(r, c, Some(64))).sum();
        assert_eq!(a64, params / 2 + params / 16);
        // Per row the scales are a rounding error; g64 adds an eighth to the int4 matrices.
        let (row, g64) = (spine_bytes(None) as f64, spine_bytes(Some(64)) as f64);
        assert!((9.4e9..9.8e9).contains(&row), "{row}");
        assert!((10.4e9..10.8e9).contains(&g64), "{g64}");
        // kv_b at g64: 7,340,032 bytes of codes and 917,504 of scales a layer.
        assert_eq!(kv_b_bytes(Some(64)), 78 * (7_340_032 + 917_504));
        assert_eq!(PRODUCTS, 78 * 5 + 21 * 3 + 3 * 3 + 75 * 4 + 1);
    }
}
