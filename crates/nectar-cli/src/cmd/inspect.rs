//! `nectar inspect`: what a model directory holds, from headers only.
use crate::args::InspectArgs;
use crate::demo::model_dir;
use anyhow::{Context, Result};
use nectar_format::Catalog;
use nectar_model::arch::glm5::{Config, Inventory};
use serde_json::json;

pub fn run(a: InspectArgs) -> Result<()> {
    let dir = model_dir(a.model)?;
    let cfg = Config::from_dir(&dir)?;
    let cat = Catalog::open(&dir).with_context(|| format!("reading {}", dir.display()))?;
    let inv = Inventory::new(&cat, &cfg);
    let r = &cfg.raw;
    let summary = json!({
        "model_type": "glm_moe_dsa",
        "layers": r.num_hidden_layers,
        "dense_layers": cfg.dense.iter().filter(|d| **d).count(),
        "hidden_size": r.hidden_size,
        "vocab_size": r.vocab_size,
        "heads": r.num_attention_heads,
        "q_lora_rank": r.q_lora_rank,
        "kv_lora_rank": r.kv_lora_rank,
        "routed_experts_per_layer": r.n_routed_experts,
        "experts_per_token": r.num_experts_per_tok,
        "moe_intermediate_size": r.moe_intermediate_size,
        "index_topk": r.index_topk,
        "full_indexer_layers": (0..r.num_hidden_layers).filter(|&l| cfg.indexer_full[l]).collect::<Vec<_>>(),
        "rope_theta": cfg.rope_theta,
        "eos_token_id": cfg.eos_ids,
        "shards": cat.shards().len(),
        "tensors": cat.len(),
    });
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"config": summary, "inventory": inv}))?
        );
        return Ok(());
    }
    println!("{}", dir.display());
    for (k, v) in summary.as_object().into_iter().flatten() {
        println!("  {k:<26} {v}");
    }
    println!(
        "\n  {:<14} {:>8} {:>14}  dtypes",
        "class", "tensors", "bytes"
    );
    for (class, s) in &inv.classes {
        let name = serde_json::to_value(class)?
            .as_str()
            .unwrap_or_default()
            .to_string();
        println!(
            "  {:<14} {:>8} {:>14}  {:?}",
            name, s.tensors, s.bytes, s.by_dtype
        );
    }
    println!(
        "\n  routed experts: {} of {} expected; bytes per expert: {}; MTP: {}{}; indexers: {}/{} full layers",
        inv.routed_experts,
        inv.routed_experts_expected,
        inv.bytes_per_expert.map_or("not uniform".into(), |b| b.to_string()),
        if inv.mtp { "present" } else { "absent" },
        inv.bytes_per_mtp_expert.map_or(String::new(), |b| format!(" ({b} B per MTP expert)")),
        inv.indexers.0,
        inv.indexers.1
    );
    for p in &inv.problems {
        println!("  problem: {p}");
    }
    anyhow::ensure!(
        inv.problems.is_empty(),
        "{} tensor(s) have unusable formats",
        inv.problems.len()
    );
    Ok(())
}
