//! Threads change speed, never bits: the demo model's logits (prefill, every position) and a
//! greedy decode's tokens and logprobs are identical on one and two threads, for the bf16 model
//! and its int4 conversion; and with two threads the forward really runs on the compute team.

mod common;
use common::{code_long_ids, json, nectar, root};

fn logits(model: &str, threads: &str) -> String {
    let (ok, out, err) = nectar(&[
        "--threads",
        threads,
        "logits",
        "--model",
        model,
        "--prompt-ids",
        &code_long_ids(),
    ]);
    assert!(ok, "{err}");
    out
}

/// (tokens, logprobs, team stats) of a 24-token greedy decode of `code_long` (284 tokens: the
/// sparse attention's selection is active).
fn decode(model: &str, threads: &str) -> (serde_json::Value, serde_json::Value, serde_json::Value) {
    let (ok, out, err) = nectar(&[
        "--threads",
        threads,
        "run",
        "--model",
        model,
        "--json",
        "--max-tokens",
        "24",
        "--logprobs",
        "5",
        "--prompt-ids",
        &code_long_ids(),
    ]);
    assert!(ok, "{err}");
    let v = json(&out);
    (
        v["tokens"].clone(),
        v["logprobs"].clone(),
        v["stats"]["team"].clone(),
    )
}

#[test]
fn one_and_two_threads_give_identical_logits_and_decodes() {
    let d = tempfile::tempdir().unwrap();
    let demo = root().join("models/nectar-demo-glm5");
    let int4 = common::int4_demo(d.path());
    for model in [demo.to_str().unwrap(), int4.to_str().unwrap()] {
        let one = logits(model, "1");
        assert!(one.len() > 1000, "{model}: {one}");
        assert!(one == logits(model, "2"), "{model}: logits differ");
        let (t1, lp1, team1) = decode(model, "1");
        let (t2, lp2, team2) = decode(model, "2");
        assert_eq!(t1.as_array().unwrap().len(), 24, "{model}");
        assert_eq!(t1, t2, "{model}: tokens differ");
        assert_eq!(lp1, lp2, "{model}: logprobs differ");
        // One thread: no team workers, no region. Two: the forward's regions ran on the team.
        assert_eq!(team1["threads"], 1);
        assert_eq!(team1["regions"], 0);
        assert_eq!(team2["threads"], 2);
        assert!(team2["regions"].as_u64().unwrap() > 24, "{model}: {team2}");
    }
}
