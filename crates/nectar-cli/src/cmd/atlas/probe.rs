//! `nectar atlas probe`: every prompt on a fresh cache, prompt prefilled then `--generate`
//! greedy tokens, counting the router's own top-k selections per token and MoE layer (the
//! `Observer::router` hook: per row, before any batch union or cache decision) into one usage
//! file per prompt.
use super::stats::{Manifest, RunInfo, MANIFEST};
use crate::args::AtlasProbeArgs;
use crate::demo::model_dir;
use anyhow::{Context, Result};
use nectar_engine::{hex, ModelBundle, ModelIdentity};
use nectar_model::arch::glm5::LoadOptions;
use nectar_model::{Observer, SeqStep};
use nectar_residency::usage::Ledger;
use nectar_residency::ExpertKey;
use serde_json::json;
use std::path::Path;

/// Prompt tokens prefilled per forward (bounds activation memory for long prompts).
const PREFILL_CHUNK: usize = 256;

/// One prompt of the prompts file.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    /// Its category (`domain` or `category`).
    pub category: String,
    /// The text.
    pub text: String,
    /// 1-based line in the file.
    pub line: usize,
}

/// Reads a JSONL prompts file: `{"domain"|"category": NAME, "text": TEXT}` per line.
pub fn read_prompts(path: &Path) -> Result<Vec<Prompt>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{}:{}", path.display(), i + 1);
        let v: serde_json::Value = serde_json::from_str(line).with_context(at)?;
        let category = v
            .get("domain")
            .or_else(|| v.get("category"))
            .and_then(|c| c.as_str())
            .with_context(|| format!("{}: no string `domain` (or `category`)", at()))?;
        anyhow::ensure!(
            !category.is_empty()
                && category
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c)),
            "{}: category `{category}` must be non-empty ASCII letters, digits, `_`, `-` or `.` \
             (it names files)",
            at()
        );
        let text = v
            .get("text")
            .and_then(|t| t.as_str())
            .with_context(|| format!("{}: no string `text`", at()))?;
        out.push(Prompt {
            category: category.to_string(),
            text: text.to_string(),
            line: i + 1,
        });
    }
    anyhow::ensure!(!out.is_empty(), "{}: no prompts", path.display());
    Ok(out)
}

/// Counts router selections per (layer, expert) while `on`.
struct Tally {
    ledger: Ledger,
    on: bool,
    selections: u64,
}

impl Observer for Tally {
    fn router(&mut self, layer: usize, _row: usize, ids: &[u32], _weights: &[f32]) {
        if self.on {
            for &e in ids {
                self.ledger.add(ExpertKey::new(layer, e as usize), 1);
            }
            self.selections += ids.len() as u64;
        }
    }
}

/// Index of the largest logit (the lowest id among equals: greedy decoding's rule).
fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// One prompt: prefill, then greedy tokens; returns the tally and the tokens generated.
fn probe_one(
    bundle: &ModelBundle,
    ids: &[u32],
    generate: usize,
    mode: &str,
    tally: &mut Tally,
) -> Result<usize> {
    let model = &bundle.model;
    let hd = model.hidden_size();
    let mut cache = model.new_cache();
    tally.on = mode != "generated";
    let mut hidden = Vec::new();
    for chunk in ids.chunks(PREFILL_CHUNK) {
        hidden = model.forward(
            &mut [SeqStep {
                cache: &mut cache,
                tokens: chunk,
            }],
            tally,
        )?;
    }
    tally.on = mode != "prompt";
    let mut generated = 0;
    while generated < generate {
        let last = &hidden[hidden.len() - hd..];
        let next = argmax(&model.logits(last)?);
        if bundle.stop_ids.contains(&next) {
            break;
        }
        generated += 1;
        hidden = model.forward(
            &mut [SeqStep {
                cache: &mut cache,
                tokens: &[next],
            }],
            tally,
        )?;
    }
    Ok(generated)
}

