//! `nectar convert`: stream a Hugging Face checkpoint into a Colibri-layout container.
use crate::args::ConvertArgs;
use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use nectar_format::convert::{convert, ConvertParams};
use nectar_model::arch::glm5::Config;

pub fn run(a: ConvertArgs) -> Result<()> {
    let cfg = Config::from_dir(&a.from).with_context(|| format!("reading {}", a.from.display()))?;
    let params = ConvertParams {
        expert_bits: a.expert_bits,
        attn_bits: a.attn_bits,
        shared_bits: a.shared_bits,
        dense_bits: a.dense_bits,
        io_bits: a.io_bits,
        mtp_bits: a.mtp_bits,
        indexer_bits: a.indexer_bits,
        group_size: a.group_size,
        n_layers: cfg.raw.num_hidden_layers,
    };
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} shard {msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
        )?
        .progress_chars("=> "),
    );
    let min_free = (a.min_free_gb.max(0.0) * 1e9) as u64;
    let report = convert(&a.from, &a.to, &params, min_free, &mut |ev| {
        bar.set_length(ev.bytes_total);
        bar.set_position(ev.bytes_done);
        bar.set_message(format!(
            "{}/{}{}",
            ev.shard + 1,
            ev.shards,
            if ev.skipped { " (done earlier)" } else { "" }
        ));
    })?;
    bar.finish();
    eprintln!(
        "converted {} shard(s), {} already done, wrote {:.3} GB into {} ({} output shards)",
        report.converted,
        report.skipped,
        report.bytes_written as f64 / 1e9,
        a.to.display(),
        report.outputs.len()
    );
    Ok(())
}
