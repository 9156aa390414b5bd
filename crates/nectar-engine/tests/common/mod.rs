//! Helpers shared by the engine's integration tests: the built-in demo model and its
//! reference prompts.
#![allow(dead_code)] // each test file uses a different subset

use nectar_engine::ModelBundle;
use serde_json::Value;
use std::path::Path;
use std::sync::OnceLock;

pub const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// The demo model, loaded once per test binary.
pub fn demo() -> &'static ModelBundle {
    static B: OnceLock<ModelBundle> = OnceLock::new();
    B.get_or_init(|| ModelBundle::open(&Path::new(ROOT).join("models/nectar-demo-glm5")).unwrap())
}

/// The demo model's reference prompts (token ids).
pub fn prompts() -> Vec<Vec<u32>> {
    let text =
        std::fs::read_to_string(Path::new(ROOT).join("models/nectar-demo-glm5/reference.json"))
            .unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            p["input_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        })
        .collect()
}
