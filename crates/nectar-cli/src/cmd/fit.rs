//! `nectar fit`: the whole memory equation for a model and a budget, and the LRU capacity it buys.
use crate::args::FitArgs;
use crate::demo::model_dir;
use anyhow::Result;
use nectar_model::arch::glm5::{
    plan_memory, resolve_gpu_budget, GpuMemory, GpuPlan, LoadOptions, PinRequest,
};
use nectar_residency::planner::{human, parse_size, render, Plan, PlanInputs};
use serde_json::{json, Value};
use std::path::Path;

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

/// The load options of the planned command (`run`, or `serve --parallel N` with `--serve`)
/// under `budget`, without the VRAM tier.
pub fn load_options(a: &FitArgs, budget: u64) -> LoadOptions {
    LoadOptions {
        memory_budget: Some(budget),
        ctx_size: a.ctx_size,
        sequences: if a.serve {
            nectar_model::arch::glm5::serve_sequences(a.parallel)
        } else {
            a.parallel.max(1)
        },
        server: a.serve,
        mtp: loads_mtp(a),
        // PILOT's prefetch slots come out of the plan (`run --prefetch pilot` plans them).
        prefetch: nectar_model::arch::glm5::Prefetch::parse(&a.prefetch).unwrap_or_default(),
        ..Default::default()
    }
}

pub fn run(a: FitArgs) -> Result<()> {
    let budget = resolve_budget(a.memory_budget.as_deref())?;
    if a.project {
        return super::project::run(&a, budget);
    }
    if let Some(g) = a.geometry.as_deref() {
        return plan_geometry(&a, g, budget);
    }
    let dir = model_dir(a.model.clone())?;
    let (gpu_memory, pin) = gpu_options(&dir, a.gpu_memory.as_deref())?;
    let opts = LoadOptions {
        gpu_memory,
        pin,
        ..load_options(&a, budget)
    };
    // One plan for RAM and VRAM, the one `run` and `serve` apply: with `--gpu-memory` the RAM
    // plan counts only the spine left on the CPU.
    let mp = plan_memory(&dir, &opts)?;
    let (inputs, gpu) = (mp.inputs, mp.gpu);
    let ram_spine: u64 = inputs.spine.iter().map(|x| x.1).sum();
    let p = mp.plan?;
    let (gpu_json, gpu_text) = match &gpu {
        Some(g) => (Some(gpu_json(g, ram_spine)), render_gpu(g, ram_spine)),
        None => (None, String::new()),
    };
    let what = ("model", dir.display().to_string());
    let top_k = nectar_model::arch::glm5::Config::from_dir(&dir)?
        .raw
        .num_experts_per_tok;
    show(&a, (budget, top_k), what, &inputs, &p, gpu_json, &gpu_text)
}

/// `fit --geometry NAME` without `--project`: the memory plan of a built-in geometry (GLM-5.2's
/// constants), as `run` or `serve` would plan it on this machine's cores.
fn plan_geometry(a: &FitArgs, name: &str, budget: u64) -> Result<()> {
    let enc = super::project::Glm52::parse(name)?;
    anyhow::ensure!(
        a.gpu_memory.is_none(),
        "--geometry plans no VRAM tier without --project (use --project --gpu-memory SIZE)"
    );
    let cores = a.cores.unwrap_or_else(rayon::current_num_threads);
    let (geom, inputs) = super::project::Geometry::glm52(enc, &load_options(a, budget), cores);
    let p = nectar_residency::planner::plan(&inputs)?;
    show(
        a,
        (budget, geom.top_k),
        ("geometry", geom.source),
        &inputs,
        &p,
        None,
        "",
    )
}

