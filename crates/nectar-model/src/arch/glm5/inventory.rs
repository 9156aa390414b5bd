//! What a GLM-5 checkpoint holds, by class, computed from headers alone (no weight is read).
use super::{logical_shape, Config};
use nectar_format::quant;
use nectar_format::Catalog;
use serde::Serialize;
use std::collections::BTreeMap;

/// The class of a tensor, by what the runtime does with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TensorClass {
    /// Always resident: embeddings, attention, norms, dense MLPs, routers, shared experts, head.
    Spine,
    /// Routed experts of the main layers (streamed under a memory budget).
    RoutedExpert,
    /// DSA indexers of the main layers.
    Indexer,
    /// Everything under the MTP layer's prefix.
    Mtp,
    /// Not part of the architecture (reported, not used).
    Other,
}

/// Classifies a tensor name.
pub fn classify(name: &str, cfg: &Config) -> TensorClass {
    let name = name.strip_suffix(".qs").unwrap_or(name);
    let n = cfg.raw.num_hidden_layers;
    let layer = name
        .strip_prefix("model.layers.")
        .and_then(|r| r.split('.').next())
        .and_then(|i| i.parse::<usize>().ok());
    match layer {
        Some(l) if l >= n => TensorClass::Mtp,
        Some(_) if name.contains(".mlp.experts.") => TensorClass::RoutedExpert,
        Some(_) if name.contains(".self_attn.indexer.") => TensorClass::Indexer,
        Some(_) => TensorClass::Spine,
        None if matches!(
            name,
            "model.embed_tokens.weight" | "model.norm.weight" | "lm_head.weight"
        ) =>
        {
            TensorClass::Spine
        }
        None => TensorClass::Other,
    }
}

/// Counts and bytes of one class.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClassStats {
    /// Tensors.
    pub tensors: usize,
    /// Bytes on disk.
    pub bytes: u64,
    /// Tensors by dtype.
    pub by_dtype: BTreeMap<String, usize>,
    /// Weight matrices by storage format (`bf16`, `int4-g64`, `int8`, ...), scales not counted.
    pub by_format: BTreeMap<String, usize>,
}

/// The inventory of a checkpoint.
#[derive(Debug, Clone, Serialize)]
pub struct Inventory {
    /// Per class.
    pub classes: BTreeMap<TensorClass, ClassStats>,
    /// Routed experts found in the main layers.
    pub routed_experts: usize,
    /// Routed experts the config implies for the main layers.
    pub routed_experts_expected: usize,
    /// Bytes of one main-layer routed expert (gate + up + down), when uniform.
    pub bytes_per_expert: Option<u64>,
    /// Bytes of one MTP routed expert.
    pub bytes_per_mtp_expert: Option<u64>,
    /// True when the MTP layer is present.
    pub mtp: bool,
    /// Full-indexer layers of the schedule that have indexer weights / that should.
    pub indexers: (usize, usize),
    /// Tensors whose format cannot be resolved (name: reason) — a container to refuse.
    pub problems: Vec<String>,
}

impl Inventory {
    /// Builds the inventory from a catalog's headers.
    pub fn new(cat: &Catalog, cfg: &Config) -> Inventory {
        let mut classes: BTreeMap<TensorClass, ClassStats> = BTreeMap::new();
        let mut experts: BTreeMap<(usize, usize), u64> = BTreeMap::new();
        let mut problems = Vec::new();
        let n = cfg.raw.num_hidden_layers;
        for e in cat.tensors() {
            let class = classify(&e.name, cfg);
            let s = classes.entry(class).or_default();
            s.tensors += 1;
            s.bytes += e.len;
            *s.by_dtype.entry(e.dtype.to_string()).or_default() += 1;
            if !e.name.ends_with(".qs") && !e.name.ends_with("_scale_inv") {
                match format_of(cat, &e.name, cfg) {
                    Ok(Some(f)) => *s.by_format.entry(f).or_default() += 1,
                    Ok(None) => {}
                    Err(m) => problems.push(format!("{}: {m}", e.name)),
                }
            }
            if let Some((l, x)) = expert_of(&e.name) {
                *experts.entry((l, x)).or_default() += e.len;
            }
        }
        let uniform = |it: &mut dyn Iterator<Item = u64>| {
            let v: Vec<u64> = it.collect();
            v.first().copied().filter(|f| v.iter().all(|x| x == f))
        };
        let main = || experts.iter().filter(|((l, _), _)| *l < n).map(|(_, b)| *b);
        let moe_layers = cfg.dense.iter().filter(|d| !**d).count();
        let full_layers: Vec<usize> = (0..n).filter(|&l| cfg.indexer_full[l]).collect();
        let have = full_layers
            .iter()
            .filter(|l| {
                cat.get(&format!("model.layers.{l}.self_attn.indexer.wk.weight"))
                    .is_some()
            })
            .count();
        Inventory {
            routed_experts: main().count(),
            routed_experts_expected: moe_layers * cfg.raw.n_routed_experts,
            bytes_per_expert: uniform(&mut main()),
            bytes_per_mtp_expert: uniform(
                &mut experts
                    .iter()
                    .filter(|((l, _), _)| *l >= n)
                    .map(|(_, b)| *b),
            ),
            mtp: has_mtp_layer(cfg, cat),
            indexers: (have, full_layers.len()),
            classes,
            problems,
        }
    }
}

/// Whether the checkpoint has an MTP layer (its `eh_proj` at layer `num_hidden_layers`).
pub(super) fn has_mtp_layer(cfg: &Config, cat: &Catalog) -> bool {
    let n = cfg.raw.num_hidden_layers;
    cat.get(&format!("model.layers.{n}.eh_proj.weight"))
        .is_some()
}

/// The storage format of a weight matrix: its dtype for float tensors, the detected quantised
/// format (checked against any stamp) when it has `.qs` scales; `None` for non-matrices.
pub fn format_of(cat: &Catalog, name: &str, cfg: &Config) -> Result<Option<String>, String> {
    let e = cat.get(name).ok_or("missing")?;
    let Some(qs) = cat.get(&format!("{name}.qs")) else {
        return Ok((e.shape.len() == 2).then(|| e.dtype.to_string().to_lowercase()));
    };
    let [o, i] =
        logical_shape(name, cfg).ok_or("quantised tensor outside the GLM-5 tensor contract")?;
    let scales = (qs.len / 4) as usize;
    quant::resolve(o, i, e.len as usize, scales, cat.stamp(name)).map(|f| Some(f.name()))
}

/// (layer, expert) of a routed-expert tensor name.
pub fn expert_of(name: &str) -> Option<(usize, usize)> {
    let rest = name.strip_prefix("model.layers.")?;
    let (l, rest) = rest.split_once('.')?;
    let rest = rest.strip_prefix("mlp.experts.")?;
    let (x, _) = rest.split_once('.')?;
    Some((l.parse().ok()?, x.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_names() {
        assert_eq!(
            expert_of("model.layers.3.mlp.experts.17.up_proj.weight"),
            Some((3, 17))
        );
        assert_eq!(
            expert_of("model.layers.3.mlp.experts.17.up_proj.weight.qs"),
            Some((3, 17))
        );
        assert_eq!(
            expert_of("model.layers.3.mlp.shared_experts.up_proj.weight"),
            None
        );
    }
}
