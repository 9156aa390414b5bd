//! `nectar bench io` and `nectar bench decode` end to end on small synthetic containers.
mod common;
use common::{json, nectar, root};
use nectar_format::synth::{synth, SynthSpec};
use std::path::{Path, PathBuf};

/// A tiny synthetic container with `experts` routed experts per layer, top-`k`.
fn container(dir: &Path, layers: usize, experts: usize, k: usize) -> PathBuf {
    let out = dir.join(format!("tiny-e{experts}"));
    let spec = SynthSpec {
        experts,
        top_k: k,
        ..SynthSpec::tiny(layers)
    };
    synth(&out, &spec, &mut |_, _| {}).unwrap();
    out
}

/// `nectar bench decode` on `model` with small, fast settings plus `extra` (slots, routes...).
fn decode(model: &Path, extra: &[&str]) -> (bool, String, String) {
    let mut args = vec![
        "bench",
        "decode",
        "--model",
        model.to_str().unwrap(),
        "--tokens",
        "12",
        "--warmup",
        "2",
        "--spine-mb",
        "1",
        "--spine-pool-mb",
        "4",
        "--raw-seconds",
        "0.05",
        "--raw-every",
        "6",
        "--json",
    ];
    args.extend_from_slice(extra);
    nectar(&args)
}

#[test]
fn bench_decode_replays_route256_as_recorded_against_belady() {
    let dir = tempfile::tempdir().unwrap();
    let model = container(dir.path(), 2, 256, 8);
    let (ok, out, err) = decode(
        &model,
        &["--routes", "trace", "--slots", "4", "--shared-mb", "0.2"],
    );
    assert!(ok, "{err}");
    let v = json(&out);
    assert_eq!(v["trace"]["experts_per_layer"], 256);
    // Trace main layers 1 and 2 on the container's two MoE layers; decode rows only.
    assert_eq!(v["trace"]["model_layer_per_moe_layer"], json("[1, 2]"));
    assert_eq!(v["trace"]["decode_rows"], 24 * 256);
    // Ids are replayed as recorded: far more than the 32 a modulo mapping of the demo gave.
    for d in v["distinct_experts_per_layer"].as_array().unwrap() {
        assert!(d.as_u64().unwrap() > 32, "{v}");
    }
    // The disk bound divides by the least any policy must read (Belady at the same slots), so
    // a policy reads at least that much, and the ratio cannot exceed 1.
    let belady = v["belady"]["gb_per_token"].as_f64().unwrap();
    assert!(belady > 0.0, "{v}");
    assert!(v["gb_per_token"].as_f64().unwrap() >= belady * 0.999, "{v}");
    assert!(v["belady"]["hit_rate"].as_f64().unwrap() >= v["hit_rate"].as_f64().unwrap());
    let raw = v["raw_disk"]["reference_gbps"].as_f64().unwrap();
    let disk = v["disk_bound_tok_s"].as_f64().unwrap();
    assert!((disk - raw / belady).abs() <= 1e-9 * disk, "{v}");
    assert!(
        v["raw_disk"]["samples_random_expert_gbps"]
            .as_array()
            .unwrap()
            .len()
            >= 3
    );
    assert!(v["ratio"].as_f64().unwrap() <= 1.0);
    assert!(
        v["spine_pool"]["bytes"].as_u64().unwrap() >= 4_000_000,
        "{v}"
    );

    // A container with fewer experts than the trace is refused, not remapped; so is a trace of
    // a smaller universe (the demo's top-4 of 32) on this 256-expert, top-8 container.
    let small = container(dir.path(), 2, 16, 4);
    let (ok, _, err) = decode(&small, &["--routes", "trace"]);
    assert!(!ok && err.contains("never remapped"), "{err}");
    let demo = root().join("tests/fixtures/traces/demo");
    let (ok, _, err) = decode(
        &model,
        &["--routes", "trace", "--trace", demo.to_str().unwrap()],
    );
    assert!(
        !ok && err.contains("top-4 of 32") && err.contains("own expert shape"),
        "{err}"
    );
}

