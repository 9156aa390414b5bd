//! `nectar fit`: the whole memory equation for a model and a budget, and the LRU capacity it buys.
use crate::args::FitArgs;
use crate::demo::model_dir;
use anyhow::Result;
use nectar_model::arch::glm5::{plan_memory, LoadOptions};
use nectar_residency::planner::{human, parse_size, render};
use serde_json::json;

/// The budget to plan for: the given size, else 90 % of the usable memory (the smaller of
/// MemAvailable and the memory cgroup's headroom).
pub fn resolve_budget(given: Option<&str>) -> Result<u64> {
    match given {
        Some(s) => parse_size(s).map_err(anyhow::Error::msg),
        None => crate::machine::usable_memory()
            .bytes
            .map(|a| a / 10 * 9)
            .ok_or_else(|| anyhow::anyhow!("cannot read available memory; pass --memory-budget")),
    }
}

/// Whether the planned command loads the MTP layer: `--mtp`, else its default (`run`: off,
/// `serve`: auto).
pub fn loads_mtp(a: &FitArgs) -> bool {
    a.mtp
        .as_deref()
        .unwrap_or(if a.serve { "auto" } else { "off" })
        != "off"
}

pub fn run(a: FitArgs) -> Result<()> {
    let budget = resolve_budget(a.memory_budget.as_deref())?;
    if a.project {
        return super::project::run(&a, budget);
    }
    let dir = model_dir(a.model.clone())?;
    let opts = LoadOptions {
        memory_budget: Some(budget),
        ctx_size: a.ctx_size,
        sequences: if a.serve {
            nectar_model::arch::glm5::serve_sequences(a.parallel)
        } else {
            a.parallel.max(1)
        },
        server: a.serve,
        mtp: loads_mtp(&a),
        ..Default::default()
    };
    let (inputs, plan) = plan_memory(&dir, &opts)?;
    match plan {
        Ok(p) => {
            if a.json {
                let terms: Vec<_> = p
                    .terms
                    .iter()
                    .map(|(k, v)| json!({"term": k, "bytes": v}))
                    .collect();
                let out = json!({
                    "model": dir, "budget": budget, "ctx_size": a.ctx_size, "slot_bytes": inputs.slot_bytes,
                    "sparse_layers": inputs.sparse_layers, "lru_per_layer": p.lru_per_layer,
                    "terms": terms, "slack": p.slack,
                });
                println!("{}", serde_json::to_string_pretty(&out)?);
            } else {
                println!(
                    "memory plan for {} (budget {}, context {} tokens):",
                    dir.display(),
                    human(budget),
                    a.ctx_size
                );
                print!("{}", render(&p, budget));
                println!(
                    "  => {} LRU slots per sparse layer ({} layers, {} per slot), {} unused",
                    p.lru_per_layer,
                    inputs.sparse_layers,
                    human(inputs.slot_bytes),
                    human(p.slack)
                );
            }
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}
