//! `nectar run --session FILE`: the second run reuses the first run's caches (reported in
//! `--json`) and prints what a run without a session prints; `.coli_kv` by file name; a damaged
//! file is refused with its name.
mod common;
use common::{code_long as prompt, json, nectar};

fn ids(v: &[u64]) -> String {
    v.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

fn run(prompt: &[u64], session: Option<&str>) -> serde_json::Value {
    let p = ids(prompt);
    let mut args = vec!["run", "--prompt-ids", &p, "--max-tokens", "6", "--json"];
    if let Some(s) = session {
        args.extend(["--session", s]);
    }
    let (ok, out, err) = nectar(&args);
    assert!(ok, "{err}");
    json(&out)
}

fn tokens(v: &serde_json::Value) -> Vec<u64> {
    v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

#[test]
fn second_run_reuses_the_session_and_matches_a_plain_run() {
    let dir = tempfile::tempdir().unwrap();
    let p1 = prompt();
    for (name, format) in [("chat.nkv", "nectar"), ("chat.coli_kv", "coli_kv")] {
        let file = dir.path().join(name);
        let f = file.to_str().unwrap();
        let first = run(&p1, Some(f));
        let s = &first["session"];
        assert_eq!(s["format"], format);
        assert_eq!(
            (s["restored_tokens"].as_u64(), s["reused_tokens"].as_u64()),
            (Some(0), Some(0))
        );
        let t1 = tokens(&first);
        let saved = p1.len() + t1.len() - 1;
        assert_eq!(s["saved_tokens"].as_u64(), Some(saved as u64));
        assert!(file.exists());

        let mut p2 = p1.clone();
        p2.extend(&t1);
        p2.extend(&p1[..5]);
        let second = run(&p2, Some(f));
        let s = &second["session"];
        assert_eq!(s["restored_tokens"].as_u64(), Some(saved as u64));
        assert_eq!(s["reused_tokens"].as_u64(), Some(saved as u64), "{s}");
        assert_eq!(
            second["stats"]["prompt_tokens"].as_u64(),
            Some((p2.len() - saved) as u64)
        );
        assert_eq!(tokens(&second), tokens(&run(&p2, None)), "{name}");
    }
    assert!(dir.path().join("chat.coli_kv.nectar-id").exists());

    let bad = dir.path().join("bad.nkv");
    std::fs::write(&bad, b"NECTARKV\x01\0\0\0 too short").unwrap();
    let p = ids(&p1);
    let (ok, _, err) = nectar(&[
        "run",
        "--prompt-ids",
        &p,
        "--session",
        bad.to_str().unwrap(),
    ]);
    assert!(
        !ok && err.contains("truncated") && err.contains("bad.nkv"),
        "{err}"
    );
}
