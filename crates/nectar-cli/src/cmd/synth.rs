//! `nectar synth`: write a synthetic container of real GLM-5.2 expert geometry.
use crate::args::SynthArgs;
use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use nectar_format::synth::{synth, SynthSpec};

pub fn run(a: SynthArgs) -> Result<()> {
    let mut spec = match a.preset.as_str() {
        "glm52" => SynthSpec::glm52(a.layers),
        "small" => SynthSpec::small(a.layers),
        "tiny" => SynthSpec::tiny(a.layers),
        other => anyhow::bail!("unknown preset `{other}` (glm52, small or tiny)"),
    };
    spec.seed = a.seed;
    spec.mtp = a.mtp;
    if let Some(n) = a.experts {
        if n < spec.top_k {
            anyhow::bail!(
                "--experts {n} is below the preset's {} experts per token",
                spec.top_k
            );
        }
        spec.experts = n;
    }
    let total = spec.layers as u64 * spec.experts as u64 * spec.expert_bytes();
    eprintln!(
        "writing {} MoE layers × {} experts × {:.1} MB = {:.2} GB of routed experts to {}",
        spec.layers,
        spec.experts,
        spec.expert_bytes() as f64 / 1e6,
        total as f64 / 1e9,
        a.out.display()
    );
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("[{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}")?
            .progress_chars("=> "),
    );
    let files = synth(&a.out, &spec, &mut |done, _| bar.set_position(done))?;
    bar.finish();
    eprintln!("wrote {} shards and config.json", files.len());
    Ok(())
}
