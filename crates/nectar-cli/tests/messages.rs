//! What the CLI says: the top-level help lists every command, counts have their singular, a run
//! that times nothing reports no rate, a missing model directory is named as such, `synth`
//! speaks one unit system, and `run --json` reports the prefill phases.

mod common;
use common::{json, nectar, needed};

#[test]
fn top_level_help_describes_the_whole_tool() {
    let (ok, out, _) = nectar(&["--help"]);
    assert!(ok);
    let first = out.lines().next().unwrap();
    assert!(!first.contains("run, logits, inspect"), "{first}");
    for cmd in [
        "run", "serve", "convert", "inspect", "fit", "bench", "synth", "logits",
    ] {
        assert!(
            out.lines().any(|l| l.trim_start().starts_with(cmd)),
            "{cmd}: {out}"
        );
    }
}

#[test]
fn one_is_singular() {
    // One LRU slot per layer: the least budget the planner accepts on this machine (its
    // "needs at least" figure, in bytes), not a fixed size — the runtime reserve depends on the
    // core count.
    let run = |budget: &str| {
        nectar(&[
            "run",
            "--prompt-ids",
            "5",
            "--max-tokens",
            "1",
            "--threads",
            "1",
            "--memory-budget",
            budget,
        ])
    };
    let (refused, _, err) = run("1M");
    assert!(!refused, "{err}");
    let least = needed(&err).to_string();
    let (ok, _, err) = run(&least);
    assert!(ok, "{err}");
    assert!(err.contains("[1 prompt token at"), "{err}");
    assert!(err.contains(", 1 thread,"), "{err}");
    assert!(
        err.contains("[experts streamed: 1 LRU slot per layer"),
        "{err}"
    );
}

#[test]
fn max_tokens_zero_reports_no_rate() {
    let (ok, out, err) = nectar(&["run", "--prompt-ids", "5,6", "--max-tokens", "0", "--json"]);
    assert!(ok, "{err}");
    let v = json(&out);
    let s = &v["stats"];
    for k in ["prefill_tok_s", "decode_tok_s"] {
        let r = s[k].as_f64().unwrap();
        assert!(r < 1e6, "{k} = {r}: a rate over no time");
    }
}

#[test]
fn a_missing_model_directory_is_named() {
    let d = tempfile::tempdir().unwrap();
    let missing = d.path().join("no-such-model");
    let (ok, _, err) = nectar(&["run", "--model", missing.to_str().unwrap(), "Hi"]);
    assert!(!ok);
    assert!(err.contains("does not exist"), "{err}");
    assert!(!err.contains("config.json"), "{err}");
}

#[test]
fn synth_speaks_binary_units_like_its_progress_bar() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("s");
    let (ok, _, err) = nectar(&[
        "synth",
        "--preset",
        "tiny",
        "--layers",
        "1",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let line = err.lines().find(|l| l.starts_with("writing")).unwrap();
    assert!(line.contains("1 MoE layer ×"), "{line}");
    assert!(line.contains("KiB") || line.contains("MiB"), "{line}");
    assert!(!line.contains(" MB") && !line.contains(" GB"), "{line}");
}

#[test]
fn an_error_cause_is_printed_once() {
    let d = tempfile::tempdir().unwrap();
    let s = d.path().join("missing/s.nectar");
    let (ok, _, err) = nectar(&["run", "--session", s.to_str().unwrap(), "Hi"]);
    assert!(!ok);
    let line = err.lines().find(|l| l.starts_with("error:")).unwrap();
    assert_eq!(line.matches("os error").count(), 1, "{line}");
}

#[test]
fn run_json_reports_where_prefill_and_decode_time_went() {
    // A tiny synth selects from index_topk = 16: a 40-token prompt runs the indexer's scores.
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("s");
    let (ok, _, err) = nectar(
        &["synth", "--preset", "tiny", "--layers", "2", "--out"]
            .into_iter()
            .chain([m.to_str().unwrap()])
            .collect::<Vec<_>>(),
    );
    assert!(ok, "{err}");
    let ids: Vec<String> = (0..40).map(|i| (i * 7 % 200).to_string()).collect();
    let ids = ids.join(",");
    let (ok, out, err) = nectar(&[
        "run",
        "--model",
        m.to_str().unwrap(),
        "--prompt-ids",
        &ids,
        "--max-tokens",
        "4",
        "--no-usage-save",
        "--json",
    ]);
    assert!(ok, "{err}");
    let j = json(&out);
    // The decode steps' phases are kept apart from the prompt's: their layers' attention and
    // MLP halves ran, and they add up to no more than the decode's own time.
    let d = &j["stats"]["decode_phases_s"];
    assert!(d["attn_proj"].as_f64().unwrap() > 0.0, "{d}");
    assert!(d["mlp"].as_f64().unwrap() > 0.0, "{d}");
    let sum: f64 = d
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_f64().unwrap())
        .sum();
    let decode_s = j["stats"]["decode_s"].as_f64().unwrap();
    assert!(
        sum <= decode_s * 1.000_001 + 1e-9,
        "{sum} > {decode_s}: {d}"
    );
    let p = &j["stats"]["prefill_phases_s"];
    for k in [
        "attn_proj",
        "indexer_keys",
        "indexer_proj",
        "indexer_topk",
        "kv_b",
        "attn_core",
        "o_proj",
        "mlp_route",
        "mlp",
        "mlp_combine",
        "other",
    ] {
        assert!(p[k].as_f64().unwrap() >= 0.0, "{k}: {p}");
    }
    // Rows past index_topk were scored, and the MLP halves ran.
    assert!(p["indexer_scores"].as_f64().unwrap() > 0.0, "{p}");
    for k in ["mlp_route", "mlp", "mlp_combine"] {
        assert!(p[k].as_f64().unwrap() > 0.0, "{k}: {p}");
    }
}
