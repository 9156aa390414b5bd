//! The built-in demo model: `models/nectar-demo-glm5` of the source tree this binary was built
//! from (it ships in the repository, so `nectar run` needs no download).
use std::path::PathBuf;

/// The model directory to use: the one given, or the built-in demo.
pub fn model_dir(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p);
    }
    let demo = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../models/nectar-demo-glm5"
    ));
    if demo.join("config.json").exists() {
        return Ok(demo);
    }
    anyhow::bail!(
        "no --model given and the built-in demo model is not at {} (was the source tree moved?)",
        demo.display()
    )
}
