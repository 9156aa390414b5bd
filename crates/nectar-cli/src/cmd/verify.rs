//! `nectar verify DIR`: are the weights what was written?
use crate::args::VerifyArgs;
use anyhow::{Context, Result};
use nectar_format::manifest::{verify, MANIFEST_FILE};
use nectar_residency::planner::human;

pub fn run(a: VerifyArgs) -> Result<()> {
    let dir = &a.dir;
    let index = dir.join("model.safetensors.index.json");
    let r = verify(dir, &mut |_, _| {}).with_context(|| format!("verifying {}", dir.display()))?;
    // Opening the catalog checked every header and, when present, the index.
    println!("{}: headers valid", dir.display());
    if index.exists() {
        println!("model.safetensors.index.json: agrees with the shards");
    }
    if !r.has_manifest {
        println!("no {MANIFEST_FILE}: tensor bytes not checked (`nectar convert` writes one)");
        return Ok(());
    }
    for m in &r.mismatches {
        println!("MISMATCH `{}`: {}", m.tensor, m.msg);
    }
    if !r.mismatches.is_empty() {
        anyhow::bail!(
            "{} from {MANIFEST_FILE}",
            crate::cmd::count(r.mismatches.len() as u64, "difference", "differences")
        );
    }
    println!(
        "{MANIFEST_FILE}: {} ({}) match",
        crate::cmd::count(r.hashed as u64, "tensor", "tensors"),
        human(r.bytes)
    );
    Ok(())
}