#[test]
fn bench_decode_replays_the_trace_with_the_real_predictor() {
    let dir = tempfile::tempdir().unwrap();
    // The demo trace routes over 32 experts, top-4.
    let model = container(dir.path(), 2, 32, 4);
    let demo = root().join("tests/fixtures/traces/demo");
    let bench = |prefetch: &str, shared_mb: &str| {
        decode(
            &model,
            &[
                "--routes",
                "trace",
                "--trace",
                demo.to_str().unwrap(),
                "--slots",
                "2",
                "--shared-mb",
                shared_mb,
                "--prefetch",
                prefetch,
            ],
        )
    };
    let run = |prefetch: &str| {
        let (ok, out, err) = bench(prefetch, "0.2");
        assert!(ok, "{err}");
        json(&out)
    };
    // The shared expert is part of the spine slice: a larger one is refused, naming both flags.
    let (ok, _, err) = bench("none", "2");
    assert!(
        !ok && err.contains("--shared-mb") && err.contains("--spine-mb"),
        "{err}"
    );
    let none = run("none");
    assert_eq!(none["prefetch_issued"], 0);
    assert_eq!(none["shared_mb_per_layer"], 0.2);
    let pilot = run("pilot");
    let p = &pilot["pilot"];
    // Our routing reproduces the trace (recorded with transformers), and the predictor names
    // most of what the next layer chooses.
    assert!(
        p["route_agreement_with_trace"].as_f64().unwrap() > 0.99,
        "{p}"
    );
    assert!(p["recall"].as_f64().unwrap() > 0.5, "{p}");
    let (issued, hits, dropped) = (
        pilot["prefetch_issued"].as_u64().unwrap(),
        pilot["prefetch_hits"].as_u64().unwrap(),
        pilot["prefetch_dropped"].as_u64().unwrap(),
    );
    assert!(issued > 0 && hits > 0);
    assert_eq!(issued, hits + dropped, "every prefetch is used or dropped");
    // Prefetch only moves reads earlier: the demand routes (and so the misses a perfect
    // predictor would hide) are the same, and hits can only grow.
    assert!(pilot["hit_rate"].as_f64().unwrap() >= none["hit_rate"].as_f64().unwrap());
    // Wasted prefetches are charged: the Belady bound is the same for every prefetch mode.
    assert_eq!(pilot["belady"], none["belady"]);
    let oracle = run("oracle");
    assert_eq!(
        oracle["prefetch_dropped"], 0,
        "a perfect guess is never wasted"
    );
}

#[test]
fn bench_io_reads_the_managers_sequence_and_a_sequential_ceiling() {
    let dir = tempfile::tempdir().unwrap();
    let model = container(dir.path(), 2, 16, 4);
    let (ok, out, err) = nectar(&[
        "bench",
        "io",
        "--model",
        model.to_str().unwrap(),
        "--seconds",
        "0.1",
        "--repeats",
        "2",
        "--json",
    ]);
    let v = json(&out);
    for arm in [
        "raw_same_sequence_gbps",
        "raw_sequential_gbps",
        "residency_gbps",
    ] {
        assert_eq!(v["repetitions"][arm].as_array().unwrap().len(), 2, "{v}");
        assert!(v[arm].as_f64().unwrap() > 0.0, "{v}");
    }
    // The reference is the best repetition of either raw arm.
    let best = ["raw_same_sequence_gbps", "raw_sequential_gbps"]
        .iter()
        .flat_map(|arm| v["repetitions"][arm].as_array().unwrap())
        .map(|x| x.as_f64().unwrap())
        .fold(0.0, f64::max);
    assert_eq!(v["reference_gbps"].as_f64().unwrap(), best, "{v}");
    // Above the higher raw arm, the bench reports its reference as wrong and fails.
    let ratio = v["ratio"].as_f64().unwrap();
    assert_eq!(ok, ratio <= 1.0, "{err}");
    assert!(ok || err.contains("reference is wrong"), "{err}");
}
