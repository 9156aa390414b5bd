//! The tensor contract: the logical `[out, in]` shape of every GLM-5 linear, from the config.
//! Quantised containers store packed codes, so their header shapes are not the logical ones;
//! format detection needs these (`specs/colibri-format.md` §3).
use super::Config;

/// The logical `[rows, cols]` of a weight matrix named `name` (without a `.qs` suffix), or
/// `None` for names that are not matrices of this architecture.
pub fn logical_shape(name: &str, cfg: &Config) -> Option<[usize; 2]> {
    let r = &cfg.raw;
    let (h, v) = (r.hidden_size, r.vocab_size);
    let (heads, dn, dr, dv) = (
        r.num_attention_heads,
        r.qk_nope_head_dim,
        r.qk_rope_head_dim,
        r.v_head_dim,
    );
    if name == "model.embed_tokens.weight" || name == "lm_head.weight" {
        return Some([v, h]);
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let rest = rest.strip_suffix(".weight")?;
    let moe_i = r.moe_intermediate_size;
    let dense = layer < r.num_hidden_layers && cfg.dense[layer];
    let shape = match rest {
        "self_attn.q_a_proj" => [r.q_lora_rank, h],
        "self_attn.q_b_proj" => [heads * (dn + dr), r.q_lora_rank],
        "self_attn.kv_a_proj_with_mqa" => [r.kv_lora_rank + dr, h],
        "self_attn.kv_b_proj" => [heads * (dn + dv), r.kv_lora_rank],
        "self_attn.o_proj" => [h, heads * dv],
        "self_attn.indexer.wq_b" => [r.index_n_heads * r.index_head_dim, r.q_lora_rank],
        "self_attn.indexer.wk" => [r.index_head_dim, h],
        "self_attn.indexer.weights_proj" => [r.index_n_heads, h],
        "mlp.gate" => [r.n_routed_experts, h],
        "mlp.gate_proj" | "mlp.up_proj" if dense => [r.intermediate_size, h],
        "mlp.down_proj" if dense => [h, r.intermediate_size],
        "mlp.shared_experts.gate_proj" | "mlp.shared_experts.up_proj" => {
            [moe_i * r.n_shared_experts, h]
        }
        "mlp.shared_experts.down_proj" => [h, moe_i * r.n_shared_experts],
        "eh_proj" => [h, 2 * h],
        "embed_tokens" | "shared_head.head" => [v, h],
        _ => {
            let e = rest.strip_prefix("mlp.experts.")?;
            let (_, proj) = e.split_once('.')?;
            match proj {
                "gate_proj" | "up_proj" => [moe_i, h],
                "down_proj" => [h, moe_i],
                _ => return None,
            }
        }
    };
    Some(shape)
}
