//! `nectar run`'s structured-output flags as the engine's [`GrammarSpec`].
use crate::args::RunArgs;
use anyhow::{Context, Result};
use nectar_engine::GrammarSpec;
use std::path::Path;

/// The grammar `--json-schema FILE`, `--json-object`, `--regex PATTERN` or
/// `--grammar FILE` asks for (clap keeps them mutually exclusive); the
/// engine compiles it and reports a bad one naming the parameter.
pub fn spec(a: &RunArgs) -> Result<Option<GrammarSpec>> {
    let read =
        |p: &Path| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()));
    Ok(if let Some(p) = &a.json_schema {
        let schema = serde_json::from_str(&read(p)?)
            .with_context(|| format!("{} is not valid JSON", p.display()))?;
        Some(GrammarSpec::JsonSchema(schema))
    } else if a.json_object {
        Some(GrammarSpec::JsonObject)
    } else if let Some(rx) = &a.regex {
        Some(GrammarSpec::Regex(rx.clone()))
    } else if let Some(p) = &a.grammar {
        Some(GrammarSpec::Lark(read(p)?))
    } else {
        None
    })
}
