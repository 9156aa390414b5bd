//! `nectar convert`: a Hugging Face checkpoint (FP8 e4m3 + 128×128 `weight_scale_inv`, BF16,
//! F16 or F32) → a Colibri-layout container, one input shard at a time.
//!
//! Per input shard `k` (1-based, in name order) the converter writes up to three shards —
//! `out-k`, `out-mtp-k`, `out-idx-k` (5 digits) — so main weights, the MTP layer and the DSA
//! indexers come out of one pass. Each output is planned from headers first (exact offsets),
//! written to `NAME.tmp` one tensor at a time in row blocks, fsynced and renamed; only then is
//! the shard recorded in `.out-progress.json`. A crash or Ctrl-C therefore never leaves a shard
//! that looks complete, and a rerun resumes after the last recorded shard. `.out-params.json`
//! pins the parameters (a resume with different ones is refused) and `.convert.lock` keeps a
//! second converter out. Free disk space is checked before each shard.
mod plan;
mod write;

pub use plan::{bits_for, family, outputs, Bits, ConvertParams, Family, OutTensor};

use crate::catalog::Catalog;
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Files copied verbatim from the source directory when present.
pub const COPIED_FILES: [&str; 6] = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
];

const PARAMS_FILE: &str = ".out-params.json";
const PROGRESS_FILE: &str = ".out-progress.json";
const LOCK_FILE: &str = ".convert.lock";

/// Progress of a conversion, reported after each tensor and each shard.
#[derive(Debug, Clone)]
pub struct ConvertEvent {
    /// 0-based index of the input shard.
    pub shard: usize,
    /// Input shards in all.
    pub shards: usize,
    /// Input bytes processed so far (skipped shards count as done).
    pub bytes_done: u64,
    /// Input bytes in all.
    pub bytes_total: u64,
    /// True when this shard was already converted by an earlier run.
    pub skipped: bool,
}

/// What a conversion did.
#[derive(Debug, Clone, Default)]
pub struct ConvertReport {
    /// Input shards converted by this run.
    pub converted: usize,
    /// Input shards an earlier run had converted.
    pub skipped: usize,
    /// Output bytes written by this run.
    pub bytes_written: u64,
    /// Output shard files (all runs).
    pub outputs: Vec<PathBuf>,
}

/// Converts `from` into `to` (see the module docs). `min_free` is the free space (bytes) that
/// must remain on the output filesystem after each shard.
pub fn convert(
    from: &Path,
    to: &Path,
    params: &ConvertParams,
    min_free: u64,
    progress: &mut dyn FnMut(&ConvertEvent),
) -> Result<ConvertReport> {
    std::fs::create_dir_all(to).map_err(|e| Error::io(to, e))?;
    let lock_path = to.join(LOCK_FILE);
    let lock = std::fs::File::create(&lock_path).map_err(|e| Error::io(&lock_path, e))?;
    if lock.try_lock().is_err() {
        return Err(Error::Convert(format!(
            "{}: another `nectar convert` is writing this directory (lock held)",
            to.display()
        )));
    }
    check_params(to, params)?;
    write::remove_stale_temps(to)?;
    let cat = Catalog::open(from)?;
    let mut done = read_progress(to)?;
    let totals: Vec<u64> = (0..cat.shards().len())
        .map(|k| cat.tensors().filter(|e| e.shard == k).map(|e| e.len).sum())
        .collect();
    let bytes_total: u64 = totals.iter().sum();
    let mut report = ConvertReport::default();
    let mut bytes_done = 0u64;
    for (k, shard) in cat.shards().iter().enumerate() {
        let key = shard
            .path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        let ev = |bytes_done, skipped| ConvertEvent {
            shard: k,
            shards: cat.shards().len(),
            bytes_done,
            bytes_total,
            skipped,
        };
        if let Some(outs) = done.get(&key) {
            bytes_done += totals[k];
            report.skipped += 1;
            report.outputs.extend(outs.iter().map(|o| to.join(o)));
            progress(&ev(bytes_done, true));
            continue;
        }
        let base = bytes_done;
        let written = write::convert_shard(&cat, k, to, params, min_free, &mut |b| {
            progress(&ev(base + b, false))
        })?;
        bytes_done += totals[k];
        report.converted += 1;
        report.bytes_written += written.iter().map(|(_, b)| b).sum::<u64>();
        let names: Vec<String> = written
            .iter()
            .map(|(p, _)| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        report.outputs.extend(written.into_iter().map(|(p, _)| p));
        done.insert(key, names);
        write::write_json_atomic(
            &to.join(PROGRESS_FILE),
            &serde_json::json!({ "done": done }),
        )?;
        progress(&ev(bytes_done, false));
    }
    for f in COPIED_FILES {
        let src = from.join(f);
        if src.exists() {
            let bytes = std::fs::read(&src).map_err(|e| Error::io(&src, e))?;
            write::write_atomic(&to.join(f), &bytes)?;
        }
    }
    // Checksums of what was written, read back from the output (so they describe the files,
    // whatever happened in memory); loading then checks headers against them, `nectar verify`
    // the bytes.
    crate::manifest::Manifest::of_catalog(&Catalog::open_unchecked(to)?)?.write(to)?;
    drop(lock);
    Ok(report)
}

fn check_params(to: &Path, params: &ConvertParams) -> Result<()> {
    let p = to.join(PARAMS_FILE);
    if p.exists() {
        let text = std::fs::read(&p).map_err(|e| Error::io(&p, e))?;
        let old: ConvertParams = serde_json::from_slice(&text)
            .map_err(|e| Error::Convert(format!("{}: unreadable parameters ({e})", p.display())))?;
        if &old != params {
            return Err(Error::Convert(format!(
                "{}: this directory was converted with different parameters ({}); refusing to mix them (now: {})",
                p.display(),
                serde_json::to_string(&old).unwrap_or_default(),
                serde_json::to_string(params).unwrap_or_default()
            )));
        }
        return Ok(());
    }
    write::write_json_atomic(&p, &serde_json::to_value(params).expect("params serialise"))
}

fn read_progress(to: &Path) -> Result<BTreeMap<String, Vec<String>>> {
    let p = to.join(PROGRESS_FILE);
    if !p.exists() {
        return Ok(BTreeMap::new());
    }
    let text = std::fs::read(&p).map_err(|e| Error::io(&p, e))?;
    let v: serde_json::Value = serde_json::from_slice(&text)
        .map_err(|e| Error::Convert(format!("{}: unreadable progress file ({e})", p.display())))?;
    let done: BTreeMap<String, Vec<String>> = serde_json::from_value(v["done"].clone())
        .map_err(|e| Error::Convert(format!("{}: unreadable progress file ({e})", p.display())))?;
    // A recorded shard whose outputs are gone is converted again.
    Ok(done
        .into_iter()
        .filter(|(_, outs)| outs.iter().all(|o| to.join(o).exists()))
        .collect())
}