/// Prints a plan (JSON with `--json`): `what` names what was planned (its JSON key and the
/// name, also the title), `gpu_*` the VRAM lines.
fn show(
    a: &FitArgs,
    (budget, top_k): (u64, usize),
    what: (&str, String),
    inputs: &PlanInputs,
    p: &Plan,
    gpu_json: Option<Value>,
    gpu_text: &str,
) -> Result<()> {
    let (key, title) = what;
    let lone = lone_client(a, (inputs, p), &load_options(a, budget), top_k)?;
    if a.json {
        let terms: Vec<_> = p
            .terms
            .iter()
            .map(|(k, v)| json!({"term": k, "bytes": v}))
            .collect();
        let mut out = json!({
            "budget": budget, "ctx_size": a.ctx_size, "slot_bytes": inputs.slot_bytes,
            "sparse_layers": inputs.sparse_layers, "lru_per_layer": p.lru_per_layer,
            "lru_extra_layers": p.lru_extra_layers,
            "terms": terms, "slack": p.slack, "gpu": gpu_json,
        });
        out[key] = json!(title);
        out["lone_client"] = lone.as_ref().map_or(Value::Null, |(p, lent)| {
            json!({
                "sequences_in_use": nectar_model::arch::glm5::serve_sequences(1),
                "lru_per_layer": p.lru_per_layer, "lru_extra_layers": p.lru_extra_layers,
                "lent_bytes": lent,
            })
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "memory plan for {title} (budget {}, context {} tokens):",
            human(budget),
            a.ctx_size
        );
        print!("{}", render(p, budget));
        println!(
            "  => {} per sparse layer ({} layers, {} per slot), {} unused",
            p.lru_words(),
            inputs.sparse_layers,
            human(inputs.slot_bytes),
            human(p.slack)
        );
        if let Some((lone, lent)) = &lone {
            println!(
                "  => a lone client: {} per sparse layer between prompts ({} lent to the LRU: the idle rows' KV cache and activations, the prompt transients, the working bank's spare slots)",
                lone.lru_words(),
                human(*lent)
            );
        }
        print!("{gpu_text}");
    }
    Ok(())
}

/// With `--serve`: the plan a lone client decodes with (one row and the kept conversation in
/// use, between prompts: the other rows' KV and activations, the prompt transients and the
/// bank's spare slots lent to the LRU, `nectar_model::arch::glm5::lent_inputs`), and the bytes
/// lent. The same for every `--parallel`: what a larger server plans beyond it is all lent.
fn lone_client(
    a: &FitArgs,
    (inputs, full): (&PlanInputs, &Plan),
    opts: &LoadOptions,
    top_k: usize,
) -> Result<Option<(Plan, u64)>> {
    if !a.serve {
        return Ok(None);
    }
    let k = nectar_model::arch::glm5::serve_sequences(1);
    let lone = nectar_model::arch::glm5::lent_inputs(inputs, k, false, top_k, opts);
    let p = nectar_residency::planner::plan(&lone)?;
    let lent = p.lru_bytes + p.slack - full.lru_bytes - full.slack;
    Ok(Some((p, lent)))
}

/// `--gpu-memory FLAG` as load options: the VRAM to plan (`auto` opens the GPU to read its
/// free memory) and the directory's usage ledger, which ranks the VRAM experts as `run` and
/// `serve` rank them. `fit` always plans a memory budget, so experts stream through RAM and the
/// plan carves the staging area for copied experts out of the VRAM, as the load does.
pub(super) fn gpu_options(
    dir: &Path,
    flag: Option<&str>,
) -> Result<(Option<GpuMemory>, Option<PinRequest>)> {
    let Some(flag) = flag else {
        return Ok((None, None));
    };
    let req = super::gpu_flag::resolve(Some(flag))?
        .ok_or_else(|| anyhow::anyhow!("--gpu-memory off: nothing goes to VRAM"))?;
    let budget =
        resolve_gpu_budget(req).map_err(|e| anyhow::anyhow!("--gpu-memory {flag}: {e}"))?;
    let pin = nectar_engine::pin_request(dir, None, None)
        .ok()
        .and_then(|(r, _)| r);
    Ok((Some(GpuMemory::Size(budget)), pin))
}

/// The VRAM lines: each spine class placed, the routed experts in VRAM per layer, and what
/// stays in RAM (`ram_spine`: the spine terms of the plan above; the experts streamed under
/// its budget).
fn render_gpu(g: &GpuPlan, ram_spine: u64) -> String {
    let mut out = format!("VRAM plan (--gpu-memory {}):\n", human(g.budget));
    for c in &g.classes {
        out += &format!(
            "  {:>12}  {} ({} of {} matrices)\n",
            human(c.placed_bytes),
            c.name,
            c.placed,
            c.total
        );
    }
    if g.staging_slots > 0 {
        out += &format!(
            "  {:>12}  staging for experts copied from RAM: {} slots of {}\n",
            human(g.staging_bytes),
            g.staging_slots,
            human(g.staging_bytes / g.staging_slots as u64)
        );
    }
    let (held, total): (usize, usize) = g
        .per_layer
        .values()
        .fold((0, 0), |(h, t), x| (h + x.0, t + x.1));
    out += &format!(
        "  {:>12}  routed experts: {held} of {total} in VRAM\n",
        human(g.expert_bytes())
    );
    let layers: Vec<String> = g
        .per_layer
        .iter()
        .map(|(l, (k, n, _))| format!("{l}: {k}/{n}"))
        .collect();
    out += &format!(
        "                experts in VRAM per layer: {}\n",
        layers.join(", ")
    );
    let used = g.used_bytes();
    out += &format!(
        "  {:>12}  in VRAM, {} unused\n",
        human(used),
        human(g.budget.saturating_sub(used))
    );
    let (left, left_bytes) = g.spine_left();
    let kept = g.spine_bytes() - g.released_bytes;
    out += &format!(
        "  => RAM spine after VRAM placement: {} (the plan above; {} of host copies released, \
         {} kept: kv_b, for decode attention on the CPU when a KV mirror does not fit)\n",
        human(ram_spine),
        human(g.released_bytes),
        human(kept),
    );
    out += &format!(
        "  => stays in RAM: {left} spine matrices ({}), computed on the CPU; {} routed experts \
         through the RAM cache above (VRAM experts take no slot and are never pinned){}\n",
        human(left_bytes),
        total - held,
        if g.staging_slots > 0 {
            ", each copied to the staging area or computed on the CPU, as measured costs favour"
        } else {
            ""
        },
    );
    out
}

fn gpu_json(g: &GpuPlan, ram_spine: u64) -> Value {
    let (left, left_bytes) = g.spine_left();
    json!({
        "ram_spine_bytes": ram_spine,
        "released_bytes": g.released_bytes,
        "kept_host_bytes": g.spine_bytes() - g.released_bytes,
        "budget": g.budget,
        "classes": g.classes.iter().map(|c| json!({
            "class": c.name, "placed": c.placed, "matrices": c.total,
            "placed_bytes": c.placed_bytes, "bytes": c.total_bytes,
        })).collect::<Vec<_>>(),
        "spine_bytes": g.spine_bytes(),
        "spine_left": {"matrices": left, "bytes": left_bytes},
        "expert_bytes": g.expert_bytes(),
        "staging": {"slots": g.staging_slots, "bytes": g.staging_bytes},
        "used_bytes": g.used_bytes(),
        "experts_per_layer": g.per_layer.iter().map(|(l, (k, n, b))| json!({
            "layer": l, "in_vram": k, "experts": n, "expert_bytes": b,
        })).collect::<Vec<_>>(),
    })
}
