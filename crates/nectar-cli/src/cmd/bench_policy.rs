//! `nectar bench policy`: a recorded routing trace replayed through the real slot policy (the
//! `Policy` state machine the residency manager runs, not a re-implementation) and through
//! Belady-OPT with bypass computed by the same tool under the same step model
//! (`nectar_residency::replay`). The default trace is route256: real routing of a model trained
//! with GLM-5.2's expert shape (256 experts, top-8), so the hit rates speak for GLM-5.2's
//! cache at the same slots per layer.
use crate::args::BenchPolicyArgs;
use anyhow::{Context, Result};
use nectar_residency::replay::{compare_setup, hottest, CacheSetup};
use nectar_residency::trace::Trace;
use nectar_residency::Admission;
use serde_json::json;
use std::path::PathBuf;

/// The route256 traces shipped with the repository.
pub fn default_trace_dir() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/traces/route256"
    ))
}

/// A policy name of `--admission` as the residency crate's [`Admission`]; `half_life`
/// replaces the frequency policy's.
pub fn parse_admission(name: &str, half_life: f64) -> Result<Admission> {
    anyhow::ensure!(
        half_life > 0.0 && half_life.is_finite(),
        "--half-life must be positive, got {half_life}"
    );
    match Admission::from_name(name) {
        Some(Admission::Frequency { .. }) => Ok(Admission::Frequency { half_life }),
        Some(a) => Ok(a),
        None => anyhow::bail!(
            "unknown admission `{name}` ({})",
            Admission::NAMES.join(", ")
        ),
    }
}

pub fn policy(a: BenchPolicyArgs) -> Result<()> {
    let dir = a.trace.clone().unwrap_or_else(default_trace_dir);
    let kinds = if a.kinds.is_empty() {
        Trace::kinds(&dir)?
    } else {
        a.kinds.clone()
    };
    anyhow::ensure!(!a.slots.is_empty(), "--slots needs at least one count");
    anyhow::ensure!(
        a.pin > 0 || !a.slots.contains(&0),
        "--slots: 0 slots without --pin caches nothing (no hit rate to compare with Belady)"
    );
    anyhow::ensure!(a.window >= 1, "--window must be at least 1");
    let admissions: Vec<(String, Admission)> = a
        .admission
        .iter()
        .map(|n| Ok((n.clone(), parse_admission(n, a.half_life)?)))
        .collect::<Result<_>>()?;
    let mut rows = Vec::new();
    for kind in &kinds {
        let trace = Trace::load(&dir, kind).with_context(|| format!("trace `{kind}`"))?;
        let n = trace.hidden_layers();
        let layers = match a.layers.as_str() {
            "mtp" => trace.mtp_layers(n),
            "all" => (0..trace.layers.len()).collect(),
            _ => trace.main_layers(n),
        };
        anyhow::ensure!(
            !layers.is_empty(),
            "{}: no {} layers (the MTP layer is known from model-config.json beside the manifest)",
            trace.path.display(),
            a.layers
        );
        let pinned = if a.pin > 0 {
            let ledger = Trace::load(&dir, "prefill").context("--pin learns from `prefill`")?;
            hottest(&ledger, &layers, a.pin)
        } else {
            Vec::new()
        };
        for &slots in &a.slots {
            for (name, adm) in &admissions {
                let setup = CacheSetup {
                    capacity: slots,
                    extra: Vec::new(),
                    prompt_lru: None,
                    admission: *adm,
                    pinned: pinned.clone(),
                    repin_swaps: a.repin,
                };
                let r = compare_setup(&trace, a.window, &layers, &setup);
                rows.push(json!({
                    "trace": kind,
                    "slots": slots,
                    "admission": name,
                    "hit_rate": r.policy.rate(),
                    "belady_hit_rate": r.belady.rate(),
                    "ratio": r.ratio(),
                    "requests": r.policy.requests,
                    "misses_per_step_layer": (r.policy.requests - r.policy.hits) as f64
                        / steps_layers(&trace, a.window, layers.len()) as f64,
                }));
            }
        }
    }
    let first = Trace::load(&dir, &kinds[0])?;
    let out = json!({
        "trace_dir": dir.display().to_string(),
        "experts_per_layer": first.experts_per_layer,
        "top_k": first.top_k,
        "layers": a.layers,
        "window": a.window,
        "half_life": a.half_life,
        "pinned_per_layer": a.pin,
        "repin_swaps_per_turn": a.repin,
        "step_model": "prompt rows replayed one per step, not counted; decode rows `window` per \
                       step; per layer the unique experts of a step are its requests; cache \
                       reset per segment where the manifest says so",
        "results": rows,
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "trace {} ({} experts, top-{}), {} layers, {} row(s) per step, {} pinned per layer{}",
        dir.display(),
        first.experts_per_layer,
        first.top_k,
        a.layers,
        a.window,
        a.pin,
        if a.repin > 0 {
            format!(", live repin (≤ {} swaps per turn)", a.repin)
        } else {
            String::new()
        }
    );
    println!(
        "{:<15} {:>5} {:<10} {:>8} {:>8} {:>6}",
        "trace", "slots", "admission", "hit", "belady", "ratio"
    );
    for r in &rows {
        println!(
            "{:<15} {:>5} {:<10} {:>8.3} {:>8.3} {:>6.3}",
            r["trace"].as_str().unwrap_or(""),
            r["slots"].as_u64().unwrap_or(0),
            r["admission"].as_str().unwrap_or(""),
            r["hit_rate"].as_f64().unwrap_or(0.0),
            r["belady_hit_rate"].as_f64().unwrap_or(0.0),
            r["ratio"].as_f64().unwrap_or(0.0),
        );
    }
    Ok(())
}

/// Counted (decode) steps × layers: the denominator of misses per step and layer.
fn steps_layers(trace: &Trace, window: usize, layers: usize) -> usize {
    nectar_residency::replay::steps(trace, window)
        .iter()
        .filter(|s| s.counted)
        .count()
        .max(1)
        * layers
}
