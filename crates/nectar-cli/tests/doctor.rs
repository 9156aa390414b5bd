//! `nectar doctor` as a process: a good model directory passes, broken ones fail naming the
//! problem.
mod common;
use common::{json, nectar, root};

fn demo() -> String {
    root().join("models/nectar-demo-glm5").display().to_string()
}

fn status<'a>(v: &'a serde_json::Value, check: &str) -> &'a str {
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == check)
        .unwrap_or_else(|| panic!("no `{check}` check in {v}"))["status"]
        .as_str()
        .unwrap()
}

#[test]
fn a_good_model_directory_passes() {
    let (ok, out, err) = nectar(&[
        "doctor",
        "--model",
        &demo(),
        "--memory-budget",
        "1G",
        "--json",
    ]);
    assert!(ok, "{out}\n{err}");
    let v = json(&out);
    assert_eq!(v["ok"], true);
    for c in [
        "cpu",
        "memory",
        "memlock",
        "model",
        "memory plan",
        "disk free",
    ] {
        assert_ne!(status(&v, c), "fail", "{v}");
    }
    assert_eq!(status(&v, "model"), "ok");
    assert_eq!(status(&v, "memory plan"), "ok");
    assert!(v.to_string().contains("decode"), "{v}");
}

#[test]
fn a_truncated_shard_fails_naming_the_file() {
    let d = tempfile::tempdir().unwrap();
    let src = root().join("models/nectar-demo-glm5");
    for f in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        std::fs::copy(src.join(f), d.path().join(f)).unwrap();
    }
    let shard = std::fs::read(src.join("model.safetensors")).unwrap();
    std::fs::write(
        d.path().join("model.safetensors"),
        &shard[..shard.len() / 2],
    )
    .unwrap();
    let (ok, out, err) = nectar(&[
        "doctor",
        "--model",
        d.path().to_str().unwrap(),
        "--memory-budget",
        "1G",
    ]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("FAIL  model") && out.contains("model.safetensors"),
        "{out}"
    );
    assert!(out.contains("truncated"), "{out}");
    assert!(err.contains("block a run: model"), "{err}");
}

#[test]
fn a_missing_config_and_a_budget_too_small_fail() {
    let d = tempfile::tempdir().unwrap();
    let (ok, out, _) = nectar(&[
        "doctor",
        "--model",
        d.path().to_str().unwrap(),
        "--memory-budget",
        "1G",
    ]);
    assert!(!ok);
    assert!(
        out.contains("FAIL  model") && out.contains("config.json"),
        "{out}"
    );
    let (ok, out, err) = nectar(&[
        "doctor",
        "--model",
        &demo(),
        "--memory-budget",
        "10M",
        "--json",
    ]);
    assert!(!ok, "{out}");
    assert_eq!(status(&json(&out), "memory plan"), "fail");
    assert!(err.contains("memory plan"), "{err}");
}

#[test]
fn a_budget_beyond_usable_memory_fails() {
    let (ok, out, err) = nectar(&["doctor", "--memory-budget", "64T", "--json"]);
    assert!(!ok, "{out}");
    assert_eq!(status(&json(&out), "budget"), "fail");
    assert!(err.contains("budget"), "{err}");
}
