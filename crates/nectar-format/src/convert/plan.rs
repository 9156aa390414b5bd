//! What the converter does with each tensor: the class → bits policy (Colibri's recommended
//! defaults) and the exact output bytes of each tensor, known before any weight is read.
use crate::dtype::DType;
use serde::{Deserialize, Serialize};

/// Target encoding of one tensor class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Bits {
    /// Keep floats (the source dtype; fp8 sources become bf16).
    Float,
    /// int8 per row.
    Int8,
    /// int4, grouped by `group_size` (0 = per row).
    Int4,
}

impl std::str::FromStr for Bits {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "4" | "int4" => Ok(Bits::Int4),
            "8" | "int8" => Ok(Bits::Int8),
            "16" | "float" | "bf16" | "keep" => Ok(Bits::Float),
            o => Err(format!("`{o}`: want 4, 8 or float")),
        }
    }
}

/// Conversion parameters (written to `.out-params.json`; a resume must use the same).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConvertParams {
    /// Routed experts of the main layers.
    pub expert_bits: Bits,
    /// Attention projections (q_a, q_b, kv_a, kv_b, o).
    pub attn_bits: Bits,
    /// Shared experts.
    pub shared_bits: Bits,
    /// Dense MLPs.
    pub dense_bits: Bits,
    /// `embed_tokens` and `lm_head`.
    pub io_bits: Bits,
    /// Every linear of the MTP layer (int4 MTP heads lose their acceptance: keep ≥ int8).
    pub mtp_bits: Bits,
    /// Indexer `wq_b` and `wk` (`weights_proj` and norms stay float).
    pub indexer_bits: Bits,
    /// Columns per int4 scale group (0 = per row).
    pub group_size: usize,
    /// Main decoder layers (`num_hidden_layers`); layers at or above are the MTP layer.
    pub n_layers: usize,
}

impl ConvertParams {
    /// Colibri's recommended defaults: routed experts int4 g64, MTP int8, embed/head int8,
    /// indexer int8, the rest of the spine int4 g64.
    pub fn recommended(n_layers: usize) -> Self {
        ConvertParams {
            expert_bits: Bits::Int4,
            attn_bits: Bits::Int4,
            shared_bits: Bits::Int4,
            dense_bits: Bits::Int4,
            io_bits: Bits::Int8,
            mtp_bits: Bits::Int8,
            indexer_bits: Bits::Int8,
            group_size: 64,
            n_layers,
        }
    }
}

/// Which output shard family a tensor goes to (Colibri's naming).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `out-NNNNN.safetensors`.
    Main,
    /// `out-mtp-NNNNN.safetensors`.
    Mtp,
    /// `out-idx-NNNNN.safetensors`.
    Indexer,
}

impl Family {
    /// File-name prefix.
    pub fn prefix(self) -> &'static str {
        match self {
            Family::Main => "out-",
            Family::Mtp => "out-mtp-",
            Family::Indexer => "out-idx-",
        }
    }
}

fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("model.layers.")?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// The output family of a tensor.
pub fn family(name: &str, p: &ConvertParams) -> Family {
    match layer_of(name) {
        Some(l) if l >= p.n_layers => Family::Mtp,
        Some(_) if name.contains(".self_attn.indexer.") => Family::Indexer,
        _ => Family::Main,
    }
}

/// The target bits of a tensor of `shape` (1-D tensors, routers and gates stay float).
pub fn bits_for(name: &str, shape: &[usize], p: &ConvertParams) -> Bits {
    if shape.len() != 2 || !name.ends_with(".weight") {
        return Bits::Float;
    }
    let keep = [
        ".mlp.gate.weight",
        "indexer.weights_proj.weight",
        "norm.weight",
        "layernorm.weight",
    ];
    if keep.iter().any(|k| name.ends_with(k)) {
        return Bits::Float;
    }
    if name == "model.embed_tokens.weight" || name == "lm_head.weight" {
        return p.io_bits;
    }
    match family(name, p) {
        Family::Mtp => p.mtp_bits,
        Family::Indexer => p.indexer_bits,
        Family::Main if name.contains(".mlp.experts.") => p.expert_bits,
        Family::Main if name.contains(".mlp.shared_experts.") => p.shared_bits,
        Family::Main if name.contains(".self_attn.") => p.attn_bits,
        Family::Main if name.contains(".mlp.") => p.dense_bits,
        Family::Main => p.attn_bits,
    }
}

