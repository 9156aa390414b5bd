//! A probe directory: one usage file per prompt, `<category>_<idx>.txt`, in the usage-ledger
//! grammar (Colibri's STATS format, `colibri-format.md` §8), plus `probe.json` (how the probe
//! ran and what each file holds) when `nectar atlas probe` wrote it. A Colibri STATS directory
//! without `probe.json` reads too.
use super::math::{Run, Stats};
use anyhow::{Context, Result};
use nectar_residency::usage::Ledger;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The probe's manifest file name.
pub const MANIFEST: &str = "probe.json";

/// One prompt of a probe, as `probe.json` lists it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunInfo {
    /// The usage file, relative to the probe directory.
    pub file: String,
    /// Its category.
    pub category: String,
    /// 1-based line of the prompts file.
    pub line: usize,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Greedy tokens generated.
    pub generated_tokens: usize,
    /// Router selections recorded (tokens counted × experts per token).
    pub selections: u64,
}

/// `probe.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    /// Format version (1).
    pub version: u32,
    /// When the probe ran (UTC, ISO 8601).
    pub created: String,
    /// The model: directory and identity hashes.
    pub model: serde_json::Value,
    /// The prompts file: path, SHA-256, prompts probed.
    pub prompts: serde_json::Value,
    /// Which tokens count: `prompt`, `generated` or `both`.
    pub tokens: String,
    /// Greedy tokens generated per prompt (at most).
    pub generate: usize,
    /// Categories in first-appearance order.
    pub categories: Vec<String>,
    /// Main layers (the usage files' layer rows run 0..=layers).
    pub layers: u32,
    /// Routed experts per layer.
    pub experts: u32,
    /// Experts selected per token.
    pub top_k: usize,
    /// Every prompt, in probe order.
    pub runs: Vec<RunInfo>,
}

/// A probe directory read back.
#[derive(Debug)]
pub struct Probe {
    /// The counts.
    pub stats: Stats,
    /// The manifest, when there is one.
    pub manifest: Option<Manifest>,
    /// Per run: its file name.
    pub files: Vec<String>,
}

/// `en_bible_3.txt` → (`en_bible`, 3).
fn split_name(name: &str) -> Option<(&str, usize)> {
    let stem = name.strip_suffix(".txt")?;
    let (cat, idx) = stem.rsplit_once('_')?;
    (!cat.is_empty()).then_some(())?;
    Some((cat, idx.parse().ok()?))
}

/// Dimensions from a usage file's `-1 L E` header, else from its largest record.
fn dims(text: &str) -> (u32, u32) {
    let mut max = (0u32, 0u32);
    for line in text.lines() {
        let f: Vec<i64> = line
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        match f.as_slice() {
            [-1, l, e] => return (*l as u32, *e as u32),
            [l, e, _] if *l >= 0 && *e >= 0 => {
                max = (max.0.max(*l as u32), max.1.max(*e as u32 + 1));
            }
            _ => {}
        }
    }
    max
}

/// Reads a probe directory.
pub fn read(dir: &Path) -> Result<Probe> {
    let mpath = dir.join(MANIFEST);
    let manifest: Option<Manifest> = match std::fs::read(&mpath) {
        Ok(b) => Some(
            serde_json::from_slice(&b).with_context(|| format!("reading {}", mpath.display()))?,
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("reading {}", mpath.display())),
    };
    let (categories, files): (Vec<String>, Vec<(String, String)>) = match &manifest {
        Some(m) => (
            m.categories.clone(),
            m.runs
                .iter()
                .map(|r| (r.file.clone(), r.category.clone()))
                .collect(),
        ),
        None => {
            let mut found = Vec::new();
            for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
                let name = e?.file_name().to_string_lossy().into_owned();
                if let Some((cat, idx)) = split_name(&name) {
                    found.push((cat.to_string(), idx, name.clone()));
                }
            }
            found.sort();
            let mut cats: Vec<String> = found.iter().map(|f| f.0.clone()).collect();
            cats.dedup();
            (cats, found.into_iter().map(|(c, _, n)| (n, c)).collect())
        }
    };
    anyhow::ensure!(
        !files.is_empty(),
        "{}: no usage files (`<category>_<idx>.txt`) to analyse",
        dir.display()
    );
    anyhow::ensure!(
        categories.len() >= 2,
        "{}: {} categor{} — an atlas needs at least 2",
        dir.display(),
        categories.len(),
        if categories.len() == 1 { "y" } else { "ies" }
    );
    let texts: Vec<(PathBuf, String)> = files
        .iter()
        .map(|(f, _)| {
            let p = dir.join(f);
            let t = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()));
            t.map(|t| (p, t))
        })
        .collect::<Result<_>>()?;
    let (layers, experts) = match &manifest {
        Some(m) => (m.layers, m.experts),
        None => texts
            .iter()
            .map(|(_, t)| dims(t))
            .fold((0, 0), |a, b| (a.0.max(b.0), a.1.max(b.1))),
    };
    anyhow::ensure!(experts > 0, "{}: no expert selections", dir.display());
    let cells = (layers as usize + 1) * experts as usize;
    let mut runs = Vec::with_capacity(files.len());
    for ((p, text), (_, cat)) in texts.iter().zip(&files) {
        let mut led = Ledger::new(layers, experts, "glm_moe_dsa");
        // Trusted: the directory was named explicitly (another engine's STATS files read too).
        led.parse_into(text, &p.display().to_string(), true)?;
        let mut counts = vec![0u64; cells];
        for k in led.hottest(usize::MAX, |_| true) {
            counts[k.layer as usize * experts as usize + k.expert as usize] = led.count(k);
        }
        let category = categories
            .iter()
            .position(|c| c == cat)
            .with_context(|| format!("{}: category `{cat}` is not in {MANIFEST}", p.display()))?;
        runs.push(Run { category, counts });
    }
    Ok(Probe {
        stats: Stats {
            categories,
            experts: experts as usize,
            runs,
        },
        manifest,
        files: files.into_iter().map(|f| f.0).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_at_the_last_underscore() {
        assert_eq!(split_name("en_bible_3.txt"), Some(("en_bible", 3)));
        assert_eq!(split_name("zh_0.txt"), Some(("zh", 0)));
        assert_eq!(split_name("zh_x.txt"), None);
        assert_eq!(split_name("_1.txt"), None);
        assert_eq!(split_name("probe.json"), None);
    }

    #[test]
    fn a_colibri_stats_directory_reads_without_a_manifest() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join("code_0.txt"),
            "-1 2 4\n-2 1 3815245270\n1 3 7\n",
        )
        .unwrap();
        // Legacy: no headers; duplicates sum.
        std::fs::write(d.path().join("math_0.txt"), "0 1 5\n0 1 2\n").unwrap();
        std::fs::write(d.path().join("notes.md"), "ignored").unwrap();
        let p = read(d.path()).unwrap();
        assert_eq!(p.stats.categories, ["code", "math"]);
        assert_eq!(p.stats.experts, 4);
        assert_eq!(p.stats.runs[0].counts.len(), 3 * 4);
        assert_eq!(p.stats.runs[0].counts[4 + 3], 7);
        assert_eq!(p.stats.runs[1].counts[1], 7);
        assert_eq!(p.stats.runs[1].category, 1);
    }

    #[test]
    fn a_bad_usage_file_is_named() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a_0.txt"), "0 1 5\n").unwrap();
        std::fs::write(d.path().join("b_0.txt"), "0 1\n").unwrap();
        let e = format!("{:#}", read(d.path()).unwrap_err());
        assert!(e.contains("b_0.txt") && e.contains("3 fields"), "{e}");
    }
}
