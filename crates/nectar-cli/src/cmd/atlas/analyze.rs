//! `nectar atlas analyze`: a probe directory → `experts.json` (Colibri §10, one entry per
//! characterised expert) and `atlas.json` (provenance, counts, validation), both written
//! crash-safely.
use super::math::{characterise, leave_one_out, shuffled, Expert, Lopo, Params, SMOOTHING};
use super::stats::{read, Probe};
use crate::args::AtlasAnalyzeArgs;
use anyhow::{Context, Result};
use nectar_format::atomic::write_atomic_bytes;
use serde_json::{json, Value};
use std::io::Write;

/// Seed of the label-shuffled control.
const CONTROL_SEED: u64 = 0x5eed;

/// Rounded to 4 decimals (keeps GLM-5.2's 19,456 experts × C probabilities small).
fn r4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

/// One `experts.json` entry: §10's fields, then Nectar's additions.
fn expert_json(e: &Expert, cats: &[String]) -> Value {
    json!({
        "layer": e.layer,
        "expert": e.expert,
        "total": e.total,
        "spec": r4(e.spec),
        "top_topic": cats[e.top],
        "top_lift": r4(e.top_lift),
        "reliability": format!("{}/{}", e.fired, e.runs),
        "p": e.p.iter().map(|&x| r4(x)).collect::<Vec<_>>(),
        "entropy_bits": r4(e.entropy / std::f64::consts::LN_2),
        "support": e.support,
        "replicated": e.replicated,
        "specialist": e.specialist,
        "label": if e.specialist { format!("specialist: {}", cats[e.top]) } else { "generalist".into() },
    })
}

fn lopo_json(l: &Lopo, cats: &[String]) -> Value {
    json!({
        "method": "leave-one-prompt-out: each prompt classified from its own routes by an \
                   atlas built without it (naive Bayes over p(category | expert))",
        "correct": l.correct,
        "prompts": l.runs,
        "accuracy": l.accuracy,
        "chance": l.chance,
        "per_category": cats.iter().zip(&l.per_category)
            .map(|(c, (ok, n))| json!({"category": c, "correct": ok, "prompts": n}))
            .collect::<Vec<_>>(),
    })
}

/// The analysis of a probe: `(experts.json, atlas.json)`.
pub fn analyze(probe: &Probe, params: &Params) -> (Value, Value) {
    let s = &probe.stats;
    let cats = &s.categories;
    let experts = characterise(s, params);
    let lopo = leave_one_out(s, params);
    let control = leave_one_out(&shuffled(s, CONTROL_SEED), params);
    let cells_used = (0..s.runs.first().map_or(0, |r| r.counts.len()))
        .filter(|&c| s.runs.iter().any(|r| r.counts[c] > 0))
        .count();
    let per_cat: Vec<Value> = cats
        .iter()
        .enumerate()
        .map(|(k, name)| {
            let runs: Vec<usize> = (0..s.runs.len())
                .filter(|&i| s.runs[i].category == k)
                .collect();
            let sel: u64 = runs
                .iter()
                .map(|&i| s.runs[i].counts.iter().sum::<u64>())
                .sum();
            let toks = |f: fn(&super::stats::RunInfo) -> usize| {
                probe.manifest.as_ref().map(|m| {
                    m.runs
                        .iter()
                        .filter(|r| &r.category == name)
                        .map(f)
                        .sum::<usize>()
                })
            };
            json!({
                "category": name, "prompts": runs.len(), "selections": sel,
                "prompt_tokens": toks(|r| r.prompt_tokens),
                "generated_tokens": toks(|r| r.generated_tokens),
            })
        })
        .collect();
    let specialists = experts.iter().filter(|e| e.specialist).count();
    let strong = experts.iter().filter(|e| e.spec >= params.strong).count();
    let out = json!({
        "categories": cats,
        "experts": experts.iter().map(|e| expert_json(e, cats)).collect::<Vec<_>>(),
    });
    let m = probe.manifest.as_ref();
    let atlas = json!({
        "version": 1,
        "created": super::utc_now(),
        "model": m.map(|m| m.model.clone()),
        "prompts": m.map(|m| m.prompts.clone()),
        "probe": m.map(|m| json!({"created": m.created, "tokens": m.tokens,
                                  "generate": m.generate, "top_k": m.top_k,
                                  "layers": m.layers, "experts_per_layer": m.experts})),
        "stats_files": probe.files.len(),
        "params": {"min_count": params.min_count, "min_runs": params.min_runs,
                   "strong": params.strong, "smoothing": SMOOTHING},
        "categories": per_cat,
        "experts": {
            "selected_at_least_once": cells_used,
            "characterised": experts.len(),
            "sparse": cells_used - experts.len(),
            "strong": strong,
            "specialists": specialists,
            "unreplicated_strong": strong - experts.iter().filter(|e| e.spec >= params.strong && e.replicated).count(),
        },
        "validation": lopo_json(&lopo, cats),
        "control": {
            "method": "the same leave-one-prompt-out on these runs with category labels \
                       shuffled (sizes kept): what the classifier reaches without information",
            "seed": CONTROL_SEED,
            "correct": control.correct,
            "accuracy": control.accuracy,
        },
    });
    (out, atlas)
}

pub fn run(a: AtlasAnalyzeArgs) -> Result<()> {
    let probe = read(&a.stats)?;
    let params = Params {
        min_count: a.min_count,
        min_runs: a.min_runs,
        strong: a.strong,
    };
    let (experts, atlas) = analyze(&probe, &params);
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    write_atomic_bytes(&a.out.join("experts.json"), &serde_json::to_vec(&experts)?)?;
    write_atomic_bytes(
        &a.out.join("atlas.json"),
        &serde_json::to_vec_pretty(&atlas)?,
    )?;
    let e = &atlas["experts"];
    let v = &atlas["validation"];
    let f = |x: &Value| x.as_f64().unwrap_or(0.0);
    let mut o = std::io::stdout().lock();
    writeln!(
        o,
        "{} prompts in {} categories: {} experts characterised ({} sparse), {} specialists \
         (spec ≥ {}, replicated in ≥ {} prompts), {} strong but unreplicated",
        probe.stats.runs.len(),
        probe.stats.categories.len(),
        e["characterised"],
        e["sparse"],
        e["specialists"],
        a.strong,
        a.min_runs,
        e["unreplicated_strong"]
    )?;
    writeln!(
        o,
        "leave-one-prompt-out: {}/{} = {:.3} (chance {:.3}; labels shuffled: {:.3})",
        v["correct"],
        v["prompts"],
        f(&v["accuracy"]),
        f(&v["chance"]),
        f(&atlas["control"]["accuracy"])
    )?;
    writeln!(o, "wrote {}/experts.json and atlas.json", a.out.display())?;
    Ok(())
}
