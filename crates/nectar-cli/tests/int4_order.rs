//! `--int4-order digits` (opt-in): the int4 demo's logits stay within f32 accuracy of the exact
//! order's, a greedy decode is the same, one and two threads give the same bits, and the JSON
//! says which order ran. Where the kernel path has neither AVX2 nor AVX-512 VNNI (the scalar
//! path, forced here on any CPU) the flag is refused, clearly.

mod common;
use common::{code_long, code_long_ids, json, nectar};

fn logits(model: &str, order: &str) -> Vec<Vec<f64>> {
    logits_on(model, order, &[])
}

/// [`logits`] with global flags in front (`--isa avx2`).
fn logits_on(model: &str, order: &str, global: &[&str]) -> Vec<Vec<f64>> {
    let ids = code_long_ids();
    let mut args = global.to_vec();
    args.extend([
        "--int4-order",
        order,
        "logits",
        "--model",
        model,
        "--prompt-ids",
        &ids,
    ]);
    let (ok, out, err) = nectar(&args);
    assert!(ok, "{err}");
    serde_json::from_value(json(&out)["logits"].clone()).unwrap()
}

fn decode(model: &str, order: &str, threads: &str) -> serde_json::Value {
    let (ok, out, err) = nectar(&[
        "--threads",
        threads,
        "--int4-order",
        order,
        "run",
        "--model",
        model,
        "--json",
        "--no-usage-save",
        "--max-tokens",
        "24",
        "--logprobs",
        "3",
        "--prompt-ids",
        &code_long_ids(),
    ]);
    assert!(ok, "{err}");
    json(&out)
}

#[test]
fn digits_keep_the_int4_demos_logits_and_decode() {
    // Any CPU: the scalar path refuses the order by name.
    let (ok, _, err) = nectar(&["--isa", "scalar", "--int4-order", "digits", "run"]);
    assert!(
        !ok && err.contains("--int4-order") && err.contains("VNNI"),
        "{err}"
    );
    let d = tempfile::tempdir().unwrap();
    let int4 = common::int4_demo(d.path());
    let model = int4.to_str().unwrap();
    let (ok, _, err) = nectar(&["--int4-order", "digits", "inspect", "--model", model]);
    if !ok {
        assert!(err.contains("VNNI"), "{err}");
        eprintln!("skipped: this CPU has neither AVX2 nor AVX-512 VNNI ({err})");
        return;
    }
    let (exact, digits) = (logits(model, "exact"), logits(model, "digits"));
    assert_eq!(exact.len(), code_long().len());
    let max = exact.iter().flatten().fold(0.0f64, |a, v| a.max(v.abs()));
    let diff = exact
        .iter()
        .flatten()
        .zip(digits.iter().flatten())
        .fold(0.0f64, |a, (x, y)| a.max((x - y).abs()));
    // The exact order's own distance from Hugging Face is bounded by 1e-4 × max|logit|; the
    // digits order is f32 arithmetic in another order, so far inside that.
    assert!(diff > 0.0, "the digits order ran the exact products");
    assert!(
        diff <= 1e-5 * max,
        "max |Δlogit| {diff} against max|logit| {max}"
    );
    // The AVX2 path's kernel (AVX-VNNI where the CPU has it) computes the order's bits too
    // (on an AVX-512 VNNI CPU this compares two kernels; where AVX2 is the best path it is the
    // same kernel twice).
    let (ok, _, _) = nectar(&["--isa", "avx2", "inspect", "--model", model]);
    if ok {
        assert_eq!(logits_on(model, "digits", &["--isa", "avx2"]), digits);
    }
    let one = decode(model, "digits", "1");
    assert_eq!(one["stats"]["int4_order"], "digits");
    assert_eq!(one["tokens"], decode(model, "exact", "1")["tokens"]);
    let two = decode(model, "digits", "2");
    assert_eq!(one["tokens"], two["tokens"]);
    assert_eq!(
        one["logprobs"], two["logprobs"],
        "threads changed the digits order's bits"
    );
}
