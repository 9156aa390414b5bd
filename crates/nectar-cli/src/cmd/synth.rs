//! `nectar synth`: write a synthetic container of real GLM-5.2 expert geometry.
use crate::args::SynthArgs;
use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use nectar_format::synth::{synth, SynthSpec};
use nectar_residency::planner::human;

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
    // Binary units throughout, as the progress bar's.
    eprintln!(
        "writing {} × {} × {} = {} of routed experts to {}",
        super::count(spec.layers as u64, "MoE layer", "MoE layers"),
        super::count(spec.experts as u64, "expert", "experts"),
        human(spec.expert_bytes()),
        human(total),
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