/// One output tensor: name, dtype, shape, byte count.
#[derive(Debug, Clone, PartialEq)]
pub struct OutTensor {
    /// Name in the output shard.
    pub name: String,
    /// Stored dtype.
    pub dtype: DType,
    /// Stored shape.
    pub shape: Vec<usize>,
    /// Byte length.
    pub bytes: u64,
}

/// The output tensors of one source tensor `[o, i]` encoded at `bits` (codes, then `.qs`).
pub fn outputs(
    name: &str,
    src: DType,
    shape: &[usize],
    bits: Bits,
    group: usize,
) -> Vec<OutTensor> {
    let t = |n: String, dtype: DType, shape: Vec<usize>| {
        let bytes = shape.iter().product::<usize>() as u64 * dtype.size() as u64;
        OutTensor {
            name: n,
            dtype,
            shape,
            bytes,
        }
    };
    match bits {
        Bits::Float => {
            let dt = if matches!(src, DType::F32 | DType::BF16 | DType::F16) {
                src
            } else {
                DType::BF16
            };
            vec![t(name.to_owned(), dt, shape.to_vec())]
        }
        Bits::Int8 => vec![
            t(name.to_owned(), DType::I8, shape.to_vec()),
            t(format!("{name}.qs"), DType::F32, vec![shape[0]]),
        ],
        Bits::Int4 => {
            let (o, i) = (shape[0], shape[1]);
            let groups = if group == 0 || group >= i {
                1
            } else {
                i.div_ceil(group)
            };
            vec![
                t(name.to_owned(), DType::U8, vec![o, i.div_ceil(2)]),
                t(format!("{name}.qs"), DType::F32, vec![o, groups]),
            ]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recommended_policy_by_class() {
        let p = ConvertParams::recommended(78);
        let b = |n: &str, s: &[usize]| bits_for(n, s, &p);
        assert_eq!(
            b(
                "model.layers.3.mlp.experts.7.gate_proj.weight",
                &[2048, 6144]
            ),
            Bits::Int4
        );
        assert_eq!(
            b(
                "model.layers.78.mlp.experts.7.gate_proj.weight",
                &[2048, 6144]
            ),
            Bits::Int8
        );
        assert_eq!(
            b("model.layers.78.eh_proj.weight", &[6144, 12288]),
            Bits::Int8
        );
        assert_eq!(
            b("model.layers.3.mlp.gate.weight", &[256, 6144]),
            Bits::Float
        );
        assert_eq!(
            b("model.layers.3.mlp.gate.e_score_correction_bias", &[256]),
            Bits::Float
        );
        assert_eq!(b("model.embed_tokens.weight", &[154880, 6144]), Bits::Int8);
        assert_eq!(
            b(
                "model.layers.0.self_attn.indexer.wq_b.weight",
                &[4096, 2048]
            ),
            Bits::Int8
        );
        assert_eq!(
            b(
                "model.layers.0.self_attn.indexer.weights_proj.weight",
                &[32, 6144]
            ),
            Bits::Float
        );
        assert_eq!(
            b("model.layers.0.self_attn.q_a_layernorm.weight", &[2048]),
            Bits::Float
        );
        assert_eq!(
            b("model.layers.0.self_attn.kv_b_proj.weight", &[28672, 512]),
            Bits::Int4
        );
        assert_eq!(
            family("model.layers.0.self_attn.indexer.wk.weight", &p),
            Family::Indexer
        );
        assert_eq!(
            family("model.layers.78.self_attn.indexer.wk.weight", &p),
            Family::Mtp
        );
    }

    #[test]
    fn output_sizes() {
        let o = outputs("w", DType::BF16, &[2048, 6144], Bits::Int4, 64);
        assert_eq!(o[0].bytes, 2048 * 3072);
        assert_eq!(o[1].bytes, 2048 * 96 * 4);
        let o = outputs("w", DType::F8E4M3, &[3, 5], Bits::Float, 64);
        assert_eq!((o[0].dtype, o[0].bytes), (DType::BF16, 30));
    }
}
