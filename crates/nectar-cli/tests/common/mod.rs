//! Helpers shared by the `nectar` binary's integration tests.
#![allow(dead_code)] // each test file uses a different subset

pub mod server;

use std::path::PathBuf;
use std::process::Command;

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// Runs `nectar ARGS`: (success, stdout, stderr).
pub fn nectar(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nectar"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The byte count of a refusal's "needs at least X (N bytes)".
pub fn needed(err: &str) -> u64 {
    err.split(" bytes)")
        .next()
        .and_then(|x| x.rsplit('(').next())
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("no minimum in: {err}"))
}

/// The demo model converted by `nectar convert` with its defaults (int4 experts and spine) into
/// `dir/demo-int4`; returns that directory.
pub fn int4_demo(dir: &std::path::Path) -> PathBuf {
    let out = dir.join("demo-int4");
    let demo = root().join("models/nectar-demo-glm5");
    let (ok, _, err) = nectar(&[
        "convert",
        "--from",
        demo.to_str().unwrap(),
        "--to",
        out.to_str().unwrap(),
        "--min-free-gb",
        "0",
    ]);
    assert!(ok, "{err}");
    out
}

/// Parses JSON output, showing it when it is not JSON.
pub fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

/// A JSON array of integers.
pub fn ids(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// The demo model's `code_long` reference prompt (token ids).
pub fn code_long() -> Vec<u64> {
    let path = root().join("models/nectar-demo-glm5/reference.json");
    let v = json(&std::fs::read_to_string(path).unwrap());
    let p = v["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "code_long")
        .unwrap();
    ids(&p["input_ids"])
}

/// [`code_long`] as the value of `--prompt-ids`.
pub fn code_long_ids() -> String {
    let ids: Vec<String> = code_long().iter().map(u64::to_string).collect();
    ids.join(",")
}