pub fn run(a: AtlasProbeArgs) -> Result<()> {
    let dir = model_dir(a.model)?;
    let prompts_path = a
        .prompts
        .clone()
        .unwrap_or_else(|| dir.join("atlas-prompts.jsonl"));
    let prompts_bytes = std::fs::read(&prompts_path)
        .with_context(|| format!("reading {}", prompts_path.display()))?;
    let mut prompts = read_prompts(&prompts_path)?;
    if let Some(n) = a.per_category {
        let mut seen = std::collections::HashMap::<String, usize>::new();
        prompts.retain(|p| {
            let c = seen.entry(p.category.clone()).or_default();
            *c += 1;
            *c <= n
        });
    }
    let budget = match &a.memory_budget {
        Some(b) => Some(crate::cmd::fit::resolve_budget(Some(b))?),
        None => None,
    };
    let opts = LoadOptions {
        memory_budget: budget,
        ..Default::default()
    };
    let bundle = ModelBundle::open_with(&dir, &opts)
        .with_context(|| format!("loading {}", dir.display()))?;
    let id = ModelIdentity::of(&dir, &bundle.model)?;
    let raw = &bundle.model.cfg.raw;
    let (layers, experts) = (raw.num_hidden_layers as u32, raw.n_routed_experts as u32);
    let model_type = raw.model_type.as_deref().unwrap_or("glm_moe_dsa");
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    clear_old(&a.out)?;

    let mut categories: Vec<String> = Vec::new();
    let mut runs = Vec::new();
    let t0 = std::time::Instant::now();
    for p in &prompts {
        let idx = runs
            .iter()
            .filter(|r: &&RunInfo| r.category == p.category)
            .count();
        if !categories.contains(&p.category) {
            categories.push(p.category.clone());
        }
        let ids = bundle
            .encode_text(&p.text)
            .with_context(|| format!("{}:{}", prompts_path.display(), p.line))?;
        anyhow::ensure!(
            !ids.is_empty(),
            "{}:{}: the prompt has no tokens",
            prompts_path.display(),
            p.line
        );
        let mut tally = Tally {
            ledger: Ledger::new(layers, experts, model_type),
            on: false,
            selections: 0,
        };
        let generated = probe_one(&bundle, &ids, a.generate, &a.tokens, &mut tally)?;
        let file = format!("{}_{idx}.txt", p.category);
        tally.ledger.save(&a.out.join(&file))?;
        runs.push(RunInfo {
            file,
            category: p.category.clone(),
            line: p.line,
            prompt_tokens: ids.len(),
            generated_tokens: generated,
            selections: tally.selections,
        });
    }
    let manifest = Manifest {
        version: 1,
        created: super::utc_now(),
        model: json!({
            "dir": dir,
            "sha256": super::sha256_hex(&[id.config, id.quant, id.tokenizer].concat()),
            "model_type": model_type,
            "config_sha256": hex(&id.config),
            "quant_layout_sha256": hex(&id.quant),
            "tokenizer_sha256": hex(&id.tokenizer),
        }),
        prompts: json!({
            "path": prompts_path,
            "sha256": super::sha256_hex(&prompts_bytes),
            "probed": runs.len(),
            "per_category_limit": a.per_category,
        }),
        tokens: a.tokens.clone(),
        generate: a.generate,
        categories,
        layers,
        experts,
        top_k: raw.num_experts_per_tok,
        runs,
    };
    nectar_format::atomic::write_atomic_bytes(
        &a.out.join(MANIFEST),
        &serde_json::to_vec_pretty(&manifest)?,
    )?;
    let toks: usize = manifest
        .runs
        .iter()
        .map(|r| r.prompt_tokens + r.generated_tokens)
        .sum();
    eprintln!(
        "probed {} prompts in {} categories ({} tokens, counting {} tokens) in {:.1} s → {}",
        manifest.runs.len(),
        manifest.categories.len(),
        toks,
        manifest.tokens,
        t0.elapsed().as_secs_f64(),
        a.out.display()
    );
    Ok(())
}

/// Removes a previous probe's usage files (those its manifest lists) and then the manifest, so
/// the directory never mixes two probes. Files no manifest claims are left alone: they are not
/// this command's to delete, and `analyze` reads only what the new manifest lists.
fn clear_old(out: &Path) -> Result<()> {
    let rm = |p: &Path| match std::fs::remove_file(p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", p.display()))
        }
        _ => Ok(()),
    };
    let mpath = out.join(MANIFEST);
    let old: Option<Manifest> = std::fs::read(&mpath)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    for r in old.iter().flat_map(|m| &m.runs) {
        // Only plain names inside `out`: a manifest never sends a deletion elsewhere.
        if Path::new(&r.file).file_name() == Some(std::ffi::OsStr::new(&r.file)) {
            rm(&out.join(&r.file))?;
        }
    }
    rm(&mpath)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_probe_removes_only_the_old_probes_files() {
        let d = tempfile::tempdir().unwrap();
        let m = serde_json::json!({
            "version": 1, "created": "", "model": {}, "prompts": {}, "tokens": "both",
            "generate": 0, "categories": ["a"], "layers": 1, "experts": 2, "top_k": 1,
            "runs": [
                {"file": "a_0.txt", "category": "a", "line": 1, "prompt_tokens": 1,
                 "generated_tokens": 0, "selections": 1},
                {"file": "../evil_0.txt", "category": "a", "line": 2, "prompt_tokens": 1,
                 "generated_tokens": 0, "selections": 1},
            ],
        });
        let out = d.path().join("out");
        std::fs::create_dir(&out).unwrap();
        std::fs::write(out.join(MANIFEST), m.to_string()).unwrap();
        for f in ["out/a_0.txt", "out/notes_1.txt", "evil_0.txt"] {
            std::fs::write(d.path().join(f), "0 0 1\n").unwrap();
        }
        clear_old(&out).unwrap();
        assert!(!out.join("a_0.txt").exists() && !out.join(MANIFEST).exists());
        assert!(out.join("notes_1.txt").exists() && d.path().join("evil_0.txt").exists());
        // An empty directory is fine.
        clear_old(&out).unwrap();
    }

    #[test]
    fn prompts_accept_domain_or_category_and_name_bad_lines() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("p.jsonl");
        std::fs::write(
            &p,
            "{\"domain\":\"zh\",\"text\":\"a\"}\n\n{\"category\":\"code\",\"text\":\"b\"}\n",
        )
        .unwrap();
        let v = read_prompts(&p).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!((v[1].category.as_str(), v[1].line), ("code", 3));
        std::fs::write(&p, "{\"domain\":\"zh\",\"text\":\"a\"}\n{\"text\":\"b\"}\n").unwrap();
        let e = format!("{:#}", read_prompts(&p).unwrap_err());
        assert!(e.contains("p.jsonl:2") && e.contains("domain"), "{e}");
        std::fs::write(&p, "{\"domain\":\"a/b\",\"text\":\"a\"}\n").unwrap();
        let e = format!("{:#}", read_prompts(&p).unwrap_err());
        assert!(e.contains("a/b"), "{e}");
    }
}
